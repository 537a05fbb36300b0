"""Runs a benchmark script the way its smoke test does: in a temporary directory, its result
written with ``--json``, a non-zero exit failing the test with the script's stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[1]


class BenchRun(NamedTuple):
    result: dict  # what the script wrote with --json
    stdout: str


def run_benchmark(tmp_path: Path, script: str, *args: str, hotpath: Optional[str] = None,
                  timeout: float = 300) -> BenchRun:
    """``benchmarks/<script> <args> --json FILE``; ``hotpath``: its SGL_PROBE_HOTPATH."""
    out = tmp_path / f"{Path(script).stem}-{hotpath or 'default'}.json"
    env = None if hotpath is None else {**os.environ, "SGL_PROBE_HOTPATH": hotpath}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return BenchRun(json.loads(out.read_text()), proc.stdout)
