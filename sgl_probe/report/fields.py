"""The few span attributes the aggregation reads, from either shape a span comes in: raw OTLP
``AnyValue`` dicts (trace files; read inline, the hot loop of a big report) or decoded attribute
dicts (Jaeger). Anything in an unexpected shape is decoded generically or read as absent; keys
this report does not know are never looked at."""

from __future__ import annotations

import math
from typing import Any, Optional

from sgl_probe.contract import (ACCEPT_LENGTH, BATCH_SIZE, CUDA_GRAPH, DURATION_MS, FORWARD_MODE, GRAPH_MS,
                                NO_GRAPH_REASON, NUM_TOKENS, RANKS, SPAN_PREFIX, START, STEP_INDEX, TIMER)
from sgl_probe.report.anyvalue import any_value
from sgl_probe.report.model import Span

TP, DP, PP = (SPAN_PREFIX + r for r in RANKS)


def num(x: Any) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def integer(x: Any) -> Optional[int]:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return None


def _text(x: Any) -> Optional[str]:
    return x if isinstance(x, str) else None


def _raw_value(v: Any, kind: str) -> Any:
    """The value of an OTLP ``AnyValue`` dict expected to hold ``kind``; any other shape is
    decoded generically."""
    if not v:
        return None
    x = v.get(kind) if type(v) is dict else None
    if x is None:
        return any_value(v)
    return x


def _raw_int(v: Any) -> Optional[int]:
    if not v:
        return None
    x = v.get("intValue") if type(v) is dict else None
    if type(x) is str:
        try:
            return int(x)
        except ValueError:
            return None
    return integer(_raw_value(v, "intValue"))


def _raw_str(v: Any) -> Optional[str]:
    if not v:
        return None
    x = v.get("stringValue") if type(v) is dict else None
    return x if type(x) is str else _text(_raw_value(v, "stringValue"))


def _ikey(v: Any) -> Any:
    """A hashable stand-in for a raw rank value (only ever a cache key)."""
    if not v or type(v) is not dict:
        return None
    x = v.get("intValue")
    return x if type(x) is str else repr(v)


def span_value(span: Span, key: str, kind: str) -> Any:
    raw = span.raw
    if raw is not None:
        return _raw_value(raw.get(key), kind)
    return span.attrs.get(key)


def accept_length(span: Span) -> Optional[float]:
    return num(span_value(span, ACCEPT_LENGTH, "doubleValue"))


def phase_fields(span: Span) -> tuple:
    """(ms, graph, batch size, step index, timer, rank cache key, forward mode, token count,
    start kind, no-graph reason, graph ms) of a phase span. The raw path reads the usual shapes
    inline."""
    raw = span.raw
    if raw is not None:
        get = raw.get
        v = get(DURATION_MS)
        ms = v.get("doubleValue") if type(v) is dict else None
        if ms is None:
            ms = _raw_value(v, "doubleValue")
        v = get(CUDA_GRAPH)
        graph = (v.get("boolValue") if type(v) is dict and "boolValue" in v else _raw_value(v, "boolValue")) is True
        v = get(TIMER)
        timer = v.get("stringValue") if type(v) is dict and "stringValue" in v else _raw_value(v, "stringValue")
        v = get(BATCH_SIZE)
        x = v.get("intValue") if type(v) is dict else None
        bs = int(x) if type(x) is str and x.isdigit() else _raw_int(v)
        v = get(STEP_INDEX)
        x = v.get("intValue") if type(v) is dict else None
        idx = int(x) if type(x) is str and x.isdigit() else _raw_int(v)
        v = get(NUM_TOKENS)
        x = v.get("intValue") if type(v) is dict else None
        ntok = int(x) if type(x) is str and x.isdigit() else _raw_int(v)
        key = (_ikey(get(TP)), _ikey(get(DP)), _ikey(get(PP)))
        v = get(FORWARD_MODE)
        x = v.get("stringValue") if type(v) is dict else None
        mode = x if type(x) is str else (_raw_str(v) if v else None)
        v = get(START)
        x = v.get("stringValue") if type(v) is dict else None
        start = x if type(x) is str else (_raw_str(v) if v else None)
        reason = None
        if not graph:
            v = get(NO_GRAPH_REASON)
            x = v.get("stringValue") if type(v) is dict else None
            reason = x if type(x) is str else (_raw_str(v) if v else None)
            graph_ms = None
        else:
            v = get(GRAPH_MS)
            graph_ms = None if v is None else num(_raw_value(v, "doubleValue"))
        return ms, graph, bs, idx, timer, key, mode, ntok, start, reason, graph_ms
    a = span.attrs
    graph = a.get(CUDA_GRAPH) is True
    return (a.get(DURATION_MS), graph, integer(a.get(BATCH_SIZE)), integer(a.get(STEP_INDEX)), a.get(TIMER),
            (a.get(TP), a.get(DP), a.get(PP)), _text(a.get(FORWARD_MODE)), integer(a.get(NUM_TOKENS)),
            _text(a.get(START)), None if graph else _text(a.get(NO_GRAPH_REASON)),
            num(a.get(GRAPH_MS)) if graph else None)


def step_fields(span: Span) -> tuple:
    """(batch size, step index, rank cache key) of a step span."""
    raw = span.raw
    if raw is not None:
        get = raw.get
        key = (_ikey(get(TP)), _ikey(get(DP)), _ikey(get(PP)))
        return _raw_int(get(BATCH_SIZE)), _raw_int(get(STEP_INDEX)), key
    a = span.attrs
    return integer(a.get(BATCH_SIZE)), integer(a.get(STEP_INDEX)), (a.get(TP), a.get(DP), a.get(PP))
