"""benchmarks/drain_cpu.py runs, drains every step it records in each pass (else it raises), and
times the stages it names: with the C extension the link's messages are packed, with the Python
hot path pickled, and each stage fits inside the whole pass."""

from __future__ import annotations

from pathlib import Path

from tests.benchruns import run_benchmark
from tests.hotpaths import c_module


def _run(tmp_path: Path, hotpath: str) -> dict:
    return run_benchmark(tmp_path, "drain_cpu.py", "--steps", "64", "--passes", "3", "--warmup", "1", "--runs", "1",
                         hotpath=hotpath).result["new"]


def test_drain_cpu_times_each_stage_of_a_pass_and_packs_with_the_c_extension(tmp_path: Path):
    py = _run(tmp_path, "python")
    assert (py["hotpath"], py["packed"]) == ("python", False)
    c_module()
    c = _run(tmp_path, "c")
    assert (c["hotpath"], c["packed"]) == ("c", True)
    for res in (py, c):
        run = res["per_run"][0]
        for stage in ("take", "summary", "encode"):  # each inside every pass: so are their medians
            assert 0 < run[f"{stage}_us_per_step"] <= run["all_us_per_step"]
    # The packed pass only where the C extension is, beside the rows' pass in the same process.
    assert py["per_run"][0]["packed_pass_us_per_step"] is None and "packed_pass_over_all" not in py
    assert c["per_run"][0]["packed_pass_us_per_step"] > 0 and c["packed_pass_over_all"]["median"] > 0


def test_drain_cpu_feeds_the_metrics_in_both_passes_with_metrics(tmp_path: Path):
    """``--metrics``: both passes also feed a PhaseMetrics (the worker raises where the metrics
    switched themselves off, or a pass took fewer steps than it recorded)."""
    c_module()
    res = run_benchmark(tmp_path, "drain_cpu.py", "--steps", "64", "--passes", "3", "--warmup", "1", "--runs", "1",
                        "--metrics", hotpath="c").result
    c = res["new"]
    assert res["metrics"] and c["per_run"][0]["metrics"]
    assert c["per_run"][0]["packed_pass_us_per_step"] > 0 and c["packed_pass_over_all"]["median"] > 0


def test_drain_cpu_samples_in_both_passes_with_sampled(tmp_path: Path):
    """``--sampled RATE``: the rows' pass decides each row, the packed pass decides in C as it
    writes; both send some of their steps, not all (the worker raises where the rows' pass took
    fewer steps than it recorded)."""
    c_module()
    res = run_benchmark(tmp_path, "drain_cpu.py", "--steps", "64", "--passes", "3", "--warmup", "1", "--runs", "1",
                        "--sampled", "0.5", hotpath="c").result
    run = res["new"]["per_run"][0]
    assert res["sampled"] == run["sampled"] == 0.5
    passes = 3 + 1  # warm-up included
    for sent in run["sent_rows_packed"]:
        assert 0 < sent < 64 * passes
    assert run["packed_pass_us_per_step"] > 0


def test_drain_cpu_walks_the_caches_cold_before_each_pass_with_evict_kb(tmp_path: Path):
    """``--evict-kb N``: both passes still take every step they recorded (the worker raises
    otherwise), after a walk the result names."""
    c_module()
    res = run_benchmark(tmp_path, "drain_cpu.py", "--steps", "64", "--passes", "3", "--warmup", "1", "--runs", "1",
                        "--evict-kb", "256", hotpath="c").result
    run = res["new"]["per_run"][0]
    assert res["evict_kb"] == run["evict_kb"] == 256
    assert run["packed_pass_us_per_step"] > 0 and run["all_us_per_step"] > 0
