"""Which resolved steps are exported: the trace sampler, decided per step before any span is
built, plus a tail-based keep of slow steps.

The sampler is the one ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` name, built from the
SDK's public sampler classes. It sees the step's derived trace id, so a ratio sampler keeps the
same steps on every rank. Our steps are roots, so the ``parentbased_*`` samplers decide as their
root sampler does. A step the sampler drops is still exported when it is slow: longer than the
running p99 of recent steps of the same forward mode (the steps a ratio sampler would most
regret losing).
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Mapping, Optional

from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, TraceIdRatioBased

from sgl_probe import spans as spans_mod
from sgl_probe.resolved import ResolvedStep

log = logging.getLogger("sgl_probe")

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


class SlowSteps:
    """Running p99 of step durations per forward mode, over the last ``window`` steps of it."""

    def __init__(self, window: int = 1024, min_seen: int = 100, refresh: int = 64) -> None:
        self.window, self.min_seen, self.refresh = window, min_seen, refresh
        self._seen: dict = {}  # mode -> [deque of durations, steps since the p99 was computed, p99]

    def is_slow(self, step: ResolvedStep) -> bool:
        """Records the step and says whether it is over the p99 of the steps before it."""
        dur = step.end_ns - step.start_ns
        entry = self._seen.get(step.mode)
        if entry is None:
            entry = self._seen[step.mode] = [collections.deque(maxlen=self.window), 0, None]
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
    """``keep(step) -> (export it, only because it was slow)``; counts both."""

    def __init__(self, run_id: str, ident: dict, environ: Mapping[str, str] = os.environ) -> None:
        self.run_id = run_id
        self.ident = ident
        self.sampler = sampler_from_env(environ)
        self.slow = SlowSteps()
        self.sampled_out = 0
        self.kept_slow = 0

    @property
    def always(self) -> bool:
        return self.sampler is None

    def keep(self, step: ResolvedStep) -> tuple[bool, bool]:
        slow = self.slow.is_slow(step)
        try:
            trace_id = spans_mod.step_trace_id(self.run_id, self.ident, step.index)
            sampled = self.sampler.should_sample(None, trace_id, "sglang.step").decision \
                == Decision.RECORD_AND_SAMPLE
        except Exception:
            sampled = True
        if sampled:
            return True, False
        if slow:
            self.kept_slow += 1
            return True, True
        self.sampled_out += 1
        return False, False
