"""Fold one GPU run's suite results into ``benchmarks/results/gpu_sglang_<run>.json``:

    python3 benchmarks/gpu_sglang/summarize.py RUN RESULT_DIR [RESULT_DIR ...]

RESULT_DIR holds what ``run.sh`` wrote (``machine.txt``, ``gpu_sglang_<tag>_<suite>.json``). The
summary has the fields every run is compared by: versions, GPU, graph-flag / accept-length /
count agreement, greedy identity, profiler ratios, the seed case and the overhead ratios.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # device, imported where it is needed
from probe_pause import control as pause  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _agreement(parts: list) -> dict:
    agree = sum(p.get("agree", 0) for p in parts)
    total = sum(max(p.get("spans", p.get("verify_spans", 0)), p.get("log_lines", 0)) for p in parts)
    return {"agree": agree, "total": total, "ratio": agree / total if total else None}


def _ratios(verdict: dict) -> dict:
    """Each configuration's ratio fields from an overhead verdict (``device.judge``)."""
    keys = ("median_ratio", "ci95", "slowdown_off_over_on", "p99_step_ratio", "launches")
    return {k: {kk: r.get(kk) for kk in keys} for k, r in verdict.items() if isinstance(r, dict) and "median_ratio" in r}


def _probe_names(received: dict | None) -> dict | None:
    """The probe's span names as received; SGLang's own tracing names a span per request
    (``Req <id>``) and per process, which are summed per service."""
    if not received:
        return received
    out: dict = {}
    for key, n in received.items():
        service, _, name = key.partition(":")
        if not name.startswith(("sglang.", "sgl_probe.")):
            name = "(SGLang's own spans)"
        out[f"{service}:{name}"] = out.get(f"{service}:{name}", 0) + n
    return out


def merge_seed_overheads(parts: list[dict]) -> dict | None:
    """seed_overhead results of several calls (``--first-pair`` keeps their launches apart),
    judged together as one alternation."""
    if len(parts) <= 1:
        return parts[0] if parts else None
    import device

    raw = {k: v for p in parts for k, v in p.get("raw", {}).items()}
    verdict = device.seed_verdict(raw)
    verdict["decode_spans_in_trace_dirs"] = {k: v for p in parts
                                             for k, v in p["verdict"].get("decode_spans_in_trace_dirs", {}).items()}
    received: dict = {}
    for p in parts:
        for k, n in (p["verdict"].get("received_spans") or {}).items():
            received[k] = received.get(k, 0) + n
    verdict["received_spans"] = received
    return {"raw": raw, "verdict": verdict}


#: overhead_ab's probe servers (device.AB_EXPORTS) by the summary's name for their ratio.
_AB_FIELDS = {"probe": "probe_recording_over_paused", "otlp": "otlp_only_recording_over_paused",
              "none": "no_export_recording_over_paused", "cputimer": "cpu_timer_recording_over_paused",
              "ref": "reference_wheel_recording_over_paused",
              "hog": "no_probe_cpu_hog_over_quiet"}


def fold_overhead_ab(ab: dict) -> dict:
    """One overhead_ab call: recording / paused per kind of probe server, the A/A control, what
    was exported, the cores each role kept busy and the scheduler process's threads (medians over
    the windows of each kind)."""
    v = ab.get("verdict", {})
    out = {field: (v.get(kind) or {}).get("all_pairs") for kind, field in _AB_FIELDS.items() if kind in v}
    for key in ("model", "conc"):
        if key in ab:
            out[key] = ab[key]
    out.update({"aa_control": (v.get("aa_control") or {}).get("all_pairs"),
                "received_spans": _probe_names(v.get("received_spans")),
                "decode_spans_in_trace_dirs": v.get("decode_spans_in_trace_dirs")})
    windows = (ab.get("windows") or {}).items()
    busy = {name: _kind_medians(w["cores_busy"], ("scheduler", "exporter", "other")
                                + (("hog",) if all("hog" in c for c in w["cores_busy"]) else ()), lambda c, k: c[k])
            for name, w in windows if w.get("cores_busy")}
    if busy:
        out["cores_busy_p50"] = busy
    threads = {name: _kind_medians(w["cores_busy"], THREAD_KEYS, lambda c, k: c["threads"][k])
               for name, w in windows if w.get("cores_busy") and all("threads" in c for c in w["cores_busy"])}
    if threads:
        out["scheduler_threads_p50"] = threads
    # Each server's first pair of the call, kept out of the ratios (h200-14 on): recording / paused.
    first = {name: w["first_pair"]["recording"] / w["first_pair"]["paused"]
             for name, w in windows if (w.get("first_pair") or {}).get("paused")}
    if first:
        out["first_pair_ratio"] = first
    return out


def fold_overhead_cross(res: dict) -> dict:
    """One overhead_cross call: the cross estimator, what each server's own pairs read from the
    same windows, the control, what was exported, and the scheduler process's cores and threads
    (medians over both servers' windows of each kind)."""
    v = res.get("verdict", {})
    over_control = v.get("over_control")
    if over_control is None and res.get("control"):  # a call judged before calls judged it (h100-29)
        import device

        over_control = device.over_control(res)
    out = {"export": res.get("export", "probe"), "tokens": res.get("tokens", 128),
           "recording_over_paused": v.get("cross"),
           "one_server": {side: v.get(f"one_server_{side}") for side in ("a", "b")},
           "control": (v.get("control") or {}).get("cross"), "over_control": over_control,
           # Calls after r133: the same windows' rates as streamed (device.STREAM), the ones to judge by.
           **{k + "_streamed": x for k, x in (("recording_over_paused", v.get("cross_stream")),
                                                ("control", (v.get("control") or {}).get("cross_stream")),
                                                ("over_control", v.get("over_control_stream"))) if x},
           "received_spans": _probe_names(v.get("received_spans")),
           "decode_spans_in_trace_dirs": v.get("decode_spans_in_trace_dirs")}
    if (res.get("first_pair") or {}).get("ratio") is not None:  # warm-up, not judged (h200-14 on)
        out["first_pair_ratio"] = res["first_pair"]["ratio"]
    cores = res.get("cores_busy") or []
    if cores:
        out["cores_busy_p50"] = _kind_medians(cores, ("scheduler", "exporter", "other"), lambda c, k: c[k])
        out["scheduler_threads_p50"] = _kind_medians(cores, THREAD_KEYS, lambda c, k: c["threads"][k])
        per_step = cross_us_per_step(res)
        if per_step:
            out["scheduler_us_per_step_p50"] = per_step
        # At each server's last flip (pause shim, h200-14 on): what its drain read GPU times with,
        # where it imported sgl_probe from (which wheel ran), what its phase ends recorded through and
        # read the current stream from, and
        # how many anchor events its drain thread had made.
        for key in ("elapsed_source", "probe_file", "hot_calls", "stream_calls", "anchor_events"):
            last = {c["server"]: (c.get("gc_at_flip") or {}).get(key) for c in cores}
            if any(last.values()):
                out[key] = last
    return out


def cross_us_per_step(res: dict, batch: int = 16) -> dict:
    """The scheduler process's threads in µs per decode step: each window's thread time per
    second over its steps per second (tok/s / ``batch``, the load's steady batch), medians over
    both servers' windows of each kind."""
    names = res.get("servers") or []
    rates = {}
    for k, w in enumerate(res.get("windows") or []):
        for side, name in zip(("a", "b"), names):
            rates[(k, name)] = w[side] / batch
    rows = []
    seen: dict = {}
    by_server: dict = {}
    for c in res.get("cores_busy") or []:
        k = seen[c["server"]] = seen.get(c["server"], -1) + 1  # the server's k-th window
        by_server.setdefault(c["server"], []).append(c)
        steps = rates.get((k, c["server"]))
        if steps:
            t = c["threads"]
            rows.append({"recording": c["recording"], "main_cpu": t["main_cpu"] / steps * 1e6,
                         "main_asleep": t["main_asleep"] / steps * 1e6, "others_cpu": t["others_cpu"] / steps * 1e6})
    out = _kind_medians(rows, ("main_cpu", "main_asleep", "others_cpu"), lambda c, k: c[k]) if rows else {}
    gc_rows = []
    for name, cs in by_server.items():
        for k, (c, nxt) in enumerate(zip(cs, cs[1:])):
            gc = _gc_per_step(c.get("gc_at_flip"), nxt.get("gc_at_flip"), rates.get((k, name)))
            if gc:
                gc_rows.append({"recording": c["recording"], **gc})
    if gc_rows:
        out.update(_kind_medians(gc_rows, ("gc", "gc_full_per_1000_steps"), lambda c, k: c[k]))
        self_rows = [r for r in gc_rows if "probe_self" in r]
        if self_rows:
            targets = sorted({k for r in self_rows for k in r if k.startswith(("probe_self:", "timer_call", "section", "drain", "pmu:"))})
            for key in ("probe_self", "hooked_calls", *targets):
                out.update(_kind_medians([r for r in self_rows if key in r], (key,), lambda c, k: c[k]))
    return out


def _gc_per_step(g0: Optional[dict], g1: Optional[dict], steps_per_s: Optional[float]) -> Optional[dict]:
    """Garbage collection between two flips (probe_pause's ``<pid>.gc``), which is one window's
    state with the settle before it: µs per step, and full collections per 1,000 steps."""
    if not (g0 and g1 and steps_per_s) or g1["t"] <= g0["t"]:
        return None
    dt = g1["t"] - g0["t"]
    seconds = sum(g1["seconds"]) - sum(g0["seconds"])
    out = {"gc": seconds / dt / steps_per_s * 1e6,
           "gc_full_per_1000_steps": (g1["count"][2] - g0["count"][2]) / dt / steps_per_s * 1e3}
    out.update(pause.own_time(g0, g1, dt * steps_per_s) or {})  # the ``self`` kinds: the probe's own time
    return out


def _kind_medians(cores_busy: list, keys: tuple, value) -> dict:
    """``{key}_recording`` / ``{key}_paused``: the median of ``value(window, key)`` over the
    windows of each kind that the server had."""
    return {f"{key}_{'recording' if rec else 'paused'}":
            statistics.median(value(c, key) for c in cores_busy if c["recording"] is rec)
            for key in keys for rec in (True, False) if any(c["recording"] is rec for c in cores_busy)}


#: What ``probe_pause.control.thread_use`` reports per window of the scheduler process.
THREAD_KEYS = ("main_cpu", "main_runq", "main_asleep", "main_vcsw_per_s", "main_ivcsw_per_s",
               "others_cpu", "busiest_other_cpu")


#: Suites whose result files keep each call apart by its tag (``gpu_sglang_<tag><suffix>.json``).
_TAGGED = ("_overhead_cross", "_overhead_ab")


def summarize(run: str, dirs: list[str]) -> dict:
    suites: dict = {}
    machine = ""
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "gpu_sglang_*.json"))):
            data = json.loads(Path(path).read_text())
            if "correct" in data or "overhead" in data:  # the "full" suite nests both
                suites.update({k: v for k, v in data.items() if k in ("correct", "overhead")})
            elif Path(path).stem.endswith("_seed_overhead"):
                suites.setdefault("seed_overheads", []).append(data)
            elif Path(path).stem.endswith(_TAGGED):  # one entry per call, by its tag
                suite = next(x for x in _TAGGED if Path(path).stem.endswith(x))
                tag = Path(path).stem[len("gpu_sglang_"):-len(suite)]
                suites.setdefault(suite, []).append((tag, data))
            else:
                suites[Path(path).stem.rsplit("_", 1)[1]] = data
        m = Path(d, "machine.txt")
        if m.exists():
            machine = m.read_text()
    lines = [ln for ln in machine.splitlines() if ln and "warn" not in ln.lower()]
    out: dict = {"run": run, "gpu": lines[0] if lines else None,
                 "versions": next((ln for ln in lines if ln.startswith("torch")), None)}
    out["sglang_version"] = (out["versions"] or "").partition("sglang ")[2].split(" ")[0] or None
    out["host_cpu"] = next((ln[len("host cpu "):] for ln in lines if ln.startswith("host cpu ")), None)
    c = suites.get("correct")
    if c:
        servers = [c[n] for n in ("plain_on", "eagle_on", "plain_nograph") if n in c]
        flags = [part for s in servers for k, part in s["graph_flag"].items() if isinstance(part, dict)]
        out["graph_flag_agreement"] = _agreement(flags)
        out["greedy_identical"] = c.get("greedy_identical")
        acc = c.get("eagle_on", {}).get("accept_length")
        out["accept_length_agreement"] = _agreement([acc]) if acc else None
        out["counts_equal_sglang_counters"] = {n: (c[n].get("counts") or {}).get("all_equal") for n in ("plain_on", "eagle_on") if n in c}
        out["profiler_ratio"] = {n: (c[n].get("profiler") or {}).get("by_phase") for n in ("plain_on", "eagle_on", "plain_nograph") if n in c}
        names = ("plain_on", "eagle_on", "plain_nograph")
        out["no_graph_reasons"] = {n: c[n].get("no_graph_reasons") for n in names if n in c}
        out["start_kinds"] = {n: c[n].get("start_kinds") for n in names if n in c}
        out["phase_p50_ms_tiny"] = {n: c[n].get("p50_ms") for n in names if n in c}
        if c.get("note"):
            out["note"] = c["note"]
    s = suites.get("seed")
    if s:
        seed: dict = {"decode_p50_ms": s.get("baseline", {}).get("p50_ms", {}).get("decode")}
        for name in ("eagle_eager", "eagle_graph"):
            r = s.get(name, {})
            verdict = ((r.get("report_json") or {}).get("speculative") or {}).get("verdict") or {}
            seed[name] = {"p50_ms": {k: v for k, v in (r.get("p50_ms") or {}).items() if v is not None},
                          "graph_share": r.get("graph_share"),
                          "verdict": {k: verdict.get(k) for k in ("speedup", "tau", "break_even", "t_decode", "t_verify",
                                                                  "t_draft", "t_draft_extend", "verify_no_graph", "wins")
                                      if k in verdict} or None,
                          "verdict_line": next((ln.strip() for ln in (r.get("report_tail") or "").splitlines()
                                                if ln.strip().startswith("=>")), None)}
        profiled = {name: r["profiler"].get("by_phase") for name in ("baseline", "eagle_eager", "eagle_graph")
                    if (r := s.get(name) or {}).get("profiler")}
        if profiled:  # seed --seed-profile: ~20 ms graph phases against the profiler's kernels
            seed["profiler_ratio"] = profiled
        out["seed_case"] = seed
    o = suites.get("overhead")
    if o:
        v = o.get("verdict", {})
        out["overhead"] = _ratios(v)
        out["overhead"]["tok_s_per_launch"] = v.get("tok_s_per_launch")
        out["overhead"]["received_spans"] = _probe_names(v.get("received_spans"))
        out["overhead"]["decode_spans_in_trace_dirs"] = v.get("decode_spans_in_trace_dirs")
    so = merge_seed_overheads(suites.get("seed_overheads") or [])
    if so:
        v = so.get("verdict", {})
        out["overhead_seed32b"] = {
            bs: _ratios(r) | {"tok_s_per_launch": r.get("tok_s_per_launch")}
            for bs, r in v.items() if bs.startswith("bs")}
        out["overhead_seed32b"]["received_spans"] = _probe_names(v.get("received_spans"))
        out["overhead_seed32b"]["decode_spans_in_trace_dirs"] = v.get("decode_spans_in_trace_dirs")
    abs_ = suites.get("_overhead_ab") or []
    if len(abs_) == 1:
        out["overhead_in_server"] = fold_overhead_ab(abs_[0][1])
    elif abs_:  # several calls (e.g. the tiny model and the 32B-class one): one entry per tag
        out["overhead_in_server"] = {tag: fold_overhead_ab(ab) for tag, ab in abs_}
    crosses = suites.get("_overhead_cross") or []
    if crosses:
        out["overhead_cross"] = {tag: fold_overhead_cross(res) for tag, res in crosses}
    return out


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    res = summarize(args[0], args[1:])
    path = ROOT / "benchmarks" / "results" / f"gpu_sglang_{args[0]}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
