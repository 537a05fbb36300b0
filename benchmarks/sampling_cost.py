"""CPU the drain thread spends deciding which steps a ratio sampler keeps, per step, side by side.

With ``OTEL_TRACES_SAMPLER=traceidratio`` the drain decides every resolved step before any span is
built (the slow-step keep included). This times, on the same rows (plain tuples, as the C drain
makes them), the release's decision (``StepSampling.keep_row``: fields by position, the trace id's
prefix hashed once, the sampler's own ratio rule) against the previous one, rebuilt here: a named
ResolvedStep of each row, the whole trace id key hashed, the SDK's ``should_sample`` per step.
With the C extension, ``c``: the same rules in C (``sgl_probe._hot.StepSampler``, what the drain
decides with, through ``keep_row`` here; its packed pass calls it without the Python call:
``drain_cpu.py --sampled``). Rounds alternate; this thread's CPU time; all must take the same
decisions.

    python3 benchmarks/sampling_cost.py [--rows 4000] [--rounds 21] [--rate 0.1] [--json FILE]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))
from gpu_common import median_ci, print_result  # noqa: E402
from opentelemetry.sdk.trace.sampling import Decision  # noqa: E402

from sgl_probe import hotpath, sampling, spans  # noqa: E402
from sgl_probe.resolved import ResolvedPhase, ResolvedStep, from_row, to_row  # noqa: E402

IDENT = {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0}


def rows(n: int) -> list[tuple]:
    """Decode steps of ~1 ms with a slow one now and then, and a prefill in five."""
    rnd = random.Random(1)
    out = []
    for i in range(1, n + 1):
        mode = "EXTEND" if i % 5 == 0 else "DECODE"
        ns = int((20.0 if i % 97 == 0 else 1.0 + rnd.random() * 0.1) * 1e6)
        ph = ResolvedPhase("decode" if mode == "DECODE" else "extend", 0, ns, True, mode, 8, 8, 0.05, "t")
        st = ResolvedStep(i, 0, ns, mode, 8, 8, 0.1, "cuda", (ph,))
        out.append(to_row(st))
    return out


def previous_keep(s: sampling.StepSampling, row: tuple) -> tuple[bool, bool]:
    """The decision as the drain took it before ``keep_row``."""
    step = from_row(row)
    slow = s.slow.is_slow(step)
    trace_id = spans.step_trace_id(s.run_id, s.ident, step.index)
    if s.sampler.should_sample(None, trace_id, "sglang.step").decision == Decision.RECORD_AND_SAMPLE:
        return True, False
    return (True, True) if slow else (False, False)


def one(kind: str, data: list[tuple], env: dict) -> tuple[float, list]:
    s = sampling.StepSampling("bench-run", dict(IDENT), env, fast=hotpath.load("c") if kind == "c" else None)
    keep = s.keep_row if kind != "previous" else (lambda row: previous_keep(s, row))
    t0 = time.thread_time_ns()
    got = [keep(row) for row in data]
    return (time.thread_time_ns() - t0) / len(data) / 1e3, got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    data = rows(args.rows)
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(args.rate)}
    kinds = ("release", "previous") + (("c",) if hotpath.load("c") is not None else ())
    times: dict = {k: [] for k in kinds}
    kept = None
    for r in range(args.rounds + 1):  # the first round warms them up and is not kept
        got = {}
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            us, got[kind] = one(kind, data, env)
            if r:
                times[kind].append(us)
        if any(got[k] != got["release"] for k in kinds):
            raise SystemExit("the decisions differ")
        kept = got["release"]
    out = {"rows": args.rows, "rounds": args.rounds, "rate": args.rate,
           "kept": sum(k for k, _ in kept), "kept_slow": sum(s for _, s in kept),
           "us_per_step": {k: statistics.median(v) for k, v in times.items()},
           "release_over_previous": median_ci([a / b for a, b in zip(times["release"], times["previous"])])}
    if "c" in times:
        out["c_over_release"] = median_ci([a / b for a, b in zip(times["c"], times["release"])])
    print_result(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
