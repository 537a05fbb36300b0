"""Phase metrics over OTLP, with the OpenTelemetry SDK's metric data model and OTLP exporters.

On only when asked: ``OTEL_METRICS_EXPORTER`` names ``otlp``, or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. The generic ``OTEL_EXPORTER_OTLP_ENDPOINT`` alone
(what trace setups set) does not turn metrics on: a trace-only backend such as Jaeger would
reject every export and fill the server log. Endpoint, protocol, headers, compression and the
export interval and timeout (``OTEL_METRIC_EXPORT_INTERVAL`` / ``_TIMEOUT``) follow the standard
variables; temporality is cumulative. Same names and bucket bounds as the Prometheus series, so
one dashboard reads either path.

The SDK's instruments are not used: they clean and hash the attributes on every ``record``
(about 10 µs per phase, 12x this path); :class:`sgl_probe.metrics.PhaseMetrics` aggregates instead,
and this sink turns its snapshots into ``MetricsData`` for the exporter, on its own thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Mapping, Optional

from sgl_probe import __version__
from sgl_probe.contract import (
    METRIC_ACCEPT_LENGTH, METRIC_DROPPED, METRIC_PHASE_SECONDS, METRIC_SPEC_BREAK_EVEN,
    METRIC_SPEC_SPEEDUP, METRIC_STEPS,
)
from sgl_probe.metrics import Snapshot

log = logging.getLogger("sgl_probe")

_PROTOCOLS = ("grpc", "http/protobuf")


def wanted(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = environ.get("OTEL_METRICS_EXPORTER")
    if names is not None and names.strip():
        return "otlp" in [n.strip().lower() for n in names.split(",")]
    return bool(environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


def protocol(environ: Mapping[str, str]) -> str:
    raw = (environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
           or "grpc").strip().lower()
    if raw not in _PROTOCOLS:
        log.warning("sgl-probe: ignoring OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL=%r: accepted values are %s; "
                    "using 'grpc'", raw, ", ".join(_PROTOCOLS))
        return "grpc"
    return raw


def _millis(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        val = int(float(raw))
        if val <= 0:
            raise ValueError
        return val
    except ValueError:
        log.warning("sgl-probe: ignoring %s=%r: accepted values are milliseconds > 0; using %d",
                    name, raw, default)
        return default


class OtlpSink:
    """Exports the latest snapshot of every rank every ``interval_ms``."""

    def __init__(self, exporter: Any, resource: Any = None, interval_ms: int = 60_000,
                 timeout_ms: int = 30_000) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.exporter = exporter
        self.resource = resource if resource is not None else Resource.create({})
        self.scope = InstrumentationScope("sgl_probe", __version__)
        self.interval_s = interval_ms / 1000
        self.timeout_ms = timeout_ms
        self._latest: dict[tuple, Any] = {}
        self._exported: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def update(self, snap: Snapshot) -> None:
        with self._lock:
            self._latest[tuple(snap.ranks.values())] = snap
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sgl-probe-metrics", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.export()

    def export(self) -> None:
        """One export of every rank whose totals changed since the last one."""
        with self._export_lock:
            with self._lock:
                snaps = [s for k, s in self._latest.items() if self._exported.get(k) is not s]
            if not snaps:
                return
            try:
                result = self.exporter.export(self.metrics_data(snaps), timeout_millis=self.timeout_ms)
            except Exception as exc:  # the exporter logs its own transport errors; this is anything else
                log.warning("sgl-probe: OTLP metrics export failed: %r", exc)
                return
            if getattr(result, "name", "") == "SUCCESS":
                for s in snaps:
                    self._exported[tuple(s.ranks.values())] = s

    def metrics_data(self, snaps: list[Snapshot]) -> Any:
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, MetricsData,
            NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
        )

        cumulative = AggregationTemporality.CUMULATIVE
        phase, accept, steps, dropped, speedup, break_even = [], [], [], [], [], []
        for s in snaps:
            def hist_point(h):
                return HistogramDataPoint(
                    attributes=h.labels, start_time_unix_nano=s.start_ns, time_unix_nano=s.time_ns,
                    count=h.count, sum=h.sum, bucket_counts=list(h.counts), explicit_bounds=list(h.bounds),
                    min=h.min, max=h.max)

            def number(value, labels):
                return NumberDataPoint(attributes=labels, start_time_unix_nano=s.start_ns,
                                       time_unix_nano=s.time_ns, value=value)

            phase += [hist_point(h) for h in s.phases]
            if s.accept_length is not None:
                accept.append(hist_point(s.accept_length))
            steps += [number(n, labels) for labels, n in s.steps]
            dropped += [number(n, labels) for labels, n in s.dropped]
            if s.verdict is not None:
                speedup.append(number(s.verdict[0], s.ranks))
                break_even.append(number(s.verdict[1], s.ranks))
        metrics = [
            Metric(METRIC_PHASE_SECONDS, "GPU time of each SGLang phase per scheduler step.", "s",
                   Histogram(phase, cumulative)),
            Metric(METRIC_STEPS, "Scheduler steps measured.", "{step}", Sum(steps, cumulative, True)),
            Metric(METRIC_DROPPED, "What the probe could not deliver, by cause (pending: steps; link, otlp, "
                   "trace_dir: spans).", "{item}", Sum(dropped, cumulative, True)),
        ]
        if accept:
            metrics.append(Metric(METRIC_ACCEPT_LENGTH, "Speculative accept length per verify step.", "{token}",
                                  Histogram(accept, cumulative)))
        if speedup:
            metrics += [
                Metric(METRIC_SPEC_SPEEDUP, "Live speculative-decoding speed-up over plain decode.", "1",
                       Gauge(speedup)),
                Metric(METRIC_SPEC_BREAK_EVEN, "Accept length at which speculative decoding breaks even.",
                       "{token}", Gauge(break_even)),
            ]
        return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(self.scope, metrics, "")], "")])

    def shutdown(self, timeout_s: float) -> None:
        """One last export, bounded: it runs on a daemon thread that is given ``timeout_s``."""
        if self._stop.is_set():  # the pipeline's shutdown can run twice (explicit, then atexit)
            return
        self._stop.set()

        def finish() -> None:
            self.export()
            self.exporter.shutdown()

        t = threading.Thread(target=finish, name="sgl-probe-metrics-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)


def exporter(environ: Mapping[str, str]) -> Any:
    if protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def from_env(environ: Mapping[str, str], resource: Any = None) -> Optional[OtlpSink]:
    """A sink when the variables ask for OTLP metrics; the exporter reads its own settings from
    ``os.environ`` (as every OpenTelemetry exporter does)."""
    if not wanted(environ):
        return None
    return OtlpSink(exporter(environ), resource,
                    _millis(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60_000),
                    _millis(environ, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000))
