"""benchmarks/gc_cost.py runs, its recording runs record every step and its paused runs none (a
pause that did not pause would report the probe's collections as the loop's), and it sees what it
claims to measure: the collections of a recording run, the tracked objects a pending step holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gc_cost_records_every_step_of_the_recording_runs_and_counts_their_collections(tmp_path: Path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gc_cost.py"), "--heap", "1000", "--steps", "3000",
                           "--drain-every", "400", "--turns", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())["new"]
    runs = {r["state"]: r for r in res["runs"]}
    assert runs["recording"]["steps_recorded"] == 2 * 400 + 399 + 3000  # first calls, the pending count, the run
    assert runs["paused"]["steps_recorded"] == 0
    # The probe's records and the loop's own objects make the recording run collect.
    assert sum(runs["recording"]["collections_per_100k_steps_by_generation"]) > 0
    # Three records per step (step, phases list, phase): tracked by the Python hot path, not the C one's.
    assert runs["recording"]["tracked_objects_per_pending_step"] == (0.0 if res["hotpath"] == "c" else 3.0)
