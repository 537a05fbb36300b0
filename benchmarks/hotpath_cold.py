"""The probe's hot path with the CPU caches cold, as in a real scheduler loop (CPU machine, no GPU).

Between two scheduler steps SGLang runs its own Python over megabytes of objects and issues
hundreds of launches, so every wrapped call finds the probe's code and data evicted. On the real
tiny server on an H200 the hot path alone cost ~2.5 % of a ~2.1 ms decode step, ~50 µs (run
h200-13), against ~3-10 µs for the same calls in a warm micro-loop. This
reproduces that on any machine: a scheduler-shaped loop (one step, one decode phase, one graph
replay per step, wrapped by the real probe through its own target table, CPU timer), and between
two steps a walk over ``--evict-kb`` of shuffled objects that evicts the caches. Only the wrapped
call is timed (``perf_counter_ns`` around it), in blocks that alternate recording and paused (the
step hooks off, as SGLang runs with the probe paused); the drain waits until the end and the
export is off (this is the hot path, not the drain or the export: ``export_cpu.py``).

    python3 benchmarks/hotpath_cold.py [--evict-kb 4096] [--steps 400] [--repeats 12] [--json FILE]
                                       [--roles step,phase,graph] [--hotpaths c,python]
                                       [--compare REV --turns 6 --hotpaths c]

``--roles``: wrap only these of the table's roles (what each wrapped call costs cold).
``--compare REV``: this tree against git revision REV (its C hot path compiled), in turns of fresh
processes, with the paired ratio of their cold costs.

Prints one JSON object: per state, the median wrapped call in µs with the caches cold and warm
(the same steps without the walk), the probe's cost (recording minus paused, per repeat; median
and 95 % bootstrap interval), and cold / warm.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))
from gpu_common import bootstrap_median_ci, median_ci, print_result  # noqa: E402
from sched_shape import ROLES, install, table  # noqa: E402

MODULE = "hotpath_cold_workload"


def _workload(name: str):
    """The scheduler-shaped module (:mod:`sched_shape`) with no work of its own in the forward, so
    the timed call is the probe's wrappers and the bare calls under them."""
    from tests.workload import Batch, ForwardMode

    batch = Batch(ForwardMode.DECODE, 16)
    batch.seq_lens = _SeqLens((16,))  # what the readers see of SGLang's tensor: its shape
    return install(name, lambda: None), batch


class _SeqLens:
    """SGLang's ``seq_lens`` tensor as the probe reads it (``shape`` only, never the data)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape


class _Obj:
    __slots__ = ("x", "y")

    def __init__(self, i: int) -> None:
        self.x, self.y = i, -i


def _evictor(kb: int):
    """A walk over ~``kb`` KiB of objects in shuffled order (each slotted object and its int
    take ~80 bytes)."""
    objs = [_Obj(i) for i in range(max(1, kb * 1024 // 80))]
    random.Random(0).shuffle(objs)

    def walk() -> int:
        t = 0
        for o in objs:
            t += o.x
        return t

    return walk


def run(evict_kb: int, steps: int, repeats: int, roles: tuple = ROLES, hotpaths: tuple = ("auto",)) -> dict:
    """``hotpaths``: one probe per hot path (``SGL_PROBE_HOTPATH`` values), each on its own copy of
    the workload, their blocks interleaved."""
    # No drain pass during the blocks: its GIL holds would land in whichever timed call they
    # interrupt (export_cpu.py measures those); the records wait, none dropped.
    os.environ.update({"SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_METRICS": "off",
                       "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_MAX_PENDING": str(10 ** 7)})
    for key in ("SGL_PROBE_TRACE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        os.environ.pop(key, None)
    import dataclasses

    from sgl_probe import config
    from sgl_probe.activate import Probe

    walk = _evictor(evict_kb)
    clock = time.perf_counter_ns
    rigs = {}
    for hp in hotpaths:
        name = f"{MODULE}_{hp}"
        Scheduler, batch = _workload(name)
        probe = Probe(dataclasses.replace(config.load(), hotpath=hp), targets=table(name, roles))
        probe.instrumentor.instrument()
        rigs[hp] = (probe, Scheduler(), batch, [h for h in probe.instrumentor.hooks if h.target.role == "step"])

    def block(hp: str, recording: bool, cold: bool) -> float:
        _, sched, batch, step_hooks = rigs[hp]
        for h in step_hooks:
            h.enabled = recording
        total = 0
        for _ in range(steps):
            if cold:
                walk()
            t = clock()
            sched.run_batch(batch)
            total += clock() - t
        return total / steps / 1e3

    for hp in hotpaths:  # warm-up: first calls, the drain thread's start
        for cold in (True, False):
            for recording in (True, False):
                block(hp, recording, cold)
    got: dict = {(h, r, c): [] for h in hotpaths for r in (True, False) for c in (True, False)}
    for i in range(repeats):
        order = [(h, r, c) for c in (True, False) for h in hotpaths for r in (True, False)]
        for key in (order if i % 2 == 0 else order[::-1]):
            got[key].append(block(*key))
    out: dict = {"evict_kb": evict_kb, "steps": steps, "repeats": repeats, "timer": "cpu", "roles": list(roles),
                 "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    for hp in hotpaths:
        probe = rigs[hp][0]
        res: dict = {"hotpath": probe.recorder.hotpath, "steps_recorded": len(probe.recorder.steps)}
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()
        for cold in (True, False):
            name = "cold" if cold else "warm"
            cost = [a - b for a, b in zip(got[(hp, True, cold)], got[(hp, False, cold)])]
            med, lo, hi = bootstrap_median_ci(cost)
            res[name] = {"recording_us": statistics.median(got[(hp, True, cold)]),
                         "paused_us": statistics.median(got[(hp, False, cold)]),
                         "probe_us": med, "probe_us_ci95": [lo, hi]}
        res["probe_cold_over_warm"] = (res["cold"]["probe_us"] / res["warm"]["probe_us"]
                                       if res["warm"]["probe_us"] > 0 else None)
        if len(hotpaths) == 1:
            out.update(res)
        else:
            out[hp] = res
    if set(hotpaths) >= {"c", "python"}:
        # Paired per repeat: the C probe's cold cost over the Python one's.
        pairs = [(a - b) / (x - y) for a, b, x, y in zip(got[("c", True, True)], got[("c", False, True)],
                                                         got[("python", True, True)], got[("python", False, True)])
                 if x - y > 0]
        if pairs:
            med, lo, hi = bootstrap_median_ci(pairs)
            out["cold_probe_c_over_python"] = {"median": med, "ci95": [lo, hi]}
    return out


def compare(args) -> dict:
    """This tree's probe against git revision ``args.compare``'s (that revision's own copy of this
    script, its C hot path compiled), run in turns in fresh processes: each turn measures
    ``--repeats`` blocks per state; the paired ratio is new / base of the cold probe cost per turn."""
    import json
    import subprocess
    import tempfile

    from gpu_common import checkout, rotation

    def turn(script: str, out: str) -> dict:
        cmd = [sys.executable, script, "--evict-kb", str(args.evict_kb), "--steps", str(args.steps), "--repeats",
               str(args.repeats), "--roles", args.roles, "--hotpaths", args.hotpaths, "--json", out]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
        return json.loads(Path(out).read_text())

    with tempfile.TemporaryDirectory() as tmp:
        scripts = {"new": __file__, "base": str(checkout(args.compare, tmp) / "benchmarks" / "hotpath_cold.py")}
        runs: dict = {"new": [], "base": []}
        for i in range(args.turns):
            for side in rotation(("new", "base"), i):
                runs[side].append(turn(scripts[side], os.path.join(tmp, f"{side}{i}.json")))

    def cost(side: str, state: str) -> list:
        return [r[state]["probe_us"] for r in runs[side]]

    return {"base": args.compare, "turns": args.turns, "steps": args.steps, "repeats_per_turn": args.repeats,
            "evict_kb": args.evict_kb, "hotpath": {s: runs[s][0].get("hotpath") for s in runs},
            "probe_us": {s: {st: median_ci(cost(s, st)) for st in ("cold", "warm")} for s in runs},
            "cold_probe_new_over_base": median_ci([a / b for a, b in zip(cost("new", "cold"), cost("base", "cold")) if b > 0]),
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--evict-kb", type=int, default=4096, help="objects walked between two steps, KiB")
    ap.add_argument("--steps", type=int, default=400, help="steps per block")
    ap.add_argument("--repeats", type=int, default=12, help="blocks per state")
    ap.add_argument("--roles", default=",".join(ROLES), help="wrap only these roles (comma-separated)")
    ap.add_argument("--hotpaths", default="auto",
                    help="comma-separated SGL_PROBE_HOTPATH values, measured side by side (e.g. c,python)")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--compare", metavar="REV", help="also run the probe of git revision REV, in turns (one hot path)")
    ap.add_argument("--turns", type=int, default=6, help="with --compare: fresh processes per side")
    args = ap.parse_args(argv)
    roles = tuple(args.roles.split(","))
    if not set(roles) <= set(ROLES) or "step" not in roles:
        ap.error(f"--roles: from {ROLES}, step among them (phases are recorded inside a step)")
    hotpaths = tuple(args.hotpaths.split(","))
    from sgl_probe.hotpath import CHOICES

    if not set(hotpaths) <= set(CHOICES) or len(set(hotpaths)) != len(hotpaths):
        ap.error("--hotpaths: distinct values from " + ", ".join(CHOICES))
    if args.compare:
        if len(hotpaths) != 1:
            ap.error("--compare: one --hotpaths value")
        print_result(compare(args), args.json)
        return 0
    print_result(run(args.evict_kb, args.steps, args.repeats, roles, hotpaths), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
