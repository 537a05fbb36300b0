"""What the run fingerprint adds to a scheduler process's startup, measured side by side.

Run with the Python of a venv that has SGLang (the probe from this checkout is put on sys.path):

    SGL_PROBE_HARNESS_DIR=... .harness/venv-0.5.23/bin/python benchmarks/fingerprint_cost.py \
        [--pairs 15] [--busy-s 1.0] [--json benchmarks/results/fingerprint_cost.json]

In one process that has imported what a scheduler imports (torch, SGLang's scheduler module):

1. ``collect()`` itself: the first call (this process's first look at SGLang's ~5,800 RECORD
   files) and repeated calls, default mode (stat every file, hash only files changed since
   install) and ``full`` (hash every file).
2. What the scheduler's own thread pays: the probe starts the fingerprint in a background thread
   from ``Scheduler.__init__``. The worst case for the scheduler is startup work that holds the
   GIL all the time, so the main thread runs a fixed pure-Python loop (``--busy-s``) with and
   without the fingerprint thread running beside it, alternating order every pair. Printed: the
   median loop time of each, their ratio with a bootstrap 95 % interval, and the median added
   milliseconds. The call that starts the thread is timed too (what blocks the constructor).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def busy(n: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - t0


def calibrate(seconds: float) -> int:
    n = 200_000
    while busy(n) < seconds / 4:
        n *= 2
    return int(n * seconds / busy(n))


def fingerprint_thread() -> threading.Thread:
    """What ``Probe._start_fingerprint`` does, minus the exporter (collect + attributes)."""
    from sgl_probe import envsnap, fingerprint

    def work() -> None:
        fingerprint.to_attributes(fingerprint.collect(launcher_env=envsnap.launcher_env()))

    t = threading.Thread(target=work, name="sgl-probe-fingerprint", daemon=True)
    t.start()
    return t


def ci_ratio(a: list[float], b: list[float], rounds: int = 2000) -> tuple[float, float]:
    ratios = [x / y for x, y in zip(a, b)]
    meds = sorted(statistics.median(random.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--busy-s", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    import torch  # noqa: F401  (the scheduler has it)
    import sglang.srt.managers.scheduler  # noqa: F401
    import_s = time.perf_counter() - t0
    from sgl_probe import fingerprint

    t0 = time.perf_counter()
    first = fingerprint.collect()
    first_ms = (time.perf_counter() - t0) * 1e3
    repeat = []
    for _ in range(5):
        t0 = time.perf_counter()
        fingerprint.collect()
        repeat.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    full = fingerprint.collect(full=True)
    full_ms = (time.perf_counter() - t0) * 1e3

    n = calibrate(args.busy_s)
    plain, with_fp, start_us, fp_done_s = [], [], [], []
    for i in range(args.pairs):
        for kind in (("plain", "fp") if i % 2 else ("fp", "plain")):
            if kind == "plain":
                plain.append(busy(n))
                continue
            t0 = time.perf_counter()
            th = fingerprint_thread()
            start_us.append((time.perf_counter() - t0) * 1e6)
            with_fp.append(busy(n))
            th.join()
            fp_done_s.append(time.perf_counter() - t0)
    lo, hi = ci_ratio(with_fp, plain)
    out = {
        "date": time.strftime("%Y-%m-%d"), "python": sys.version.split()[0],
        "sglang": first["sglang"].get("version"), "record_files": first["sglang"].get("checked"),
        "hashed_default": first["sglang"].get("hashed"), "import_s": round(import_s, 2),
        "collect_first_ms": round(first_ms, 1), "collect_repeat_median_ms": round(statistics.median(repeat), 1),
        "collect_full_ms": round(full_ms, 1), "full_hashed": full["sglang"].get("hashed"),
        "pairs": args.pairs, "busy_s": args.busy_s,
        "startup_loop_median_s": {"without": round(statistics.median(plain), 4),
                                  "with_fingerprint_thread": round(statistics.median(with_fp), 4)},
        "ratio_median": round(statistics.median(w / p for w, p in zip(with_fp, plain)), 4),
        "ratio_ci95": [round(lo, 4), round(hi, 4)],
        "added_ms_median": round(statistics.median((w - p) * 1e3 for w, p in zip(with_fp, plain)), 1),
        "thread_start_us_median": round(statistics.median(start_us), 1),
        "fingerprint_done_after_s_median": round(statistics.median(fp_done_s), 3),
    }
    print(f"SGLang {out['sglang']}: {out['record_files']} RECORD files; import of torch + scheduler {import_s:.1f} s")
    print(f"collect(): first {first_ms:.0f} ms, repeated {out['collect_repeat_median_ms']:.0f} ms "
          f"(hashed {out['hashed_default']}), full hash {full_ms:.0f} ms ({out['full_hashed']} files)")
    print(f"startup work holding the GIL, {args.pairs} pairs side by side:")
    print(f"  without fingerprint  {out['startup_loop_median_s']['without']:.3f} s")
    print(f"  with fingerprint     {out['startup_loop_median_s']['with_fingerprint_thread']:.3f} s"
          f"   ratio {out['ratio_median']:.3f} (95 % CI {lo:.3f}-{hi:.3f}), +{out['added_ms_median']:.0f} ms")
    print(f"  starting the thread blocks the caller {out['thread_start_us_median']:.0f} µs")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
