"""Which resolved steps are exported: the trace sampler, decided per step before any span is
built, plus a tail-based keep of slow steps.

The sampler is the one ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` name, built from the
SDK's public sampler classes. It sees the step's derived trace id, so a ratio sampler keeps the
same steps on every rank. Our steps are roots, so the ``parentbased_*`` samplers decide as their
root sampler does. A step the sampler drops is still exported when it is slow: longer than the
running p99 of recent steps of the same forward mode (the steps a ratio sampler would most
regret losing).

With the C extension, a ratio sampler's (or always_off's) decisions are the extension's
``StepSampler``: the same rules in C, one state for the drain's packed pass (which decides each
step before writing it into the link's message, making no row) and for :meth:`StepSampling.keep_row`.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any, Mapping, Optional

from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, TraceIdRatioBased

from sgl_probe import spans as spans_mod
from sgl_probe.contract import TIMER_HOST
from sgl_probe.resolved import ResolvedStep

log = logging.getLogger("sgl_probe")

#: Where a resolved step's fields sit in its row.
_INDEX, _START, _END, _MODE, _TIMER = (ResolvedStep._fields.index(f)
                                       for f in ("index", "start_ns", "end_ns", "mode", "timer"))
_TRACE_ID_LIMIT = TraceIdRatioBased.TRACE_ID_LIMIT

_NAMES = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
          "parentbased_always_off", "parentbased_traceidratio")


def sampler_from_env(environ: Mapping[str, str] = os.environ) -> Optional[Sampler]:
    """The configured sampler, or None when every step is kept (the default)."""
    raw = environ.get("OTEL_TRACES_SAMPLER", "").strip()
    name = raw.lower() or "parentbased_always_on"
    if name not in _NAMES:
        log.warning("sgl-probe: ignoring OTEL_TRACES_SAMPLER=%r: accepted values are %s; keeping every step",
                    raw, ", ".join(_NAMES))
        return None
    root = name.replace("parentbased_", "")
    if root == "always_on":
        return None
    if root == "always_off":
        return ALWAYS_OFF
    arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        rate = float(arg) if arg else 1.0
        if not 0.0 <= rate <= 1.0:
            raise ValueError
    except ValueError:
        log.warning("sgl-probe: ignoring OTEL_TRACES_SAMPLER_ARG=%r: accepted values are numbers from 0 to 1; "
                    "using 1.0", arg)
        rate = 1.0
    return TraceIdRatioBased(rate)


def slow_key(row: tuple) -> Any:
    """Which running p99 a resolved step's duration joins: its forward mode's, or, for a step the
    CUDA timer left untimed (host times), one of its own (the C sampler builds the same key)."""
    mode = row[_MODE]
    return (TIMER_HOST, mode) if row[_TIMER] == TIMER_HOST else mode


class SlowSteps:
    """Running p99 of step durations per forward mode, over the last ``window`` steps of it."""

    def __init__(self, window: int = 1024, min_seen: int = 100, refresh: int = 64) -> None:
        self.window, self.min_seen, self.refresh = window, min_seen, refresh
        self._seen: dict = {}  # mode -> [deque of durations, steps since the p99 was computed, p99]

    def is_slow(self, step: ResolvedStep) -> bool:
        """Records the step and says whether it is over the p99 of the steps before it."""
        return self.is_slow_row(step)

    def is_slow_row(self, row: tuple) -> bool:
        """:meth:`is_slow` for a step as the drain resolves it (a plain tuple in ResolvedStep's
        field order; a ResolvedStep is one too)."""
        dur = row[_END] - row[_START]
        mode = slow_key(row)
        entry = self._seen.get(mode)
        if entry is None:
            entry = self._seen[mode] = [collections.deque(maxlen=self.window), 0, None]
        durations = entry[0]
        p99 = entry[2]
        durations.append(dur)
        entry[1] += 1
        if entry[1] >= self.refresh and len(durations) >= self.min_seen:
            ordered = sorted(durations)
            entry[2] = ordered[int(0.99 * (len(ordered) - 1))]
            entry[1] = 0
        return p99 is not None and dur > p99


class StepSampling:
    """``keep(step) -> (export it, only because it was slow)``; counts both. ``fast``: the C
    extension (see :meth:`c_state`)."""

    def __init__(self, run_id: str, ident: dict, environ: Mapping[str, str] = os.environ,
                 fast: Any = None) -> None:
        self.run_id = run_id
        self.ident = ident
        self.sampler = sampler_from_env(environ)
        self.slow = SlowSteps()
        self._sampled_out = 0
        self._kept_slow = 0
        self._bound_for: Optional[Sampler] = None  # the sampler _bound was worked out for
        self._bound: Optional[int] = None
        self._trace_ids: Optional[tuple] = None  # ((run id, dp rank), step_trace_ids for them)
        self._c: Any = None  # the extension's StepSampler, for self._c_for
        self._c_for: Optional[Sampler] = None
        self._c_key: Optional[tuple] = None  # the (run id, dp rank) its prefix was set for
        bound = 0 if self.sampler is ALWAYS_OFF else _ratio_bound(self.sampler)
        kind = getattr(fast, "StepSampler", None)
        if kind is not None and bound is not None:
            try:
                self._c = kind(bound, self.slow.window, self.slow.min_seen, self.slow.refresh)
                self._c_for = self.sampler
            except Exception as exc:  # the Python rules decide, as without the extension
                log.debug("sgl-probe: sampling in Python (%s)", exc)

    @property
    def always(self) -> bool:
        return self.sampler is None

    @property
    def sampled_out(self) -> int:
        """Steps the sampler dropped."""
        return self._sampled_out + (self._c.sampled_out if self._c is not None else 0)

    @property
    def kept_slow(self) -> int:
        """Steps the sampler dropped that were exported all the same, being slow."""
        return self._kept_slow + (self._c.kept_slow if self._c is not None else 0)

    def c_state(self) -> Any:
        """The extension's StepSampler for the drain's packed pass, its trace-id prefix that of the
        current run and dp rank (ranks may arrive after the first steps); None where the Python
        rules decide (no extension, another sampler)."""
        c = self._c
        if c is None or self._c_for is not self.sampler:
            return None
        key = (self.run_id, self.ident.get("dp_rank", 0))
        if key != self._c_key:
            c.set_prefix(spans_mod.step_trace_prefix(self.run_id, self.ident))
            self._c_key = key
        return c

    def keep(self, step: ResolvedStep) -> tuple[bool, bool]:
        return self.keep_row(step)

    def keep_row(self, row: tuple) -> tuple[bool, bool]:
        """:meth:`keep` for a step as the drain resolves it (a plain tuple in ResolvedStep's field
        order): the drain thread decides every step, so no named copy is made of it."""
        c = self.c_state()
        if c is not None:
            return c.keep(row[_INDEX], row[_START], row[_END], slow_key(row))
        slow = self.slow.is_slow_row(row)
        try:
            sampled = self._sampled(row[_INDEX])
        except Exception:
            sampled = True
        if sampled:
            return True, False
        if slow:
            self._kept_slow += 1
            return True, True
        self._sampled_out += 1
        return False, False

    def _sampled(self, index: int) -> bool:
        key = (self.run_id, self.ident.get("dp_rank", 0))
        if self._trace_ids is None or self._trace_ids[0] != key:  # the ranks arrive after the first steps may
            self._trace_ids = (key, spans_mod.step_trace_ids(self.run_id, self.ident))
        trace_id = self._trace_ids[1](index)
        if self._bound_for is not self.sampler:
            self._bound_for, self._bound = self.sampler, _ratio_bound(self.sampler)
        bound = self._bound
        if bound is not None:
            return trace_id & _TRACE_ID_LIMIT < bound
        return self.sampler.should_sample(None, trace_id, "sglang.step").decision == Decision.RECORD_AND_SAMPLE


def _ratio_bound(sampler: Optional[Sampler]) -> Optional[int]:
    """The bound a TraceIdRatioBased sampler compares trace ids with, where its rule is the one this
    module applies directly (checked on trace ids around the bound; the SDK's call builds a result
    object per step); None: ask the sampler."""
    if type(sampler) is not TraceIdRatioBased:
        return None
    try:
        bound = sampler.bound
        probes = {0, 1, bound - 1, bound, bound + 1, _TRACE_ID_LIMIT, (1 << 127) | max(bound - 1, 0), (1 << 127) | bound}
        for tid in probes:
            tid &= (1 << 128) - 1
            want = sampler.should_sample(None, tid, "sglang.step").decision == Decision.RECORD_AND_SAMPLE
            if want != (tid & _TRACE_ID_LIMIT < bound):
                return None
        return bound
    except Exception:
        return None
