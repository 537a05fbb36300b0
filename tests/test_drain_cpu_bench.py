"""benchmarks/drain_cpu.py runs, drains every step it records in each pass (else it raises), and
times the stages it names: with the C extension the link's messages are packed, with the Python
hot path pickled, and each stage fits inside the whole pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.hotpaths import c_module

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, hotpath: str) -> dict:
    out = tmp_path / f"{hotpath}.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "drain_cpu.py"), "--steps", "64", "--passes", "3",
                           "--warmup", "1", "--runs", "1", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "SGL_PROBE_HOTPATH": hotpath})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["new"]


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
