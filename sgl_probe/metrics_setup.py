"""Which metric outputs this process has: chosen once per process from the environment
(:mod:`sgl_probe.metrics` says what asks for each), shared by the ranks it serves."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping, Optional

from sgl_probe import metrics_otlp, metrics_prom
from sgl_probe.metrics import PhaseMetrics

log = logging.getLogger("sgl_probe")

_LOCK = threading.Lock()
_SINKS: Optional[tuple[int, list]] = None   # (pid, sinks): rebuilt in a forked child


def build_sinks(environ: Mapping[str, str], resource: Any = None) -> list:
    """The sinks the environment asks for; empty when none."""
    sinks: list = []
    for name, make in (("Prometheus", lambda: metrics_prom.from_env(environ)),
                       ("OTLP", lambda: metrics_otlp.from_env(environ, resource))):
        try:
            sink = make()
        except Exception as exc:
            log.warning("sgl-probe: %s metrics not set up: %r", name, exc)
            sink = None
        if sink is not None:
            sinks.append(sink)
    return sinks


def phase_metrics(ident: Mapping[str, Any], resource: Any = None, mode: str = "auto",
                  environ: Optional[Mapping[str, str]] = None, fast: Any = None) -> Optional[PhaseMetrics]:
    """This rank's metrics over the process's sinks (built once per process), or None when no
    metrics were asked for. ``resource``: the OpenTelemetry Resource of the process (OTLP);
    ``mode``: ``SGL_PROBE_METRICS`` (``Config.metrics``), ``off`` builds nothing; ``fast``: the C
    hot path module, which adds the steps in C (see :class:`PhaseMetrics`)."""
    global _SINKS
    if mode == "off":
        return None
    with _LOCK:
        if _SINKS is None or _SINKS[0] != os.getpid():
            _SINKS = (os.getpid(), build_sinks(os.environ if environ is None else environ, resource))
        sinks = _SINKS[1]
    return PhaseMetrics(ident, sinks, fast=fast) if sinks else None


def shutdown(timeout_s: float = 3.0) -> None:
    """Push what the OTLP sink holds; bounded, for the process's exit path (flush the
    ``PhaseMetrics`` first)."""
    with _LOCK:
        sinks = _SINKS[1] if _SINKS is not None and _SINKS[0] == os.getpid() else []
    for sink in sinks:
        try:
            sink.shutdown(timeout_s)
        except Exception as exc:
            log.debug("sgl-probe: metrics shutdown: %r", exc)
