"""The exporter process: resolved steps in over the link (:mod:`sgl_probe.wire`), spans out
through the OpenTelemetry SDK (:class:`sgl_probe.sinks.SpanSink`).

One per server process, started by it (:mod:`sgl_probe.exporter_process`) with
``python -m sgl_probe.exporter_main FD SERVER_PID [IDLE_FLUSH_S]``. It never outlives that
process: it exits when the link closes (the server exited, however it exited) or, checked every
second, when the server is no longer its parent; either way it first flushes what it has, for a
bounded time. It also holds spans only briefly (batches of 0.2 s, and a flush once the server has
sent nothing for ``IDLE_FLUSH_S``): SGLang ends a server by SIGKILL to every descendant of its
launcher (``kill_process_tree``), this process included, and spans still batched then are lost.
Ctrl-C reaches the whole process group: this process ignores it and lets the server decide.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

from sgl_probe.config import Config

STATS_EVERY_S = 0.5
#: Larger than any message the server's socket lets through (its send buffer is capped lower).
RECV_BUFFER = 8 << 20
FLUSH_ON_EXIT_S = 5.0
#: The span batch delay here unless ``OTEL_BSP_SCHEDULE_DELAY`` sets one: the SDK's 5 s is
#: meant to keep export work off a busy process, and this process is off the server's already;
#: a SIGKILL (SGLang's shutdown sends one) loses at most this much of a busy server's spans.
BATCH_DELAY_MS = 200
#: A link quiet for this long means the server is idle: export what is batched. The server
#: passes its ``SGL_PROBE_IDLE_FLUSH_S``; this is that setting's default, for a caller that does not.
IDLE_FLUSH_S = Config.idle_flush_s
#: Added to the server's nice value: on a host whose cores SGLang's own processes keep busy, the
#: scheduler wins the CPU over span encoding; an exporter that falls behind fills the link, and
#: the server drops (and counts) what does not fit rather than wait.
NICE_INCREMENT = 10

log = logging.getLogger("sgl_probe")


class Exporter:
    def __init__(self, sock: socket.socket, server_pid: Optional[int] = None) -> None:
        self.sock = sock
        self.server_pid = server_pid
        self.sink: Any = None
        self.meta: Optional[tuple] = None
        self.resource: Any = None
        self.received = 0
        self._last_stats = 0.0
        self._stats_sent: Optional[tuple] = None
        self.unflushed = False  # spans handed to the SDK since the last flush
        self._idle_flush: Optional[threading.Thread] = None

    def idle(self) -> None:
        """The link was quiet for :data:`IDLE_FLUSH_S`: export what the SDK still batches, on a
        thread of its own, so that the counts keep going back to the server and the link keeps
        being read while an unreachable collector makes the export retry for seconds."""
        if not self.unflushed or self.sink is None:
            return
        if self._idle_flush is not None and self._idle_flush.is_alive():
            return
        self.unflushed = False
        self._idle_flush = threading.Thread(target=self.sink.flush, args=(FLUSH_ON_EXIT_S,),
                                            name="sgl-probe-idle-flush", daemon=True)
        self._idle_flush.start()

    def server_alive(self) -> bool:
        return self.server_pid is None or os.getppid() == self.server_pid

    def stats(self) -> tuple:
        sink = self.sink
        if sink is None:
            return (self.received, 0, 0, {})
        return (self.received, sink.settled, sink.dropped, sink.dropped_by)

    def handle(self, kind: str, payload: Any) -> bool:
        """False when told to stop."""
        from sgl_probe import spans as spans_mod, wire
        from sgl_probe.resolved import from_row

        if kind == wire.STEPS:
            steps = [from_row(row) for row in payload[0]]
            kept_slow = payload[1]
            self.received += sum(1 + len(st.phases) for st in steps)
            if self.sink is not None:
                run_id, ident, spec = self.meta[0], self.meta[1], self.meta[2]
                self.sink.steps(steps, run_id, ident, spec, self.resource, kept_slow)
                self.unflushed = True
        elif kind == wire.ENV:
            attrs, when_ns, name = payload
            self.received += 1
            if self.sink is not None:
                self.sink.offer([spans_mod.build_env_span(attrs, when_ns, self.meta[0], self.meta[1],
                                                           self.resource, name)])
                self.unflushed = True
        elif kind == wire.META:
            self._set_meta(payload)
        elif kind == wire.FLUSH:
            if self.sink is not None:
                self.unflushed = False
                self.sink.flush(FLUSH_ON_EXIT_S)
            self._send(wire.FLUSHED, (payload, self.stats()))
        elif kind == wire.STOP:
            return False
        return True

    def _set_meta(self, meta: tuple) -> None:
        from sgl_probe import sinks

        run_id, ident, spec, version, pid, trace_dir = meta
        if self.sink is None:
            # Waiting for queue room holds only this process's loop; the server's link buffers.
            # Once the server is gone, what is left in the link is exported without waits: this
            # process must not outlive it by more than its final flush.
            self.sink = sinks.SpanSink(trace_dir, pid, delay_ms=BATCH_DELAY_MS, room_wait_s=sinks.ROOM_WAIT_S,
                                       still_wanted=self.server_alive)
        self.meta = meta
        self.resource = sinks.make_resource(ident, run_id, version, pid)

    def _send(self, kind: str, payload: Any) -> None:
        from sgl_probe import wire

        try:
            self.sock.send(wire.encode(kind, payload), socket.MSG_DONTWAIT)
        except OSError:
            pass  # the server is gone or not reading: it will ask again

    def maybe_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_stats < STATS_EVERY_S and not force:
            return
        self._last_stats = now
        stats = self.stats()
        if stats != self._stats_sent:
            from sgl_probe import wire

            self._stats_sent = stats
            self._send(wire.STATS, stats)

    def finish(self) -> None:
        """Flush and shut the exporters down, for a bounded time (the collector may be gone)."""
        if self.sink is None:
            return
        t = threading.Thread(target=self.sink.shutdown, name="sgl-probe-exporter-exit", daemon=True)
        t.start()
        t.join(FLUSH_ON_EXIT_S)


def serve(sock: socket.socket, server_pid: int, idle_flush_s: float = IDLE_FLUSH_S) -> None:
    from sgl_probe import wire

    exporter = Exporter(sock, server_pid)
    # Also the period of the check on the server: it is never longer than a second.
    sock.settimeout(min(idle_flush_s, 1.0))
    quiet_since = time.monotonic()
    buf = bytearray(RECV_BUFFER)
    view = memoryview(buf)
    try:
        while True:
            try:
                n = sock.recv_into(buf)
            except socket.timeout:
                n = None
            except OSError:
                break
            if n == 0:  # every copy of the server's end is closed
                break
            if n is not None:
                quiet_since = time.monotonic()
                data = view[:n]
                try:
                    if not exporter.handle(*wire.decode(data)):
                        break
                except Exception as exc:
                    log.warning("sgl-probe exporter: dropping a message: %r", exc)
            elif not exporter.server_alive():
                break
            elif time.monotonic() - quiet_since >= idle_flush_s:
                exporter.idle()
            exporter.maybe_stats()
    finally:
        exporter.finish()
        exporter.maybe_stats(force=True)


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # unwinds serve(): flush, then exit


def main(argv: list[str]) -> int:
    fd, server_pid = int(argv[1]), int(argv[2])
    idle_flush_s = float(argv[3]) if len(argv) > 3 else IDLE_FLUSH_S
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_cleanly)
    from sgl_probe import export_log

    formatter = logging.Formatter("[%(asctime)s sgl-probe pid " + str(server_pid) + " exporter] %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    export_log.install(formatter)
    log.setLevel(logging.INFO)
    log.propagate = False
    if os.getppid() != server_pid:  # the server died before we got here
        return 0
    try:
        os.nice(NICE_INCREMENT)
    except OSError:
        pass
    serve(socket.socket(fileno=fd), server_pid, idle_flush_s)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # exporter threads (gRPC) must not hold the exit
