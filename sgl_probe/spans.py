"""The span contract: resolved steps -> OpenTelemetry spans.

Names and attribute keys come from :mod:`sgl_probe.contract`; they are what the report command,
the pytest plugin and users' Jaeger queries rely on (README lists them). Spans are built as SDK
``ReadableSpan`` objects with explicit ids and times (the GPU interval, not the host call), then
handed to span processors. Nothing here needs the timer or CUDA: the input is plain data, so this
runs wherever the spans are exported (the exporter process).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable, Optional

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from sgl_probe import __version__, contract as C
from sgl_probe.resolved import ResolvedPhase, ResolvedStep

SCOPE = InstrumentationScope("sgl_probe", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_rand = random.Random()
_UNSET = Status(StatusCode.UNSET)
_SPEC_KEYS = tuple((key, C.SPEC_PREFIX + key) for key in C.SPEC_SETTINGS)
_RANK_KEYS = tuple((key, C.SPAN_PREFIX + key) for key in C.RANKS)


def derived_trace_id(run_id: str, *parts: object) -> int:
    """Same run id + same step index -> same trace id in every rank's process."""
    key = "/".join([run_id, *map(str, parts)]).encode()
    return _trace_id(hashlib.blake2b(key, digest_size=16))


def _trace_id(h: Any) -> int:
    return int.from_bytes(h.digest(), "big") or 1


def new_span_id() -> int:
    return _rand.getrandbits(64) or 1


def _step_parts(ident: dict) -> tuple:
    return ("dp%s" % ident.get("dp_rank", 0), "step")


def step_trace_id(run_id: str, ident: dict, index: int) -> int:
    """Every rank of a data-parallel replica puts step ``index`` in the same trace."""
    return derived_trace_id(run_id, *_step_parts(ident), index)


def step_trace_prefix(run_id: str, ident: dict) -> bytes:
    """What every :func:`step_trace_id` key of one run and replica starts with (the index follows)."""
    return ("/".join([run_id, *_step_parts(ident)]) + "/").encode()


def step_trace_ids(run_id: str, ident: dict) -> Callable[[int], int]:
    """:func:`step_trace_id` of one run and replica as a function of the index, the key's common
    prefix hashed once (blake2b streams: its state plus the index is the whole key's hash), for
    the drain thread, which derives one per step when a sampler decides."""
    prefix = hashlib.blake2b(step_trace_prefix(run_id, ident), digest_size=16)

    def trace_id(index: int) -> int:
        h = prefix.copy()
        h.update(str(index).encode())
        return _trace_id(h)

    return trace_id


def _status(error: Optional[str]) -> Status:
    return _UNSET if error is None else Status(StatusCode.ERROR, error)


def _error_events(error: Optional[str], when: int) -> tuple:
    if error is None:
        return ()
    kind, _, message = error.partition(": ")
    return (Event("exception", {"exception.type": kind, "exception.message": message}, timestamp=when),)


def rank_attributes(ident: dict) -> dict:
    return {span_key: ident[key] for key, span_key in _RANK_KEYS if ident.get(key) is not None}


def _batch_attributes(attrs: dict, rec: Any) -> None:
    """Forward mode, batch size and tokens of a step or phase, where known."""
    if rec.mode is not None:
        attrs[C.FORWARD_MODE] = rec.mode
    if rec.batch_size is not None:
        attrs[C.BATCH_SIZE] = rec.batch_size
    if rec.num_tokens is not None:
        attrs[C.NUM_TOKENS] = rec.num_tokens


def phase_attributes(ph: ResolvedPhase, timer_kind: str, ranks: dict, spec: dict, step_index: int) -> dict:
    attrs = {
        C.DURATION_MS: (ph.end_ns - ph.start_ns) / 1e6,
        C.TIMER: timer_kind,
        C.HOST_MS: ph.host_ms,
        C.TARGET: ph.target,
        C.PHASE: ph.phase,
        C.STEP_INDEX: step_index,
        C.CUDA_GRAPH: ph.graph,
    }
    _batch_attributes(attrs, ph)
    if ph.start_kind is not None:
        attrs[C.START] = ph.start_kind
    if ph.graph_ms is not None:
        attrs[C.GRAPH_MS] = ph.graph_ms
    if ph.no_graph_reason is not None and not ph.graph:
        attrs[C.NO_GRAPH_REASON] = ph.no_graph_reason
    attrs.update(ranks)
    if ph.phase == "verify" and ph.accept_length is not None:
        attrs[C.ACCEPT_LENGTH] = ph.accept_length
    if ph.phase in C.SPEC_PHASES:
        for key, span_key in _SPEC_KEYS:
            if spec.get(key) is not None:
                attrs[span_key] = spec[key]
    return attrs


def build_step_spans(step: ResolvedStep, run_id: str, ident: dict, spec: dict, resource: Any,
                     extra: Optional[dict] = None) -> list[ReadableSpan]:
    """All spans of one scheduler step: the ``sglang.step`` parent first, then its phases.
    ``extra`` adds attributes to the step span (e.g. why a sampled-out step was kept)."""
    trace_id = step_trace_id(run_id, ident, step.index)
    step_ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
    ranks = rank_attributes(ident)
    spans: list[ReadableSpan] = [None]  # type: ignore[list-item]  # the parent, filled in below
    for ph in step.phases:
        ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
        spans.append(ReadableSpan(
            name=C.phase_span(ph.phase), context=ctx, parent=step_ctx, resource=resource,
            attributes=phase_attributes(ph, step.timer, ranks, spec, step.index),
            events=_error_events(ph.error, ph.end_ns), kind=SpanKind.INTERNAL, status=_status(ph.error),
            start_time=ph.start_ns, end_time=ph.end_ns, instrumentation_scope=SCOPE))
    step_attrs = {
        C.STEP_INDEX: step.index,
        C.TIMER: step.timer,
        C.HOST_MS: step.host_ms,
        C.DURATION_MS: (step.end_ns - step.start_ns) / 1e6,
        C.CUDA_GRAPH: any(ph.graph for ph in step.phases),
    }
    _batch_attributes(step_attrs, step)
    step_attrs.update(ranks)
    if extra:
        step_attrs.update(extra)
    spans[0] = ReadableSpan(
        name=C.STEP_SPAN, context=step_ctx, parent=None, resource=resource, attributes=step_attrs,
        events=_error_events(step.error, step.end_ns), kind=SpanKind.INTERNAL, status=_status(step.error),
        start_time=step.start_ns, end_time=step.end_ns, instrumentation_scope=SCOPE)
    return spans


def build_env_span(attrs: dict, when_ns: int, run_id: str, ident: dict, resource: Any,
                   name: str = C.ENV_SPAN) -> ReadableSpan:
    """Every process of a run puts its snapshots (and other once-per-process spans, ``name``) in
    one trace, so Jaeger shows them together."""
    trace_id = derived_trace_id(run_id, "env")
    ctx = SpanContext(trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED)
    full = dict(attrs)
    full.update(rank_attributes(ident))
    return ReadableSpan(
        name=name, context=ctx, parent=None, resource=resource, attributes=full,
        kind=SpanKind.INTERNAL, start_time=when_ns, end_time=when_ns, instrumentation_scope=SCOPE)
