"""Opt-in (``SGL_PROBE_NCCL_CONFIRM=1``): what NCCL itself says it took from the environment.

An env snapshot shows what a worker *had*; only NCCL can say what it *read*. With
``NCCL_DEBUG=INFO`` and the ``ENV`` subsystem, NCCL logs ``<VAR> set by environment to <value>``
for every variable it actually reads, when it reads it (at communicator init). So, just before the
first communicator of the process (the ``nccl_init`` hook), the probe points NCCL's debug output
at a per-process file in a directory of its own (``NCCL_DEBUG_FILE``, so nothing lands on the
user's stdout/stderr), and asks for ``INIT,ENV`` at ``INFO``. Once NCCL logs ``Init COMPLETE`` (plus
a short grace period for variables read right after), or at exit, it emits one more
``sgl_probe.env_snapshot`` span, ``sgl_probe.snapshot_point = "nccl_confirm"``, holding the env
as it is *then*, ``nccl.confirmed.<VAR>`` for each line NCCL printed, and the names present in the
env that NCCL never confirmed (set too late, misspelt, or simply not NCCL parameters).

The user's own NCCL debug settings win: an existing ``NCCL_DEBUG_FILE`` is read rather than
replaced, a more verbose ``NCCL_DEBUG`` (``TRACE``) is kept, and an explicit
``NCCL_DEBUG_SUBSYS`` only gets ``INIT,ENV`` added. The variables the probe set are listed in
``sgl_probe.nccl.set_by_probe`` and are left out of this span's ``env.*`` values.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
import tempfile
import threading
import time
from typing import Callable, Iterable, Mapping, Optional

from sgl_probe import envsnap
from sgl_probe.redact import redact_value

log = logging.getLogger("sgl_probe")

SET_LINE = re.compile(r"\b(NCCL_[A-Z0-9_]+) set by environment to (.*?)\s*$")
INIT_DONE = re.compile(r"\bInit COMPLETE\b")
_INT_WITH_DOT = re.compile(r"-?\d+\.")

_DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def clean_value(raw: str) -> str:
    """NCCL ends integer-parameter lines with a period (``... to 0.``), string ones without."""
    raw = raw.strip()
    if _INT_WITH_DOT.fullmatch(raw):
        return raw[:-1]
    return raw


def parse_log(text: str) -> tuple[dict[str, str], bool]:
    """({VAR: value NCCL reported}, whether a communicator finished initialising)."""
    confirmed: dict[str, str] = {}
    for line in text.splitlines():
        m = SET_LINE.search(line)
        if m:
            confirmed.setdefault(m.group(1), clean_value(m.group(2)))
    return confirmed, bool(INIT_DONE.search(text))


def expand_debug_file(pattern: str, pid: int, host: Optional[str] = None) -> str:
    """NCCL's own expansion of ``NCCL_DEBUG_FILE``: ``%h`` host name, ``%p`` pid."""
    host = socket.gethostname() if host is None else host
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern) and pattern[i + 1] in "hp":
            out.append(host if pattern[i + 1] == "h" else str(pid))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def debug_plan(environ: Mapping[str, str], directory: str) -> tuple[dict[str, str], str]:
    """The variables to set before NCCL initialises, and the debug-file pattern NCCL will use.

    Leaves the user's own choices in place wherever they already produce the ENV lines."""
    changes: dict[str, str] = {}
    level = environ.get("NCCL_DEBUG", "").strip().upper()
    if level not in ("INFO", "TRACE"):
        changes["NCCL_DEBUG"] = "INFO"
    subsys = environ.get("NCCL_DEBUG_SUBSYS", "").strip()
    if not subsys:
        changes["NCCL_DEBUG_SUBSYS"] = "INIT,ENV"
    elif subsys.startswith("^"):
        # An exclusion list: drop INIT and ENV from what is excluded.
        kept = [s for s in subsys[1:].split(",") if s.strip().upper() not in ("INIT", "ENV", "")]
        changes["NCCL_DEBUG_SUBSYS"] = ("^" + ",".join(kept)) if kept else "ALL"
    else:
        names = {s.strip().upper() for s in subsys.split(",")}
        missing = [s for s in ("INIT", "ENV") if s not in names and "ALL" not in names]
        if missing:
            changes["NCCL_DEBUG_SUBSYS"] = ",".join([subsys] + missing)
    pattern = environ.get("NCCL_DEBUG_FILE", "").strip()
    if not pattern:
        pattern = os.path.join(directory, "nccl.%p.log")  # %p: a child process gets its own file
        changes["NCCL_DEBUG_FILE"] = pattern
    return changes, pattern


def confirm_attributes(confirmed: Mapping[str, str], allow: Iterable[str], environ: Mapping[str, str],
                       set_by_probe: Mapping[str, str], original: Mapping[str, Optional[str]],
                       path: str, status: str) -> dict[str, object]:
    """The ``nccl_confirm`` snapshot: the env now (as the user set it), and what NCCL confirmed."""
    user_env = dict(environ)
    for name in set_by_probe:  # show the user's env, not the probe's debug settings
        if original.get(name) is None:
            user_env.pop(name, None)
        else:
            user_env[name] = original[name]  # type: ignore[assignment]
    attrs = envsnap.snapshot_attributes("nccl_confirm", allow, user_env)
    values, _ = envsnap.snapshot(allow, user_env)
    shown, withheld = [], []
    shown_values: dict[str, str] = {}
    for name, value in sorted(confirmed.items()):
        if envsnap.is_secret(name):
            withheld.append(name)
            continue
        # Redacted like the env values it is compared with (a credential in a value never leaves).
        value = shown_values[name] = redact_value(value)
        attrs["nccl.confirmed." + name] = value
        shown.append(name)
    attrs["sgl_probe.nccl.confirmed"] = shown
    if withheld:
        attrs["sgl_probe.nccl.confirmed_withheld"] = withheld
    attrs["sgl_probe.nccl.not_confirmed"] = sorted(
        n for n in values if n.startswith("NCCL_") and n not in confirmed and n not in _DEBUG_VARS)
    attrs["sgl_probe.nccl.value_differs"] = sorted(
        n for n in shown if n in values and values[n] != shown_values[n])
    attrs["sgl_probe.nccl.set_by_probe"] = ["%s=%s" % kv for kv in sorted(set_by_probe.items())]
    attrs["sgl_probe.nccl.debug_file"] = path
    attrs["sgl_probe.nccl.status"] = status
    return attrs


class Confirmer:
    """One per process, armed at its first NCCL init. ``emit(attrs, when_ns)`` sends the span."""

    POLL_S = 0.25
    GRACE_S = 1.0
    TIMEOUT_S = 600.0

    def __init__(self, allow: Iterable[str], emit: Callable[[dict, int], None],
                 directory: Optional[str] = None, environ=None) -> None:
        self.allow = tuple(allow)
        self.emit = emit
        self.environ = os.environ if environ is None else environ
        self.directory = directory
        self.pid = os.getpid()
        self.changes: dict[str, str] = {}
        self.original: dict[str, Optional[str]] = {}
        self.path = ""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._armed_at = 0.0

    def arm(self) -> dict[str, str]:
        """Point NCCL's debug output at our file. Must run before NCCL's first initialisation in
        this process (NCCL reads its debug settings once)."""
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="sgl-probe-nccl-")  # 0700, ours alone
        changes, pattern = debug_plan(self.environ, self.directory)
        self.original = {k: self.environ.get(k) for k in changes}
        self.environ.update(changes)
        self.changes = changes
        self.path = expand_debug_file(pattern, self.pid)
        self._armed_at = time.monotonic()
        log.info("sgl-probe: SGL_PROBE_NCCL_CONFIRM: NCCL debug output of pid %d goes to %s", self.pid, self.path)
        return changes

    def read(self) -> tuple[dict[str, str], bool, bool]:
        """(confirmed, init complete, file exists)."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return {}, False, False
        confirmed, complete = parse_log(text)
        return confirmed, complete, True

    def finish(self, status: Optional[str] = None) -> bool:
        """Emit the span once; returns whether this call emitted it."""
        if os.getpid() != self.pid:
            return False  # a forked child inherited this object (and its atexit entry)
        with self._lock:
            if self.done.is_set():
                return False
            confirmed, complete, exists = self.read()
            if status is None:
                status = "init_complete" if complete else ("incomplete" if exists else "no_log")
            attrs = confirm_attributes(confirmed, self.allow, self.environ, self.changes, self.original,
                                       self.path, status)
            self.done.set()
        self.emit(attrs, time.time_ns())
        return True

    def poll_once(self, now: Optional[float] = None, complete_since: Optional[float] = None) -> Optional[float]:
        """One step of the watcher; returns the time ``Init COMPLETE`` was first seen (or None).
        Emits once the grace period has passed, or when the timeout is reached."""
        now = time.monotonic() if now is None else now
        _, complete, exists = self.read()
        if complete and complete_since is None:
            complete_since = now
        if complete_since is not None and now - complete_since >= self.GRACE_S:
            self.finish("init_complete")
        elif now - self._armed_at >= self.TIMEOUT_S:
            self.finish("timeout" if exists else "no_log")
        return complete_since

    def start(self) -> None:
        atexit.register(self._at_exit)
        self._thread = threading.Thread(target=self._run, name="sgl-probe-nccl-confirm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        since = None
        while not self.done.is_set() and not self._stop.wait(self.POLL_S):
            try:
                since = self.poll_once(complete_since=since)
            except Exception as exc:  # never let the watcher die noisily
                log.warning("sgl-probe: NCCL confirm watcher: %r", exc)
                return

    def _at_exit(self) -> None:
        self._stop.set()
        try:
            self.finish()
        except Exception:
            pass
