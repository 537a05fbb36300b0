"""Jaeger query-API JSON (``GET /api/traces``): what Jaeger UI's "JSON File" upload accepts, so a
run can be browsed in Jaeger without a collector. OTLP fields map the way Jaeger's own OTLP
translator maps them (``span.kind``, ``otel.status_code``, ``error``, ``otel.scope.*`` tags; array
attributes as JSON strings; times in microseconds)."""

from __future__ import annotations

import json
from typing import Any, Iterable

from sgl_probe.report.model import Span


def tag(key: str, value: Any) -> dict:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, (list, dict)):
        return {"key": key, "type": "string", "value": json.dumps(value, separators=(",", ":"))}
    return {"key": key, "type": "string", "value": "" if value is None else str(value)}


def span_dict(span: Span, process_id: str) -> dict:
    tags = [tag(k, v) for k, v in span.attrs.items()]
    tags.append(tag("span.kind", span.kind or "internal"))
    if span.scope:
        tags.append(tag("otel.scope.name", span.scope))
    if span.scope_version:
        tags.append(tag("otel.scope.version", span.scope_version))
    if span.error:
        tags.append(tag("otel.status_code", "ERROR"))
        tags.append(tag("error", True))
        if span.status_message:
            tags.append(tag("otel.status_description", span.status_message))
    refs = ([{"refType": "CHILD_OF", "traceID": span.trace_id, "spanID": span.parent_id}]
            if span.parent_id else [])
    logs = [{"timestamp": t // 1000, "fields": [tag("event", name)] + [tag(k, v) for k, v in attrs.items()]}
            for t, name, attrs in span.events]
    return {"traceID": span.trace_id, "spanID": span.span_id, "operationName": span.name,
            "references": refs, "startTime": span.start_ns // 1000,
            "duration": max(0, span.end_ns - span.start_ns) // 1000, "tags": tags, "logs": logs,
            "processID": process_id, "warnings": None, "flags": 1}


def trace_dict(trace_id: str, spans: list[Span]) -> dict:
    processes: dict[str, dict] = {}
    ids: dict[tuple, str] = {}
    out = []
    for span in sorted(spans, key=lambda s: (s.start_ns, s.parent_id != "")):
        res = span.resource
        pid = ids.get(res.key)
        if pid is None:
            pid = ids[res.key] = f"p{len(ids) + 1}"
            processes[pid] = {"serviceName": res.service,
                              "tags": [tag(k, v) for k, v in res.attrs.items() if k != "service.name"]}
        out.append(span_dict(span, pid))
    return {"traceID": trace_id, "spans": out, "processes": processes, "warnings": None}


def document(traces: Iterable[tuple[str, list[Span]]]) -> dict:
    data = [trace_dict(tid, spans) for tid, spans in traces]
    data.sort(key=lambda t: min((s["startTime"] for s in t["spans"]), default=0))
    return {"data": data, "total": 0, "limit": 0, "offset": 0, "errors": None}


def write(path: str, traces: Iterable[tuple[str, list[Span]]]) -> int:
    doc = document(traces)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return len(doc["data"])
