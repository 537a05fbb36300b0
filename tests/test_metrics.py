"""Phase metrics without SGLang: prometheus_client's multiprocess mode across real processes (the
way SGLang's /metrics collects them), a real Prometheus scraping that exposition, OTLP metrics to
the testing API's receiver over real sockets, what turns each output on, failure isolation, and
the Grafana dashboard checked against the names the code exports."""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sgl_probe import config, contract, metrics, metrics_otlp, metrics_setup
from sgl_probe.resolved import ResolvedPhase, ResolvedStep, to_row
from sgl_probe.testing.receiver import OTLPReceiver

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest, multiprocess  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "sgl-probe.json"
RANKS = {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0}


def phase(name: str, ms: float, graph: bool = False, mode: str = "DECODE", accept=None) -> ResolvedPhase:
    return ResolvedPhase(name, 1_000, 1_000 + int(ms * 1e6), graph, mode, 4, 4, 0.05, "target", accept)


def step(index: int, *phases: ResolvedPhase, mode: str = "DECODE") -> ResolvedStep:
    return ResolvedStep(index, 1_000, 1_000 + max(p.end_ns for p in phases), mode, 4, 4, 0.1, "cpu", phases)


def spec_step(index: int, accept: float = 2.5) -> ResolvedStep:
    return step(index, phase("draft", 1.0, True, "DRAFT_EXTEND"), phase("verify", 6.0, False, "TARGET_VERIFY", accept),
                phase("draft_extend", 1.5, True, "DRAFT_EXTEND"), mode="TARGET_VERIFY")


class Verdict:
    speedup, break_even = 1.25, 2.1


def scrape_multiproc(path: Path) -> str:
    """What SGLang's /metrics serves: its add_prometheus_middleware builds exactly this."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    return generate_latest(registry).decode()


def samples(text: str) -> list:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


# --- Prometheus multiprocess: two ranks in two processes --------------------------------------

RANK_SCRIPT = r"""
import os, sys
from sgl_probe.metrics_setup import phase_metrics
from sgl_probe.resolved import ResolvedPhase, ResolvedStep, to_row
rank, n = int(sys.argv[1]), int(sys.argv[2])
m = phase_metrics({"tp_rank": rank, "dp_rank": 0, "pp_rank": 0}, mode="auto")
assert m is not None and len(m.sinks) == 1, m
def ph(name, ms, mode, graph=False, accept=None):
    return ResolvedPhase(name, 0, int(ms * 1e6), graph, mode, 2, 2, 0.1, "t", accept)
m.observe_step(ResolvedStep(0, 0, 1, "EXTEND", 2, 2, 0.1, "cpu", (ph("extend", 40.0, "EXTEND"),)))
for i in range(n):
    # 0.12 ms on rank 0 and 9 s on rank 1: both ends of the bucket range must resolve.
    m.observe_step(ResolvedStep(i + 1, 0, 1, "DECODE", 2, 2, 0.1, "cpu",
                                (ph("decode", 0.12 if rank == 0 else 9000.0, "DECODE", graph=True),)))
m.set_dropped({"otlp": 2}); m.set_dropped({"otlp": 5, "pending": 1}); m.set_dropped({"otlp": 4, "pending": 1})
class V: speedup = 0.75 + rank; break_even = 3.0
m.set_verdict(V)
m.flush()
"""


@pytest.fixture(scope="module")
def multiproc_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prom-multiproc")
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(path)}
    for rank, n in ((0, 7), (1, 3)):
        subprocess.run([sys.executable, "-c", RANK_SCRIPT, str(rank), str(n)], env=env, check=True, timeout=60)
    return path


def test_two_ranks_through_the_multiprocess_directory(multiproc_dir):
    got = samples(scrape_multiproc(multiproc_dir))

    def value(name, **labels):
        hits = [s.value for s in got if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(hits) == 1, (name, labels, hits)
        return hits[0]

    for rank, n, bucket in (("0", 7, "0.00015"), ("1", 3, "10.0")):
        decode = {"phase": "decode", "cuda_graph": "true", "forward_mode": "DECODE", "tp_rank": rank}
        assert value("sgl_probe_phase_seconds_count", **decode) == n
        # The 0.1 ms .. 10 s range resolves: rank 0's 0.12 ms and rank 1's 9 s sit in finite buckets.
        assert value("sgl_probe_phase_seconds_bucket", le=bucket, **decode) == n
        smaller = contract.PHASE_SECONDS_BUCKETS[contract.PHASE_SECONDS_BUCKETS.index(float(bucket)) - 1]
        assert value("sgl_probe_phase_seconds_bucket", le=repr(smaller), **decode) == 0
        assert value("sgl_probe_phase_seconds_count", phase="extend", tp_rank=rank) == 1
        assert value("sgl_probe_steps_total", forward_mode="DECODE", tp_rank=rank) == n
        assert value("sgl_probe_steps_total", forward_mode="EXTEND", tp_rank=rank) == 1
        # each cause follows its total, not the calls, and never back down
        assert value("sgl_probe_dropped_total", tp_rank=rank, cause="otlp") == 5
        assert value("sgl_probe_dropped_total", tp_rank=rank, cause="pending") == 1
        assert value("sgl_probe_spec_speedup", tp_rank=rank) == 0.75 + int(rank)  # per rank, no pid label
        assert value("sgl_probe_spec_break_even_accept_length", tp_rank=rank) == 3.0
    labels = {k for s in got if s.name == "sgl_probe_phase_seconds_count" for k in s.labels}
    assert labels == set(contract.PHASE_LABELS)


def test_real_prometheus_scrapes_the_exposition_per_rank(multiproc_dir, tmp_path):
    from tests.harness.prometheus import Prometheus, PrometheusUnavailable, ensure_prometheus

    try:
        binary = ensure_prometheus()
    except PrometheusUnavailable as exc:
        pytest.skip(str(exc))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = scrape_multiproc(multiproc_dir).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Prometheus(binary, [f"127.0.0.1:{server.server_address[1]}"], tmp_path / "prom") as prom:
            result = prom.wait_for('sum by (tp_rank) (sgl_probe_phase_seconds_count{phase="decode"})',
                                   lambda r: len(r) == 2)
            assert {r["metric"]["tp_rank"]: float(r["value"][1]) for r in result} == {"0": 7.0, "1": 3.0}
            p50 = prom.query('histogram_quantile(0.5, sum by (le, tp_rank) (sgl_probe_phase_seconds_bucket))')
            by_rank = {r["metric"]["tp_rank"]: float(r["value"][1]) for r in p50}
            assert 0.0001 <= by_rank["0"] <= 0.00015 and 8.0 <= by_rank["1"] <= 10.0, by_rank
    finally:
        server.shutdown()
        server.server_close()


# --- OTLP -------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_metrics_reach_the_receiver(protocol, monkeypatch):
    with OTLPReceiver() as receiver:
        for key, value in receiver.env(protocol, signals=("metrics",)).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
        sink = metrics_otlp.from_env(__import__("os").environ)
        assert sink is not None
        m = metrics.PhaseMetrics({"tp_rank": 1, "dp_rank": 0, "pp_rank": 0}, [sink])
        try:
            for i in range(5):
                m.observe_step(step(i, phase("decode", 3.0, True)))
            m.observe_step(spec_step(5, accept=3.0))
            m.set_dropped({"pending": 0, "link": 4, "otlp": 0})
            m.set_verdict(Verdict)
            m.flush()

            def done(points):
                return any(p.name == contract.METRIC_PHASE_SECONDS and p.count == 5 for p in points) \
                    and any(p.name == contract.METRIC_SPEC_SPEEDUP for p in points)

            receiver.wait_for_metrics(done, timeout=20)
        finally:
            sink.shutdown(3)
        latest = {(p.name, p.attributes.get("phase")): p for p in receiver.latest_metrics()}
    decode = latest[(contract.METRIC_PHASE_SECONDS, "decode")]
    assert decode.kind == "histogram" and decode.unit == "s" and decode.transport == protocol.split("/")[0]
    assert decode.attributes == {"phase": "decode", "forward_mode": "DECODE", "cuda_graph": "true",
                                 "tp_rank": "1", "dp_rank": "0", "pp_rank": "0"}
    assert decode.explicit_bounds == list(contract.PHASE_SECONDS_BUCKETS)
    assert decode.sum == pytest.approx(5 * 0.003)
    assert decode.bucket_counts[contract.PHASE_SECONDS_BUCKETS.index(0.003)] == 5
    assert latest[(contract.METRIC_PHASE_SECONDS, "verify")].count == 1
    steps = {p.attributes["forward_mode"]: p.value for p in receiver.latest_metrics(contract.METRIC_STEPS)}
    assert steps == {"DECODE": 5, "TARGET_VERIFY": 1}
    accept = latest[(contract.METRIC_ACCEPT_LENGTH, None)]
    assert (accept.count, accept.sum) == (1, 3.0)
    dropped = [(p.attributes, p.value) for p in receiver.latest_metrics(contract.METRIC_DROPPED)]
    assert dropped == [({"cause": "link", "tp_rank": "1", "dp_rank": "0", "pp_rank": "0"}, 4)]  # none at 0
    assert latest[(contract.METRIC_SPEC_SPEEDUP, None)].value == 1.25
    assert latest[(contract.METRIC_SPEC_BREAK_EVEN, None)].value == 2.1


# --- what turns the outputs on ----------------------------------------------------------------

@pytest.mark.parametrize(("environ", "kinds"), [
    ({}, []),
    # A trace endpoint alone (what Jaeger setups set) must not start sending metrics there.
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, []),
    ({"OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9"}, []),
    ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ({"OTEL_METRICS_EXPORTER": "console,otlp"}, ["OtlpSink"]),
    ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9"}, ["OtlpSink"]),
])
def test_nothing_is_exposed_unless_asked(environ, kinds):
    sinks = metrics_setup.build_sinks(environ)
    try:
        assert [type(s).__name__ for s in sinks] == kinds
    finally:
        for s in sinks:
            s.shutdown(0.5)


def test_off_switch_and_bad_value():
    assert metrics_setup.phase_metrics(RANKS, mode="off", environ={"OTEL_METRICS_EXPORTER": "otlp"}) is None
    cfg = config.load({"SGL_PROBE_METRICS": "prometheus"})
    assert cfg.metrics == "auto"
    assert cfg.problems == ("sgl-probe: ignoring SGL_PROBE_METRICS='prometheus': accepted values are auto, off; "
                            "using 'auto'",)
    assert config.load({"SGL_PROBE_METRICS": "OFF"}).metrics == "off"


@pytest.mark.parametrize(("prelude", "message"), [
    ("sys.modules['prometheus_client'] = None", "prometheus_client is not installed"),
    ("del os.environ['PROMETHEUS_MULTIPROC_DIR']; import prometheus_client; "
     "os.environ['PROMETHEUS_MULTIPROC_DIR'] = d", "imported before PROMETHEUS_MULTIPROC_DIR"),
])
def test_prometheus_client_is_optional_and_must_see_the_directory_first(prelude, message, tmp_path):
    script = (f"import os, sys; d = os.environ['PROMETHEUS_MULTIPROC_DIR']; {prelude}\n"
              "from sgl_probe.metrics_setup import build_sinks\nprint(len(build_sinks(os.environ)))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    assert out.stderr.count("sgl-probe:") == 1 and message in out.stderr, out.stderr


def test_a_failing_sink_costs_one_line_and_disables_the_metrics(caplog):
    calls = []

    class Broken:
        def update(self, snap):
            calls.append(snap)
            raise OSError("disk full")

    m = metrics.PhaseMetrics(RANKS, [Broken()], flush_s=0)
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        for i in range(3):
            m.observe_step(step(i, phase("decode", 1.0)))
        m.set_dropped({"otlp": 3})
        m.set_verdict(Verdict)
        m.flush()
    assert m.failed and len(calls) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "metrics disabled" in lines[0] and "disk full" in lines[0], lines


def test_batched_flushes_equal_prometheus_clients_own_observe():
    """The sink adds aggregated deltas to prometheus_client's histogram values: the exposition must
    be the one that observe() per value gives, bucket edges, both ends and repeated flushes included."""
    from prometheus_client import Histogram

    from sgl_probe.metrics_prom import PrometheusSink

    values_ms = [0.05, 0.1, 0.12, 3.0, 3.0000001, 4.0, 250.0, 9999.0, 10000.0, 25000.0]
    ours = CollectorRegistry()
    m = metrics.PhaseMetrics(RANKS, [PrometheusSink(registry=ours)], flush_s=3600)
    ref = CollectorRegistry()
    hist = Histogram(contract.METRIC_PHASE_SECONDS, "ref", contract.PHASE_LABELS,
                     buckets=contract.PHASE_SECONDS_BUCKETS, registry=ref)
    for rnd in range(3):
        for i, ms in enumerate(values_ms[rnd::2]):
            st = step(i, phase("decode", ms, True))
            m.observe_step(st)
            hist.labels(phase="decode", forward_mode="DECODE", cuda_graph="true", **metrics.rank_labels(RANKS)) \
                .observe((st.phases[0].end_ns - st.phases[0].start_ns) / 1e9)
        m.flush()

    def series(reg):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(generate_latest(reg).decode())
                if s.name.startswith(contract.METRIC_PHASE_SECONDS) and not s.name.endswith("_created")}

    got, want = series(ours), series(ref)
    assert got.keys() == want.keys() and len(got) == len(contract.PHASE_SECONDS_BUCKETS) + 3
    assert {k: pytest.approx(v) for k, v in got.items()} == want


def test_the_drains_plain_rows_count_as_their_named_steps():
    """The drain feeds the metrics its rows as plain tuples (the C drain's, not ResolvedStep), in
    chunks: the same series as prometheus_client's own observe() per phase, accept lengths,
    step counts by mode and both graph labels included."""
    from prometheus_client import Counter, Histogram

    from sgl_probe.metrics_prom import PrometheusSink

    ranks = metrics.rank_labels(RANKS)
    ours = CollectorRegistry()
    m = metrics.PhaseMetrics(RANKS, [PrometheusSink(registry=ours)], flush_s=3600)
    ref = CollectorRegistry()
    hist = Histogram(contract.METRIC_PHASE_SECONDS, "ref", contract.PHASE_LABELS,
                     buckets=contract.PHASE_SECONDS_BUCKETS, registry=ref)
    acc = Histogram(contract.METRIC_ACCEPT_LENGTH, "ref", list(ranks), buckets=contract.ACCEPT_LENGTH_BUCKETS,
                    registry=ref)
    steps = Counter(contract.METRIC_STEPS, "ref", ["forward_mode", *ranks], registry=ref)
    named = [step(0, phase("extend", 40.0, False, "EXTEND"), mode="EXTEND")]
    named += [step(i, phase("decode", 0.1 * i, i % 3 == 0)) for i in range(1, 30)]
    named += [spec_step(30 + i, accept=1.0 + i / 4) for i in range(7)]
    rows = [to_row(st) for st in named]
    assert all(type(r) is tuple and type(r[-2][0]) is tuple for r in rows)
    for i in range(0, len(rows), 16):
        m.observe_rows(rows[i:i + 16])
    m.flush()
    for st in named:
        steps.labels(forward_mode=st.mode, **ranks).inc()
        for ph in st.phases:
            hist.labels(phase=ph.phase, forward_mode=ph.mode, cuda_graph="true" if ph.graph else "false",
                        **ranks).observe((ph.end_ns - ph.start_ns) / 1e9)
            if ph.accept_length is not None:
                acc.labels(**ranks).observe(ph.accept_length)

    names = (contract.METRIC_PHASE_SECONDS, contract.METRIC_ACCEPT_LENGTH, contract.METRIC_STEPS)

    def series(reg):
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples(generate_latest(reg).decode())
                if s.name.startswith(names) and not s.name.endswith("_created")}

    got, want = series(ours), series(ref)
    assert {k for k in want if k[0].startswith(contract.METRIC_ACCEPT_LENGTH)}  # the reference has them all
    assert {k: pytest.approx(v) for k, v in got.items() if k in want} == want


# --- the Grafana dashboard against the code ---------------------------------------------------

def exported_series() -> tuple[set, set]:
    """Sample names and label names the Prometheus sink really exposes, every family exercised."""
    from sgl_probe.metrics_prom import PrometheusSink

    m = metrics.PhaseMetrics(RANKS, [PrometheusSink(registry=(reg := CollectorRegistry()))])
    m.observe_step(step(0, phase("decode", 3.0, True)))
    m.observe_step(spec_step(1))
    m.set_dropped({"trace_dir": 1})
    m.set_verdict(Verdict)
    m.flush()
    got = samples(generate_latest(reg).decode())
    return {s.name for s in got}, {k for s in got for k in s.labels}


_NAME = re.compile(r"\bsgl_probe_[A-Za-z0-9_]*")
_SELECTOR = re.compile(r"\{([^{}]*)\}")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# Added by Prometheus itself (target labels) or by histogram series.
_SCRAPE_LABELS = {"le", "instance", "job"}


def queries(node) -> list[tuple[str, str]]:
    """(where, text) of every PromQL expression, template query and legend in the dashboard."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition", "legendFormat") and isinstance(value, str):
                out.append((key, value))
            elif key == "query" and isinstance(value, str):
                out.append((key, value))
            else:
                out.extend(queries(value))
    elif isinstance(node, list):
        for item in node:
            out.extend(queries(item))
    return out


def dashboard_problems(dashboard: dict, names: set, labels: set) -> list[str]:
    problems = []
    for where, text in queries(dashboard):
        if where == "legendFormat":
            used_labels = set(_LEGEND.findall(text))
        else:
            for name in _NAME.findall(text):
                if name not in names:
                    problems.append(f"{where} {text!r}: no metric {name!r} is exported")
            used_labels = {m.split("=")[0].strip(" !~") for sel in _SELECTOR.findall(text)
                           for m in sel.split(",") if "=" in m}
            used_labels |= {x.strip() for grp in _BY.findall(text) for x in grp.split(",") if x.strip()}
        for label in used_labels - labels - _SCRAPE_LABELS:
            problems.append(f"{where} {text!r}: no label {label!r} on the probe's series")
    return problems


def test_every_dashboard_metric_and_label_is_exported():
    names, labels = exported_series()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard_problems(dashboard, names, labels) == []
    used = {n for _, text in queries(dashboard) for n in _NAME.findall(text)}
    # Every family the code exports is on the dashboard somewhere.
    for family in contract.METRIC_HISTOGRAMS + contract.METRIC_COUNTERS + contract.METRIC_GAUGES:
        assert any(u == family or u.startswith(family + "_") for u in used), family
    # The check itself can fail: a renamed metric or label in one panel is caught.
    broken = json.loads(DASHBOARD.read_text())
    target = next(p for p in broken["panels"] if p.get("targets"))["targets"][0]
    target["expr"] = target["expr"].replace("sgl_probe_phase_seconds_bucket", "sgl_probe_phase_second_bucket") \
                                   .replace("phase=", "stage=")
    found = dashboard_problems(broken, names, labels)
    assert any("sgl_probe_phase_second_bucket" in p for p in found) and any("'stage'" in p for p in found), found


def test_dashboard_is_provisioned_in_compose():
    from tests.test_docker_files import _load_yaml_files

    compose, datasource, provider, prom = _load_yaml_files([
        ROOT / "docker" / "compose.yaml", ROOT / "docker/grafana/provisioning/datasources/prometheus.yaml",
        ROOT / "docker/grafana/provisioning/dashboards/sgl-probe.yaml", ROOT / "docker" / "prometheus.yml"])
    services = compose["services"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["metrics"]
    assert "--enable-metrics" in services["sglang"]["command"].split()
    grafana_mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in services["grafana"]["volumes"])
    assert grafana_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    dash_dir = grafana_mounts["./grafana/dashboards"]
    assert provider["providers"][0]["options"]["path"] == dash_dir
    ds = datasource["datasources"][0]
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert uids == {ds["uid"]} and ds["url"] == "http://prometheus:9090"
    prom_mount = next(v for v in services["prometheus"]["volumes"] if v.startswith("./prometheus.yml:"))
    assert prom_mount.split(":")[1] in " ".join(services["prometheus"]["command"])
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["sglang:30000"] and prom["scrape_configs"][0]["metrics_path"] == "/metrics"
    assert "30000:30000" in " ".join(services["sglang"]["ports"]).replace("${SGLANG_PORT:-30000}", "30000")


def test_bucket_bounds():
    b = contract.PHASE_SECONDS_BUCKETS
    assert b[0] == 0.0001 and b[-1] == 10.0 and list(b) == sorted(set(b))
    assert max(hi / lo for lo, hi in zip(b, b[1:])) <= 1.5 + 1e-9
    assert not any(math.isnan(x) for x in contract.ACCEPT_LENGTH_BUCKETS)
