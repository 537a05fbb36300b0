"""The server side of the exporter process: start it, feed it resolved steps, watch it.

Everything here runs on the probe's drain thread (or a caller's flush/shutdown), never on
SGLang's scheduler thread, and never waits on the exporter: a send that finds the link full
drops that message and counts its spans. An exporter that dies is counted, said once in the log
and started again, up to :data:`MAX_RESTARTS` times; then export is given up (one more line) and
every later span is counted as dropped. Spans the dead process had not finished with count as
dropped too.

Each server process has its own exporter, so one rank's exporter failing touches no other rank.
The exporter is a fresh interpreter (``subprocess``, no fork of the server's state): safe
whether the server's processes were started by fork or spawn. After a fork the child process
drops the link it inherited (without a word to the exporter, which belongs to the parent) and
starts its own.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Optional

from sgl_probe import wire

log = logging.getLogger("sgl_probe")

MAX_RESTARTS = 3
#: Messages the link could not take yet wait here, in order (a burst larger than the socket's
#: buffer, an exporter still starting); beyond this, new steps are dropped and counted.
MAX_BACKLOG_BYTES = 16 << 20
#: Said the first time the backlog is full (then only counted, as link= on the summary line).
BEHIND = ("sgl-probe: spans dropped on their way to the exporter process: %d MiB of them wait for it, stopped or "
          "not keeping up (link= on the summary line counts them from now on). Sampling "
          "(OTEL_TRACES_SAMPLER=traceidratio) lowers its load; slow steps are still kept. Said once.")
_live: "weakref.WeakSet[ProcessSink]" = weakref.WeakSet()


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ProcessSink:
    def __init__(self, cfg, run_id: str, ident: dict, spec: dict, sglang_version: Optional[str]) -> None:
        self.trace_dir = cfg.trace_dir
        self.idle_flush_s = cfg.idle_flush_s
        self.run_id, self.ident, self.spec, self.version = run_id, ident, spec, sglang_version
        self.pid = os.getpid()
        # The exporter exports where the probe was configured to (OTEL_* and SGL_PROBE_* as they
        # were when the probe loaded its configuration, before any later change to this process's
        # environment), also when it is started or restarted later.
        self._env = dict(os.environ)
        self.proc: Optional[subprocess.Popen] = None
        self.deaths = 0
        self.given_up = False
        self.closed = False  # shut down: no more sends, no restarts
        self.link_dropped = 0  # spans refused by a full link, or sent after giving up
        self._said_behind = False
        self.lost = 0  # spans a dead exporter had not finished with
        self._dead_dropped: dict[str, int] = {}  # what dead exporters' outputs had dropped
        self.sent = 0  # spans sent to the current exporter
        self.stats: tuple = (0, 0, 0, {})  # the current exporter's (received, settled, dropped, by output)
        self._meta_sent: Any = None
        self._lock = threading.RLock()
        self._flush_token = 0
        self._sock: Any = None
        self._theirs: Any = None
        self._backlog: collections.deque = collections.deque()  # (message, spans it carries)
        self._backlog_bytes = 0
        #: The C extension's ``pack_steps`` (the pipeline sets it with the C hot path): STEPS
        #: messages packed instead of pickled (wire.PACKED).
        self.pack: Any = None
        self._open_link()
        _live.add(self)

    # -- link and process ------------------------------------------------------------------
    def _open_link(self) -> None:
        self._sock, self._theirs = wire.pair()
        #: The largest message this link takes (the drain's packed pass fills its messages up to it).
        self.max_message = wire.max_message(self._sock)
        self.sent = 0
        self.stats = (0, 0, 0, {})
        self._meta_sent = None

    def _spawn(self) -> None:
        """Started lazily (first drain), so the server's own thread never pays for it; what was
        sent before waits in the link."""
        theirs = self._theirs
        self._theirs = None
        env = dict(self._env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
        env["SGL_PROBE"] = "0"  # the exporter is not a server process: nothing to instrument
        # ``-m`` would put the working directory first on sys.path (Python >= 3.11 honours this):
        # the exporter imports the probe that started it, not a same-named folder where the
        # server was launched.
        env["PYTHONSAFEPATH"] = "1"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sgl_probe.exporter_main", str(theirs.fileno()), str(self.pid),
                 repr(self.idle_flush_s)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, close_fds=True)
        except Exception as exc:
            self._give_up("cannot start the exporter process (%r)" % (exc,))
        finally:
            theirs.close()

    def _died(self, why: str) -> None:
        self.deaths += 1
        received, settled, dropped, by_output = self.stats
        for name, n in by_output.items():
            self._dead_dropped[name] = self._dead_dropped.get(name, 0) + n
        self.lost += max(0, self.sent - settled) + sum(spans for _, spans in self._backlog)
        self._backlog.clear()  # its messages belong to the dead link (the next needs META first)
        self._backlog_bytes = 0
        try:
            self._sock.close()
        except OSError:
            pass
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(1.0)
            except Exception:
                pass
        self.proc = None
        if self.deaths > MAX_RESTARTS:
            self._give_up("the exporter process %s, %d times" % (why, self.deaths))
            return
        log.warning("sgl-probe: the exporter process %s (%d/%d); starting a new one; its unfinished "
                    "spans count as dropped", why, self.deaths, MAX_RESTARTS)
        self._open_link()

    def _give_up(self, why: str) -> None:
        log.warning("sgl-probe: %s; no more spans from this process (the summary line goes on and "
                    "counts them as dropped)", why)
        self.given_up = True
        self._sock = None

    def _check(self) -> None:
        if self.given_up or self.closed:
            return
        if self.proc is None and self._theirs is not None:
            self._spawn()
            return
        if self.proc is not None:
            code = self.proc.poll()
            if code is not None:
                self._died("exited (code %s)" % code)
                return
        self._read_replies()

    def _read_replies(self, want_token: Optional[int] = None) -> bool:
        got = False
        sock = self._sock
        while sock is not None:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not data:
                break
            kind, payload = wire.decode(data)
            if kind == wire.STATS:
                self.stats = payload
            elif kind == wire.FLUSHED:
                token, self.stats = payload
                got = got or token == want_token
        return got

    def _send(self, data: bytes, spans: int) -> bool:
        """Queue the message behind any waiting ones and send what the link takes now."""
        if self.given_up or self.closed:  # (giving up was said then; closed: the process is exiting)
            self.link_dropped += spans
            return False
        if spans and self._backlog_bytes + len(data) > MAX_BACKLOG_BYTES:
            if not self._said_behind:
                self._said_behind = True
                log.warning(BEHIND, MAX_BACKLOG_BYTES >> 20)
            self.link_dropped += spans
            return False
        self._backlog.append((data, spans))
        self._backlog_bytes += len(data)
        self._pump()
        return True

    def _pump(self) -> None:
        backlog = self._backlog
        while backlog and self._sock is not None:
            data, spans = backlog[0]
            try:
                self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.EMSGSIZE:  # one message larger than the socket allows
                    backlog.popleft()
                    self._backlog_bytes -= len(data)
                    self.link_dropped += spans
                    continue
                self._died("closed its end (%s)" % type(exc).__name__)  # EPIPE / ECONNRESET
                return
            backlog.popleft()
            self._backlog_bytes -= len(data)
            self.sent += spans

    @property
    def backlogged(self) -> bool:
        return bool(self._backlog)

    def pump_for(self, timeout_s: float) -> None:
        """Send waiting messages as the exporter makes room, for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if os.getpid() != self.pid or self._sock is None:
                    return
                self._check()
                self._pump()
                if not self._backlog or self._sock is None:
                    return
                sock = self._sock
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([], [sock], [], min(left, 0.05))

    def _send_meta(self) -> None:
        meta = (self.run_id, dict(self.ident), dict(self.spec), self.version, self.pid, self.trace_dir)
        if meta != self._meta_sent and self._send(wire.encode(wire.META, meta), 0):
            self._meta_sent = meta

    # -- the sink interface ----------------------------------------------------------------
    def send_steps(self, steps: list, kept_slow: list) -> None:
        with self._lock:
            if os.getpid() != self.pid:
                return
            self._check()
            for data, spans in wire.encode_steps(steps, kept_slow, self.pack, self.max_message):
                self._send_meta()  # first on every link, also on one opened after a death
                self._send(data, spans)

    def send_packed(self, packed: Any) -> None:
        """The steps the drain's packed pass wrote into ``packed`` (the C extension's
        ``PackedSteps``), as one STEPS message; ``packed`` is empty again after."""
        with self._lock:
            spans = packed.spans
            data = packed.finish()
            if data is None or os.getpid() != self.pid:
                return
            self._check()
            self._send_meta()
            self._send(data, spans)

    def send_env(self, attrs: dict, when_ns: int, name: str) -> None:
        with self._lock:
            if os.getpid() != self.pid:
                return
            self._send_meta()
            self._send(wire.encode(wire.ENV, (attrs, when_ns, name)), 1)

    def poll(self) -> None:
        """Once per drain: start the exporter, notice its death, read its counts."""
        with self._lock:
            if os.getpid() == self.pid:
                self._check()

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by.values())

    @property
    def dropped_by(self) -> dict[str, int]:
        """``link``: spans that never reached an exporter (a full link, a dead or missing exporter
        process); then each output of the exporter process, over every exporter it started."""
        out = {"link": self.link_dropped + self.lost}
        for by in (self._dead_dropped, self.stats[3]):
            for name, n in by.items():
                out[name] = out.get(name, 0) + n
        return out

    def flush(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) until the exporter has exported everything sent so far."""
        with self._lock:
            if os.getpid() != self.pid:
                return False
            self._check()
            if self.given_up:
                return False
            self._flush_token += 1
            token = self._flush_token
            if not self._send(wire.encode(wire.FLUSH, token), 0):
                return False
            deadline = time.monotonic() + timeout_s
            while True:
                self._pump()
                if self._read_replies(token):
                    return True
                sock = self._sock
                left = deadline - time.monotonic()
                if sock is None or left <= 0 or self.proc is None or self.proc.poll() is not None:
                    return False
                select.select([sock], [sock] if self._backlog else [], [], min(left, 0.2))

    def shutdown(self, timeout_s: float) -> None:
        """Ask the exporter to flush and exit; wait for it at most ``timeout_s``."""
        with self._lock:
            if os.getpid() != self.pid or self.given_up or self.closed:
                return
            if self.proc is None and self._theirs is not None:
                self._spawn()
            deadline = time.monotonic() + timeout_s
            if self._sock is not None:
                self._send(wire.encode(wire.STOP, None), 0)
                while self._backlog and self._sock is not None and time.monotonic() < deadline:
                    select.select([], [self._sock], [], max(0.0, min(deadline - time.monotonic(), 0.05)))
                    self._pump()
            self.closed = True
            proc = self.proc
        if proc is not None:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # it exits on its own once the link closes with this process
        with self._lock:
            self._read_replies()
            if self._sock is not None:
                self._sock.close()
            self.link_dropped += sum(spans for _, spans in self._backlog)  # never sent
            self._backlog.clear()

    def forget_after_fork(self) -> None:
        """In a forked child: close the inherited link without telling the parent's exporter."""
        for sock in (self._sock, self._theirs):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self._sock = self._theirs = None
        self.proc = None
        self.given_up = True


def _after_fork_in_child() -> None:
    for sink in list(_live):
        if sink.pid != os.getpid():
            sink.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
