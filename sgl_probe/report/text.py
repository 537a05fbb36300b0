"""The terminal rendering: plain aligned text (no colour, no dependencies), read from the same
document ``--json`` prints, so the two never disagree."""

from __future__ import annotations

from typing import Optional


def stragglers_even() -> float:
    from sgl_probe.report.stragglers import EVEN

    return EVEN


def _ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = []
    for line in [headers, *rows]:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def phase_table(rows: list[dict], steps: list[dict], by_rank: bool, by_bs: bool) -> list[str]:
    """Steady calls only; a ``warm-up`` column counts the calls left out, when there are any."""
    warm = any(r.get("warmup_calls") for r in rows)
    headers = ["phase", "graph"] + (["rank"] if by_rank else []) + (["bs"] if by_bs else []) + \
              ["count", "mean ms", "p50", "p90", "p99", "step share"] + (["warm-up"] if warm else []) + \
              ([""] if by_rank else [])
    body = []
    for r in rows:
        line = [r["phase"], "yes" if r["cuda_graph"] else "no"]
        if by_rank:
            line.append(r["rank"])
        if by_bs:
            line.append(r["bs"])
        line += [f"{r['count']:,}", _ms(r["mean_ms"]), _ms(r["p50_ms"]), _ms(r["p90_ms"]),
                 _ms(r["p99_ms"]), _pct(r["share_of_step_time"])]
        if warm:
            line.append(f"{r['warmup_calls']:,}" if r.get("warmup_calls") else "")
        if by_rank:
            line.append(f"<< slowest +{100 * r['slower_than_fastest']:.0f} %" if r.get("slowest") else "")
        body.append(line)
    for s in steps:
        line = ["(step)", ""] + ([s["rank"]] if by_rank else []) + ([""] if by_bs else [])
        line += [f"{s['count']:,}", _ms(s["mean_ms"]), _ms(s["p50_ms"]), _ms(s["p90_ms"]),
                 _ms(s["p99_ms"]), ""] + ([""] if warm else []) + ([""] if by_rank else [])
        body.append(line)
    first_num = 2 + by_rank + by_bs
    return table(headers, body, set(range(first_num, first_num + 6 + warm)))


def warmup_line(w: dict) -> str:
    """What the tables and the verdict left out, and by which rule: always said."""
    if not w["calls"]:
        return f"  warm-up left out: none ({w['rule']})"
    phases = ", ".join(f"{p} {n:,}" for p, n in sorted(w["by_phase"].items(), key=lambda kv: -kv[1]))
    return (f"  warm-up left out: {_n(w['calls'], 'call')} ({phases}; {_ms(w['calls_ms'])} ms) in "
            f"{_n(w['steps'], 'step')}; rule: {w['rule']}")


def _n(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def graph_section(rows: list[dict]) -> list[str]:
    """Why phases ran without a CUDA graph, and which start their times used."""
    if not any(r["recorded"] for r in rows):
        return []  # spans from a probe that records neither: nothing to say
    out = []
    for r in rows:
        bits = []
        if r["no_graph_reasons"]:
            bits.append(f"no graph in {_pct(1.0 - r['graph'])} of calls: " +
                        ", ".join(f"{k} {_pct(v)}" for k, v in r["no_graph_reasons"].items()))
        if r["start"]:
            bits.append("start " + ", ".join(f"{k} {_pct(v)}" for k, v in r["start"].items()))
        g = r.get("graph_launch")
        if g:
            bits.append(f"graph launched {_ms(g['before_launch_p50_ms'])} ms after the call, "
                        f"graph {_ms(g['graph_p50_ms'])} ms (p50)")
        if bits:
            out.append(f"  {r['phase'] + ':':<13} " + "; ".join(bits))
    if not out:
        return []
    head = ["CUDA graphs (share of each phase's calls; host_clock start: the GPU was idle at the call, "
            "so the time includes the launch latency; a graph launched late: SGLang's host-side "
            "preparation left the GPU waiting):"]
    return head + out


def header(doc: dict) -> list[str]:
    inp = doc["input"]
    runs = doc["runs"]
    parts = [f"{inp['spans']:,} spans", f"{inp['steps']:,} steps"]
    if doc["time_range_s"] is not None:
        parts.append(f"{doc['time_range_s']:.1f} s")
    parts.append("ranks " + " ".join(doc["ranks"]))
    timers = doc["timers"]
    if timers:
        kinds = sorted(timers)
        what = {"cuda": "GPU time (CUDA events)", "cpu": "host time (cpu timer)",
                "host": "host time of steps the CUDA timer left untimed (kept out of the phase times)"}
        parts.append("timer " + ", ".join(f"{k}: {what.get(k, k)}" for k in kinds))
    out = ["sgl-probe report: " + " · ".join(parts)]
    for i, run in enumerate(runs, 1):
        label = f"run{i} " if len(runs) > 1 else "run "
        out.append(f"  {label}{run['run_id'] or '?'}: service {run['service']}, SGLang "
                   f"{run['sglang_version'] or '?'}, sgl-probe {run['sgl_probe_version'] or '?'}, "
                   f"{run['ranks']} rank(s)")
    if doc.get("warmup") is not None:
        out.append(warmup_line(doc["warmup"]))
    if inp["error_spans"]:
        out.append("  spans with status ERROR: " + ", ".join(f"{k} {v}" for k, v in sorted(inp["error_spans"].items())))
    return out


def spec_section(spec: dict) -> list[str]:
    cyc = spec["cycle"]
    st = cyc.get("settings") or {}
    bits = [str(st["algorithm"])] if st.get("algorithm") else []
    for key, fmt in (("num_steps", "{} steps"), ("topk", "topk {}"), ("num_draft_tokens", "{} draft tokens")):
        if st.get(key) is not None:
            bits.append(fmt.format(st[key]))
    out = [f"Speculative decoding{' (' + ', '.join(bits) + ')' if bits else ''}: "
           f"{cyc['n_steps']:,} spec steps, {cyc['n_verify']:,} verify spans"]
    tau = f"τ {cyc['tau']:.2f}" if cyc["tau"] is not None else "τ unknown"
    out.append(f"  per-phase times: {cyc.get('statistic', 'mean')}s over steady steps (warm-up left out), "
               f"batch sizes weighted by their step counts; τ the mean accept length")
    out.append(f"  cycle {_ms(cyc['draft_ms'] + cyc['verify_ms'] + cyc['draft_extend_ms'] + cyc['other_ms'])} ms"
               f" = draft {_ms(cyc['draft_ms'])} + verify {_ms(cyc['verify_ms'])} + draft_extend "
               f"{_ms(cyc['draft_extend_ms'])} + other {_ms(cyc['other_ms'])}; {tau}; verify without a "
               f"graph in {100 * cyc['verify_no_graph']:.0f} % of steps")
    dec = spec.get("decode")
    if dec is not None and spec.get("decode_matched_ms") is not None:
        kind = "graph" if dec["graph"] else "eager (no graph decode seen)"
        warm = f", {dec['warmup_calls']:,} warm-up calls left out" if dec.get("warmup_calls") else ""
        out.append(f"  decode step {_ms(spec['decode_matched_ms'] + spec['decode_matched_other_ms'])} ms = "
                   f"forward {_ms(spec['decode_matched_ms'])} + other {_ms(spec['decode_matched_other_ms'])}"
                   f" ({kind}, {dec['n']:,} steps from {spec['decode_source']}{warm}, matched to the spec "
                   f"steps' batch sizes)")
    v = spec.get("verdict")
    if v is not None:
        out.append(f"  break-even τ* {v['break_even']:.2f}; largest verify that wins at this τ: "
                   f"{_ms(v['verify_max_ms'])} ms")
        out.append("  => " + v["sentence"])
    if spec.get("by_bucket"):
        out.append("  by batch size: " + " · ".join(
            f"bs {r['bs']}: {r['speedup']:.2f}× (τ {r['tau']:.2f}, n {r['n']})" for r in spec["by_bucket"]))
    for note in spec.get("notes") or ():
        out.append("  note: " + note)
    return out


def straggler_section(items: list[dict]) -> list[str]:
    out = ["Stragglers (same step, ranks side by side):"]
    for it in items:
        grp = f"[{it['group']}] " if it["group"] else ""
        if it["straggler"]:
            what = (f"{it['slowest_rank']} slowest: +{_ms(it['slowest_excess_ms'])} ms mean "
                    f"(+{100 * it['slowest_excess_rel']:.0f} %) over the fastest rank")
        else:
            what = f"ranks even (means within {100 * stragglers_even():.0f} %)"
        line = (f"  {grp}{it['phase']:<12} {what}; {it['slowest_rank']} slowest in "
                f"{100 * it['slowest_share']:.0f} % of {it['steps_compared']:,} steps; spread mean "
                f"{_ms(it['mean_spread_ms'])} ms, p90 {_ms(it['p90_spread_ms'])} ms")
        out.append(line)
        if it["worst_steps"]:
            w = it["worst_steps"][0]
            ranks = " ".join(f"{k} {_ms(v)}" for k, v in w["ms"].items())
            out.append(f"  {'':<{len(grp) + 12}} worst: step {w['step_index']} (trace {w['trace_id'] or '?'}): {ranks} ms")
    return out


def env_section(env: dict) -> list[str]:
    out = [f"Env: {env['snapshots']} snapshots ({', '.join(env['points'])}) from {len(env['ranks'])} rank(s), "
           f"{env['variables']} variables"]
    if env["differs_across_ranks"]:
        for name, vals in sorted(env["differs_across_ranks"].items())[:10]:
            out.append(f"  differs across ranks: {name}: " + ", ".join(f"{k}={v if v is not None else '(unset)'}"
                                                                    for k, v in vals.items()))
    else:
        out.append("  identical on every rank")
    for name, ch in sorted(env["changed_after_launch"].items())[:12]:
        workers = sorted({str(v) if v is not None else "(unset)" for v in ch["workers"].values()})
        launcher = ch["launcher"] if ch["launcher"] is not None else "(unset)"
        out.append(f"  changed after launch: {name}: launcher {launcher} -> worker {', '.join(workers)}")
    if len(env["changed_after_launch"]) > 12:
        out.append(f"  ... and {len(env['changed_after_launch']) - 12} more changed after launch (--json lists all)")
    return out


def render(doc: dict, by_rank: bool = False, by_bs: bool = False) -> str:
    out = header(doc)
    out.append("")
    if by_rank and by_bs:
        rows = doc["phases_by_rank_bs"]
    else:
        rows = doc["phases_by_rank"] if by_rank else doc["phases_by_bs"] if by_bs else doc["phases"]
    out += phase_table(rows, doc["steps_by_rank"] if by_rank else doc["steps"], by_rank, by_bs)
    graphs = graph_section(doc.get("graphs") or [])
    if graphs:
        out.append("")
        out += graphs
    if doc["speculative"] is not None:
        out.append("")
        out += spec_section(doc["speculative"])
    if by_rank:
        out.append("")
        if doc.get("stragglers"):
            out += straggler_section(doc["stragglers"])
        else:
            out.append("Stragglers: fewer than two TP ranks of one server in the input: nothing to compare")
    elif doc.get("rank_gap"):
        gap = doc["rank_gap"]
        out.append("")
        if gap["excess_rel"] > stragglers_even():
            out.append(f"{len(doc['ranks'])} ranks: largest gap between ranks: {gap['phase']} on {gap['rank']} "
                       f"(+{_ms(gap['excess_ms'])} ms mean, +{100 * gap['excess_rel']:.0f} %); "
                       f"--by-rank shows ranks side by side")
        else:
            out.append(f"{len(doc['ranks'])} ranks, even: every phase's rank means within "
                       f"{100 * stragglers_even():.0f} %; --by-rank shows ranks side by side")
    if doc.get("env"):
        out.append("")
        out += env_section(doc["env"])
    files = doc.get("files") or {}
    if files:
        out.append("")
        for what, info in files.items():
            out.append(f"wrote {info['path']} ({what}: {info['detail']})")
    return "\n".join(out) + "\n"
