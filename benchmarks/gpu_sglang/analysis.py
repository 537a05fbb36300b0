"""What the real-GPU SGLang runs are judged by: the probe's spans against SGLang's own log lines,
its metrics and the torch profiler's kernels of the same steps, and on/off throughput ratios.

Stdlib only and free of SGLang, so the same code runs on the GPU machine (``device.py``) and in
the CPU test suite (``tests/test_gpu_sglang_build.py``).
"""
from __future__ import annotations

import bisect
import glob
import gzip
import json
import os
import random
import re
import statistics
from typing import Iterable, Optional

# "Decode batch [17], #running-req: 3, ..., accept len: 2.33, ..., cuda graph: True, ..."
# (the iteration number appears with SGLANG_LOG_FORWARD_ITERS=1; "cpu graph" on SGLang's CPU engine)
_BATCH = re.compile(r"(Prefill|Decode) batch(?: \[(\d+)\])?, (.*)")
_GRAPH = re.compile(r"(?:cuda|cpu) graph: (True|False)")
_RUNNING = re.compile(r"#running-req: (\d+)")
_ACCEPT = re.compile(r"accept len: ([0-9.]+)")
_NEW_SEQ = re.compile(r"#new-seq: (\d+)")


def parse_batch_lines(text: str) -> list[dict]:
    """SGLang's per-batch log lines, in order: kind (prefill|decode), iter, graph, running, accept."""
    out = []
    for line in text.splitlines():
        m = _BATCH.search(line)
        if not m:
            continue
        rest = m.group(3)
        g = _GRAPH.search(rest)
        if g is None:
            continue
        acc = _ACCEPT.search(rest)
        run = _RUNNING.search(rest)
        new = _NEW_SEQ.search(rest)
        out.append({"kind": m.group(1).lower(), "iter": int(m.group(2)) if m.group(2) else None,
                    "graph": g.group(1) == "True", "running": int(run.group(1)) if run else None,
                    "new_seq": int(new.group(1)) if new else None,
                    "accept": float(acc.group(1)) if acc else None})
    return out


def _value(v: dict):
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def read_spans(trace_dir: str) -> list[dict]:
    """Every span of a ``SGL_PROBE_TRACE_DIR`` (OTLP/JSON lines), flattened."""
    spans = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                for rs in json.loads(line).get("resourceSpans", ()):
                    res = {a["key"]: _value(a["value"]) for a in rs.get("resource", {}).get("attributes", ())}
                    for ss in rs.get("scopeSpans", ()):
                        for sp in ss.get("spans", ()):
                            spans.append({
                                "name": sp["name"], "trace_id": sp.get("traceId"),
                                "start": int(sp["startTimeUnixNano"]), "end": int(sp["endTimeUnixNano"]),
                                "attrs": {a["key"]: _value(a["value"]) for a in sp.get("attributes", ())},
                                "error": sp.get("status", {}).get("code") == "STATUS_CODE_ERROR",
                                "pid": res.get("process.pid"), "file": os.path.basename(path)})
    return spans


def phase_spans(spans: Iterable[dict], phase: str) -> list[dict]:
    """Spans of one phase in step order (per process, then step index)."""
    got = [s for s in spans if s["name"] == "sglang." + phase]
    return sorted(got, key=lambda s: (s["pid"] or 0, s["attrs"].get("sglang.step_index", 0), s["start"]))


def _compare(flags_a: list, flags_b: list) -> dict:
    n = min(len(flags_a), len(flags_b))
    agree = sum(1 for i in range(n) if flags_a[i] == flags_b[i])
    first_bad = [i for i in range(n) if flags_a[i] != flags_b[i]][:5]
    return {"spans": len(flags_a), "log_lines": len(flags_b), "agree": agree,
            "agreement": agree / max(len(flags_a), len(flags_b)) if (flags_a or flags_b) else None,
            "first_mismatches": first_bad}


def graph_agreement(spans: list[dict], lines: list[dict], spec: bool) -> dict:
    """Each span's ``sglang.cuda_graph`` against SGLang's ``cuda graph:`` line for the same batch.

    A decode batch of a speculative server is one draft / verify / draft-extend round; SGLang's
    flag for it is the verify's (the target forward), so verify spans are compared there."""
    decode_phase = "verify" if spec else "decode"
    ours_dec = [s["attrs"].get("sglang.cuda_graph") is True for s in phase_spans(spans, decode_phase)]
    ours_pre = [s["attrs"].get("sglang.cuda_graph") is True for s in phase_spans(spans, "extend")]
    dec = _compare(ours_dec, [ln["graph"] for ln in lines if ln["kind"] == "decode"])
    pre = _compare(ours_pre, [ln["graph"] for ln in lines if ln["kind"] == "prefill"])
    total = max(dec["spans"], dec["log_lines"]) + max(pre["spans"], pre["log_lines"])
    return {decode_phase: dec, "extend": pre,
            "agreement": (dec["agree"] + pre["agree"]) / total if total else None,
            "graph_true": sum(ours_dec) + sum(ours_pre), "graph_false": total - sum(ours_dec) - sum(ours_pre)}


def accept_agreement(spans: list[dict], lines: list[dict]) -> dict:
    """Verify spans' accept length and batch size against SGLang's ``accept len`` per decode line."""
    ours = [(s["attrs"].get("sglang.batch_size"), s["attrs"].get("sglang.spec.accept_length"))
            for s in phase_spans(spans, "verify")]
    theirs = [(ln["running"], ln["accept"]) for ln in lines if ln["kind"] == "decode"]
    n = min(len(ours), len(theirs))
    agree = sum(1 for i in range(n) if ours[i][1] is not None and theirs[i][1] is not None
                and round(ours[i][1], 2) == theirs[i][1])
    bs_agree = sum(1 for i in range(n) if ours[i][0] == theirs[i][0])
    return {"verify_spans": len(ours), "log_lines": len(theirs), "agree": agree, "batch_size_agree": bs_agree,
            "agreement": agree / max(len(ours), len(theirs)) if (ours or theirs) else None,
            "first_mismatches": [(i, ours[i], theirs[i]) for i in range(n)
                                 if ours[i][1] is None or round(ours[i][1], 2) != theirs[i][1]][:5]}


def metric_counts(metrics_text: str) -> dict:
    """SGLang's own pass counters: cuda_graph_passes_total by mode, spec_verify_calls_total."""
    out: dict = {"passes": {}, "verify_calls": None}
    for line in metrics_text.splitlines():
        m = re.match(r'sglang:cuda_graph_passes_total\{(.*)\} ([0-9.e+]+)$', line)
        if m:
            mode = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))).get("mode", "?")
            out["passes"][mode] = out["passes"].get(mode, 0) + float(m.group(2))
        m = re.match(r'sglang:spec_verify_calls_total(?:\{.*\})? ([0-9.e+]+)$', line)
        if m:
            out["verify_calls"] = (out["verify_calls"] or 0) + float(m.group(1))
    return out


def count_agreement(spans: list[dict], counts: dict, spec: bool = False) -> dict:
    """Probe spans per (phase, graph) against SGLang's ``cuda_graph_passes_total`` modes (a
    speculative server's decode passes are its verify steps). ``spec_verify_calls_total`` is
    reported beside them: SGLang counts it per request when the request finishes."""
    rows = {}
    for mode, n in counts["passes"].items():
        phase = ("verify" if spec else "decode") if mode.startswith("decode") else "extend"
        graph = mode.endswith("cuda_graph")
        ours = sum(1 for s in spans if s["name"] == "sglang." + phase and (s["attrs"].get("sglang.cuda_graph") is True) == graph)
        rows[mode] = {"sglang": n, "probe": ours}
    out = {"rows": rows, "all_equal": bool(rows) and all(r["sglang"] == r["probe"] for r in rows.values())}
    verify = [s for s in spans if s["name"] == "sglang.verify"]
    if counts.get("verify_calls") is not None:
        out["spec_verify_calls"] = {"sglang_finished_requests": counts["verify_calls"],
                                    "probe_verify_rows": sum(s["attrs"].get("sglang.batch_size") or 0 for s in verify)}
    return out


# ---- torch profiler ------------------------------------------------------------------------

#: Kineto event categories that are GPU work.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load_trace(trace: "str | dict") -> dict:
    """A Kineto chrome trace (``.json`` or ``.json.gz``) by path, or one already loaded (a
    profile's trace is large: load it once for every reader below)."""
    if isinstance(trace, dict):
        return trace
    opener = gzip.open if trace.endswith(".gz") else open
    with opener(trace, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def read_kernels(trace: "str | dict") -> list[tuple[int, int]]:
    """GPU kernel intervals (epoch ns) from a Kineto chrome trace (:func:`load_trace`)."""
    doc = load_trace(trace)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    out = []
    for ev in doc.get("traceEvents", ()):
        if ev.get("ph") == "X" and ev.get("cat") in GPU_CATEGORIES:
            t0 = base + int(round(float(ev["ts"]) * 1000))
            out.append((t0, t0 + int(round(float(ev.get("dur", 0)) * 1000))))
    out.sort()
    return out


def graph_launches(trace: "str | dict") -> dict:
    """How the profiler itself sees each CUDA graph launch: the ``cudaGraphLaunch`` runtime
    call's duration and the time from its start to the graph's first kernel (Kineto's own host
    and GPU clocks; kernels matched to their launch by correlation id), p50 / p10 / p90 in µs.
    Under the profiler these include its per-node instrumentation of the graph."""
    events = load_trace(trace).get("traceEvents", ())
    launch = {e["args"]["correlation"]: (float(e["ts"]), float(e.get("dur", 0))) for e in events
              if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")
              and "correlation" in e.get("args", {})}
    first: dict = {}
    for e in events:
        c = e.get("args", {}).get("correlation")
        if c in launch and e.get("cat") in GPU_CATEGORIES:
            first[c] = min(first.get(c, float("inf")), float(e["ts"]))

    def q(vals: list) -> Optional[dict]:
        if not vals:
            return None
        vals = sorted(vals)
        return {"p50": statistics.median(vals), "p10": vals[len(vals) // 10], "p90": vals[len(vals) * 9 // 10]}

    return {"launches": len(launch), "with_kernels": len(first),
            "call_us": q([d for _, d in launch.values()]),
            "to_first_kernel_us": q([first[c] - launch[c][0] for c in first])}


def _assign(spans: list[dict], starts: list[int], kernels: list[tuple[int, int]], offset: int) -> list:
    """Per span: (span, first kernel start, last kernel end, n kernels) of the kernels whose
    midpoint (shifted by ``offset``) falls inside the span."""
    rows = []
    for s in spans:
        lo = bisect.bisect_left(starts, s["start"] - offset - 5_000_000)
        first = last = None
        n = 0
        for k0, k1 in kernels[lo:]:
            if k0 + offset > s["end"] + 5_000_000:
                break
            mid = (k0 + k1) // 2 + offset
            if s["start"] <= mid <= s["end"]:
                first = k0 if first is None else min(first, k0)
                last = k1 if last is None else max(last, k1)
                n += 1
        if n:
            rows.append((s, first + offset, last + offset, n))
    return rows


def profiler_ratio(spans: list[dict], kernels: list[tuple[int, int]],
                   phases: tuple = ("decode", "extend", "draft", "verify", "draft_extend")) -> dict:
    """The probe's phase durations against the profiler's kernel envelope of the same phases.

    The two clocks (the probe's host/GPU anchors, Kineto's) can differ by a few hundred
    microseconds. A phase's end is a GPU event recorded right behind its last kernel, so the
    offset is found by aligning ends: first the offset (+-2 ms) that puts the most kernels inside
    phase spans, then the median gap between each span's end and its last kernel's end."""
    ph = [s for s in spans if s["name"] in {"sglang." + p for p in phases} and kernels
          and kernels[0][0] - 10**9 <= s["start"] <= kernels[-1][1] + 10**9]
    if not ph or not kernels:
        return {"spans": 0}
    starts = [k[0] for k in kernels]
    # Every offset in a range assigns the same kernels; the envelope does not depend on it.
    counts = {off: sum(n for *_, n in _assign(ph, starts, kernels, off)) for off in range(-2_000_000, 2_000_001, 10_000)}
    top = max(counts.values())
    tied = [off for off, n in counts.items() if n == top]
    best = tied[len(tied) // 2]
    for _ in range(3):
        rows = _assign(ph, starts, kernels, best)
        if not rows:
            break
        best += int(statistics.median(s["end"] - k1 for s, _, k1, _ in rows))
    rows = _assign(ph, starts, kernels, best)
    out: dict = {"clock_offset_us": best / 1000, "spans_matched": len(rows), "spans_in_window": len(ph),
                 "by_phase": {}}
    groups: dict = {}
    for s, k0, k1, n in rows:
        key = (s["name"][len("sglang."):], s["attrs"].get("sgl_probe.start", "?"))
        groups.setdefault(key, []).append((s["end"] - s["start"], k1 - k0))
    all_probe = sum(p for v in groups.values() for p, _ in v)
    all_kern = sum(k for v in groups.values() for _, k in v)
    # The graph's own time (sgl_probe.graph_ms: from its launch to the phase's end) against the
    # kernels in that window, with the clock offset found above; not part of the overall ratio,
    # which keeps judging the spans' intervals.
    launched = [dict(s, start=s["end"] - int(s["attrs"]["sgl_probe.graph_ms"] * 1e6),
                     attrs=dict(s["attrs"], **{"sgl_probe.start": "graph_launch"}))
                for s in ph if s["attrs"].get("sgl_probe.graph_ms") is not None]
    for s, k0, k1, n in _assign(launched, starts, kernels, best):
        groups.setdefault((s["name"][len("sglang."):], "graph_launch"), []).append((s["end"] - s["start"], k1 - k0))
    for (phase, start), v in sorted(groups.items()):
        out["by_phase"][f"{phase}/{start}"] = {
            "n": len(v), "probe_p50_ms": statistics.median(p for p, _ in v) / 1e6,
            "kernel_envelope_p50_ms": statistics.median(k for _, k in v) / 1e6,
            "ratio_of_sums": sum(p for p, _ in v) / max(1, sum(k for _, k in v)),
            "median_ratio": statistics.median(p / k for p, k in v if k > 0) if any(k for _, k in v) else None}
    out["ratio_of_sums"] = all_probe / all_kern if all_kern else None
    return out


# ---- throughput ratios ---------------------------------------------------------------------

def pair_ratios(windows: dict) -> list[float]:
    """recording / paused of each pair of one server's overhead_ab windows."""
    return [a / b for a, b in zip(windows.get("recording", []), windows.get("paused", [])) if b]


def bootstrap_ratio(off: list[float], on: list[float], n: int = 4000, seed: int = 0) -> dict:
    """on/off ratio of medians over launches, with a 95 % bootstrap interval (resampling launches)."""
    if not off or not on:
        return {"median_ratio": None}
    rng = random.Random(seed)
    med = statistics.median(on) / statistics.median(off)
    draws = sorted(statistics.median(rng.choices(on, k=len(on))) / statistics.median(rng.choices(off, k=len(off)))
                   for _ in range(n))
    return {"median_ratio": med, "ci95": [draws[int(0.025 * n)], draws[int(0.975 * n) - 1]],
            "launches": [len(off), len(on)]}


def percentile(vals: list[float], q: float) -> Optional[float]:
    if not vals:
        return None
    s = sorted(vals)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def steady(spans: list[dict]) -> list[dict]:
    """Drop each shape's first uses (phase, mode, batch size, graph): JIT compilation and autotune
    land there on a fresh server and are 10-1000x the steady state."""
    seen: dict = {}
    out = []
    for s in sorted(spans, key=lambda s: s["start"]):
        a = s["attrs"]
        key = (s["name"], a.get("sglang.forward_mode"), a.get("sglang.batch_size"), a.get("sglang.cuda_graph"))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 2:
            out.append(s)
    return out


def phase_p50(spans: list[dict], phase: str, graph: Optional[bool] = None) -> Optional[float]:
    vals = [s["attrs"]["sgl_probe.duration_ms"] for s in steady(phase_spans(spans, phase))
            if graph is None or (s["attrs"].get("sglang.cuda_graph") is True) == graph]
    return statistics.median(vals) if vals else None


def parse_smi(text: str) -> list[tuple[float, float]]:
    """(epoch seconds, SM clock MHz) per line of ``nvidia-smi --query-gpu=timestamp,clocks.sm
    --format=csv,noheader,nounits -lms N`` (timestamps ``2026/12/03 08:30:00.123``, local time);
    lines that do not parse (a header, "[N/A]") are skipped."""
    import datetime

    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((when, float(parts[1])))
        except ValueError:
            continue
    return out


def window_clock(samples: list[tuple[float, float]], t0: float, t1: float) -> Optional[float]:
    """Median SM clock of the samples inside [t0, t1] (epoch seconds), None without one."""
    vals = [mhz for t, mhz in samples if t0 <= t <= t1]
    return statistics.median(vals) if vals else None


def clock_adjusted_ratio(rec: list[float], paused: list[float], rec_clk: list, paused_clk: list,
                         n: int = 1000, seed: int = 0) -> dict:
    """Recording / paused at equal GPU clocks. Per pair: d = log(rate ratio), x = log(clock ratio);
    d = c + b x over the pairs; exp(c) is the ratio with the clock difference taken
    out (pairing already takes out what stays constant over a pair); the fit is Theil-Sen, robust
    to a few wild pairs. A bootstrap over pairs gives the interval. ``r2``: the squared
    correlation of d and x, the share of the pairs' spread the clock accounts for. Pairs without a
    clock on both sides are left out."""
    import math

    pts = [(math.log(a / b), math.log(ca / cb)) for a, b, ca, cb in zip(rec, paused, rec_clk, paused_clk)
           if a and b and ca and cb]
    if len(pts) < 3:
        return {"ratio": None, "pairs": len(pts)}

    def fit(sample: list) -> tuple[float, float]:
        # Theil-Sen: a pair straddling a warm-up or a stall (ratios of 0.2 are seen) must not
        # steer the fit, as it would least squares.
        slopes = [(sample[j][0] - sample[i][0]) / (sample[j][1] - sample[i][1])
                  for i in range(len(sample)) for j in range(i + 1, len(sample))
                  if sample[j][1] != sample[i][1]]
        b = statistics.median(slopes) if slopes else 0.0
        return statistics.median(d - b * x for d, x in sample), b

    ds, xs = [d for d, _ in pts], [x for _, x in pts]
    try:
        r2 = statistics.correlation(ds, xs) ** 2
    except statistics.StatisticsError:  # no spread in one of them
        r2 = 0.0
    c, b = fit(pts)
    rng = random.Random(seed)
    draws = sorted(math.exp(fit(rng.choices(pts, k=len(pts)))[0]) for _ in range(n))
    return {"ratio": math.exp(c), "ci95": [draws[int(0.025 * n)], draws[int(0.975 * n) - 1]],
            "clock_exponent": b, "r2": r2, "pairs": len(pts)}
