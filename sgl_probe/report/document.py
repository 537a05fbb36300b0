"""The whole report as one JSON-able dict (``--json`` prints it; the text renderer reads it)."""

from __future__ import annotations

import itertools
import math
from typing import Optional

from sgl_probe.contract import PHASES
from sgl_probe.report import speculative, stragglers
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.model import Problems
from sgl_probe.stats import WARMUP_RULE, bucket_order, describe, median

SCHEMA = 1


def _clean(x):
    """NaN/inf are not JSON: None instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _phase_order(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def phase_rows(agg: Aggregator, by_rank: bool, by_bs: bool) -> list[dict]:
    merged: dict[tuple, list] = {}
    warm: dict[tuple, list] = {}
    for groups, into in ((agg.groups, merged), (agg.warmup_groups, warm)):
        for (phase, graph, b, rank), arr in groups.items():
            key = (phase, graph, rank if by_rank else None, b if by_bs else None)
            into.setdefault(key, []).append(arr)
            if into is warm:
                merged.setdefault(key, [])
    total_all = agg.step_total_ms()
    rows = []
    for (phase, graph, rank, b), arrs in merged.items():
        d = describe(itertools.chain.from_iterable(arrs))
        w = warm.get((phase, graph, rank, b), ())
        total = agg.step_total_ms(rank) if by_rank else total_all
        row = {"phase": phase, "cuda_graph": graph}
        if by_rank:
            row["rank"] = agg.label(rank)
            row["_rank"] = rank
        if by_bs:
            row["bs"] = b
        row.update(d)
        row["warmup_calls"] = sum(len(a) for a in w)
        row["warmup_ms"] = math.fsum(math.fsum(a) for a in w)
        row["share_of_step_time"] = d["sum_ms"] / total if total > 0 else None
        rows.append(row)
    rows.sort(key=lambda r: (_phase_order(r["phase"]), not r["cuda_graph"],
                             bucket_order(r.get("bs", "1")),
                             agg.rank_sort_key(r["_rank"]) if by_rank else ()))
    if by_rank:  # flag the slowest rank of each (phase, graph[, bs]) when several ranks ran it
        peers: dict[tuple, list] = {}
        for r in rows:
            peers.setdefault((r["phase"], r["cuda_graph"], r.get("bs")), []).append(r)
        for group in peers.values():
            for r in group:
                r["slowest"] = False
            group = [r for r in group if r["count"]]
            if len(group) > 1:
                top = max(group, key=lambda r: r["mean_ms"])
                fastest = min(r["mean_ms"] for r in group)
                top["slowest"] = True
                top["slower_than_fastest"] = (top["mean_ms"] - fastest) / fastest if fastest > 0 else 0.0
        for r in rows:
            del r["_rank"]
    return rows


def step_rows(agg: Aggregator, by_rank: bool) -> list[dict]:
    if by_rank:
        out = []
        for rank in sorted(agg.step_ms, key=agg.rank_sort_key):
            out.append({"rank": agg.label(rank), **describe(agg.step_ms[rank])})
        return out
    if not any(agg.step_ms.values()):
        return []
    return [describe(itertools.chain.from_iterable(agg.step_ms.values()))]


def env_summary(agg: Aggregator) -> Optional[dict]:
    if not agg.env:
        return None
    chosen = {}
    for rank, snaps in agg.env.items():
        best = [s for s in snaps if s["point"] == "nccl_init"] or snaps
        chosen[agg.label(rank)] = best[-1]
    names = sorted({n for s in chosen.values() for n in s["vars"]})
    across = {}
    for n in names:
        vals = {label: s["vars"].get(n) for label, s in chosen.items()}
        if len(set(vals.values())) > 1:
            across[n] = vals
    changed = {}
    for label, s in chosen.items():
        for n in s["differs_from_launcher"]:
            entry = changed.setdefault(n, {"launcher": s["launcher"].get(n), "workers": {}})
            entry["workers"][label] = s["vars"].get(n)
    points = sorted({s["point"] for snaps in agg.env.values() for s in snaps if s["point"]})
    return {"snapshots": sum(len(v) for v in agg.env.values()), "points": points,
            "ranks": sorted(chosen), "variables": len(names),
            "differs_across_ranks": across, "changed_after_launch": changed,
            "withheld": sorted({n for s in chosen.values() for n in s["withheld"]}),
            "per_rank": {label: {"point": s["point"], "vars": s["vars"]} for label, s in chosen.items()}}


ALL = ("by_bs", "by_rank", "stragglers")

NOT_RECORDED = "not recorded"


def graph_usage(agg: Aggregator) -> list[dict]:
    """Per phase: share of calls with a graph, why the others had none (share of the phase's
    calls per ``sglang.no_graph_reason``), and which start the phase's times used (share per
    ``sgl_probe.start``). Every call counts here, warm-up included: graph use is not timing."""
    calls: dict[str, int] = {}
    for groups in (agg.groups, agg.warmup_groups):
        for (phase, _g, _b, _r), arr in groups.items():
            calls[phase] = calls.get(phase, 0) + len(arr)
    out = []
    for phase in sorted(calls, key=_phase_order):
        n = calls[phase]
        if not n:
            continue
        reasons = {(r if r is not None else NOT_RECORDED): k / n for (p, r), k in agg.no_graph.items() if p == phase}
        starts = {s: k / n for (p, s), k in agg.starts.items() if p == phase}
        row = {"phase": phase, "calls": n, "graph": 1.0 - sum(reasons.values()),
               "no_graph_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
               "start": dict(sorted(starts.items(), key=lambda kv: -kv[1])),
               "recorded": bool(starts) or any(r != NOT_RECORDED for r in reasons)}
        launch = agg.graph_launch.get(phase)
        if launch is not None and len(launch[0]):
            # Where a graph phase's time goes: host work before the graph's launch, the graph.
            row["graph_launch"] = {"calls": len(launch[0]), "before_launch_p50_ms": median(launch[1]),
                                   "graph_p50_ms": median(launch[0])}
        out.append(row)
    return out


def rank_gap(agg: Aggregator) -> Optional[dict]:
    """The largest difference between ranks' mean phase times (cheap: no sorting), for the hint
    under the table when ranks are not shown side by side."""
    means: dict[tuple, list] = {}
    for (phase, _g, _b, rank), arr in agg.groups.items():
        m = means.setdefault((phase, rank), [0, 0.0])
        m[0] += len(arr)
        m[1] += math.fsum(arr)
    best = None
    for phase in {p for p, _ in means}:
        per = {r: v[1] / v[0] for (p, r), v in means.items() if p == phase and v[0]}
        if len(per) < 2:
            continue
        slow = max(per, key=per.get)
        fast = min(per.values())
        gap = per[slow] - fast
        if best is None or gap > best["excess_ms"]:
            best = {"phase": phase, "rank": agg.label(slow), "excess_ms": gap,
                    "excess_rel": gap / fast if fast > 0 else 0.0}
    return best


def build(agg: Aggregator, problems: Problems, sources: list[str], baseline: Optional[Aggregator] = None,
          baseline_sources: Optional[list[str]] = None, want: tuple = ALL, by_rank_bs: bool = False) -> dict:
    """``want``: which of the costlier parts (each sorts every duration again) to include."""
    runs = sorted(agg.runs.values(), key=lambda r: r["run_id"])
    doc = {
        "sgl_probe_report": SCHEMA,
        "sources": list(sources),
        "baseline_sources": list(baseline_sources or []),
        "input": {"spans": agg.n_spans, "steps": agg.n_steps, "phase_spans": agg.n_phase_spans,
                  "env_snapshots": sum(len(v) for v in agg.env.values()),
                  "other_span_names": dict(agg.unknown_names), "error_spans": dict(agg.errors),
                  "problems": problems.count()},
        "problems": problems.items,
        "problems_not_listed": problems.more(),
        "runs": runs,
        "ranks": [agg.label(r) for r in sorted(agg.ranks, key=agg.rank_sort_key)],
        "timers": dict(agg.timers),
        "time_range_s": ((agg.t_max - agg.t_min) / 1e9 if agg.t_min is not None and agg.t_max else None),
        "warmup": {"rule": WARMUP_RULE, **agg.warmup()},
        "phases": phase_rows(agg, False, False),
        "phases_by_bs": phase_rows(agg, False, True) if "by_bs" in want else None,
        "phases_by_rank": phase_rows(agg, True, False) if "by_rank" in want else None,
        "steps": step_rows(agg, False),
        "steps_by_rank": step_rows(agg, True) if "by_rank" in want else None,
        "graphs": graph_usage(agg),
        "speculative": speculative.analyse(agg, baseline),
        "stragglers": stragglers.analyse(agg) if "stragglers" in want else None,
        "rank_gap": rank_gap(agg) if len(agg.ranks) > 1 else None,
        "env": env_summary(agg),
        "files": {},
    }
    if by_rank_bs:
        doc["phases_by_rank_bs"] = phase_rows(agg, True, True)
    if baseline is not None:
        doc["baseline"] = {"spans": baseline.n_spans, "phases": phase_rows(baseline, False, False)}
    return doc


def clean(doc: dict) -> dict:
    return _clean(doc)
