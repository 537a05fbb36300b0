"""Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing): one process per rank,
one thread (track) per phase, plus the scheduler step; complete ("X") events at the measured
interval, named ``verify · no graph`` / ``verify · graph`` so eager and graph calls get different
colours; env snapshots as instant events. Times are microseconds from the earliest span."""

from __future__ import annotations

import json
from typing import Callable, Iterable

from sgl_probe.contract import CUDA_GRAPH, FINGERPRINT_SPAN, PHASES, SNAPSHOT_POINT
from sgl_probe.report.model import ENV, PHASE_NAMES, STEP, Span

TRACKS = ("step", *PHASES, "other")


def _args(span: Span) -> dict:
    args = {k: v for k, v in span.attrs.items() if not isinstance(v, (list, dict))}
    args["trace_id"] = span.trace_id
    args["span_id"] = span.span_id
    if span.error:
        args["error"] = span.status_message or True
    return args


def events(spans: Iterable[Span], rank_of: Callable[[Span], tuple], label: Callable[[tuple], str],
           sort_key: Callable[[tuple], tuple]) -> dict:
    spans = list(spans)
    base = min((s.start_ns for s in spans if s.start_ns), default=0)
    ranks: dict[tuple, int] = {}
    for r in sorted({rank_of(s) for s in spans}, key=sort_key):
        ranks[r] = len(ranks) + 1
    used: set[tuple[int, int]] = set()
    out: list[dict] = []
    for s in spans:
        pid = ranks[rank_of(s)]  # tids count from 1: 0 is special to some viewers
        ts = round((s.start_ns - base) / 1000, 3)
        phase = PHASE_NAMES.get(s.name)
        if s.name in (ENV, FINGERPRINT_SPAN):
            tid = 1
            what = "run fingerprint" if s.name == FINGERPRINT_SPAN else \
                f"env snapshot: {s.attrs.get(SNAPSHOT_POINT)}"
            out.append({"ph": "i", "s": "p", "name": what,
                        "cat": "sgl_probe.env", "pid": pid, "tid": tid, "ts": ts, "args": _args(s)})
            used.add((pid, tid))
            continue
        if s.name == STEP:
            tid, name = 1, "step"
        elif phase is not None:
            tid = TRACKS.index(phase) + 1
            name = f"{phase} · {'graph' if s.attrs.get(CUDA_GRAPH) is True else 'no graph'}"
        else:
            tid, name = len(TRACKS), s.name
        used.add((pid, tid))
        out.append({"ph": "X", "name": name, "cat": "sgl_probe", "pid": pid, "tid": tid, "ts": ts,
                    "dur": round(max(0, s.end_ns - s.start_ns) / 1000, 3), "args": _args(s)})
    meta: list[dict] = []
    for r, pid in ranks.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label(r)}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for pid, tid in sorted(used):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": TRACKS[tid - 1]}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    out.sort(key=lambda e: e["ts"])
    return {"traceEvents": meta + out, "displayTimeUnit": "ms",
            "otherData": {"generator": "sgl-probe report", "time_base_unix_ns": base}}


def write(path: str, spans: Iterable[Span], rank_of, label, sort_key) -> int:
    doc = events(spans, rank_of, label, sort_key)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return sum(1 for e in doc["traceEvents"] if e["ph"] != "M")
