"""The drain thread's CPU per step, stage by stage (CPU machine, no GPU): what it holds the GIL for,
which a launch-bound scheduler thread waits out (BENCHMARKS.md, runs h200-13 to h200-19).

A scheduler-shaped loop (:mod:`sched_shape`: step, decode phase, graph replay; the real probe, CPU
timer, the summary line on) records ``--steps`` steps (a second of the tiny server); then, as a
drain pass does, they are taken in the drain's chunks (``take``: ready checks, rows, the records
freed), added to the summary line's window (``summary``), encoded for the exporter process's link
as its sink would (``encode``: packed by the C extension, else pickled), and the rows and messages
freed (``all`` is the whole pass). ``packed_pass``: as many steps again in the drain's packed pass
(every step exported, no sampler, no metrics: each step written straight into the link's message
and the summary, no rows), each pass beside the rows' one, either first by turns; ``packed_pass_over_all``
their ratio per run. Wall time per step (the loop is single-threaded and the machine otherwise
idle), median over ``--passes`` passes after ``--warmup``; each run a fresh process.

``--metrics``: both passes also feed the phase metrics (a ``PhaseMetrics`` with the C loop and no
sink: what ``--enable-metrics`` or OTLP metrics add to the drain thread), the rows' pass through
``observe_rows`` with the summary, the packed pass as it takes each step (releases that do not
feed metrics from the packed pass run the rows' pass only).

``--evict-kb N``: after recording and before each pass, a walk over ~N KiB of shuffled objects
(``hotpath_cold``'s), as SGLang's own work between two drain passes leaves the records cold: on a
server they were written up to a second earlier, by another thread, and evicted since. Only the
pass after the walk is timed.

``--sampled RATE``: a ratio sampler (``OTEL_TRACES_SAMPLER=traceidratio``) keeps that share of the
steps, plus the slow ones: the rows' pass decides each row (``StepSampling.keep_row``) and encodes
the kept ones; the packed pass decides in C as it writes (releases without the C sampler run the
rows' pass only, as their drain did for a sampled server).

    python3 benchmarks/drain_cpu.py [--steps 540] [--passes 20] [--runs 4] [--metrics] [--sampled RATE]
                                    [--evict-kb N] [--compare REV] [--json FILE]

``--compare REV``: the same in fresh processes with git revision REV's probe (its C hot path
compiled), runs alternating, with the paired ratios of ``all`` and of the packed pass per run, this
tree over REV.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = ("take", "summary", "encode", "all", "packed_pass")


def worker(root: str, steps: int, passes: int, warmup: int, with_metrics: bool = False,
           sampled: float | None = None, evict_kb: int = 0) -> dict:
    sys.path[:0] = [root, str(HERE)]
    os.environ.update({"SGL_PROBE_SUMMARY_S": "30", "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_METRICS": "off",
                       "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_MAX_PENDING": str(10 ** 7)})
    if sampled is not None:
        os.environ.update({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(sampled)})
    for key in ("SGL_PROBE_TRACE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(key, None)
    import sgl_probe
    from sgl_probe import config, export, wire
    from sgl_probe.activate import Probe
    from sgl_probe.drain import take_ready

    from hotpath_cold import _evictor, _workload
    from sched_shape import ROLES, table

    walk = _evictor(evict_kb) if evict_kb else (lambda: 0)
    Scheduler, batch = _workload("drain_cpu_workload")
    probe = Probe(config.load(), targets=table("drain_cpu_workload", ROLES))
    probe.instrumentor.instrument()
    sched = Scheduler()
    rec, pipe = probe.recorder, probe.pipeline
    packs = "pack" in inspect.signature(wire.encode_steps).parameters  # revisions before it pickled
    pack = getattr(rec.c, "pack_steps", None) if packs else None
    clock = time.perf_counter_ns
    packed_type = getattr(rec.c, "PackedSteps", None)  # revisions before it had no packed pass
    metrics = None
    if with_metrics:
        from sgl_probe.metrics import PhaseMetrics

        metrics = pipe.metrics = PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=rec.c)
        if "metrics" not in inspect.signature(take_ready).parameters:
            packed_type = None  # no packed pass with metrics in that revision
    packed_args: tuple = () if metrics is None else (metrics,)
    sampling = pipe.sampling if sampled is not None else None
    if sampling is not None:
        c_state = getattr(sampling, "c_state", None)
        if c_state is None or c_state() is None or "sampler" not in inspect.signature(take_ready).parameters:
            packed_type = None  # no packed pass with a sampler in that revision
        else:
            packed_args = (metrics, c_state())
    kept_total = [0, 0]  # steps the rows' pass / the packed pass sent
    got: dict = {k: [] for k in STAGES}

    def packed_pass() -> int:
        """The same steps in the drain's packed pass (export.Pipeline.drain's loop, no sink): taken
        straight into link messages and the summary, the messages freed."""
        for _ in range(steps):
            sched.run_batch(batch)
        walk()
        t0 = clock()
        limit = export.packed_limit(None) if hasattr(export, "packed_limit") else wire.MAX_MESSAGE
        due_args = (not getattr(rec.timer, "elapsed_keeps_gil", True),) \
            if "reads_ahead" in inspect.signature(export.packed_due).parameters else ()  # revisions before: none
        pk, msgs, left, n = packed_type(limit), [], [], 0
        while True:
            before = pk.rows
            if not take_ready(rec.steps, rec.timer, clock(), False, export.CHUNK, left, pk, pipe.summary, *packed_args):
                break
            n += pk.rows - before + len(left)
            if export.packed_due(pk, *due_args):
                kept_total[1] += pk.rows
                msgs.append(pk.finish())
        kept_total[1] += pk.rows
        msgs.append(pk.finish())
        del msgs, left
        if n != steps and sampling is None:
            raise RuntimeError(f"packed: took {n} of {steps} steps")
        return clock() - t0

    for i in range(warmup + passes):
        packed_ns = packed_pass() if packed_type is not None and i % 2 else None  # either first, by turns
        for _ in range(steps):
            sched.run_batch(batch)
        walk()
        rows: list = []
        t0 = clock()
        while take_ready(rec.steps, rec.timer, clock(), False, export.CHUNK, rows):
            pass
        t1 = clock()
        for j in range(0, len(rows), export.CHUNK):
            pipe.observe_rows(rows[j:j + export.CHUNK])
        t2 = clock()
        n = len(rows)
        if sampling is None:
            slow = [False] * len(rows)
        else:  # the drain's decision per row, then only the kept ones encoded
            kept, slow = [], []
            for row in rows:
                keep, was_slow = sampling.keep_row(row)
                if keep:
                    kept.append(row)
                    slow.append(was_slow)
            rows = kept
            kept_total[0] += len(rows)
        msgs = wire.encode_steps(rows, slow, pack) if packs else wire.encode_steps(rows, slow)
        t3 = clock()
        del rows, msgs, slow
        t4 = clock()
        if n != steps:
            raise RuntimeError(f"took {n} of {steps} steps")
        if packed_type is not None and not i % 2:
            packed_ns = packed_pass()
        if i >= warmup:
            for k, (a, b) in zip(STAGES, ((t0, t1), (t1, t2), (t2, t3), (t0, t4))):
                got[k].append((b - a) / steps / 1e3)
            if packed_ns is not None:
                got["packed_pass"].append(packed_ns / steps / 1e3)
    probe.instrumentor.uninstrument()
    if metrics is not None and metrics.failed:
        raise RuntimeError("the metrics switched themselves off")
    return {"probe": os.path.dirname(sgl_probe.__file__), "hotpath": rec.hotpath, "packed": pack is not None,
            "metrics": metrics is not None, "sampled": sampled, "evict_kb": evict_kb, "sent_rows_packed": kept_total,
            **{f"{k}_us_per_step": statistics.median(v) if v else None for k, v in got.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=540, help="steps per drain pass")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="passes left out first")
    ap.add_argument("--runs", type=int, default=4, help="fresh processes per side")
    ap.add_argument("--metrics", action="store_true", help="both passes also feed the phase metrics")
    ap.add_argument("--sampled", type=float, metavar="RATE", help="a ratio sampler keeping this share")
    ap.add_argument("--evict-kb", type=int, default=0, help="objects walked before each pass, KiB")
    ap.add_argument("--compare", metavar="REV", help="also run git revision REV's probe, runs alternating")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--worker", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.passes, args.warmup, args.metrics, args.sampled,
                                args.evict_kb)))
        return 0

    sys.path.insert(0, str(HERE))
    from gpu_common import median_ci, print_result, revision_roots, worker_json

    with tempfile.TemporaryDirectory() as tmp:
        roots = revision_roots(args.compare, tmp)
        runs: dict = {side: [] for side in roots}
        for i in range(args.runs):
            for side in (roots if i % 2 == 0 else list(roots)[::-1]):
                runs[side].append(worker_json([sys.executable, __file__, "--worker", roots[side], "--steps",
                                               str(args.steps), "--passes", str(args.passes), "--warmup",
                                               str(args.warmup)] + (["--metrics"] if args.metrics else [])
                                              + ([] if args.sampled is None else ["--sampled", str(args.sampled)])
                                              + (["--evict-kb", str(args.evict_kb)] if args.evict_kb else [])))
    out: dict = {"steps": args.steps, "passes": args.passes, "warmup": args.warmup, "runs": args.runs,
                 "metrics": args.metrics, "sampled": args.sampled, "evict_kb": args.evict_kb, "python": sys.version.split()[0]}
    if args.compare:
        out["base"] = args.compare
    for side, rs in runs.items():
        out[side] = {"hotpath": rs[0]["hotpath"], "packed": rs[0]["packed"],
                     **{k: median_ci([r[f"{k}_us_per_step"] for r in rs]) for k in STAGES
                        if rs[0].get(f"{k}_us_per_step") is not None}, "per_run": rs}
        if rs[0].get("packed_pass_us_per_step") is not None:  # side by side in each process
            out[side]["packed_pass_over_all"] = median_ci([r["packed_pass_us_per_step"] / r["all_us_per_step"] for r in rs])
    if args.compare:
        out["all_new_over_base"] = median_ci([a["all_us_per_step"] / b["all_us_per_step"]
                                       for a, b in zip(runs["new"], runs["base"])])
        pairs = [(a["packed_pass_us_per_step"], b["packed_pass_us_per_step"]) for a, b in zip(runs["new"], runs["base"])
                 if a.get("packed_pass_us_per_step") and b.get("packed_pass_us_per_step")]
        if pairs:
            out["packed_pass_new_over_base"] = median_ci([a / b for a, b in pairs])
    print_result(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
