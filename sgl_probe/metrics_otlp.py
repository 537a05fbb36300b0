"""Phase metrics over OTLP, through the OpenTelemetry metrics SDK.

On only when asked: ``OTEL_METRICS_EXPORTER`` names ``otlp``, or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. The generic ``OTEL_EXPORTER_OTLP_ENDPOINT`` alone
(what trace setups set) does not turn metrics on: a trace-only backend such as Jaeger would
reject every export and fill the server log. Endpoint, protocol, headers, the export interval
(``OTEL_METRIC_EXPORT_INTERVAL``) and temporality follow the standard variables. The same names
and bucket bounds as the Prometheus series, so one dashboard reads either path.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Any, Iterable, Mapping, Optional

from sgl_probe import __version__
from sgl_probe.contract import (
    ACCEPT_LENGTH_BUCKETS, METRIC_ACCEPT_LENGTH, METRIC_DROPPED, METRIC_PHASE_SECONDS,
    METRIC_SPEC_BREAK_EVEN, METRIC_SPEC_SPEEDUP, METRIC_STEPS, PHASE_SECONDS_BUCKETS,
)

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


class OtlpSink:
    """One MeterProvider for the process; ranks are attributes on every data point."""

    def __init__(self, exporter: Any, resource: Any = None) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        self.reader = PeriodicExportingMetricReader(exporter)
        views = [View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(bounds))
                 for name, bounds in ((METRIC_PHASE_SECONDS, PHASE_SECONDS_BUCKETS),
                                      (METRIC_ACCEPT_LENGTH, ACCEPT_LENGTH_BUCKETS))]
        kwargs = {} if resource is None else {"resource": resource}
        # Not the SDK's own atexit shutdown: an unreachable collector must not hold the worker's
        # exit (see shutdown()).
        self.provider = MeterProvider(metric_readers=[self.reader], views=views, shutdown_on_exit=False,
                                      **kwargs)
        meter = self.provider.get_meter("sgl_probe", __version__)
        self._phase = meter.create_histogram(
            METRIC_PHASE_SECONDS, unit="s", description="GPU time of each SGLang phase per scheduler step.")
        self._steps = meter.create_counter(METRIC_STEPS, unit="{step}", description="Scheduler steps measured.")
        self._accept = meter.create_histogram(
            METRIC_ACCEPT_LENGTH, unit="{token}", description="Speculative accept length per verify step.")
        self._dropped = meter.create_counter(METRIC_DROPPED, unit="{step}", description="Steps dropped.")
        self._verdicts: dict[tuple, tuple[float, float]] = {}
        self._lock = threading.Lock()
        meter.create_observable_gauge(METRIC_SPEC_SPEEDUP, [partial(self._observe, 0)], unit="1",
                                      description="Live speculative-decoding speed-up over plain decode.")
        meter.create_observable_gauge(METRIC_SPEC_BREAK_EVEN, [partial(self._observe, 1)], unit="{token}",
                                      description="Accept length at which speculative decoding breaks even.")

    def phase(self, labels: Mapping[str, str]):
        return partial(self._phase.record, attributes=dict(labels))

    def steps(self, labels: Mapping[str, str]):
        return partial(self._steps.add, attributes=dict(labels))

    def accept_length(self, labels: Mapping[str, str]):
        return partial(self._accept.record, attributes=dict(labels))

    def dropped(self, labels: Mapping[str, str]):
        return partial(self._dropped.add, attributes=dict(labels))

    def verdict(self, labels: Mapping[str, str], speedup: float, break_even: float) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            if speedup != speedup:  # NaN: not known now; report nothing rather than NaN
                self._verdicts.pop(key, None)
            else:
                self._verdicts[key] = (speedup, break_even)

    def _observe(self, which: int, options: Any = None) -> Iterable:
        from opentelemetry.metrics import Observation

        with self._lock:
            items = list(self._verdicts.items())
        return [Observation(values[which], dict(key)) for key, values in items]

    def shutdown(self, timeout_s: float) -> None:
        """One last export, bounded: it runs on a daemon thread that is given ``timeout_s``."""
        t = threading.Thread(target=self.provider.shutdown, kwargs={"timeout_millis": timeout_s * 1000},
                             name="sgl-probe-metrics-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)


def exporter(environ: Mapping[str, str]) -> Any:
    if protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def from_env(environ: Mapping[str, str], resource: Any = None) -> Optional[OtlpSink]:
    return OtlpSink(exporter(environ), resource) if wanted(environ) else None
