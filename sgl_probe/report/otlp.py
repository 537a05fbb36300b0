"""OTLP/JSON: the ``SGL_PROBE_TRACE_DIR`` files (one ``ExportTraceServiceRequest`` per line, ids in
hex) and single OTLP/JSON documents (what collectors' file exporters and Jaeger UI take).

Streams: one line is parsed at a time, so a file of any size costs one line's worth of memory.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Iterable, Iterator

from sgl_probe.report.anyvalue import attributes, raw_attributes
from sgl_probe.report.model import Problems, Resource, Span, contract_problem

_KINDS = {"SPAN_KIND_INTERNAL": "internal", "SPAN_KIND_SERVER": "server", "SPAN_KIND_CLIENT": "client",
          "SPAN_KIND_PRODUCER": "producer", "SPAN_KIND_CONSUMER": "consumer", 1: "internal",
          2: "server", 3: "client", 4: "producer", 5: "consumer"}


def hex_id(value: Any, nbytes: int) -> str:
    """OTLP/JSON ids are hex; proto3 JSON (``MessageToDict`` defaults) writes base64."""
    if not value:
        return ""
    s = str(value)
    if len(s) == 2 * nbytes:
        return s.lower()
    try:
        raw = base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return s.lower()
    return raw.hex() if len(raw) == nbytes else s.lower()


def _events(sp: dict) -> tuple:
    evs = sp.get("events")
    if not evs:
        return ()
    return tuple((int(e.get("timeUnixNano") or 0), e.get("name", ""), attributes(e.get("attributes")))
                 for e in evs)


def spans_of_request(msg: dict, path: str, where: str, problems: Problems) -> Iterator[Span]:
    """Spans of one ``ExportTraceServiceRequest`` (a dict with ``resourceSpans``)."""
    for rs in msg.get("resourceSpans") or ():
        res_attrs = attributes((rs.get("resource") or {}).get("attributes"))
        resource = None
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or {}
            scope_name = scope.get("name", "")
            why = contract_problem(res_attrs, scope_name)
            spans = ss.get("spans") or ()
            if why is not None:
                if spans:
                    problems.add(path, where, "unknown-version", f"{why}; {len(spans)} spans skipped")
                continue
            if resource is None:
                resource = Resource(res_attrs)
            scope_version = scope.get("version", "")
            for sp in spans:
                try:
                    status = sp.get("status")
                    if status:
                        error = status.get("code") in ("STATUS_CODE_ERROR", 2)
                        message = status.get("message", "")
                    else:
                        error, message = False, ""
                    tid = sp.get("traceId", "")
                    sid = sp.get("spanId", "")
                    pid = sp.get("parentSpanId", "")
                    yield Span(
                        sp["name"], tid if len(tid) == 32 else hex_id(tid, 16),
                        sid if len(sid) == 16 else hex_id(sid, 8), pid if not pid or len(pid) == 16 else hex_id(pid, 8),
                        int(sp.get("startTimeUnixNano") or 0), int(sp.get("endTimeUnixNano") or 0), None,
                        resource, error, message, _events(sp) if "events" in sp else (),
                        _KINDS.get(sp.get("kind"), "internal"), scope_name, scope_version,
                        raw_attributes(sp.get("attributes")))
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    problems.add(path, where, "bad-span", f"span not in OTLP/JSON shape ({exc!r}); skipped")


def read_lines(fh: Iterable, path: str, problems: Problems, start_line: int = 1) -> Iterator[Span]:
    """OTLP/JSON lines (``str`` or ``bytes``). A bad line (truncated by a killed process, not
    JSON, not a request) costs that line only."""
    lineno = start_line - 1
    loads = json.loads
    for line in fh:
        lineno += 1
        try:
            msg = loads(line)
        except ValueError as exc:
            if not line.strip():
                continue
            if isinstance(line, bytes):
                line = line.decode("utf-8", "replace")
            detail = getattr(exc, "msg", str(exc))
            col = getattr(exc, "colno", None)
            truncated = not line.endswith("\n") or (col is not None and col >= len(line.rstrip("\n")))
            what = "truncated JSON" if truncated else "invalid JSON"
            where_col = f" at column {col}" if col else ""
            problems.add(path, str(lineno), "bad-json", f"{what}{where_col} ({detail}); line skipped")
            continue
        if not isinstance(msg, dict) or "resourceSpans" not in msg:
            problems.add(path, str(lineno), "wrong-shape",
                         "valid JSON but not an OTLP ExportTraceServiceRequest (no resourceSpans); "
                         "line skipped")
            continue
        yield from spans_of_request(msg, path, str(lineno), problems)
