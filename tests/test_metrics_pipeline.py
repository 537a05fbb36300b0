"""The metrics through the probe's real pipeline (wrappers, recorder, drain thread, summary line)
in a process of its own, driven by the speculative-decoding workload of tests/workload_spec.py:
Prometheus multiprocess files and OTLP metrics count exactly the spans the same run wrote, and
the live verdict gauges equal the verdict the summary line printed."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from sgl_probe import contract
from sgl_probe.testing.receiver import OTLPReceiver

pytest.importorskip("prometheus_client")
from tests.test_metrics import samples, scrape_multiproc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import logging, os, sys
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.INFO)  # the summary lines (a server's log has them)
from tests import workload_spec as ws
from sgl_probe import config
from sgl_probe.activate import Probe

probe = Probe(config.load(), targets=ws.TABLE)
probe.instrumentor.instrument()
sched = ws.Scheduler(ws.ServerArgs(True), tp_rank=1, pp_rank=0, dp_rank=None)
plan = ws.Plan(prefills=2, spec_steps=24, plain_decode_steps=0)
# Plain decode first: the verdict needs a decode time, then every window with verify steps has one.
for i in range(6):
    sched.run_batch(ws.Batch(ws.ForwardMode.DECODE, 2, spec=False))
for batch in ws.steps_of(plan):
    sched.run_batch(batch)
    ws.spin(0.01)
probe.pipeline.flush()
probe.pipeline.shutdown()
"""


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics-pipeline")
    (tmp / "prom").mkdir()
    with OTLPReceiver() as receiver:
        env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp / "prom"),
               "SGL_PROBE_TRACE_DIR": str(tmp / "traces"), "SGL_PROBE_SUMMARY_S": "0.05",
               "SGL_PROBE_DRAIN_S": "0.05", "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_RUN_ID": "metrics-pipeline",
               "OTEL_METRIC_EXPORT_INTERVAL": "200", **receiver.env("grpc", signals=("metrics",))}
        out = subprocess.run([sys.executable, "-c", RANK, str(ROOT)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        otlp = receiver.latest_metrics()
    spans = [sp for path in (tmp / "traces").glob("*.jsonl") for line in path.read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]
    return {"exposition": scrape_multiproc(tmp / "prom"), "otlp": otlp, "spans": spans, "log": out.stderr}


def _attrs(span: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def test_counts_equal_the_spans(pipeline_run):
    want = Counter()
    for sp in pipeline_run["spans"]:
        a = _attrs(sp)
        if sp["name"].startswith("sglang.") and sp["name"] != "sglang.step" and "sglang.cuda_graph" in a:
            want[(sp["name"].removeprefix("sglang."), a.get("sglang.forward_mode", "unknown"))] += 1
    assert {p for p, _ in want} == {"decode", "extend", "draft", "verify", "draft_extend"}
    got = samples(pipeline_run["exposition"])
    prom = Counter({(s.labels["phase"], s.labels["forward_mode"]): s.value for s in got
                    if s.name == "sgl_probe_phase_seconds_count"})
    assert prom == want
    assert all(s.labels["tp_rank"] == "1" and s.labels["dp_rank"] == "0" for s in got if s.name.startswith("sgl_probe"))
    otlp = Counter({(p.attributes["phase"], p.attributes["forward_mode"]): p.count
                    for p in pipeline_run["otlp"] if p.name == contract.METRIC_PHASE_SECONDS})
    assert otlp == want
    steps = sum(1 for sp in pipeline_run["spans"] if sp["name"] == "sglang.step")
    assert sum(s.value for s in got if s.name == "sgl_probe_steps_total") == steps
    verify = [_attrs(sp) for sp in pipeline_run["spans"] if sp["name"] == "sglang.verify"]
    accept = next(s for s in got if s.name == "sgl_probe_spec_accept_length_count")
    assert accept.value == len(verify) > 0
    total = next(s for s in got if s.name == "sgl_probe_spec_accept_length_sum").value
    assert total == pytest.approx(sum(a["sglang.spec.accept_length"] for a in verify))


def test_verdict_gauges_equal_the_summary_lines_verdict(pipeline_run):
    verdicts = re.findall(r"spec ([0-9.]+)× vs \w+ decode \(τ [0-9.]+, break-even ([0-9.]+)", pipeline_run["log"])
    assert verdicts, pipeline_run["log"][-2000:]
    speedup, break_even = map(float, verdicts[-1])
    got = {s.name: s.value for s in samples(pipeline_run["exposition"])}
    # The line prints two decimals for the speed-up and one for tau.
    assert got["sgl_probe_spec_speedup"] == pytest.approx(speedup, abs=0.005)
    assert got["sgl_probe_spec_break_even_accept_length"] == pytest.approx(break_even, abs=0.05)
    otlp = {p.name: p.value for p in pipeline_run["otlp"]}
    assert otlp[contract.METRIC_SPEC_SPEEDUP] == got["sgl_probe_spec_speedup"]
    assert math.isfinite(otlp[contract.METRIC_SPEC_BREAK_EVEN])
    assert "metrics disabled" not in pipeline_run["log"] and "already shutdown" not in pipeline_run["log"]
