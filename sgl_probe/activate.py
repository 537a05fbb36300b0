"""What happens once SGLang is imported in a process: config, run identity, instrumentation.

Processes that never build a Scheduler (the launcher, the detokenizer) only record the launch
environment for their children and register import hooks; the exporter and its thread start in
a process the first time it has something to send (a scheduler's identity or an NCCL init).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
import weakref
from typing import Any, Optional

from sgl_probe import config, envsnap
from sgl_probe.contract import DIST_BACKEND, ENV_RUN_ID as RUN_ID_VAR, SNAPSHOT_TRIGGER
from sgl_probe.recorder import Recorder

log = logging.getLogger("sgl_probe")

_PROBE: Optional["Probe"] = None


def _setup_logging() -> None:
    if getattr(log, "_sgl_probe_handler", False):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s sgl-probe pid " + str(os.getpid()) + "] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    log._sgl_probe_handler = True


def ensure_run_id(environ: Optional[dict] = None) -> str:
    """The launching process picks the run id; spawned workers inherit it through the env."""
    env = os.environ if environ is None else environ
    run_id = env.get(RUN_ID_VAR)
    if not run_id:
        run_id = env[RUN_ID_VAR] = _new_run_id()
    return run_id


def _new_run_id() -> str:
    return "%s-%s" % (time.strftime("%Y%m%dT%H%M%S"), uuid.uuid4().hex[:12])


def sglang_version() -> Optional[str]:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


class Probe:
    def __init__(self, cfg: config.Config, start_env: Optional[dict] = None, targets=None) -> None:
        from sgl_probe.instrument import Instrumentor
        from sgl_probe.targets import TARGETS

        self.cfg = cfg
        # Given from outside (the user, `sgl-probe run`, or a parent launcher): keep it as is.
        self._run_id_given = bool(os.environ.get(RUN_ID_VAR))
        self.run_id = ensure_run_id()
        envsnap.record_launcher_env(cfg.env_allow)
        self.version = sglang_version()
        self.recorder = Recorder(cfg.timer, cfg.max_pending, log, cfg.hotpath, cfg.drain_interval_s,
                                 cfg.gpu_every_ms)
        self.instrumentor = Instrumentor(self, TARGETS if targets is None else targets, self.version)
        self.ident: dict[str, Any] = {}
        self.pipeline = None
        self._start_env = start_env if start_env is not None else dict(os.environ)
        self._start_ns = time.time_ns()
        self._start_sent = False
        self._nccl_sent = False
        self._fingerprint_started = False
        self.nccl_confirmer = None  # SGL_PROBE_NCCL_CONFIRM=1: see sgl_probe.nccl_confirm
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _call_if_alive(ref, "_after_fork"))

    def _after_fork(self) -> None:
        """A forked child inherits the recorder's state but none of the export threads."""
        self.recorder.reset_after_fork()
        had_pipeline = self.pipeline is not None
        self.pipeline = None
        self._fingerprint_started = False
        if had_pipeline:
            self.ident = dict(self.ident)
            self.ensure_pipeline()

    # -- pipeline ---------------------------------------------------------------------------
    def ensure_pipeline(self):
        if self.pipeline is None:
            from sgl_probe.export import Pipeline

            self.pipeline = Pipeline(self.recorder, self.cfg, self.run_id, self.ident, self.version)
            self.pipeline.start()
        return self.pipeline

    def _send_process_start(self) -> None:
        if self._start_sent:
            return
        self._start_sent = True
        attrs = envsnap.snapshot_attributes("process_start", self.cfg.env_allow, self._start_env)
        self.ensure_pipeline().emit_env(attrs, self._start_ns)

    # -- hooks (called from instrument wrappers, before the original runs) -------------------
    def on_launch(self, hook, wrapped, args: tuple, kwargs: dict) -> None:
        """SGLang is about to rewrite env and spawn a server's workers from this process."""
        if not self._run_id_given:
            os.environ[RUN_ID_VAR] = self.run_id = _new_run_id()
        envsnap.record_launcher_env(self.cfg.env_allow, replace=True)

    def on_identity(self, hook, wrapped, args: tuple, kwargs: dict) -> None:
        """``Scheduler.__init__``: learn ranks and spec settings before NCCL is initialised."""
        from sgl_probe.identity import read_identity, read_spec

        ident = read_identity(wrapped, args, kwargs)
        self.ident.update(ident)
        self.recorder.spec.update(read_spec(args, kwargs))
        self._send_process_start()
        self._start_fingerprint()

    def _start_fingerprint(self) -> None:
        """Once per process, in its own thread: hashing SGLang's files must not delay a step."""
        if self._fingerprint_started:
            return
        self._fingerprint_started = True
        pipeline = self.ensure_pipeline()
        if pipeline.sink is None:
            return  # nowhere to send it: spend nothing
        import threading

        threading.Thread(target=_send_fingerprint, args=(pipeline,), name="sgl-probe-fingerprint",
                         daemon=True).start()

    def on_nccl_init(self, hook, wrapped, args: tuple, kwargs: dict) -> None:
        """First communicator in this process: NCCL reads its variables now, so snapshot now."""
        if self._nccl_sent:
            return
        self._nccl_sent = True
        self._send_process_start()
        attrs = envsnap.snapshot_attributes("nccl_init", self.cfg.env_allow)
        attrs[SNAPSHOT_TRIGGER] = hook.target.name
        backend = kwargs.get("backend", args[0] if args and isinstance(args[0], str) else None)
        if backend is not None:
            attrs[DIST_BACKEND] = str(backend)
        pipeline = self.ensure_pipeline()
        if self.cfg.nccl_confirm:
            # After the snapshot above (it shows the user's env), before NCCL reads its settings.
            try:
                from sgl_probe.nccl_confirm import Confirmer

                confirmer = Confirmer(self.cfg.env_allow, pipeline.emit_env)
                confirmer.arm()
                confirmer.start()
                self.nccl_confirmer = confirmer
                attrs["sgl_probe.nccl.debug_file"] = confirmer.path
            except Exception as exc:
                log.warning("sgl-probe: SGL_PROBE_NCCL_CONFIRM: could not arm NCCL's log: %r", exc)
        pipeline.emit_env(attrs, time.time_ns())


def _send_fingerprint(pipeline) -> None:
    try:
        from sgl_probe import fingerprint
        from sgl_probe.contract import FINGERPRINT_SPAN

        when = time.time_ns()
        fp = fingerprint.collect(launcher_env=envsnap.launcher_env())
        pipeline.emit_env(fingerprint.to_attributes(fp), when, FINGERPRINT_SPAN)
    except Exception as exc:
        log.warning("sgl-probe: run fingerprint not recorded: %r", exc)


def get_probe() -> Optional[Probe]:
    return _PROBE


def _call_if_alive(ref, method: str) -> None:
    obj = ref()
    if obj is not None:
        try:
            getattr(obj, method)()
        except Exception as exc:
            log.warning("sgl-probe: %s failed: %r", method, exc)


def activate(start_env: Optional[dict] = None) -> Optional[Probe]:
    """Idempotent; returns the process's probe, or None when disabled."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    _setup_logging()
    # SGLang copies SGL_* variables to SGLANG_* and warns about each one; ours are not legacy
    # SGLang settings, so that warning is noise in the user's server log.
    import warnings

    warnings.filterwarnings("ignore", message=r"Environment variable SGL_PROBE\w* is deprecated")
    cfg = config.load()
    if not cfg.enabled:
        return None
    if start_env is None:
        startup = sys.modules.get("_sgl_probe_arm")  # absent: the probe was not armed at startup
        start_env = startup.start_env() if startup is not None else None
    _PROBE = Probe(cfg, start_env)
    _PROBE.instrumentor.instrument()
    return _PROBE
