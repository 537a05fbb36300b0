"""Spans as the report sees them, whatever file format they came from, and input problems."""

from __future__ import annotations

from typing import Any, Optional

from sgl_probe import __version__
from sgl_probe.contract import ENV_SPAN, PHASES, PROBE_VERSION, STEP_SPAN, phase_span
from sgl_probe.report.anyvalue import any_value

#: ``sgl_probe.version`` major.minor releases whose span contract (README "The span contract")
#: this report reads. Spans from any other release are skipped with a message naming the file.
KNOWN_CONTRACTS = ("0.1",)

PHASE_NAMES = {phase_span(p): p for p in PHASES}
STEP = STEP_SPAN
ENV = ENV_SPAN


class Resource:
    """Who emitted a group of spans (one OTLP ``resource`` or one Jaeger process)."""

    __slots__ = ("attrs", "service", "key", "rank_cache")

    def __init__(self, attrs: dict, service: Optional[str] = None) -> None:
        self.attrs = attrs
        self.rank_cache: dict = {}  # the aggregator's rank keys for spans of this resource
        self.service = service or attrs.get("service.name") or "unknown"
        self.key = (self.service, tuple(sorted((k, repr(v)) for k, v in attrs.items()
                                               if k != "service.instance.id")))


class Span:
    """One span. ``attrs`` is the decoded attribute dict; spans read from OTLP/JSON carry ``raw``
    (attribute key -> OTLP ``AnyValue`` dict) and decode it only when ``attrs`` is first asked
    for: the aggregation reads the few values it needs straight from ``raw`` (see
    :mod:`sgl_probe.report.aggregate`), which is most of a million-span report's time saved."""

    __slots__ = ("name", "trace_id", "span_id", "parent_id", "start_ns", "end_ns", "_attrs", "raw",
                 "resource", "error", "status_message", "events", "kind", "scope", "scope_version")

    def __init__(self, name: str, trace_id: str, span_id: str, parent_id: str, start_ns: int,
                 end_ns: int, attrs: Optional[dict], resource: Resource, error: bool = False,
                 status_message: str = "", events: tuple = (), kind: str = "internal",
                 scope: str = "", scope_version: str = "", raw: Optional[dict] = None) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.start_ns = start_ns
        self.end_ns = end_ns
        self._attrs = attrs
        self.raw = raw
        self.resource = resource
        self.error = error
        self.status_message = status_message
        self.events = events  # ((time_ns, name, attrs), ...)
        self.kind = kind
        self.scope = scope
        self.scope_version = scope_version

    @property
    def attrs(self) -> dict:
        if self._attrs is None:
            self._attrs = {k: any_value(v) if v else None for k, v in (self.raw or {}).items()}
        return self._attrs

    def attr(self, key: str, default: Any = None) -> Any:
        """A span attribute, falling back to the resource (ranks live in both)."""
        val = self.attrs.get(key)
        if val is None:
            val = self.resource.attrs.get(key, default)
        return val


def contract_problem(resource_attrs: dict, scope: str) -> Optional[str]:
    """Why spans of this resource cannot be read with this report's contract, or None."""
    version = resource_attrs.get(PROBE_VERSION)
    if version is None:
        if scope == "sgl_probe":
            return None  # stripped resource (e.g. a collector dropped it): the scope still says ours
        return (f"not sgl-probe spans (service {resource_attrs.get('service.name', '?')!r}, "
                f"scope {scope or '?'!r}, no sgl_probe.version)")
    mm = ".".join(str(version).split(".")[:2])
    if mm not in KNOWN_CONTRACTS:
        return (f"spans from sgl-probe {version}, whose span contract this report "
                f"(sgl-probe {__version__}, knows {', '.join(KNOWN_CONTRACTS)}.x) does not know")
    return None


class Problems:
    """Input problems, each naming its file and line; repeated kinds per file are counted, not
    listed (a 1 GB file of bad lines must not become a 1 GB error report)."""

    SHOWN_PER_KIND = 3

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._seen: dict[tuple[str, str], int] = {}

    def add(self, path: str, where: Optional[str], kind: str, message: str) -> None:
        key = (path, kind)
        n = self._seen.get(key, 0) + 1
        self._seen[key] = n
        if n <= self.SHOWN_PER_KIND:
            self.items.append({"file": path, "where": where, "kind": kind, "message": message})

    def merge(self, other: "Problems", line_offset: int = 0) -> None:
        """Fold in a chunk's problems; its line numbers count from the chunk's first line."""
        listed: dict[tuple[str, str], int] = {}
        for it in other.items:
            key = (it["file"], it["kind"])
            listed[key] = listed.get(key, 0) + 1
            where = it["where"]
            if line_offset and where is not None and where.isdigit():
                where = str(int(where) + line_offset)
            self.add(it["file"], where, it["kind"], it["message"])
        for key, n in other._seen.items():  # counted but not listed there
            rest = n - listed.get(key, 0)
            if rest > 0:
                self._seen[key] = self._seen.get(key, 0) + rest

    def more(self) -> list[dict]:
        """(file, kind, how many were not listed)."""
        return [{"file": p, "kind": k, "not_listed": n - self.SHOWN_PER_KIND}
                for (p, k), n in self._seen.items() if n > self.SHOWN_PER_KIND]

    def count(self) -> int:
        return sum(self._seen.values())

    def lines(self) -> list[str]:
        out = []
        for it in self.items:
            loc = it["file"] + (f":{it['where']}" if it["where"] else "")
            out.append(f"{loc}: {it['message']}")
        for m in self.more():
            out.append(f"{m['file']}: ... and {m['not_listed']} more {m['kind']} problems")
        return out

    def __bool__(self) -> bool:
        return bool(self._seen)
