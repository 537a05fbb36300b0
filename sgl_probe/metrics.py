"""Always-on phase metrics, fed by every resolved step (sampled for spans or not).

Two outputs, each only when the user asked for it:

- Prometheus, on SGLang's own ``/metrics``: with ``--enable-metrics`` SGLang sets
  ``PROMETHEUS_MULTIPROC_DIR`` before spawning its schedulers and serves every process's
  prometheus_client files from there. The probe writes its series into the same directory (one
  file set per process, ranks as labels): no port of its own. See :mod:`sgl_probe.metrics_prom`.
- OTLP metrics through the OpenTelemetry metrics SDK when ``OTEL_METRICS_EXPORTER`` names
  ``otlp`` or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. See :mod:`sgl_probe.metrics_otlp`.

``SGL_PROBE_METRICS=off`` turns both off. Whichever process receives resolved steps builds one
:class:`PhaseMetrics` per rank with :func:`phase_metrics` and calls ``observe_step`` for each
step. A failure in a sink costs one log line and switches the metrics off; it never reaches the
caller.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from sgl_probe.contract import RANK_LABELS
from sgl_probe.resolved import ResolvedStep

log = logging.getLogger("sgl_probe")

Observe = Callable[[float], None]


class Sink(Protocol):
    """One output. Each method binds a label set once and returns the callable used per step."""

    def phase(self, labels: Mapping[str, str]) -> Observe: ...        # seconds
    def steps(self, labels: Mapping[str, str]) -> Observe: ...        # increment
    def accept_length(self, labels: Mapping[str, str]) -> Observe: ...
    def dropped(self, labels: Mapping[str, str]) -> Observe: ...      # increment
    def verdict(self, labels: Mapping[str, str], speedup: float, break_even: float) -> None: ...
    def shutdown(self, timeout_s: float) -> None: ...


def rank_labels(ident: Mapping[str, Any]) -> dict[str, str]:
    """``tp_rank`` / ``dp_rank`` / ``pp_rank`` as label values ("" where the rank is unknown,
    which Prometheus treats as an absent label)."""
    return {k: "" if ident.get(k) is None else str(ident[k]) for k in RANK_LABELS}


def _fan_out(bound: Sequence[Observe]) -> Observe:
    if len(bound) == 1:
        return bound[0]

    def call(value: float) -> None:
        for fn in bound:
            fn(value)

    return call


class PhaseMetrics:
    """The metrics of one rank (a scheduler process, or one rank's stream in an exporter)."""

    def __init__(self, ident: Mapping[str, Any], sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.ranks = rank_labels(ident)
        self.failed = False
        self._phase: dict[tuple, Observe] = {}
        self._steps: dict[Optional[str], Observe] = {}
        self._accept: Optional[Observe] = None
        self._dropped: Optional[Observe] = None
        self._dropped_seen = 0

    def _bind(self, method: str, labels: dict[str, str]) -> Observe:
        return _fan_out([getattr(sink, method)(labels) for sink in self.sinks])

    def observe_step(self, step: ResolvedStep) -> None:
        """Count the step and time each of its phases; never raises."""
        if self.failed:
            return
        try:
            inc = self._steps.get(step.mode)
            if inc is None:
                inc = self._steps[step.mode] = self._bind(
                    "steps", {"forward_mode": step.mode or "unknown", **self.ranks})
            inc(1)
            for ph in step.phases:
                key = (ph.phase, ph.mode, ph.graph)
                observe = self._phase.get(key)
                if observe is None:
                    observe = self._phase[key] = self._bind("phase", {
                        "phase": ph.phase, "forward_mode": ph.mode or "unknown",
                        "cuda_graph": "true" if ph.graph else "false", **self.ranks})
                observe((ph.end_ns - ph.start_ns) / 1e9)
                if ph.accept_length is not None:
                    if self._accept is None:
                        self._accept = self._bind("accept_length", dict(self.ranks))
                    self._accept(ph.accept_length)
        except Exception as exc:
            self._fail("observe_step", exc)

    def set_dropped(self, total: int) -> None:
        """The rank's total of dropped steps so far (the counter follows it up)."""
        if self.failed:
            return
        try:
            delta = total - self._dropped_seen
            if delta > 0:
                if self._dropped is None:
                    self._dropped = self._bind("dropped", dict(self.ranks))
                self._dropped(delta)
                self._dropped_seen = total
        except Exception as exc:
            self._fail("set_dropped", exc)

    def set_verdict(self, verdict: Any) -> None:
        """The live speculative verdict (anything with ``speedup`` and ``break_even``, e.g. the
        summary's), or None when it is not known for the current window (the gauges read NaN)."""
        if self.failed:
            return
        nan = float("nan")
        speedup = nan if verdict is None else float(verdict.speedup)
        break_even = nan if verdict is None else float(verdict.break_even)
        try:
            for sink in self.sinks:
                sink.verdict(self.ranks, speedup, break_even)
        except Exception as exc:
            self._fail("set_verdict", exc)

    def _fail(self, where: str, exc: BaseException) -> None:
        self.failed = True
        log.warning("sgl-probe: metrics disabled in this process after an error in %s: %r", where, exc)


# --- the process's sinks --------------------------------------------------------------------

_LOCK = threading.Lock()
_SINKS: Optional[tuple[int, list]] = None   # (pid, sinks): rebuilt in a forked child


def build_sinks(environ: Mapping[str, str], resource: Any = None) -> list:
    """The sinks the environment asks for; empty when none."""
    from sgl_probe import metrics_otlp, metrics_prom

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
                  environ: Optional[Mapping[str, str]] = None) -> Optional[PhaseMetrics]:
    """This rank's metrics over the process's sinks (built once per process), or None when no
    metrics were asked for. ``resource``: the OpenTelemetry Resource of the process (OTLP);
    ``mode``: ``SGL_PROBE_METRICS`` (``Config.metrics``), ``off`` builds nothing."""
    global _SINKS
    if mode == "off":
        return None
    with _LOCK:
        if _SINKS is None or _SINKS[0] != os.getpid():
            _SINKS = (os.getpid(), build_sinks(os.environ if environ is None else environ, resource))
        sinks = _SINKS[1]
    return PhaseMetrics(ident, sinks) if sinks else None


def shutdown(timeout_s: float = 3.0) -> None:
    """Push what the OTLP sink holds; bounded, for the process's exit path."""
    with _LOCK:
        sinks = _SINKS[1] if _SINKS is not None and _SINKS[0] == os.getpid() else []
    for sink in sinks:
        try:
            sink.shutdown(timeout_s)
        except Exception as exc:
            log.debug("sgl-probe: metrics shutdown: %r", exc)
