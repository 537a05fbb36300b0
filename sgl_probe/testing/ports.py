"""A port for a server a test launches."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768 and up), from which the server's own
    outgoing connections (NCCL, gloo, ZMQ) take theirs: one of them could otherwise take a port
    picked with ``bind(0)`` in the seconds before the server binds it. Racy by nature (the port is
    released before the server binds it)."""
    for port in random.Random().sample(range(20000, 32000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-31999")
