"""Always-on phase metrics, fed by every resolved step (sampled for spans or not).

Two outputs, each only when the user asked for it:

- Prometheus, on SGLang's own ``/metrics``: with ``--enable-metrics`` SGLang sets
  ``PROMETHEUS_MULTIPROC_DIR`` before spawning its schedulers and serves every process's
  prometheus_client files from there. The probe writes its series into the same directory (one
  file set per process, ranks as labels): no port of its own. See :mod:`sgl_probe.metrics_prom`.
- OTLP metrics when ``OTEL_METRICS_EXPORTER`` names ``otlp`` or
  ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is set. See :mod:`sgl_probe.metrics_otlp`.

``SGL_PROBE_METRICS=off`` turns both off. Whichever process receives resolved steps builds one
:class:`PhaseMetrics` per rank with :func:`sgl_probe.metrics_setup.phase_metrics` and calls
``observe_rows`` with the steps as they are resolved (``observe_step`` for one), and
``maybe_flush`` when idle.

Steps are aggregated here (a bisect and a few additions per phase: in Python ~0.7-1.6 µs per step,
with the C hot path its ``metrics_add`` ~0.2, or the drain's packed pass as it takes each step
(``c_state``), on the drain thread, which holds the GIL for it); the
sinks get cumulative snapshots at most once per ``flush_s``. Recording each phase
into prometheus_client's multiprocess files or the OpenTelemetry SDK's instruments costs 7x to
15x that (BENCHMARKS.md, "Metrics path"). A failure in a sink costs one
log line and switches the metrics off; it never reaches the caller.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from typing import Any, Mapping, NamedTuple, Optional, Protocol, Sequence

from sgl_probe.contract import ACCEPT_LENGTH_BUCKETS, DROP_CAUSE_LABEL, PHASE_SECONDS_BUCKETS, RANK_LABELS, TIMER_HOST
from sgl_probe.resolved import ResolvedPhase, ResolvedStep

log = logging.getLogger("sgl_probe")

_INF = float("inf")
#: Where a Hist's counts start in its ``data`` (after sum, min, max).
_COUNTS = 3
#: Where a resolved step's and phase's fields sit in their rows.
_MODE, _PHASES, _TIMER = (ResolvedStep._fields.index(f) for f in ("mode", "phases", "timer"))
_PH_AT = _PH_PHASE, _PH_START, _PH_END, _PH_GRAPH, _PH_MODE, _PH_ACCEPT = tuple(
    ResolvedPhase._fields.index(f) for f in ("phase", "start_ns", "end_ns", "graph", "mode", "accept_length"))


class Hist:
    """Cumulative histogram of one series; ``counts[i]`` holds values in (bounds[i-1], bounds[i]]
    (the last slot is above every bound), as prometheus_client stores its buckets. Its numbers
    live in one list, ``data`` (sum, min, max, then the counts), which the C extension's
    ``metrics_add`` updates in place as :meth:`add` does."""

    __slots__ = ("labels", "bounds", "data")

    def __init__(self, labels: dict[str, str], bounds: Sequence[float]) -> None:
        self.labels = labels
        self.bounds = tuple(bounds)
        self.data: list = [0.0, _INF, -_INF] + [0] * (len(self.bounds) + 1)

    @property
    def counts(self) -> list:
        return self.data[_COUNTS:]

    @property
    def sum(self) -> float:
        return self.data[0]

    @property
    def min(self) -> float:
        return self.data[1]

    @property
    def max(self) -> float:
        return self.data[2]

    def add(self, value: float) -> None:
        data = self.data
        data[_COUNTS + bisect_left(self.bounds, value)] += 1
        data[0] += value
        if value < data[1]:
            data[1] = value
        if value > data[2]:
            data[2] = value

    def frozen(self) -> "HistPoint":
        data = self.data
        return HistPoint(self.labels, self.bounds, tuple(data[_COUNTS:]), data[0], data[1], data[2])


class HistPoint(NamedTuple):
    labels: dict
    bounds: tuple
    counts: tuple
    sum: float
    min: float
    max: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class Snapshot(NamedTuple):
    """Cumulative totals of one rank since ``start_ns``, as the sinks receive them."""

    ranks: dict
    start_ns: int
    time_ns: int
    phases: tuple          # HistPoint per (phase, forward_mode, cuda_graph)
    steps: tuple           # (labels, count) per forward_mode
    accept_length: Optional[HistPoint]
    dropped: tuple         # (labels, count) per cause
    verdict: Optional[tuple]  # (speedup, break_even) or None while unknown


class Sink(Protocol):
    def update(self, snap: Snapshot) -> None: ...
    def shutdown(self, timeout_s: float) -> None: ...


def rank_labels(ident: Mapping[str, Any]) -> dict[str, str]:
    """``tp_rank`` / ``dp_rank`` / ``pp_rank`` as label values ("" where the rank is unknown,
    which Prometheus treats as an absent label)."""
    return {k: "" if ident.get(k) is None else str(ident[k]) for k in RANK_LABELS}


class PhaseMetrics:
    """The metrics of one rank (a scheduler process, or one rank's stream in an exporter).
    Not thread-safe: call it from the one thread that receives the rank's steps."""

    def __init__(self, ident: Mapping[str, Any], sinks: Sequence[Sink], flush_s: float = 1.0,
                 fast: Any = None) -> None:
        """``fast``: the C hot path module (:mod:`sgl_probe.hotpath`), whose ``metrics_add`` does
        :meth:`observe_rows`'s loop in C; None: Python."""
        self._fast_add = getattr(fast, "metrics_add", None)
        self.sinks = list(sinks)
        self.ranks = rank_labels(ident)
        self.flush_ns = int(flush_s * 1e9)
        self.failed = False
        self.start_ns = time.time_ns()
        self._phase: dict[tuple, Hist] = {}
        self._steps: dict[Optional[str], list] = {}
        self._accept: Optional[Hist] = None
        self._dropped: dict[str, int] = {}
        self._verdict: Optional[tuple] = None
        self._dirty = False
        self._last_flush = time.monotonic_ns()

    def observe_step(self, step: ResolvedStep) -> None:
        """Count the step and time each of its phases; never raises."""
        self.observe_rows((step,))

    def observe_rows(self, rows: Sequence[tuple]) -> None:
        """:meth:`observe_step` for steps as the drain resolves them (plain tuples in
        :class:`ResolvedStep`'s field order, its phases in :class:`ResolvedPhase`'s; a
        ResolvedStep is one too): the fields read by position, so no named copy is made of
        each step on the drain thread. Never raises."""
        if self.failed:
            return
        try:
            if self._fast_add is not None:  # the same loop in C, for every step the server runs
                if any(row[_TIMER] == TIMER_HOST for row in rows):
                    # The C loop histograms every phase it is given: the untimed steps go
                    # through the Python loop, which counts them without their host times.
                    self._observe_py([row for row in rows if row[_TIMER] == TIMER_HOST])
                    rows = [row for row in rows if row[_TIMER] != TIMER_HOST]
                self._fast_add(rows, _MODE, _PHASES, _PH_AT, self._steps, self._phase, self._new_steps,
                               self._new_hist, self._accept_hist)
                self._dirty = self._dirty or bool(rows)
            else:
                self._observe_py(rows)
            self.maybe_flush()
        except Exception as exc:
            self._fail("observe_rows", exc)

    def _observe_py(self, rows: Sequence[tuple]) -> None:
        steps_of, phase_of = self._steps, self._phase
        for row in rows:
            mode = row[_MODE]
            steps = steps_of.get(mode)
            if steps is None:
                steps = self._new_steps(mode)
            steps[1] += 1
            # A step the CUDA timer left untimed counts, with its accept lengths; its phases'
            # host times stay out of the phase histograms, which hold GPU times.
            timed = row[_TIMER] != TIMER_HOST
            for ph in row[_PHASES]:
                if timed:
                    key = (ph[_PH_PHASE], ph[_PH_MODE], ph[_PH_GRAPH])
                    hist = phase_of.get(key)
                    if hist is None:
                        hist = self._new_hist(key)
                    hist.add((ph[_PH_END] - ph[_PH_START]) / 1e9)
                accept = ph[_PH_ACCEPT]
                if accept is not None:
                    self._accept_hist().add(accept)
            self._dirty = True

    def c_state(self) -> Optional[tuple]:
        """What the C drain's packed pass feeds these metrics through (``drain.take_ready``):
        :meth:`observe_rows`'s containers and callbacks as ``metrics_add`` takes them, and a list
        an error goes into instead of being raised (the step is sent whatever the metrics do).
        None without the C loop, or once the metrics are off. Pass it to :meth:`c_state_done`."""
        if self._fast_add is None or self.failed:
            return None
        return (self._steps, self._phase, self._new_steps, self._new_hist, self._accept_hist, [])

    def c_state_done(self, state: tuple, added: bool) -> None:
        """After a packed take with ``state``: what :meth:`observe_rows` does after its loop
        (``added``: steps were counted). Never raises."""
        errors = state[5]
        if errors:
            self._fail("observe_rows", errors[0])
        elif added:
            self._dirty = True

    # -- what ``metrics_add`` asks for at a series' first step ------------------------------------
    def _new_steps(self, mode: Any) -> list:
        steps = self._steps[mode] = [{"forward_mode": mode or "unknown", **self.ranks}, 0]
        return steps

    def _new_hist(self, key: tuple) -> Hist:
        hist = self._phase[key] = Hist({
            "phase": key[0], "forward_mode": key[1] or "unknown",
            "cuda_graph": "true" if key[2] else "false", **self.ranks}, PHASE_SECONDS_BUCKETS)
        return hist

    def _accept_hist(self) -> Hist:
        if self._accept is None:
            self._accept = Hist(dict(self.ranks), ACCEPT_LENGTH_BUCKETS)
        return self._accept

    def set_dropped(self, by: Mapping[str, int]) -> None:
        """The rank's totals so far of what was dropped, by cause (the summary line's breakdown:
        ``pending`` in steps, the others in spans); each counter follows its total up."""
        for cause, total in by.items():
            if total > self._dropped.get(cause, 0):
                self._dropped[cause] = total
                self._dirty = True

    def set_verdict(self, verdict: Any) -> None:
        """The live speculative verdict (anything with ``speedup`` and ``break_even``, e.g. the
        summary's), or None when it is not known for the current window."""
        value = None if verdict is None else (float(verdict.speedup), float(verdict.break_even))
        if value != self._verdict:
            self._verdict = value
            self._dirty = True

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.ranks, self.start_ns, time.time_ns(), tuple(h.frozen() for h in self._phase.values()),
            tuple((labels, n) for labels, n in self._steps.values()),
            self._accept.frozen() if self._accept is not None else None,
            tuple(({DROP_CAUSE_LABEL: cause, **self.ranks}, n) for cause, n in self._dropped.items()), self._verdict)

    def maybe_flush(self) -> None:
        """``flush`` once ``flush_s`` has passed since the last one (call it when idle, too)."""
        if time.monotonic_ns() - self._last_flush >= self.flush_ns:
            self.flush()

    def flush(self) -> None:
        """Hand the totals to the sinks if anything changed; never raises."""
        self._last_flush = time.monotonic_ns()
        if self.failed or not self._dirty:
            return
        self._dirty = False
        try:
            snap = self.snapshot()
            for sink in self.sinks:
                sink.update(snap)
        except Exception as exc:
            self._fail("flush", exc)

    def _fail(self, where: str, exc: BaseException) -> None:
        self.failed = True
        log.warning("sgl-probe: metrics disabled in this process after an error in %s: %r", where, exc)
