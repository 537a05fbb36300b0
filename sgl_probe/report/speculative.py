"""Verdict inputs from aggregates: the spec cycle (per step: draft + verify + draft_extend + the
rest of the step), the decode step it competes with (graph decode preferred; from ``--baseline``
or this run's own decode steps), matched by batch-size bucket, and the graph-verify what-if.

Every per-phase time is the median over steady steps (warm-up left out by the aggregation,
:data:`sgl_probe.stats.VERDICT_STATISTIC`); batch-size buckets are weighted by their step counts.
The math itself is :func:`sgl_probe.stats.evaluate`."""

from __future__ import annotations

from typing import Optional

from sgl_probe.report.aggregate import Aggregator
from sgl_probe.stats import VERDICT_STATISTIC, bucket_order, evaluate, median

NO_BASELINE = ("no decode time to compare with: give --baseline SOURCE (the same server and load "
               "without speculative decoding)")
SPEC_PARTS = ("draft_ms", "verify_ms", "draft_extend_ms", "other_ms")


def _median_or(values, default: Optional[float]) -> Optional[float]:
    return median(values) if len(values) else default


def decode_reference(agg: Aggregator) -> Optional[dict]:
    """Per-step decode time, graph decode when there is any. ``decode_ms`` is the forward,
    ``other_ms`` the rest of its scheduler step (0 when the source has no step spans)."""
    for graph in (True, False):
        warm = sum(len(a) for (p, g, _b, _r), a in agg.warmup_groups.items() if p == "decode" and g == graph)
        rows = {b: v for (g, b), v in agg.decode_steps.items() if g == graph and len(v[0])}
        if rows:
            return {"graph": graph, "from_steps": True, "n": sum(len(v[0]) for v in rows.values()),
                    "warmup_calls": warm,
                    "decode_ms": median(x for v in rows.values() for x in v[0]),
                    "other_ms": median(x for v in rows.values() for x in v[1]),
                    "buckets": {b: {"n": len(v[0]), "decode_ms": median(v[0]), "other_ms": median(v[1])}
                                for b, v in rows.items()}}
        buckets: dict = {}
        for (p, g, b, _r), arr in agg.groups.items():
            if p == "decode" and g == graph:
                buckets.setdefault(b, []).extend(arr)
        buckets = {b: v for b, v in buckets.items() if v}
        if buckets:
            return {"graph": graph, "from_steps": False, "n": sum(len(v) for v in buckets.values()),
                    "warmup_calls": warm,
                    "decode_ms": median(x for v in buckets.values() for x in v), "other_ms": 0.0,
                    "buckets": {b: {"n": len(v), "decode_ms": median(v), "other_ms": 0.0}
                                for b, v in buckets.items()}}
    return None


def spec_cycle(agg: Aggregator) -> Optional[dict]:
    verify_graph = agg.values("verify", graph=True)
    verify_eager = agg.values("verify", graph=False)
    n_verify = len(verify_graph) + len(verify_eager)
    if not n_verify:
        return None
    out: dict = {"n_verify": n_verify, "verify_no_graph": len(verify_eager) / n_verify,
                 "verify_graph_ms": _median_or(verify_graph, None),
                 "n_verify_graph": len(verify_graph), "settings": dict(agg.spec_settings),
                 "statistic": VERDICT_STATISTIC}
    buckets = {}
    if agg.spec_steps:
        out["from_steps"] = True
        for b, arrays in agg.spec_steps.items():
            buckets[b] = {"n": len(arrays[0]), **{k: median(a) for k, a in zip(SPEC_PARTS, arrays)}}
    else:  # no step spans (e.g. a Jaeger export without them): one call of each phase per cycle
        out["from_steps"] = False
        for b in {k[2] for k, arr in agg.groups.items() if k[0] == "verify" and len(arr)}:
            ver = agg.values("verify", bkt=b)
            buckets[b] = {"n": len(ver), "verify_ms": median(ver),
                          "draft_ms": _median_or(agg.values("draft", bkt=b), 0.0),
                          "draft_extend_ms": _median_or(agg.values("draft_extend", bkt=b), 0.0),
                          "other_ms": 0.0}
    n = sum(v["n"] for v in buckets.values())
    if not n:  # every verify was warm-up
        return None
    for key in SPEC_PARTS:
        out[key] = sum(v[key] * v["n"] for v in buckets.values()) / n
    out["n_steps"] = n
    out["buckets"] = buckets
    n_tau, tau = agg.tau()
    out["tau"] = tau if n_tau else None
    out["n_tau"] = n_tau
    for b, v in buckets.items():
        nb, tb = agg.tau(b)
        v["tau"] = tb if nb else None
    return out


def _decode_for(ref: dict, b: str) -> tuple[float, float]:
    row = ref["buckets"].get(b) or ref
    return row["decode_ms"], row["other_ms"]


def _evaluate(tau, cyc: dict, decode_ms: float, decode_other: float, ref: dict, graph_ms, source):
    return evaluate(
        tau, decode_ms + decode_other, cyc["verify_ms"], cyc["draft_ms"], cyc["draft_extend_ms"],
        cyc["other_ms"], decode_graph=ref["graph"], verify_no_graph=cyc.get("verify_no_graph"),
        verify_graph_ms=graph_ms, verify_graph_source=source)


def analyse(agg: Aggregator, baseline: Optional[Aggregator] = None) -> Optional[dict]:
    """The speculative section of the report, or None when there are no verify spans."""
    cyc = spec_cycle(agg)
    if cyc is None:
        return None
    if baseline is not None:
        ref, ref_source = decode_reference(baseline), "--baseline"
    else:
        ref, ref_source = decode_reference(agg), "this run's own decode steps"
    out = {"cycle": cyc, "decode": ref, "decode_source": ref_source if ref else None,
           "verdict": None, "by_bucket": [], "notes": []}
    if cyc["tau"] is None:
        out["notes"].append("verify spans carry no sglang.spec.accept_length: no τ, no verdict")
        return out
    if ref is None:
        out["notes"].append(NO_BASELINE if baseline is None else
                            "the --baseline input has no decode spans: no decode time to compare with")
        return out
    # Match the decode step to the spec steps' batch sizes (eager vs graph and batch size both
    # move the per-step time; comparing across them is how wrong verdicts are made).
    weights = {b: v["n"] for b, v in cyc["buckets"].items()}
    total = sum(weights.values())
    matched = [(_decode_for(ref, b), w) for b, w in weights.items()]
    dec_ms = sum(d * w for (d, _o), w in matched) / total
    dec_other = sum(o * w for (_d, o), w in matched) / total
    unmatched = sorted((b for b in weights if b not in ref["buckets"]), key=bucket_order)
    if unmatched:
        out["notes"].append("no decode steps at batch size " + ", ".join(unmatched) +
                            ": the overall decode mean stands in for them")
    out["decode_matched_ms"] = dec_ms
    out["decode_matched_other_ms"] = dec_other
    if cyc["verify_graph_ms"] is not None:
        graph_ms, source = cyc["verify_graph_ms"], f"measured on {cyc['n_verify_graph']} graph verifies"
    elif ref["graph"]:
        graph_ms, source = dec_ms, "taken as one graph decode forward"
    else:
        graph_ms, source = None, ""
    v = _evaluate(cyc["tau"], cyc, dec_ms, dec_other, ref, graph_ms, source)
    out["verdict"] = v.as_dict() if v else None
    if len(cyc["buckets"]) > 1:
        for b in sorted(cyc["buckets"], key=bucket_order):
            row = cyc["buckets"][b]
            if b not in ref["buckets"] or row["tau"] is None:
                continue
            d, o = _decode_for(ref, b)
            vb = _evaluate(row["tau"], {**row, "verify_no_graph": None}, d, o, ref, None, "")
            if vb is not None:
                out["by_bucket"].append({"bs": b, "n": row["n"], "tau": row["tau"],
                                         "speedup": vb.speedup, "break_even": vb.break_even,
                                         "cycle_ms": vb.cycle_ms, "decode_ms": d + o})
    return out
