"""benchmarks/export_cpu.py runs end to end on this machine (the real probe, the exporter process,
a real OTLP receiver over a socket, the trace dir) and prints what the issue asks of it: every span
sent is received, none dropped, the CPU per step of each design and thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.benchruns import ROOT, run_benchmark


def test_export_cpu_counts_every_span_at_the_receiver_and_the_cpu_of_each_design(tmp_path: Path):
    res = run_benchmark(tmp_path, "export_cpu.py", "--steps", "60", "--repeats", "1", "--trace-dir").result
    assert res["spans_received"] == res["spans_sent"] > 2 * 60 and res["dropped"] == 0
    assert res["in_process_cpu_us_per_step"] > 0  # the exporter-process design, the one the probe runs
    assert set(res["loop_ratio_vs_off"]) == {"off", "no_export", "in_process", "out_of_process"}
    run = res["runs"]["out_of_process"][0]
    assert run["steps"] == 60 and run["sent"] == run["spans_received"]
    assert run["threads_cpu_us_per_step"]["MainThread"] > 0


def test_settings_reach_the_measured_processes_only_through_env(tmp_path: Path):
    """The benchmark drops OTEL_* / SGL_PROBE_* around it; --env sets them in every measured
    process: with room for 5 pending steps and no drain pass until the end, steps are dropped."""
    res = run_benchmark(tmp_path, "export_cpu.py", "--steps", "60", "--repeats", "1",
                        "--env", "SGL_PROBE_MAX_PENDING=5", "--env", "SGL_PROBE_DRAIN_S=3600").result
    assert res["env"] == {"SGL_PROBE_MAX_PENDING": "5", "SGL_PROBE_DRAIN_S": "3600"}
    run = res["runs"]["out_of_process"][0]
    assert run["dropped"] > 0 and run["spans_received"] < 2 * 60


def test_a_setting_the_benchmark_makes_itself_is_refused_by_name(tmp_path: Path):
    """--env SGL_PROBE_TIMER would be overwritten by the benchmark's own (the CPU timer): it is
    refused, naming the variable, before anything is measured."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "export_cpu.py"), "--steps", "10", "--repeats",
                           "1", "--env", "SGL_PROBE_TIMER=cuda"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode != 0 and "--env SGL_PROBE_TIMER" in proc.stderr, proc.stderr[-2000:]
