"""The span contract: finished records -> OpenTelemetry spans.

Names and attribute keys here are what the report command, the pytest plugin and users' Jaeger
queries rely on; README.md lists them. Spans are built as SDK ``ReadableSpan`` objects with
explicit ids and times (the GPU interval, not the host call), then handed to span processors.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from sgl_probe import __version__
from sgl_probe.recorder import PhaseRecord, StepRecord

SCOPE = InstrumentationScope("sgl_probe", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_rand = random.Random()


def derived_trace_id(run_id: str, *parts: object) -> int:
    """Same run id + same step index -> same trace id in every rank's process."""
    key = "/".join([run_id, *map(str, parts)]).encode()
    tid = int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "big")
    return tid or 1


def new_span_id() -> int:
    return _rand.getrandbits(64) or 1


def _status(error: Optional[BaseException]) -> Status:
    if error is None:
        return Status(StatusCode.UNSET)
    return Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")


def _error_events(error: Optional[BaseException], when: int) -> tuple:
    if error is None:
        return ()
    from opentelemetry.sdk.trace import Event

    return (Event("exception", {"exception.type": type(error).__name__,
                                "exception.message": str(error)}, timestamp=when),)


def _put(attrs: dict, key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def rank_attributes(ident: dict) -> dict:
    attrs: dict = {}
    for key in ("tp_rank", "dp_rank", "pp_rank"):
        _put(attrs, "sglang." + key, ident.get(key))
    return attrs


def graph_used(ph: PhaseRecord) -> bool:
    """SGLang's own report from the call's result wins; else whether a graph-replay target ran."""
    return bool(ph.graph if ph.graph is not None else ph.graph_hook)


def phase_durations(st: StepRecord, timer: Any) -> list[tuple]:
    """``(phase, ms, graph, accept_length)`` per finished phase: what the summary line needs,
    without building spans (the path taken when nothing is exported)."""
    out = []
    for ph in st.phases:
        if ph.t_end is None:
            continue
        t0, t1 = timer.interval(ph.t_start, ph.t_end)
        out.append((ph.phase, (t1 - t0) / 1e6, graph_used(ph), ph.accept_length))
    return out


def phase_attributes(ph: PhaseRecord, timer_kind: str, duration_ms: float, ident: dict,
                     spec: dict, step_index: int) -> dict:
    attrs = {
        "sgl_probe.duration_ms": duration_ms,
        "sgl_probe.timer": timer_kind,
        "sgl_probe.host_ms": (ph.host1 - ph.host0) / 1e6,
        "sgl_probe.target": ph.target,
        "sglang.phase": ph.phase,
        "sglang.step_index": step_index,
        "sglang.cuda_graph": graph_used(ph),
    }
    _put(attrs, "sglang.forward_mode", ph.mode)
    _put(attrs, "sglang.batch_size", ph.batch_size)
    _put(attrs, "sglang.num_tokens", ph.num_tokens)
    attrs.update(rank_attributes(ident))
    if ph.phase == "verify":
        _put(attrs, "sglang.spec.accept_length", ph.accept_length)
    if ph.phase in ("draft", "verify", "draft_extend"):
        for key in ("algorithm", "num_steps", "topk", "num_draft_tokens"):
            _put(attrs, "sglang.spec." + key, spec.get(key))
    return attrs


def step_trace_id(run_id: str, ident: dict, index: int) -> int:
    """Every rank of a data-parallel replica puts step ``index`` in the same trace."""
    return derived_trace_id(run_id, "dp%s" % ident.get("dp_rank", 0), "step", index)


def build_step_spans(st: StepRecord, timer: Any, run_id: str, ident: dict, spec: dict,
                     resource: Any) -> tuple[int, list[ReadableSpan]]:
    """All spans of one scheduler step: the ``sglang.step`` parent first, then its phases."""
    trace_id = step_trace_id(run_id, ident, st.index)
    step_ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
    children: list[ReadableSpan] = []
    lo = timer.wall(st.host0)
    hi = timer.wall(st.host1)
    for ph in st.phases:
        if ph.t_end is None:
            continue
        t0, t1 = timer.interval(ph.t_start, ph.t_end)
        lo, hi = min(lo, t0), max(hi, t1)
        ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
        children.append(ReadableSpan(
            name="sglang." + ph.phase, context=ctx, parent=step_ctx, resource=resource,
            attributes=phase_attributes(ph, timer.kind, (t1 - t0) / 1e6, ident, spec, st.index),
            events=_error_events(ph.error, t1), kind=SpanKind.INTERNAL, status=_status(ph.error),
            start_time=t0, end_time=t1, instrumentation_scope=SCOPE))
    step_attrs = {
        "sglang.step_index": st.index,
        "sgl_probe.timer": timer.kind,
        "sgl_probe.host_ms": (st.host1 - st.host0) / 1e6,
        "sgl_probe.duration_ms": (hi - lo) / 1e6,
        "sglang.cuda_graph": any(c.attributes["sglang.cuda_graph"] for c in children),
    }
    _put(step_attrs, "sglang.forward_mode", st.mode)
    _put(step_attrs, "sglang.batch_size", st.batch_size)
    _put(step_attrs, "sglang.num_tokens", st.num_tokens)
    step_attrs.update(rank_attributes(ident))
    step_span = ReadableSpan(
        name="sglang.step", context=step_ctx, parent=None, resource=resource, attributes=step_attrs,
        events=_error_events(st.error, hi), kind=SpanKind.INTERNAL, status=_status(st.error),
        start_time=lo, end_time=hi, instrumentation_scope=SCOPE)
    return trace_id, [step_span, *children]


def build_env_span(attrs: dict, when_ns: int, run_id: str, ident: dict, resource: Any,
                   name: str = "sgl_probe.env_snapshot") -> ReadableSpan:
    """Every process of a run puts its snapshots in one trace, so Jaeger shows them together."""
    trace_id = derived_trace_id(run_id, "env")
    ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
    full = dict(attrs)
    full.update(rank_attributes(ident))
    return ReadableSpan(
        name=name, context=ctx, parent=None, resource=resource, attributes=full,
        kind=SpanKind.INTERNAL, start_time=when_ns, end_time=when_ns,
        instrumentation_scope=SCOPE)
