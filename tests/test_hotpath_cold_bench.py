"""benchmarks/hotpath_cold.py runs, and its blocks record exactly what they claim: every step of
a recording block, none of a paused one (a benchmark whose pause did not pause, or whose probe did
not record, would report a cost of nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_hotpath_cold_records_every_step_of_the_recording_blocks_and_none_of_the_paused(tmp_path: Path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hotpath_cold.py"), "--steps", "5",
                           "--repeats", "2", "--evict-kb", "64", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    # warm-up: one recording block cold and one warm; then per repeat one of each again
    assert res["steps_recorded"] == (2 + 2 * 2) * 5
    for state in ("cold", "warm"):
        assert set(res[state]) == {"recording_us", "paused_us", "probe_us", "probe_us_ci95"}
        assert res[state]["recording_us"] > 0 and res[state]["paused_us"] > 0
