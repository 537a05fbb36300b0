"""benchmarks/gc_cost.py runs, its recording runs record every step and its paused runs none (a
pause that did not pause would report the probe's collections as the loop's), and it sees what it
claims to measure: the Python hot path's records are tracked and start collections; the C hot
path's are neither."""

from __future__ import annotations

from pathlib import Path

from tests.benchruns import run_benchmark
from tests.hotpaths import c_module


def _run(tmp_path: Path, hotpath: str) -> dict:
    res = run_benchmark(tmp_path, "gc_cost.py", "--heap", "1000", "--steps", "3000", "--drain-every", "400",
                        "--turns", "1", hotpath=hotpath).result["new"]
    assert res["hotpath"] == hotpath
    runs = {r["state"]: r for r in res["runs"]}
    assert runs["recording"]["steps_recorded"] == 2 * 400 + 399 + 3000  # first calls, the pending count, the run
    assert runs["paused"]["steps_recorded"] == 0
    return runs


def test_gc_cost_sees_the_python_records_collections_and_none_of_the_c_ones(tmp_path: Path):
    py = _run(tmp_path, "python")
    # Three records per step (step, phases list, phase), tracked; a second's worth starts collections.
    assert py["recording"]["tracked_objects_per_pending_step"] == 3.0
    assert sum(py["recording"]["collections_per_100k_steps_by_generation"]) > 0
    c_module()
    c = _run(tmp_path, "c")
    assert c["recording"]["tracked_objects_per_pending_step"] == 0.0
    assert c["recording"]["collections_per_100k_steps_by_generation"] == \
        c["paused"]["collections_per_100k_steps_by_generation"]
