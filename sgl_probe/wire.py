"""The link between a server process and its exporter process: one connected Unix
``SOCK_SEQPACKET`` socket pair carrying pickled messages of plain data; with the C extension, the
STEPS messages are packed instead (:data:`PACKED`, below).

Sequenced packets keep message boundaries and a non-blocking send of one message either goes
whole or fails at once, so a full link drops whole messages (and the sender counts them) and
never blocks the sender. Messages stay well under the socket's send buffer.
"""

from __future__ import annotations

import pickle
import socket
import struct
from operator import itemgetter
from typing import Any, Callable, Optional

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


def max_message(sock: socket.socket) -> int:
    """The largest message ``sock`` takes in one piece, up to :data:`MAX_MESSAGE`: half its send
    buffer as the kernel reports it (its own bookkeeping counts against the buffer too), where a
    host caps the buffer below what :func:`pair` asks for."""
    try:
        return max(1024, min(MAX_MESSAGE, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 2))
    except OSError:
        return MAX_MESSAGE


def encode(kind: str, payload: Any) -> bytes:
    return pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> tuple[str, Any]:
    if data[:4] == PACKED:
        return STEPS, _unpack()(data)
    kind, payload = pickle.loads(data)
    return kind, payload


_phases_of = itemgetter(PHASES)

#: Steps per message before the size check (a decode step with one phase pickles to ~100 bytes).
CHUNK_STEPS = 128


def encode_steps(steps: list, kept_slow: list, pack: Optional[Callable] = None,
                 limit: int = MAX_MESSAGE) -> list[tuple[bytes, int]]:
    """STEPS messages for a batch, each under ``limit`` (:data:`MAX_MESSAGE`, or a link's
    :func:`max_message`; unless one step alone is larger), with the number of spans each one
    carries (what a drop of that message costs). ``pack``: the C extension's ``pack_steps`` (the
    messages packed where it can), or None."""
    out: list[tuple[bytes, int]] = []
    for i in range(0, len(steps), CHUNK_STEPS):
        _encode_chunk(steps[i:i + CHUNK_STEPS], kept_slow[i:i + CHUNK_STEPS], out, pack, limit)
    return out


def _encode_chunk(steps: list, kept_slow: list, out: list, pack: Optional[Callable], limit: int) -> None:
    data = None
    if pack is not None:
        try:
            data = pack(steps, kept_slow)
        except Exception:  # e.g. no memory for the buffer: pickle has its own way, the steps still go
            data = None
    if data is None:
        data = encode(STEPS, (steps, kept_slow))
    if len(data) <= limit or len(steps) == 1:
        out.append((data, len(steps) + sum(map(len, map(_phases_of, steps)))))
        return
    half = len(steps) // 2
    _encode_chunk(steps[:half], kept_slow[:half], out, pack, limit)
    _encode_chunk(steps[half:], kept_slow[half:], out, pack, limit)


# -- STEPS, packed ------------------------------------------------------------------------------
#: A packed STEPS message starts with these bytes (a pickled one with pickle's 0x80). Then, all
#: little-endian: u32 rows, u32 strings, each string as u32 length and UTF-8, one byte per row
#: (kept because slow), and each row as a value: ``N`` None, ``T`` / ``F`` a bool, ``i`` an int64,
#: ``d`` a float64, ``s`` a u32 number in the strings, ``t`` a u32 count and that many values
#: (a row, its phases, a phase: three deep at most). Written by ``sgl_probe._hot.pack_steps``
#: (pickling the same rows cost the drain thread more than resolving them); read by
#: ``_hot.unpack_steps`` or, without the extension, :func:`unpack_steps`, its reference.
PACKED = b"\xa7SP1"
_UNPARSED = "sgl-probe: a packed steps message that does not parse"
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def unpack_steps(data: bytes) -> tuple[list, list]:
    """(rows, kept_slow) of a packed STEPS message; ValueError where it does not parse."""
    try:
        return _Reader(data).steps()
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ValueError(_UNPARSED) from exc


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.at = 0
        self.strings: list[str] = []

    def u32(self) -> int:
        (v,) = _U32.unpack_from(self.view, self.at)
        self.at += 4
        return v

    def steps(self) -> tuple[list, list]:
        if bytes(self.view[:4]) != PACKED:
            raise ValueError("sgl-probe: not a packed steps message")
        self.at = 4
        n, ns = self.u32(), self.u32()
        for _ in range(ns):
            length = self.u32()
            if self.at + length > len(self.view):
                raise ValueError(_UNPARSED)
            self.strings.append(str(self.view[self.at:self.at + length], "utf-8"))
            self.at += length
        if self.at + n > len(self.view):
            raise ValueError(_UNPARSED)
        slow = [b != 0 for b in self.view[self.at:self.at + n]]
        self.at += n
        rows = [self.value(1) for _ in range(n)]
        if self.at != len(self.view):
            raise ValueError(_UNPARSED)
        return rows, slow

    def value(self, depth: int) -> Any:
        tag = chr(self.view[self.at])
        self.at += 1
        if tag == "N":
            return None
        if tag in "TF":
            return tag == "T"
        if tag in "id":
            (v,) = (_I64 if tag == "i" else _F64).unpack_from(self.view, self.at)
            self.at += 8
            return v
        if tag == "s":
            return self.strings[self.u32()]
        if tag == "t" and depth <= 3:
            return tuple(self.value(depth + 1) for _ in range(self.u32()))
        raise ValueError(_UNPARSED)


def _unpack() -> Callable[[bytes], tuple[list, list]]:
    """The C reader where the extension is built, else :func:`unpack_steps`."""
    from sgl_probe import hotpath

    fast = hotpath.load("auto")
    return getattr(fast, "unpack_steps", None) or unpack_steps
