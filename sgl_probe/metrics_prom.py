"""Phase metrics into SGLang's own ``/metrics``, through prometheus_client's multiprocess mode.

SGLang (``--enable-metrics``) sets ``PROMETHEUS_MULTIPROC_DIR`` before it spawns the schedulers
and serves ``/metrics`` from a ``MultiProcessCollector`` over that directory. A metric created in
any process of the server writes its values to per-process files there, so the probe's series
appear on the same endpoint, one set per rank (the ranks are labels), with no port of its own.
prometheus_client is imported only here, only then: SGLang brings it; the probe does not need it.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from sgl_probe.contract import (
    ACCEPT_LENGTH_BUCKETS, DROP_CAUSE_LABEL, METRIC_ACCEPT_LENGTH, METRIC_DROPPED, METRIC_PHASE_SECONDS,
    METRIC_SPEC_BREAK_EVEN, METRIC_SPEC_SPEEDUP, METRIC_STEPS, PHASE_LABELS, PHASE_SECONDS_BUCKETS,
    RANK_LABELS,
)
from sgl_probe.metrics import Snapshot

log = logging.getLogger("sgl_probe")

MULTIPROC_VAR = "PROMETHEUS_MULTIPROC_DIR"


class PrometheusSink:
    """The probe's metric families. ``registry=None`` registers nothing: in multiprocess mode the
    values live in the shared directory and SGLang's collector reads them from there (and a
    second registration in SGLang's default registry could collide)."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        reg = {"registry": registry}
        self._phase = Histogram(
            METRIC_PHASE_SECONDS, "GPU time of each SGLang phase per scheduler step (every step).",
            PHASE_LABELS, buckets=PHASE_SECONDS_BUCKETS, **reg)
        self._steps = Counter(
            METRIC_STEPS, "Scheduler steps the probe measured.", ("forward_mode",) + RANK_LABELS, **reg)
        self._accept = Histogram(
            METRIC_ACCEPT_LENGTH, "Speculative accept length (tau) per verify step.",
            RANK_LABELS, buckets=ACCEPT_LENGTH_BUCKETS, **reg)
        self._dropped = Counter(
            METRIC_DROPPED, "What the probe could not deliver, by cause: pending (steps, the drain was behind), "
            "link (spans, the exporter process), otlp and trace_dir (spans, that output).",
            (DROP_CAUSE_LABEL,) + RANK_LABELS, **reg)
        # "mostrecent": one value per rank across the server's processes, no pid label.
        self._speedup = Gauge(
            METRIC_SPEC_SPEEDUP, "Live speculative-decoding speed-up over plain decode (>1 wins).",
            RANK_LABELS, multiprocess_mode="mostrecent", **reg)
        self._break_even = Gauge(
            METRIC_SPEC_BREAK_EVEN, "Accept length at which speculative decoding breaks even now.",
            RANK_LABELS, multiprocess_mode="mostrecent", **reg)
        self._pushed: dict[tuple, Any] = {}

    def update(self, snap: Snapshot) -> None:
        """Add what changed since the last snapshot of the same series (``Snapshot`` totals are
        cumulative; the multiprocess files are too)."""
        hists = [(h, self._phase) for h in snap.phases]
        if snap.accept_length is not None:
            hists.append((snap.accept_length, self._accept))
        for hist, family in hists:
            key = (id(family), tuple(hist.labels.values()))
            before = self._pushed.get(key)
            if before is not None and before.counts == hist.counts:
                continue
            child = family.labels(**hist.labels)
            # No public way to add a batch of observations: the child's own values, which the
            # multiprocess files back (the same two that Histogram.observe() increments).
            buckets, total = child._buckets, child._sum
            if len(buckets) != len(hist.counts):
                raise RuntimeError("prometheus_client histogram layout changed: %d buckets, expected %d"
                                   % (len(buckets), len(hist.counts)))
            for i, n in enumerate(hist.counts):
                delta = n - (before.counts[i] if before is not None else 0)
                if delta:
                    buckets[i].inc(delta)
            total.inc(hist.sum - (before.sum if before is not None else 0.0))
            self._pushed[key] = hist
        for labels, n in snap.steps:
            self._add(self._steps, labels, n)
        for labels, n in snap.dropped:
            self._add(self._dropped, labels, n)
        key = ("verdict", tuple(snap.ranks.values()))
        if self._pushed.get(key, None) != snap.verdict and (snap.verdict is not None or key in self._pushed):
            speedup, break_even = snap.verdict or (float("nan"), float("nan"))  # NaN: not known now
            self._speedup.labels(**snap.ranks).set(speedup)
            self._break_even.labels(**snap.ranks).set(break_even)
            self._pushed[key] = snap.verdict

    def _add(self, counter: Any, labels: dict, total: int) -> None:
        key = (id(counter), tuple(labels.values()))
        delta = total - self._pushed.get(key, 0)
        if delta > 0:
            counter.labels(**labels).inc(delta)
            self._pushed[key] = total

    def shutdown(self, timeout_s: float) -> None:
        pass  # every value is already in its file


def from_env(environ: Mapping[str, str]) -> Optional[PrometheusSink]:
    """A sink when SGLang's metrics are on in this process (``PROMETHEUS_MULTIPROC_DIR`` set, by
    ``--enable-metrics`` or by the user) and prometheus_client is importable; else None."""
    if not environ.get(MULTIPROC_VAR):
        return None
    try:
        from prometheus_client import values
    except ImportError:
        log.warning("sgl-probe: %s is set but prometheus_client is not installed: no probe series "
                    "on /metrics", MULTIPROC_VAR)
        return None
    # prometheus_client picks multiprocess mode when it is first imported; imported earlier, its
    # values would stay in this process and never reach /metrics.
    if not getattr(values.ValueClass, "_multiprocess", False):
        log.warning("sgl-probe: prometheus_client was imported before %s was set in this process: "
                    "no probe series on /metrics", MULTIPROC_VAR)
        return None
    return PrometheusSink()
