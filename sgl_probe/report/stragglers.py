"""Same step, ranks side by side: TP ranks of one server run the same step sequence (step index N
has one trace id across ranks), so per step and phase the slowest rank and the spread between
ranks are direct measurements, not averages of averages."""

from __future__ import annotations

import heapq
import math
from array import array
from collections import defaultdict

from sgl_probe.contract import PHASES
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.stats import percentile

WORST_STEPS = 3
NAN = float("nan")
#: Slowest-rank means within this fraction of the fastest rank's are called even, not a straggler.
EVEN = 0.02


def analyse(agg: Aggregator, worst: int = WORST_STEPS) -> list[dict]:
    groups: dict[tuple, list] = defaultdict(list)
    for rank in agg.ranks:
        if rank[3] is not None:
            groups[rank[:3]].append(rank)
    out = []
    for gkey in sorted(groups, key=lambda g: tuple(str(x) for x in g)):
        ranks = sorted(groups[gkey], key=agg.rank_sort_key)
        if len(ranks) < 2:
            continue
        traces = agg.step_traces.get(gkey, {})
        for phase in (*PHASES, "step"):
            arrays = [(i, agg.by_step[(r, phase)]) for i, r in enumerate(ranks) if (r, phase) in agg.by_step]
            if len(arrays) < 2:
                continue
            k = len(ranks)
            slowest = [0] * k
            sums = [0.0] * k
            counts = [0] * k
            spreads = []
            heap: list = []
            n = max(len(a) for _, a in arrays)
            cols = [i for i, _ in arrays]
            padded = [a if len(a) == n else a + array("d", [NAN]) * (n - len(a)) for _, a in arrays]
            for idx, vals in enumerate(zip(*padded)):
                total = sum(vals)
                if total == total:  # every rank ran this phase in this step (the usual case)
                    hi_v = max(vals)
                    lo_v = min(vals)
                    hi_i = cols[vals.index(hi_v)]
                    for j, v in enumerate(vals):
                        sums[cols[j]] += v
                        counts[cols[j]] += 1
                else:
                    present = [(v, cols[j]) for j, v in enumerate(vals) if v == v]
                    if len(present) < 2:
                        continue
                    hi_v, hi_i = max(present)
                    lo_v = min(present)[0]
                    for v, i in present:
                        sums[i] += v
                        counts[i] += 1
                slowest[hi_i] += 1
                spread = hi_v - lo_v
                spreads.append(spread)
                if len(heap) < worst:
                    heapq.heappush(heap, (spread, idx))
                elif spread > heap[0][0]:
                    heapq.heapreplace(heap, (spread, idx))
            compared = len(spreads)
            if not compared:
                continue
            rows = []
            for i, r in enumerate(ranks):
                if counts[i]:
                    rows.append({"rank": agg.label(r), "mean_ms": sums[i] / counts[i],
                                 "slowest_share": slowest[i] / compared, "steps": counts[i]})
            flag = max(rows, key=lambda row: (row["mean_ms"], row["slowest_share"]))
            spreads.sort()
            worst_steps = []
            for spread, idx in sorted(heap, reverse=True):
                worst_steps.append({
                    "step_index": idx, "trace_id": traces.get(idx), "spread_ms": spread,
                    "ms": {agg.label(ranks[i]): a[idx] for i, a in arrays
                           if idx < len(a) and a[idx] == a[idx]}})
            fastest = min(row["mean_ms"] for row in rows)
            out.append({"group": "/".join(agg.label(ranks[0]).split("/")[:-1]) or None,
                        "phase": phase, "steps_compared": compared, "ranks": rows,
                        "slowest_rank": flag["rank"], "slowest_share": flag["slowest_share"],
                        "slowest_excess_ms": flag["mean_ms"] - fastest,
                        "slowest_excess_rel": (flag["mean_ms"] - fastest) / fastest if fastest > 0 else 0.0,
                        "straggler": flag["mean_ms"] > fastest * (1 + EVEN),
                        "mean_spread_ms": math.fsum(spreads) / compared,
                        "p90_spread_ms": percentile(spreads, 0.9), "worst_steps": worst_steps})
    return out
