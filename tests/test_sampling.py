"""The drain's sampling decision per step, without SGLang: the trace id it derives is the span's,
the ratio sampler's rule applied directly decides as the SDK's sampler does, and a step read from
the drain's plain row is decided as the same named step."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, TraceIdRatioBased

from sgl_probe import sampling, spans
from sgl_probe.resolved import ResolvedPhase, ResolvedStep, from_row, to_row


@pytest.mark.parametrize("ident", [{"dp_rank": 0}, {"dp_rank": None}, {"dp_rank": 3}, {}])
def test_step_trace_ids_are_step_trace_id(ident):
    ids = spans.step_trace_ids("run-7f3a", ident)
    rnd = random.Random(3)
    for index in [0, 1, 9, 10, 123456789, *(rnd.randrange(1 << 40) for _ in range(300))]:
        assert ids(index) == spans.step_trace_id("run-7f3a", ident, index)


@pytest.mark.parametrize("rate", [0.0, 1e-6, 0.1, 0.5, 0.999, 1.0])
def test_the_ratio_rule_decides_as_the_sdks_sampler(rate):
    sampler = TraceIdRatioBased(rate)
    bound = sampling._ratio_bound(sampler)
    assert bound == sampler.bound
    rnd = random.Random(rate)
    for tid in [1, bound, bound - 1 if bound else 1, *(rnd.getrandbits(128) or 1 for _ in range(2000))]:
        want = sampler.should_sample(None, tid, "sglang.step").decision == Decision.RECORD_AND_SAMPLE
        assert (tid & sampling._TRACE_ID_LIMIT < bound) == want


def test_a_sampler_whose_rule_differs_is_asked_every_time():
    """Another sampler, or a ratio sampler that no longer decides by this rule (an SDK that
    changed it), is asked through should_sample, never second-guessed."""
    assert sampling._ratio_bound(None) is None and sampling._ratio_bound(ALWAYS_OFF) is None

    class Inverted(TraceIdRatioBased):
        pass

    assert sampling._ratio_bound(Inverted(0.5)) is None
    odd = TraceIdRatioBased(0.5)
    real = odd.should_sample
    odd.should_sample = lambda ctx, tid, name, *a, **k: real(ctx, tid ^ 1 << 63, name)
    assert sampling._ratio_bound(odd) is None
    s = sampling.StepSampling("run-x", {"dp_rank": 0}, {"OTEL_TRACES_SAMPLER": "traceidratio",
                                                         "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    assert s._sampled(0) in (True, False) and s._bound is not None  # the SDK's own ratio sampler: the rule
    s.sampler = odd
    for i in range(200):
        tid = spans.step_trace_id("run-x", {"dp_rank": 0}, i)
        assert s._sampled(i) == (odd.should_sample(None, tid, "x").decision == Decision.RECORD_AND_SAMPLE)
    assert s._bound is None


def _step(i: int, ms: float, mode: str = "DECODE") -> ResolvedStep:
    ph = ResolvedPhase("decode", 0, int(ms * 1e6), True, mode, 4, 4, 0.05, "t")
    return ResolvedStep(i, 0, int(ms * 1e6), mode, 4, 4, 0.1, "cuda", (ph,))


def test_a_row_is_kept_as_its_named_step_and_as_the_sdk_decides():
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.2"}
    ident = {"tp_rank": 0, "dp_rank": 1, "pp_rank": 0}
    by_row, by_step = sampling.StepSampling("run-r", ident, env), sampling.StepSampling("run-r", ident, env)
    rnd = random.Random(5)
    steps = [_step(i, 20.0 if i % 97 == 96 else 1.0 + rnd.random() * 0.1, "DECODE" if i % 5 else "EXTEND")
             for i in range(1, 3001)]
    ratio = TraceIdRatioBased(0.2)
    for st in steps:
        row = to_row(st)
        assert type(row) is tuple and type(row[-2][0]) is tuple and from_row(row) == st
        got = by_row.keep_row(row)
        assert got == by_step.keep(st)
        sampled = ratio.should_sample(None, spans.step_trace_id("run-r", ident, st.index), "x").decision \
            == Decision.RECORD_AND_SAMPLE
        assert got[0] == (sampled or got[1]) and not (sampled and got[1])
    assert by_row._bound is not None  # decided by the rule, not the SDK's call
    assert by_row.kept_slow > 0 and by_row.sampled_out > 0
    assert (by_row.kept_slow, by_row.sampled_out) == (by_step.kept_slow, by_step.sampled_out)


def test_the_trace_ids_follow_a_dp_rank_learned_later():
    ident = {"tp_rank": 0}
    s = sampling.StepSampling("run-d", ident, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    first = [s._sampled(i) for i in range(64)]
    ident["dp_rank"] = 2
    later = [s._sampled(i) for i in range(64)]
    ratio = TraceIdRatioBased(0.5)
    for i in range(64):
        for dp, got in ((0, first[i]), (2, later[i])):
            tid = spans.step_trace_id("run-d", {"dp_rank": dp}, i)
            assert got == (ratio.should_sample(None, tid, "x").decision == Decision.RECORD_AND_SAMPLE)
    assert first != later
