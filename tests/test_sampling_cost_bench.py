"""benchmarks/sampling_cost.py runs and its decisions agree (it stops when they differ), with
steps both kept by the sampler and kept because slow; with the C extension the C rules are timed
too."""

from __future__ import annotations

from pathlib import Path

from sgl_probe import hotpath
from tests.benchruns import run_benchmark


def test_sampling_cost_times_every_decision_and_they_agree(tmp_path: Path):
    res = run_benchmark(tmp_path, "sampling_cost.py", "--rows", "400", "--rounds", "3", "--rate", "0.2").result
    assert res["rows"] == 400 and 0 < res["kept_slow"] < res["kept"] < 400
    assert all(v > 0 for v in res["us_per_step"].values())
    r = res["release_over_previous"]
    assert 0 < r["ci95"][0] <= r["median"] <= r["ci95"][1]
    assert ("c_over_release" in res) == (hotpath.load("c") is not None)
    if "c_over_release" in res:
        assert set(res["us_per_step"]) == {"release", "previous", "c"}
