"""benchmarks/sampling_cost.py runs and its two decisions agree (it stops when they differ), with
steps both kept by the sampler and kept because slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sampling_cost_times_both_decisions_and_they_agree(tmp_path: Path):
    out = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sampling_cost.py"), "--rows", "400",
                           "--rounds", "3", "--rate", "0.2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert res["rows"] == 400 and 0 < res["kept_slow"] < res["kept"] < 400
    assert all(v > 0 for v in res["us_per_step"].values())
    r = res["release_over_previous"]
    assert 0 < r["ci95"][0] <= r["median"] <= r["ci95"][1]
