"""Phase metrics from a real SGLang 0.5.23 server (CPU, tp 2, ``--enable-metrics``) with the probe
installed from its wheel: its own ``/metrics`` carries the probe's series for both ranks, with
counts equal to the spans of the same run; a real Prometheus scrapes it and answers per rank; OTLP
metrics of the same run reach the testing API's receiver. One launch for every assertion."""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest

from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan
from tests.harness.model import ensure_tiny_model
from tests.harness.prometheus import Prometheus, PrometheusUnavailable, ensure_prometheus
from tests.harness.server import SGLangServer
from tests.harness.venv import ensure_venv
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

VERSION, TP, NEW_TOKENS = "0.5.23", 2, 6
PROMPTS = ["hello world the quick", "once upon a time there", "brown fox jumps over lazy"]
ARGS = ("--disable-radix-cache", "--dtype", "float32", "--enable-metrics")
PHASE_FAMILY = "sgl_probe_phase_seconds"
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\} ([0-9.e+-]+|NaN)$")


@dataclass
class MetricsRun:
    spans: list = field(default_factory=list)
    exposition: str = ""
    prom_counts: dict = field(default_factory=dict)  # (phase, tp_rank) -> Prometheus query value
    prom_series: list = field(default_factory=list)
    otlp: list = field(default_factory=list)
    log: str = ""


def parse(exposition: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in exposition.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))))
    return out


def span_counts(spans: list[ReceivedSpan]) -> Counter:
    """Phase spans per (phase, forward_mode, cuda_graph, tp_rank), labelled as the metrics are."""
    return Counter((s.name.removeprefix("sglang."), s.attributes.get("sglang.forward_mode", "unknown"),
                    str(s.attributes["sglang.cuda_graph"]).lower(), str(s.attributes["sglang.tp_rank"]))
                   for s in spans if s.name.startswith("sglang.") and s.name != "sglang.step"
                   and "sglang.cuda_graph" in s.attributes)


def metric_counts(exposition: str) -> Counter:
    return Counter({(lab["phase"], lab["forward_mode"], lab["cuda_graph"], lab["tp_rank"]): v
                    for name, lab, v in parse(exposition) if name == PHASE_FAMILY + "_count"})


@pytest.fixture(scope="module")
def metrics_run(tmp_path_factory) -> MetricsRun:
    try:
        prometheus = ensure_prometheus()
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("metrics-run")
    venv = ensure_venv(VERSION)
    install_wheel(venv, build_wheel(tmp / "wheel"))
    model = ensure_tiny_model(venv)
    run = MetricsRun()
    with OTLPReceiver() as receiver:
        env = {**receiver.env("grpc"), **receiver.env("http/protobuf", signals=("metrics",)),
               "SGL_PROBE": "1", "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "500",
               "SGL_PROBE_RUN_ID": None}
        server = SGLangServer(venv, model, tp=TP, env=env, extra_args=ARGS, log_path=tmp / "server.log")
        with Prometheus(prometheus, [f"127.0.0.1:{server.port}"], tmp / "prometheus") as prom, server:
            before = span_counts(receiver.spans())  # the server's warm-up, as far as it has arrived
            batch = server.generate_many(PROMPTS, NEW_TOKENS)
            for text in PROMPTS[:2]:
                server.generate(text, NEW_TOKENS, ignore_eos=True)
            # What this run's requests add at least, per rank: one extend each for the batch and
            # the two lone requests; decode steps for the batch's longest completion and for each
            # lone request (ignore_eos: exactly NEW_TOKENS - 1 each).
            longest = max(r["meta_info"]["completion_tokens"] for r in batch)
            at_least = {"extend": 3, "decode": (longest - 1) + 2 * (NEW_TOKENS - 1)}
            # Spans and metrics settle independently (batch span export vs a 1 s metrics flush),
            # and both can lag the requests (the exporter process may still be starting): wait
            # until the spans hold this run's steps, /metrics counts what the spans count, and
            # both stay so across a metrics flush; or give up and let the tests say.
            deadline, agreed = time.monotonic() + 60, None
            while time.monotonic() < deadline:
                run.spans = receiver.spans()
                run.exposition = server.request_text("/metrics")
                got = span_counts(run.spans)
                if (_holds_the_run(got, before, at_least) and metric_counts(run.exposition) == got):
                    if agreed == got:
                        break
                    agreed = got
                    time.sleep(1.5)
                    continue
                agreed = None
                time.sleep(0.5)
            query = f"sum by (phase, tp_rank) ({PHASE_FAMILY}_count)"
            want = Counter()
            for (ph, _, _, rank), n in metric_counts(run.exposition).items():
                want[(ph, rank)] += n
            try:
                prom.wait_for(query, lambda r: {(x["metric"]["phase"], x["metric"]["tp_rank"]): float(x["value"][1])
                                                for x in r} == dict(want), timeout=30)
            except TimeoutError:
                pass  # the test below shows what Prometheus has
            run.prom_counts = {(x["metric"]["phase"], x["metric"]["tp_rank"]): float(x["value"][1])
                               for x in prom.query(query)}
            run.prom_series = prom.api("series", **{"match[]": f'{PHASE_FAMILY}_bucket{{phase="decode"}}'})
            try:
                receiver.wait_for_metrics(
                    lambda pts: _otlp_counts(pts) == metric_counts(run.exposition), timeout=20)
            except TimeoutError:
                pass
            run.otlp = receiver.metrics()
        run.log = server.log_text()
    return run


def _holds_the_run(got: Counter, before: Counter, at_least: dict) -> bool:
    """Every rank's spans count, per phase, at least what it had before the requests plus what
    the requests add: a warm-up-only state agrees with /metrics too, and must not end the wait."""
    for rank in map(str, range(TP)):
        for phase, n in at_least.items():
            def total(c: Counter) -> float:
                return sum(v for (ph, _, _, r), v in c.items() if ph == phase and r == rank)
            if total(got) < total(before) + n:
                return False
    return True


def _otlp_counts(points) -> Counter:
    latest = {}
    for p in points:
        if p.name == PHASE_FAMILY:
            key = (p.attributes["phase"], p.attributes["forward_mode"], p.attributes["cuda_graph"],
                   p.attributes["tp_rank"])
            if key not in latest or p.time_ns >= latest[key].time_ns:
                latest[key] = p
    return Counter({k: p.count for k, p in latest.items()})


def test_metrics_endpoint_has_bucket_series_for_both_ranks(metrics_run):
    samples = parse(metrics_run.exposition)
    buckets = {(lab["phase"], lab["tp_rank"]) for name, lab, _ in samples if name == PHASE_FAMILY + "_bucket"}
    for phase in ("decode", "extend"):
        for rank in map(str, range(TP)):
            assert (phase, rank) in buckets, (phase, rank, sorted(buckets))
    ours = [lab for name, lab, _ in samples if name.startswith("sgl_probe_")]
    assert ours and all("pid" not in lab for lab in ours)  # one series per rank, not per process
    # SGLang's own series are still served beside them.
    assert any(name.startswith("sglang:") for name, _, _ in samples)


def test_counts_equal_the_spans_of_the_same_run(metrics_run):
    spans = span_counts(metrics_run.spans)
    assert {k[3] for k in spans} == {"0", "1"} and {k[0] for k in spans} >= {"decode", "extend"}
    assert metric_counts(metrics_run.exposition) == spans
    steps = Counter(str(s.attributes["sglang.tp_rank"]) for s in metrics_run.spans if s.name == "sglang.step")
    got = defaultdict(float)
    for name, lab, v in parse(metrics_run.exposition):
        if name == "sgl_probe_steps_total":
            got[lab["tp_rank"]] += v
    assert dict(got) == dict(steps)


def test_prometheus_scrapes_the_server_and_answers_per_rank(metrics_run):
    want = Counter()
    for (ph, _, _, rank), n in metric_counts(metrics_run.exposition).items():
        want[(ph, rank)] += n
    assert metrics_run.prom_counts == dict(want)
    ranks = {s["tp_rank"] for s in metrics_run.prom_series}
    assert ranks == {"0", "1"} and all(s["job"] == "sglang" for s in metrics_run.prom_series)


def test_otlp_metrics_of_the_same_run_reach_the_receiver(metrics_run):
    assert _otlp_counts(metrics_run.otlp) == metric_counts(metrics_run.exposition)
    point = next(p for p in metrics_run.otlp if p.name == PHASE_FAMILY)
    assert point.transport == "http" and point.unit == "s" and point.resource.get("service.name") == "sglang"
    assert "sgl-probe: metrics disabled" not in metrics_run.log
