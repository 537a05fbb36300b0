"""Interpreter startup with sgl-probe installed (SGLang not imported) vs a bare venv.

Builds the wheel and three fresh venvs: bare; wheel installed; wheel installed with its startup
files (sgl_probe.pth / .start) removed, which isolates the hook's own cost from that of a bigger
site-packages (the wheel's dependencies: grpcio, protobuf, opentelemetry, wrapt). Times
``python -c pass`` round-robin, order reversed every round, and prints median paired ratios
with bootstrap 95 % intervals. Target: <= 1.05 against the bare venv.

    python3 benchmarks/startup.py [--pairs 200] [--json benchmarks/results/startup.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_common import bootstrap_median_ci  # noqa: E402  (stdlib only)
from tests.harness.wheel import build_wheel, fresh_venv  # noqa: E402


def once(python: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheel = build_wheel(tmp / "wheel")
        pys = {"bare": fresh_venv(tmp / "bare", None) / "bin" / "python",
               "probe": fresh_venv(tmp / "probe", wheel) / "bin" / "python",
               "deps_only": fresh_venv(tmp / "deps", wheel) / "bin" / "python"}
        sp = Path(subprocess.run([str(pys["deps_only"]), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip())
        for name in ("sgl_probe.pth", "sgl_probe.start"):
            (sp / name).unlink()
        for py in pys.values():  # warm the page cache
            for _ in range(5):
                once(py)
        times = {k: [] for k in pys}
        for i in range(args.pairs):
            order = list(pys) if i % 2 else list(reversed(pys))
            for k in order:
                times[k].append(once(pys[k]))
    out = {"rounds": args.pairs, "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d"),
           "target": 1.05, "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}}
    for label, num, den in (("probe_vs_bare", "probe", "bare"), ("probe_vs_deps_only", "probe", "deps_only"),
                            ("deps_only_vs_bare", "deps_only", "bare")):
        ratios = [a / b for a, b in zip(times[num], times[den])]
        _, lo, hi = bootstrap_median_ci(ratios)
        out[label] = {"median": statistics.median(ratios), "ci95": [lo, hi]}
        print(f"{label:<20} {statistics.median(ratios):.3f} (95% CI {lo:.3f}-{hi:.3f})")
    print("median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in out["median_ms"].items())
          + "; target: probe_vs_bare <= 1.05")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
