"""benchmarks/sampling_cost.py runs and its two decisions agree (it stops when they differ), with
steps both kept by the sampler and kept because slow."""

from __future__ import annotations

from pathlib import Path

from tests.benchruns import run_benchmark


def test_sampling_cost_times_both_decisions_and_they_agree(tmp_path: Path):
    res = run_benchmark(tmp_path, "sampling_cost.py", "--rows", "400", "--rounds", "3", "--rate", "0.2").result
    assert res["rows"] == 400 and 0 < res["kept_slow"] < res["kept"] < 400
    assert all(v > 0 for v in res["us_per_step"].values())
    r = res["release_over_previous"]
    assert 0 < r["ci95"][0] <= r["median"] <= r["ci95"][1]
