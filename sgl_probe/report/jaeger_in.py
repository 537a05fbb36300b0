"""Jaeger's query-API JSON (``{"data": [{"traceID", "spans", "processes"}]}``): the shape of
``GET /api/traces`` and of the files Jaeger UI downloads and uploads.

Jaeger's translation of OTLP is undone here: ``span.kind``, ``otel.status_code``, ``error`` and
``otel.scope.*`` tags go back to span fields, the rest are the span's attributes; process tags
(plus ``serviceName``) are the resource.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

from sgl_probe.report.model import Problems, Resource, Span, contract_problem

#: Tags Jaeger adds when it translates OTLP spans; they are span fields, not attributes.
SPECIAL_TAGS = ("span.kind", "otel.status_code", "otel.status_description", "error",
                "otel.scope.name", "otel.scope.version", "otel.library.name", "otel.library.version",
                "internal.span.format")


def tag_value(tag: dict) -> Any:
    typ = str(tag.get("type", "string")).lower()
    val = tag.get("value")
    if typ in ("int64", "int"):
        return int(val)
    if typ in ("float64", "float"):
        return float(val)
    if typ == "bool":
        return val if isinstance(val, bool) else str(val).lower() == "true"
    return val


def tags(items) -> dict:
    return {t["key"]: tag_value(t) for t in items or ()}


def _pad(value: Any, nchars: int) -> str:
    s = str(value or "").lower()
    return s.rjust(nchars, "0") if s else ""


def spans_of_document(doc: Any, path: str, problems: Problems) -> Iterator[Span]:
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        problems.add(path, None, "wrong-shape", "not Jaeger query-API JSON (no \"data\" list)")
        return
    for err in doc.get("errors") or ():
        problems.add(path, None, "jaeger-error", f"Jaeger reported: {err}")
    for ti, trace in enumerate(doc["data"]):
        where = f"trace[{ti}]"
        if not isinstance(trace, dict):
            problems.add(path, where, "wrong-shape", "trace is not an object; skipped")
            continue
        proc_attrs: dict[str, dict] = {}
        proc_res: dict[Any, Resource] = {}
        for pid, proc in (trace.get("processes") or {}).items():
            attrs = tags(proc.get("tags"))
            attrs.setdefault("service.name", proc.get("serviceName"))
            proc_attrs[pid] = attrs
        for si, sp in enumerate(trace.get("spans") or ()):
            try:
                t = tags(sp.get("tags"))
                pid = sp.get("processID")
                res_attrs = proc_attrs.get(pid)
                if res_attrs is None:  # old Jaeger JSON: the process inline in each span
                    res_attrs = tags((sp.get("process") or {}).get("tags"))
                    res_attrs.setdefault("service.name", (sp.get("process") or {}).get("serviceName"))
                scope = t.get("otel.scope.name") or t.get("otel.library.name") or ""
                why = contract_problem(res_attrs, scope)
                if why is not None:
                    problems.add(path, f"{where}.spans[{si}]", "unknown-version", f"{why}; span skipped")
                    continue
                res = proc_res.get(pid) if pid in proc_attrs else None
                if res is None:
                    res = Resource(res_attrs)
                    if pid in proc_attrs:
                        proc_res[pid] = res
                parent = ""
                for ref in sp.get("references") or ():
                    if ref.get("refType", "CHILD_OF") == "CHILD_OF":
                        parent = _pad(ref.get("spanID"), 16)
                        break
                start = int(sp["startTime"]) * 1000
                status = str(t.get("otel.status_code", "")).upper()
                error = status == "ERROR" or t.get("error") is True
                events = tuple((int(lg.get("timestamp", 0)) * 1000,
                                str(tags(lg.get("fields")).get("event", "")),
                                {k: v for k, v in tags(lg.get("fields")).items() if k != "event"})
                               for lg in sp.get("logs") or ())
                attrs = {k: v for k, v in t.items() if k not in SPECIAL_TAGS}
                yield Span(sp["operationName"], _pad(sp.get("traceID") or trace.get("traceID"), 32),
                           _pad(sp["spanID"], 16), parent, start, start + int(sp.get("duration", 0)) * 1000,
                           attrs, res, error, str(t.get("otel.status_description", "")), events,
                           str(t.get("span.kind", "internal")), scope, str(t.get("otel.scope.version", "")))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                problems.add(path, f"{where}.spans[{si}]", "bad-span",
                             f"span not in Jaeger JSON shape ({exc!r}); skipped")


def parse_lookback(text: str) -> int:
    """``90s``, ``30m``, ``2h``, ``1d`` -> seconds."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text))


def query_url(base: str, service: str, limit: int, lookback_s: int, now_s: float | None = None) -> str:
    now_us = int((time.time() if now_s is None else now_s) * 1e6)
    params = {"service": service, "limit": str(limit), "start": str(now_us - lookback_s * 1_000_000),
              "end": str(now_us)}
    return base.rstrip("/") + "/api/traces?" + urllib.parse.urlencode(params)


def fetch(base: str, service: str, limit: int, lookback_s: int, problems: Problems,
          timeout_s: float = 60.0) -> Iterator[Span]:
    """Traces of ``service`` from a Jaeger query service (``/api/traces``, Jaeger's internal HTTP
    API: fine for this, not a stability contract)."""
    url = query_url(base, service, limit, lookback_s)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            doc = json.load(resp)
    except urllib.error.HTTPError as exc:
        problems.add(url, None, "jaeger-http", f"Jaeger answered HTTP {exc.code} {exc.reason}")
        return
    except (urllib.error.URLError, OSError) as exc:
        problems.add(url, None, "jaeger-http", f"cannot reach Jaeger: {getattr(exc, 'reason', exc)}")
        return
    except ValueError as exc:
        problems.add(url, None, "jaeger-http", f"Jaeger's answer is not JSON ({exc})")
        return
    if isinstance(doc, dict) and not doc.get("data") and not doc.get("errors"):
        problems.add(url, None, "jaeger-empty",
                     f"no traces of service {service!r} in the last {lookback_s}s (check --service, --lookback)")
    yield from spans_of_document(doc, url, problems)
