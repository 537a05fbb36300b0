"""The span contract with exact values: a recorded step with known clocks becomes exactly these
spans (names, times, parent links, attributes, which keys are left out), and trace ids line up
across ranks the way the report and Jaeger rely on."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, StatusCode

from sgl_probe import contract as C
from sgl_probe import spans
from sgl_probe.readers import Facts
from sgl_probe.recorder import PhaseRecord, StepRecord

RES = Resource.create({"service.name": "sglang"})
SPEC = {"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
IDENT = {"tp_rank": 1, "dp_rank": 0, "pp_rank": None}
OFFSET = 1_000_000_000_000


class Timer:
    """Tokens are host nanoseconds; the wall clock is the host clock plus a fixed offset."""

    kind = "cpu"

    def interval_kind(self, start, end):
        return start + OFFSET, end + OFFSET, "gpu_event" if start == 5_000_000 else None

    def wall(self, host_ns):
        return host_ns + OFFSET

    def ready(self, start, end):
        return True

    def release(self, start, end):
        pass


def build(st: StepRecord, ident=IDENT, run_id="run-1", **extra) -> list:
    """The step's spans through whichever resolve path this checkout has."""
    try:
        from sgl_probe.drain import resolve_step
    except ImportError:
        return spans.build_step_spans(st, Timer(), run_id, ident, SPEC, RES)[1]
    return spans.build_step_spans(resolve_step(st, Timer()), run_id, ident, SPEC, RES, *([extra] if extra else []))


def phase(name, mode, bs, tokens, t0, t1, host0, host1, graph=None, hook=False, accept=None, error=None):
    ph = PhaseRecord(Facts(name, mode, bs, tokens), "mod:" + name, host0, t0)
    ph.t_end, ph.host1 = t1, host1
    ph.graph, ph.graph_hook, ph.accept_length, ph.error = graph, hook, accept, error
    return ph


def spec_step() -> StepRecord:
    st = StepRecord(7, Facts("step", "DECODE", 2, 2), 1_000)
    st.host1 = 90_000_000
    st.phases = [
        phase("draft", "DECODE", 2, 4, 2_000_000, 5_000_000, 1_500_000, 2_500_000, hook=True),
        phase("verify", "TARGET_VERIFY", 2, 8, 5_000_000, 95_000_000, 3_000_000, 4_000_000, graph=False,
              accept=2.5),
        phase("draft_extend", "DRAFT_EXTEND_V2", 2, 8, 95_000_000, 97_000_000, 4_000_000, 4_500_000,
              graph=True),
    ]
    return st


def test_step_and_phase_spans_exactly():
    out = build(spec_step())
    assert [s.name for s in out] == ["sglang.step", "sglang.draft", "sglang.verify", "sglang.draft_extend"]
    step, draft, verify, dext = out
    # The step spans its host call and every phase's interval (the verify ends after the host call).
    assert (step.start_time, step.end_time) == (1_000 + OFFSET, 97_000_000 + OFFSET)
    assert (verify.start_time, verify.end_time) == (5_000_000 + OFFSET, 95_000_000 + OFFSET)
    assert step.parent is None and all(s.parent.span_id == step.context.span_id for s in out[1:])
    assert len({s.context.trace_id for s in out}) == 1 and len({s.context.span_id for s in out}) == 4
    assert step.context.trace_id == spans.step_trace_id("run-1", IDENT, 7)
    a = dict(step.attributes)
    assert a[C.STEP_INDEX] == 7 and a[C.TIMER] == "cpu" and a[C.FORWARD_MODE] == "DECODE"
    assert a[C.BATCH_SIZE] == 2 and a[C.NUM_TOKENS] == 2 and a["sglang.tp_rank"] == 1 and a["sglang.dp_rank"] == 0
    assert "sglang.pp_rank" not in a
    assert a[C.HOST_MS] == (90_000_000 - 1_000) / 1e6
    assert a[C.DURATION_MS] == (97_000_000 - 1_000) / 1e6
    assert a[C.CUDA_GRAPH] is True  # some phase ran a graph
    v = dict(verify.attributes)
    assert v[C.DURATION_MS] == 90.0 and v[C.HOST_MS] == 1.0 and v[C.TARGET] == "mod:verify"
    assert v[C.PHASE] == "verify" and v[C.STEP_INDEX] == 7 and v[C.FORWARD_MODE] == "TARGET_VERIFY"
    assert v[C.BATCH_SIZE] == 2 and v[C.NUM_TOKENS] == 8 and v[C.ACCEPT_LENGTH] == 2.5
    assert v[C.CUDA_GRAPH] is False
    assert v.get(C.START) == "gpu_event" and C.START not in dict(draft.attributes)
    assert {k: v[C.SPEC_PREFIX + k] for k in C.SPEC_SETTINGS} == SPEC
    d = dict(draft.attributes)
    assert d[C.CUDA_GRAPH] is True  # no flag from SGLang: the replay hook decides
    assert C.ACCEPT_LENGTH not in d and d[C.SPEC_PREFIX + "topk"] == 1
    assert dict(dext.attributes)[C.CUDA_GRAPH] is True
    assert all(s.status.status_code == StatusCode.UNSET and not s.events for s in out)
    for s in out:
        assert s.resource is RES and s.kind == SpanKind.INTERNAL and s.instrumentation_scope.name == "sgl_probe"
        assert s.context.is_remote is False and s.context.trace_flags.sampled


def test_decode_phase_has_no_spec_keys_and_no_absent_values():
    st = StepRecord(1, Facts("step", None, None, None), 0)
    st.host1 = 10
    ph = phase("decode", None, None, None, 2, 8, 1, 9, graph=True, accept=3.0)
    st.phases = [ph]
    step, dec = build(st)
    a = dict(dec.attributes)
    assert not any(k.startswith(C.SPEC_PREFIX) for k in a)  # accept length only on verify spans
    assert C.FORWARD_MODE not in a and C.BATCH_SIZE not in a and C.NUM_TOKENS not in a
    assert a[C.CUDA_GRAPH] is True
    s = dict(step.attributes)
    assert C.FORWARD_MODE not in s and C.BATCH_SIZE not in s and C.NUM_TOKENS not in s
    assert (step.start_time, step.end_time) == (OFFSET, 10 + OFFSET)


def test_a_graph_less_step_and_an_unfinished_phase():
    st = StepRecord(2, Facts("step", "DECODE", 1, 1), 100)
    st.host1 = 200
    st.phases = [phase("decode", "DECODE", 1, 1, 120, 180, 110, 190, graph=False, hook=True),
                 phase("decode", "DECODE", 1, 1, 150, None, 150, 150)]
    out = build(st)
    assert [s.name for s in out] == ["sglang.step", "sglang.decode"]  # no end: not a span
    assert dict(out[1].attributes)[C.CUDA_GRAPH] is False  # SGLang's False wins over the hook
    assert dict(out[0].attributes)[C.CUDA_GRAPH] is False


def test_errors_mark_the_phase_and_the_step():
    st = spec_step()
    st.phases[1].error = RuntimeError("verify blew up: out of memory")
    st.error = KeyError("k")
    step, _draft, verify, _ = build(st)
    assert verify.status.status_code == StatusCode.ERROR
    assert verify.status.description == "RuntimeError: verify blew up: out of memory"
    assert [(e.name, dict(e.attributes)) for e in verify.events] == [
        ("exception", {"exception.type": "RuntimeError", "exception.message": "verify blew up: out of memory"})]
    assert verify.events[0].timestamp == verify.end_time
    assert step.status.status_code == StatusCode.ERROR and step.status.description == "KeyError: 'k'"
    assert step.events[0].timestamp == step.end_time


def test_trace_ids_line_up_across_ranks():
    a = spans.step_trace_id("run", {"tp_rank": 0, "dp_rank": 1}, 5)
    assert a == spans.step_trace_id("run", {"tp_rank": 3, "dp_rank": 1}, 5)  # TP ranks share
    assert a != spans.step_trace_id("run", {"tp_rank": 0, "dp_rank": 2}, 5)  # DP replicas do not
    assert a != spans.step_trace_id("run", {"tp_rank": 0, "dp_rank": 1}, 6)
    assert a != spans.step_trace_id("other", {"tp_rank": 0, "dp_rank": 1}, 5)
    assert spans.step_trace_id("run", {}, 5) == spans.step_trace_id("run", {"dp_rank": 0}, 5)
    assert spans.derived_trace_id("r", "x", 1) == spans.derived_trace_id("r", "x", "1")
    # Every process derives it the same way, whatever its probe version: blake2b-128 of the parts.
    import hashlib

    assert spans.derived_trace_id("r", "x", 1) == int.from_bytes(
        hashlib.blake2b(b"r/x/1", digest_size=16).digest(), "big")
    assert a == spans.derived_trace_id("run", "dp1", "step", 5)
    assert 0 < a < 1 << 128 and a.bit_length() > 64  # a 128-bit id
    assert spans.new_span_id() != spans.new_span_id() and 0 < spans.new_span_id() < 1 << 64


def test_env_span():
    s = spans.build_env_span({"env.NCCL_ALGO": "Ring"}, 1234, "run-9", {"tp_rank": 2, "dp_rank": None}, RES)
    t = spans.build_env_span({}, 99, "run-9", {}, RES, name=C.FINGERPRINT_SPAN)
    assert s.name == C.ENV_SPAN and t.name == C.FINGERPRINT_SPAN
    assert s.context.trace_id == t.context.trace_id == spans.derived_trace_id("run-9", "env")
    assert dict(s.attributes) == {"env.NCCL_ALGO": "Ring", "sglang.tp_rank": 2}
    assert (s.start_time, s.end_time, s.parent) == (1234, 1234, None)
    for span in (s, t):
        assert span.resource is RES and span.kind == SpanKind.INTERNAL
        assert span.instrumentation_scope.name == "sgl_probe"
        assert span.context.is_remote is False and span.context.trace_flags.sampled
    assert spans.rank_attributes({"tp_rank": 0, "dp_rank": 0, "pp_rank": 0, "x": 1}) == {
        "sglang.tp_rank": 0, "sglang.dp_rank": 0, "sglang.pp_rank": 0}


def test_no_graph_reason_only_on_graph_less_phases_and_extra_step_attributes():
    st = StepRecord(3, Facts("step", "DECODE", 1, 1), 100)
    st.host1 = 200
    a = phase("decode", "DECODE", 1, 1, 120, 150, 110, 160, graph=False)
    b = phase("decode", "DECODE", 1, 1, 150, 180, 160, 190, graph=True)
    a.no_graph_reason = b.no_graph_reason = "batch_too_large"
    st.phases = [a, b]
    try:
        out = build(st, **{C.KEPT: C.KEPT_SLOW})
    except AttributeError:  # a checkout without kept steps
        out = build(st)
    else:
        assert dict(out[0].attributes)[C.KEPT] == C.KEPT_SLOW
    assert dict(out[1].attributes).get(C.NO_GRAPH_REASON) == "batch_too_large"
    assert C.NO_GRAPH_REASON not in dict(out[2].attributes)


def test_the_step_starts_at_its_earliest_phase_and_unfinished_phases_are_skipped():
    st = StepRecord(4, Facts("step", "DECODE", 1, 1), 500)
    st.host1 = 600
    # The first phase never finished; the GPU interval of the second began before the host call.
    st.phases = [phase("decode", "DECODE", 1, 1, 50, None, 500, 500),
                 phase("decode", "DECODE", 1, 1, 100, 700, 510, 590, graph=True)]
    step, dec = build(st)
    assert (dec.start_time, dec.end_time) == (100 + OFFSET, 700 + OFFSET)
    assert (step.start_time, step.end_time) == (100 + OFFSET, 700 + OFFSET)


def test_graph_ms_only_where_a_graph_was_launched():
    from sgl_probe.resolved import ResolvedPhase, ResolvedStep

    launched = ResolvedPhase("decode", 0, 2_000_000, True, "DECODE", 1, 1, 0.1, "t", graph_ms=1.25)
    eager = ResolvedPhase("decode", 2_000_000, 3_000_000, False, "DECODE", 1, 1, 0.1, "t")
    step = ResolvedStep(1, 0, 3_000_000, "DECODE", 1, 1, 0.3, "cuda", (launched, eager))
    _, a, b = spans.build_step_spans(step, "run", {"tp_rank": 0}, {}, RES)
    assert dict(a.attributes)[C.GRAPH_MS] == 1.25 and dict(a.attributes)[C.DURATION_MS] == 2.0
    assert C.GRAPH_MS not in dict(b.attributes)
