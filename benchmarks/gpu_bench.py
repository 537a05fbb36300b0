"""Prove the probe's timing on one GPU: overhead, per-call cost, accuracy, graph flag, no host sync.

    python3 benchmarks/gpu_bench.py [--smoke] [--out DIR]

Drives the probe's real code (target table -> wrapt wrappers -> recorder -> CUDA-event timer ->
drain thread -> span builder -> BatchSpanProcessor -> OTLP/gRPC exporter) around a torch workload
shaped like SGLang's scheduler: ``Scheduler_<tag>.run_batch`` (step) calls
``Worker_<tag>.forward_batch_generation`` (phase), which either replays a CUDA graph through
``GraphRunner_<tag>.replay`` (graph role) or runs an eager, launch-bound layer stack; verify steps
report an accept count to ``Metrics_<tag>.update_spec_metrics`` (accept role). Spans go to a real
OTLP receiver in a child process on localhost while the loops run.

Sections (each in gpu_bench_<section>.py, writes into $OUT/gpu_bench.json; the table is printed last):
  percall   probe's added CPU time per wrapped step vs two bare pooled Event.record() calls
  drainprof the drain thread's CPU per step with real CUDA events, by stage, and its profile
  loops     paired fine-grained interleaving: untimed / probe (full export) / probe hot path only /
            naive synchronize() timer, per loop shape; median paired ratio + bootstrap 95 % CI
  accuracy  probe phase time vs torch profiler kernel sum and kernel envelope, same steps
  graphflag sglang.cuda_graph on every exported span vs what each step actually ran
  syncdebug probe-on loop under torch.cuda.set_sync_debug_mode("error"), plus a positive control
  capture   graph-capture safety, each case in its own process (gpu_capture_check.py)
Without CUDA (--smoke or no GPU) it runs tiny CPU versions of what it can and says what it skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

import gpu_common as gc
from gpu_bench_accuracy import section_accuracy
from gpu_bench_capture import section_capture
from gpu_bench_drainprof import section_drainprof
from gpu_bench_env import RESULTS, Env, log
from gpu_bench_graphflag import section_graphflag
from gpu_bench_loops import ALL_VARIANTS, SHAPES, SMOKE_SHAPES, section_loops
from gpu_bench_percall import section_percall
from gpu_bench_syncdebug import section_syncdebug


def _cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The host's CPU (the probe's host-side cost per step follows it; h100-4 against h100-5)."""
    try:
        with open(cpuinfo) as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script's logic")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.gettempdir())
    ap.add_argument("--loop-budget-s", type=float, default=28.0, help="target seconds per loop shape")
    ap.add_argument("--only", default="", help="comma-separated sections to run")
    ap.add_argument("--shapes", default="", help="comma-separated loop shapes (default: all)")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS), help="loop variants; untimed is the base")
    ap.add_argument("--max-rounds", type=int, default=150)
    args = ap.parse_args()
    env = Env(args.smoke)
    t = env.torch
    RESULTS["meta"] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "versions": gc.versions(), "cuda": env.cuda, "smoke": env.smoke,
        "device": t.cuda.get_device_name(0) if env.cuda else "cpu",
        "cuda_runtime": getattr(t.version, "cuda", None),
        "nccl": ".".join(map(str, t.cuda.nccl.version())) if env.cuda else None,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }
    log("meta %s" % RESULTS["meta"])
    only = set(filter(None, args.only.split(",")))
    want = lambda s: not only or s in only  # noqa: E731
    os.makedirs(args.out, exist_ok=True)  # a missing folder lost run 33a's results at the first save
    path = os.path.join(args.out, "gpu_bench.json")
    spans_path = os.path.join(tempfile.gettempdir(), "gpu_bench_spans_%d.jsonl" % os.getpid())
    rcv = gc.ReceiverProcess(spans_path)
    cpu_us = 300.0

    def save() -> None:
        with open(path, "w") as fh:
            json.dump({k: v for k, v in RESULTS.items() if not k.startswith("_")}, fh, indent=1, default=str)

    def run(name, fn, *a):
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn(*a)
        except Exception:
            RESULTS[name] = {"error": traceback.format_exc()[-3000:]}
            log("%s FAILED:\n%s" % (name, RESULTS[name]["error"]))
        RESULTS.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 1)
        save()

    try:
        if want("percall"):
            run("percall", section_percall, env, 5 if env.smoke else 31, 200 if env.smoke else 2000, rcv.env())
            pc = RESULTS["percall"]
            log("percall %s" % {k: v for k, v in pc.items() if k != "us_per_call_all"})
        shapes = SMOKE_SHAPES if env.smoke else SHAPES
        if args.shapes:
            shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
        if want("drainprof"):
            run("drainprof", section_drainprof, env, rcv, 300 if env.smoke else 3000)
            log("drainprof %s" % {k: v for k, v in RESULTS["drainprof"].get("stages", {}).items() if k != "profile"})
        if want("loops"):
            run("loops", section_loops, env, rcv, shapes, args.loop_budget_s, cpu_us,
                args.variants.split(","), args.max_rounds)
        if want("graphflag") and isinstance(RESULTS.get("loops"), dict) and "error" not in RESULTS["loops"]:
            run("graphflag", section_graphflag, rcv, RESULTS["loops"])
            log("graphflag %s" % RESULTS["graphflag"])
        if env.cuda and want("accuracy") and RESULTS.get("_shapes"):
            run("accuracy", section_accuracy, env, rcv, list(RESULTS["_shapes"]), cpu_us)
        if env.cuda and want("syncdebug") and RESULTS.get("_shapes"):
            run("syncdebug", section_syncdebug, env, rcv, cpu_us, 300)
        if env.cuda and want("capture"):
            run("capture", section_capture, 180)
        if not env.cuda:
            RESULTS["skipped"] = ["accuracy", "syncdebug", "capture", "graph shapes: no CUDA"]
    finally:
        rcv.close()
        save()
    print_table(RESULTS)


def print_table(r: dict) -> None:
    print("\n=== gpu_bench summary ===")
    pc = r.get("percall", {})
    if "probe_added_vs_two_bare_records" in pc:
        x = pc["probe_added_vs_two_bare_records"]
        m = pc["us_per_call_median"]
        print("per call: probe adds %.2f us; two bare records %.2f us; ratio %.3f [%.3f, %.3f] (target <= 1.2)" % (
            pc["probe_added_us_median"], m["two_bare_records"], x["median_ratio"], *x["ci95"]))
    oh = pc.get("off_hot_path") or {}
    if oh:
        print("off the hot path, per step: drain %.1f us CPU, drain+OTLP export %.1f us CPU" % (
            oh.get("drain_cpu_us_per_step", float("nan")), oh.get("drain_and_export_cpu_us_per_step", float("nan"))))
    for name, x in (r.get("loops") or {}).items():
        if not isinstance(x, dict) or "ratios_vs_untimed" not in x:
            continue
        rv = x["ratios_vs_untimed"]
        graph = name.startswith("graph")
        # All CPU charged (the drain's and the export's CPU added to the step) has its own target
        # on graph loops: 1.02; everything else 1.005 on graph loops, 1.01 on eager ones.
        targets = {"probe_charged": 1.02} if graph else {}
        target = 1.005 if graph else 1.01
        labels = {"probe_hot": "hot path", "probe": "full export in-block", "probe_charged": "all CPU charged",
                  "sync": "synchronize() timer"}
        # Only the probe as deployed is judged against the target; the rest are diagnostics.
        judged = ("probe", "probe_hot", "probe_charged")
        print("%-24s %6.2f ms  %s" % (name, x["step_ms_events"], " | ".join(
            "%s %.4f [%.4f, %.4f]%s" % (labels.get(k, k), v["median_ratio"], *v["ci95"],
                                        "" if k not in judged else
                                        (" met" if v["ci95"][1] <= targets.get(k, target) else " MISSED"))
            for k, v in rv.items())))
        p99 = (x.get("p99_step_ratio_vs_untimed") or {}).get("probe")
        gpu99 = (x.get("p99_gpu_step_ratio_vs_untimed") or {}).get("probe")
        rest99 = (x.get("p99_gpu_step_ratio_vs_untimed_after_first") or {}).get("probe")
        if gpu99 is not None:  # the step time a client sees: completions of consecutive steps
            print("%-24s p99 step on/off %.4f%s (host call %.4f; without each block's first step %.4f)" % (
                "", gpu99, " met" if gpu99 <= 1.01 else " MISSED", p99 if p99 is not None else float("nan"),
                rest99 if rest99 is not None else float("nan")))
        elif p99 is not None:
            print("%-24s p99 host step on/off %.4f%s" % ("", p99, " met" if p99 <= 1.01 else " MISSED"))
    for name, x in (r.get("accuracy") or {}).items():
        if isinstance(x, dict) and "probe_over_kernel_sum" in x:
            print("accuracy %-24s per-step median: probe/kernel-sum %s, probe/envelope %s; means: probe %.3f ms, "
                  "kernel sum %.3f ms" % (
                      name, "%.4f" % x["probe_over_kernel_sum_median"] if "probe_over_kernel_sum_median" in x else "-",
                      "%.4f" % x["probe_over_envelope_median"] if "probe_over_envelope_median" in x else "-",
                      x["probe_ms_mean"], x["kernel_sum_ms_mean"]))


if __name__ == "__main__":
    main()
