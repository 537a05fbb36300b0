"""What the probe's records cost the garbage collector (CPU machine, no GPU).

A record lives from its step to the drain pass that resolves it (about a second: ~500 steps on a
launch-bound server), and the summary line's window keeps every call of 30 s. An object the
collector tracks is scanned by every young collection in that time, survives them, and is moved
to the oldest generation; enough of those and CPython runs a full collection, which scans the
server's whole heap (SGLang, torch: about a million objects) on the scheduler thread. Every
allocation of a collector-aware object also counts toward the next young collection until it is
freed, and those collections promote SGLang's own young objects too.

This measures it: a scheduler-shaped loop (:mod:`sched_shape`, the real probe through its own
target table, CPU timer, export off, the summary line on) over a heap of ``--heap`` objects (fewer
than a server's: full collections come sooner, each scanning less, so their cost per step is about
the same and a run of minutes shows them), ``--churn`` objects of the loop's own per step living
``--churn-life`` steps, the drain run every ``--drain-every`` steps; the collector's time by
generation from ``gc.callbacks``, and the loop's time per step (the probe's whole cost in it:
wrappers, drain, collections). Each run is a fresh process, recording or paused (the step hooks
off, as SGLang runs with the probe paused). The probe's share is recording minus paused, per turn.

    python3 benchmarks/gc_cost.py [--heap 200000] [--steps 300000] [--turns 5] [--json FILE]
                                  [--compare REV]

``--compare REV``: the same runs with git revision REV's probe (its C hot path compiled), in
turns, with the paired ratios of the probe's GC time and of its share of the loop, this tree over REV.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STATES = ("recording", "paused")


def worker(args) -> dict:
    """One run in this process, with the probe found at ``args.probe_root``."""
    sys.path[:0] = [args.probe_root, str(HERE)]
    # The summary line on, at its default: its window holds every call of 30 s.
    os.environ.update({"SGL_PROBE_SUMMARY_S": "30", "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_METRICS": "off",
                       "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_MAX_PENDING": str(10 ** 7)})
    for key in ("SGL_PROBE_TRACE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(key, None)

    import sgl_probe
    from hotpath_cold import _workload
    from sched_shape import ROLES, table
    from sgl_probe import config
    from sgl_probe.activate import Probe

    heap = [[i] for i in range(args.heap)]  # the server's long-lived objects
    name = "gc_cost_workload"
    Scheduler, batch = _workload(name)
    probe = Probe(config.load(), targets=table(name, ROLES))
    probe.instrumentor.instrument()
    sched = Scheduler()
    for h in probe.instrumentor.hooks:
        if h.target.role == "step":
            h.enabled = args.state == "recording"
    ring: list = [None] * args.churn_life

    def run(steps: int) -> None:
        for i in range(steps):
            ring[i % args.churn_life] = [[i] for _ in range(args.churn)]  # the loop's own objects
            sched.run_batch(batch)
            if i % args.drain_every == args.drain_every - 1:
                probe.pipeline.drain()

    run(2 * args.drain_every)  # first calls
    probe.pipeline.drain()
    gc.collect()
    # Tracked objects per step while it waits for the drain.
    before = len(gc.get_objects())
    run(args.drain_every - 1)
    per_pending = (len(gc.get_objects()) - before) / (args.drain_every - 1)
    probe.pipeline.drain()
    gc.collect()

    spent = [0] * 3
    count = [0] * 3
    t0 = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            t0[0] = time.perf_counter_ns()
        else:
            spent[info["generation"]] += time.perf_counter_ns() - t0[0]
            count[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    wall = time.perf_counter_ns()
    run(args.steps)
    wall = time.perf_counter_ns() - wall
    gc.callbacks.remove(on_gc)
    rec = probe.recorder
    out = {"probe": os.path.dirname(sgl_probe.__file__), "hotpath": rec.hotpath, "state": args.state,
           "heap": args.heap, "steps": args.steps, "steps_recorded": rec.step_count,
           "tracked_objects_per_pending_step": per_pending,
           "gc_us_per_step": sum(spent) / args.steps / 1e3,
           "gc_us_per_step_by_generation": [s / args.steps / 1e3 for s in spent],
           "collections_per_100k_steps_by_generation": [c * 1e5 / args.steps for c in count],
           "loop_us_per_step": wall / args.steps / 1e3}
    del heap
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heap", type=int, default=200_000, help="long-lived tracked objects (the server's heap)")
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--churn", type=int, default=30, help="the loop's own objects per step")
    ap.add_argument("--churn-life", type=int, default=50, help="steps each of them lives")
    ap.add_argument("--drain-every", type=int, default=500, help="steps between two drain passes")
    ap.add_argument("--turns", type=int, default=5, help="fresh processes per side and state")
    ap.add_argument("--compare", metavar="REV", help="also run git revision REV's probe, in turns")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--state", choices=STATES, help=argparse.SUPPRESS)
    ap.add_argument("--probe-root", default=str(ROOT), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    sys.path.insert(0, str(HERE))
    from gpu_common import median_ci, print_result, revision_roots, rotation, worker_json

    with tempfile.TemporaryDirectory() as tmp:
        roots = revision_roots(args.compare, tmp)
        runs: dict = {(side, state): [] for side in roots for state in STATES}
        variants = list(runs)
        for i in range(args.turns):
            for side, state in rotation(variants, i):
                cmd = [sys.executable, __file__, "--worker", "--state", state, "--probe-root", roots[side],
                       "--heap", str(args.heap), "--steps", str(args.steps), "--churn", str(args.churn),
                       "--churn-life", str(args.churn_life), "--drain-every", str(args.drain_every)]
                runs[(side, state)].append(worker_json(cmd))

    def probe_share(side: str, key: str) -> list:  # recording minus paused, per turn
        return [r[key] - p[key] for r, p in zip(runs[(side, "recording")], runs[(side, "paused")])]

    probe_gc = {side: probe_share(side, "gc_us_per_step") for side in roots}
    probe_loop = {side: probe_share(side, "loop_us_per_step") for side in roots}
    out: dict = {"heap": args.heap, "steps": args.steps, "churn": args.churn, "churn_life": args.churn_life,
                 "drain_every": args.drain_every, "turns": args.turns, "python": sys.version.split()[0]}
    if args.compare:
        out["base"] = args.compare
    for side in roots:
        rec, paused = runs[(side, "recording")], runs[(side, "paused")]
        out[side] = {
            "hotpath": rec[0]["hotpath"],
            "tracked_objects_per_pending_step": median_ci([r["tracked_objects_per_pending_step"] for r in rec]),
            "gc_us_per_step": {"recording": median_ci([r["gc_us_per_step"] for r in rec]),
                               "paused": median_ci([r["gc_us_per_step"] for r in paused])},
            "probe_gc_us_per_step": median_ci(probe_gc[side]),
            "probe_loop_us_per_step": median_ci(probe_loop[side]),
            "full_collections_per_100k_steps": {
                "recording": median_ci([r["collections_per_100k_steps_by_generation"][2] for r in rec]),
                "paused": median_ci([r["collections_per_100k_steps_by_generation"][2] for r in paused])},
            "runs": rec + paused,
        }
    if args.compare:
        for key, got in (("probe_gc_new_over_base", probe_gc), ("probe_loop_new_over_base", probe_loop)):
            pairs = [a / b for a, b in zip(got["new"], got["base"]) if b > 0]
            if pairs:
                out[key] = median_ci(pairs)
    print_result(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
