"""The link between a server process and its exporter process: one connected Unix
``SOCK_SEQPACKET`` socket pair carrying pickled messages of plain data.

Sequenced packets keep message boundaries and a non-blocking send of one message either goes
whole or fails at once, so a full link drops whole messages (and the sender counts them) and
never blocks the sender. Messages stay well under the socket's send buffer.
"""

from __future__ import annotations

import pickle
import socket
from operator import itemgetter
from typing import Any

from sgl_probe.resolved import PHASES

# server -> exporter
META = "meta"      # (run_id, ident, spec, sglang_version, server pid, trace_dir)
STEPS = "steps"    # (list of steps as rows: resolved.from_row, list of kept-because-slow flags)
ENV = "env"        # (attributes, wall-clock ns, span name)
FLUSH = "flush"    # token: export what you have, then answer FLUSHED
STOP = "stop"      # flush and exit
# exporter -> server
STATS = "stats"    # (spans received, spans finished: exported, failed or refused, spans dropped,
                   #  {output name: spans it dropped})
FLUSHED = "flushed"  # (token, STATS payload)

#: Largest message sent; a batch of steps is split to stay under it.
MAX_MESSAGE = 48 * 1024
_BUFFER = 4 * 1024 * 1024  # asked for; the kernel caps it (net.core.wmem_max)


def pair() -> tuple[socket.socket, socket.socket]:
    """(server end, exporter end). The server end never blocks."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (ours, theirs):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        except OSError:
            pass
    ours.setblocking(False)
    return ours, theirs


def encode(kind: str, payload: Any) -> bytes:
    return pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> tuple[str, Any]:
    kind, payload = pickle.loads(data)
    return kind, payload


_phases_of = itemgetter(PHASES)

#: Steps per message before the size check (a decode step with one phase pickles to ~100 bytes).
CHUNK_STEPS = 128


def encode_steps(steps: list, kept_slow: list) -> list[tuple[bytes, int]]:
    """STEPS messages for a batch, each under :data:`MAX_MESSAGE` (unless one step alone is
    larger), with the number of spans each one carries (what a drop of that message costs)."""
    out: list[tuple[bytes, int]] = []
    for i in range(0, len(steps), CHUNK_STEPS):
        _encode_chunk(steps[i:i + CHUNK_STEPS], kept_slow[i:i + CHUNK_STEPS], out)
    return out


def _encode_chunk(steps: list, kept_slow: list, out: list) -> None:
    data = encode(STEPS, (steps, kept_slow))
    if len(data) <= MAX_MESSAGE or len(steps) == 1:
        out.append((data, len(steps) + sum(map(len, map(_phases_of, steps)))))
        return
    half = len(steps) // 2
    _encode_chunk(steps[:half], kept_slow[:half], out)
    _encode_chunk(steps[half:], kept_slow[half:], out)
