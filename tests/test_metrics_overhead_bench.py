"""benchmarks/metrics_overhead.py runs, feeds every variant the drain's rows, and its metrics
really counted them (the OTLP variant's points reach the receiver)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchruns import run_benchmark
from tests.hotpaths import c_module

pytest.importorskip("prometheus_client")


@pytest.fixture(autouse=True)
def _c_extension():
    c_module()  # the C loop's variant needs it (skips, or fails where the CI requires it)


def test_metrics_overhead_times_every_variant_on_the_drains_feed(tmp_path: Path):
    res, stdout = run_benchmark(tmp_path, "metrics_overhead.py", "--rounds", "2", "--steps", "160")
    variants = res["variants"]
    assert set(variants) == {"no metrics", "prometheus", "otlp", "both", "prometheus, C loop",
                             "ref: a named copy per step", "ref: prometheus_client per phase",
                             "ref: OTel SDK instruments per phase"}
    assert all(v["median_us"] >= 0 for v in variants.values())
    feed = res["drain_feed_vs_named_copy"]
    assert feed["ci95"][0] <= feed["median"] <= feed["ci95"][1] and feed["median"] > 0
    c_loop = res["c_loop_vs_python_loop"]
    assert c_loop["ci95"][0] <= c_loop["median"] <= c_loop["ci95"][1]
    points = int(stdout.split("OTLP points received: ")[1].split()[0])
    assert points > 0
