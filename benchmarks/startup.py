"""Interpreter startup with sgl-probe installed (SGLang not imported) vs a bare venv.

Builds the wheel, makes two fresh venvs (bare; wheel installed), then times ``python -c pass``
alternately in both, order flipped each pair, and prints the median paired ratio with a
bootstrap 95 % interval. Target: <= 1.05.

    python3 benchmarks/startup.py [--pairs 200] [--json benchmarks/results/startup.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.harness.wheel import build_wheel, fresh_venv  # noqa: E402


def once(python: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True)
    return time.perf_counter() - t0


def bootstrap_ci(ratios: list[float], n: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel = build_wheel(tmp / "wheel")
        bare = fresh_venv(tmp / "bare", None) / "bin" / "python"
        probed = fresh_venv(tmp / "probed", wheel) / "bin" / "python"
        for py in (bare, probed):  # warm the page cache
            for _ in range(5):
                once(py)
        ratios, t_bare, t_probe = [], [], []
        for i in range(args.pairs):
            if i % 2:
                b, p = once(bare), once(probed)
            else:
                p, b = once(probed), once(bare)
            t_bare.append(b)
            t_probe.append(p)
            ratios.append(p / b)
    lo, hi = bootstrap_ci(ratios)
    out = {"pairs": args.pairs, "bare_ms_median": statistics.median(t_bare) * 1e3,
           "probed_ms_median": statistics.median(t_probe) * 1e3,
           "ratio_median": statistics.median(ratios), "ratio_ci95": [lo, hi], "target": 1.05,
           "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    print(f"python -c pass: bare {out['bare_ms_median']:.1f} ms, with sgl-probe {out['probed_ms_median']:.1f} ms; "
          f"paired ratio {out['ratio_median']:.3f} (95% CI {lo:.3f}-{hi:.3f}; target <= 1.05)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
