"""benchmarks/hotpath_cold.py runs, and its blocks record exactly what they claim: every step of
a recording block, none of a paused one (a benchmark whose pause did not pause, or whose probe did
not record, would report a cost of nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.benchruns import run_benchmark


def test_hotpath_cold_records_every_step_of_the_recording_blocks_and_none_of_the_paused(tmp_path: Path):
    res = run_benchmark(tmp_path, "hotpath_cold.py", "--steps", "5", "--repeats", "2", "--evict-kb", "64",
                        timeout=120).result
    # warm-up: one recording block cold and one warm; then per repeat one of each again
    assert res["steps_recorded"] == (2 + 2 * 2) * 5
    for state in ("cold", "warm"):
        assert set(res[state]) == {"recording_us", "paused_us", "probe_us", "probe_us_ci95"}
        assert res[state]["recording_us"] > 0 and res[state]["paused_us"] > 0
