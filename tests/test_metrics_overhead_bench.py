"""benchmarks/metrics_overhead.py runs, feeds every variant the drain's rows, and its metrics
really counted them (the OTLP variant's points reach the receiver)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parents[1]


def test_metrics_overhead_times_every_variant_on_the_drains_feed(tmp_path: Path):
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "metrics_overhead.py"), "--rounds", "2",
                           "--steps", "160", "--json", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    variants = res["variants"]
    assert set(variants) == {"no metrics", "prometheus", "otlp", "both", "ref: a named copy per step",
                             "ref: prometheus_client per phase", "ref: OTel SDK instruments per phase"}
    assert all(v["median_us"] >= 0 for v in variants.values())
    feed = res["drain_feed_vs_named_copy"]
    assert feed["ci95"][0] <= feed["median"] <= feed["ci95"][1] and feed["median"] > 0
    points = int(proc.stdout.split("OTLP points received: ")[1].split()[0])
    assert points > 0
