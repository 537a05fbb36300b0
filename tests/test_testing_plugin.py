"""The testing API (``sgl_probe.testing``, pytest plugin ``sgl_probe_collector``).

Three layers:

- fast: env-snapshot spans built by the probe's own code (``envsnap.snapshot_attributes`` +
  ``spans.build_env_span``) and exported with the stock OTel SDK exporters to the collector, then
  queried and asserted on; malformed payloads against the session fixture; user-style test files
  run through ``pytest`` in a subprocess (the plugin is found through its entry point).
- fresh venv: only the built wheel + pytest installed; the example test file (docs/testing.md) runs
  against a **placeholder** package named ``sglang`` (a few classes with SGLang's names that
  spawn two "scheduler" processes; it exists to trigger the probe, it is not SGLang), once as is
  (passes) and once through a launcher that spawns tp rank 1 without ``NCCL_PROTO`` (fails).
- real server (marked ``sglang``): the same example file against real SGLang 0.5.23, ``--tp 2``,
  on CPU: it passes for every scheduler process, and fails naming tp rank 1 and ``NCCL_PROTO``
  when the one-rank launcher starts it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from sgl_probe import envsnap
from sgl_probe import spans as spans_mod
from sgl_probe.config import DEFAULT_ENV_ALLOW
from sgl_probe.testing import (
    UNKNOWN,
    Collector,
    EnvPropagationError,
    ServerExited,
    assert_env_propagated,
    env_propagation_problems,
    env_snapshots,
    nccl_confirmations,
    phase_spans,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "test_sglang_env_propagation.py"
LAUNCHER = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "CUDA_VISIBLE_DEVICES": "0,1"}


# -- building spans the way the probe does ------------------------------------------------------


def snapshot_span(point: str, worker_env: dict, *, tp_rank, pid: int, run_id: str = "run-a",
                  launcher: dict | None = LAUNCHER, extra: dict | None = None) -> ReadableSpan:
    environ = dict(worker_env)
    if launcher is not None:
        environ[envsnap.LAUNCHER_ENV_VAR] = json.dumps(launcher)
    attrs = envsnap.snapshot_attributes(point, DEFAULT_ENV_ALLOW, environ)
    if point == "nccl_init":
        attrs["sgl_probe.snapshot_trigger"] = "torch.distributed:init_process_group"
        attrs["sgl_probe.dist_backend"] = "nccl"
    attrs.update(extra or {})
    ident = {} if tp_rank is None else {"tp_rank": tp_rank, "dp_rank": 0, "pp_rank": 0}
    resource = Resource.create({"process.pid": pid, "sgl_probe.run_id": run_id, "service.name": "sglang",
                                **{"sglang." + k: v for k, v in ident.items()}})
    return spans_mod.build_env_span(attrs, time.time_ns(), run_id, ident, resource)


def plain_span(name: str, attrs: dict, *, pid: int, run_id: str = "run-a", start_ns: int | None = None,
               ) -> ReadableSpan:
    start = start_ns or time.time_ns()
    ctx = SpanContext(spans_mod.derived_trace_id(run_id, name, start), spans_mod.new_span_id(), False,
                      TraceFlags(TraceFlags.SAMPLED))
    resource = Resource.create({"process.pid": pid, "sgl_probe.run_id": run_id, "service.name": "sglang"})
    return ReadableSpan(name=name, context=ctx, resource=resource, attributes=attrs, kind=SpanKind.INTERNAL,
                        start_time=start, end_time=start + 2_000_000, instrumentation_scope=spans_mod.SCOPE)


def export(collector: Collector, spans: list, protocol: str = "grpc") -> None:
    if protocol == "grpc":
        exporter = GrpcExporter(endpoint=collector.grpc_endpoint, insecure=True)
    else:
        exporter = HttpExporter(endpoint=collector.http_endpoint)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


def two_points(worker_start: dict, worker_nccl: dict, **kw) -> list[ReadableSpan]:
    return [snapshot_span("process_start", worker_start, **kw), snapshot_span("nccl_init", worker_nccl, **kw)]


@pytest.fixture
def collector():
    with Collector() as c:
        yield c


# -- fixture and launch environment -------------------------------------------------------------


def test_fixture_hands_out_grpc_and_http_env(sgl_probe_collector, monkeypatch):
    c = sgl_probe_collector
    grpc_env, http_env = c.env(), c.env("http/protobuf")
    assert grpc_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == c.grpc_endpoint
    assert grpc_env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
    assert http_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == c.http_endpoint
    assert http_env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].endswith("/v1/traces")
    assert http_env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert grpc_env["SGL_PROBE_RUN_ID"] != http_env["SGL_PROBE_RUN_ID"]  # every call is a new run
    assert c.run_ids[-2:] == [grpc_env["SGL_PROBE_RUN_ID"], http_env["SGL_PROBE_RUN_ID"]]
    with pytest.raises(ValueError, match="accepted: 'grpc', 'http/protobuf'"):
        c.env("zipkin")

    # A launch env drops what would misroute the spans or fake the launcher, keeps the rest.
    for key, value in {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://elsewhere:4317", "OTEL_TRACES_SAMPLER": "always_off",
                       "OTEL_SDK_DISABLED": "true", "SGL_PROBE_RUN_ID": "stale",
                       "SGL_PROBE_LAUNCHER_ENV": '{"NCCL_PROTO":"Simple"}', "OTEL_SERVICE_NAME": "mine",
                       "NCCL_DEBUG": "WARN", "DROP_ME": "1"}.items():
        monkeypatch.setenv(key, value)
    env = c.launch_env({"NCCL_PROTO": "LL", "DROP_ME": None}, protocol="http/protobuf")
    for gone in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED",
                 "SGL_PROBE_LAUNCHER_ENV", "DROP_ME"):
        assert gone not in env
    assert env["SGL_PROBE_RUN_ID"] not in ("stale", None) and env["SGL_PROBE_RUN_ID"] == c.run_ids[-1]
    assert env["OTEL_SERVICE_NAME"] == "mine" and env["NCCL_DEBUG"] == "WARN" and env["NCCL_PROTO"] == "LL"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == c.http_endpoint
    assert env["PATH"] == os.environ["PATH"]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_snapshots_per_pid_rank_and_point(sgl_probe_collector, protocol):
    c = sgl_probe_collector
    run = c.env(protocol)["SGL_PROBE_RUN_ID"]
    # SGLang's launcher set NCCL_CUMEM_ENABLE before spawning: every worker differs there.
    worker = {**LAUNCHER, "NCCL_CUMEM_ENABLE": "0", "HOME": "/root"}
    spans = two_points(worker, worker, tp_rank=0, pid=1000, run_id=run) + \
        two_points(worker, worker, tp_rank=1, pid=1001, run_id=run)
    export(c, spans[:3], protocol)  # rank 1's nccl_init not yet there
    with pytest.raises(TimeoutError) as info:
        c.wait_for_env_snapshots(range(2), at="nccl_init", run_id=run, timeout=0.5)
    assert "tp_rank 1 (pid 1001): process_start" in str(info.value)
    export(c, spans[3:], protocol)
    snaps = c.wait_for_env_snapshots(range(2), at="nccl_init", run_id=run, timeout=10)

    assert sorted(snaps) == [(1000, 0, "nccl_init"), (1000, 0, "process_start"),
                             (1001, 1, "nccl_init"), (1001, 1, "process_start")]
    assert snaps.ranks() == [0, 1] and snaps.pids() == [1000, 1001]
    snap = snaps[(1001, 1, "nccl_init")]
    assert snap.env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_ALGO": "Ring", "NCCL_CUMEM_ENABLE": "0",
                        "NCCL_PROTO": "LL"}  # HOME is not on the allow-list
    assert snap.differs_from_launcher == ("NCCL_CUMEM_ENABLE",)
    assert snap.launcher_value("NCCL_CUMEM_ENABLE") is None  # the launcher did not have it
    assert snap.launcher_value("NCCL_PROTO") == "LL"
    assert (snap.run_id, snap.service_name, snap.dist_backend) == (run, "sglang", "nccl")
    assert snap.trigger == "torch.distributed:init_process_group"
    assert snap.label == "tp_rank 1 (pid 1001)"
    assert [s.point for s in snaps.for_rank(1)] == ["nccl_init", "process_start"]
    assert list(snaps.at("process_start")) == [(1000, 0, "process_start"), (1001, 1, "process_start")]
    assert assert_env_propagated(snaps, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, ranks=range(2))
    # The same checks straight from the collector or from a list of spans.
    assert_env_propagated(c.env_snapshots(run_id=run), {"NCCL_PROTO": "LL"}, ranks=[0, 1],
                          at=("process_start", "nccl_init"))
    assert_env_propagated(c.spans(run_id=run), {"NCCL_PROTO": "LL"})
    # Other runs (the other parametrization, or other tests on this session collector) stay out.
    assert {s.run_id for s in c.env_snapshots(run_id=run).values()} == {run}


# -- the assertion's verdicts -------------------------------------------------------------------


def test_failure_names_rank_variable_values_and_where_it_changed(collector):
    lost_at_spawn = {k: v for k, v in LAUNCHER.items() if k != "NCCL_PROTO"}
    spans = (two_points(LAUNCHER, LAUNCHER, tp_rank=0, pid=2000)
             # spawned without it: the launcher had LL, the worker never did
             + two_points(lost_at_spawn, lost_at_spawn, tp_rank=1, pid=2001)
             # spawned with it, removed inside the worker before NCCL init
             + two_points(LAUNCHER, lost_at_spawn, tp_rank=2, pid=2002)
             # SGLang-style rewrite before spawn: value changed, not removed
             + two_points({**LAUNCHER, "NCCL_PROTO": "Simple"}, {**LAUNCHER, "NCCL_PROTO": "Simple"},
                          tp_rank=3, pid=2003))
    export(collector, spans)
    snaps = collector.wait_for_env_snapshots(range(4), timeout=10)
    with pytest.raises(EnvPropagationError) as info:
        assert_env_propagated(snaps, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, ranks=range(5), at="nccl_init")
    message = str(info.value)
    lines = message.splitlines()
    assert lines[0] == ("environment not propagated at nccl_init (NCCL_PROTO='LL', NCCL_ALGO='Ring'): "
                        "4 problem(s) in 4 of 5 scheduler process(es)")
    assert lines[1].startswith("  tp_rank 4: no env snapshot at nccl_init arrived (received: tp_rank 0 (pid 2000)")
    assert lines[2] == (
        "  tp_rank 1 (pid 2001) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had 'LL'; "
        "rewritten before spawning: yes (the process was spawned without it: it was changed in SGLang's "
        "launching process after `import sglang`, by SGLang's own env setup or other code running there)")
    assert lines[3] == (
        "  tp_rank 2 (pid 2002) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had 'LL'; "
        "rewritten before spawning: no (the process was spawned with the launcher's 'LL'; it changed "
        "inside the process before nccl_init)")
    assert lines[4].startswith("  tp_rank 3 (pid 2003) at nccl_init: NCCL_PROTO is 'Simple', expected 'LL'; "
                               "launcher had 'LL'; rewritten before spawning: yes (the process was spawned "
                               "with 'Simple'")
    assert lines[5] == "  as expected: tp_rank 0 (pid 2000)"
    assert len(lines) == 6
    problems = info.value.problems
    assert [(p.kind, p.tp_rank, p.name, p.changed_before_spawn) for p in problems] == [
        ("missing_snapshot", 4, None, None), ("differs", 1, "NCCL_PROTO", True),
        ("differs", 2, "NCCL_PROTO", False), ("differs", 3, "NCCL_PROTO", True)]
    assert sorted(s.tp_rank for s in info.value.checked) == [0, 1, 2, 3]
    # The same verdict at process_start: only the processes spawned without the value.
    problems, _ = env_propagation_problems(snaps, {"NCCL_PROTO": "LL"}, at="process_start")
    assert [(p.tp_rank, p.changed_before_spawn) for p in problems] == [(1, True), (3, True)]


def test_launcher_never_had_it_unknown_launcher_withheld_and_must_be_unset(collector):
    no_proto = {"NCCL_ALGO": "Ring"}
    spans = (two_points(no_proto, no_proto, tp_rank=0, pid=3000, launcher=no_proto)
             + two_points(no_proto, no_proto, tp_rank=1, pid=3001, launcher=None)  # no probe in the launcher
             + [snapshot_span("nccl_init", {**LAUNCHER, "NCCL_IB_AUTH_KEY": "x", "MY_SETTING": "1"},
                              tp_rank=2, pid=3002)])  # no process_start from this one
    export(collector, spans, "http/protobuf")
    collector.wait_for(lambda s: len(s) == 5, timeout=10)
    with pytest.raises(AssertionError) as info:
        assert_env_propagated(collector, {"NCCL_PROTO": "LL", "NCCL_IB_AUTH_KEY": "x", "MY_SETTING": "1",
                                          "NCCL_ALGO": None})
    text = str(info.value)
    assert ("tp_rank 0 (pid 3000) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had unset; "
            "rewritten before spawning: no (nothing changed it: the launcher itself never had the expected "
            "value)") in text
    assert ("tp_rank 1 (pid 3001) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had unknown; "
            "rewritten before spawning: unknown (this snapshot carries no launcher env") in text
    assert ("tp_rank 2 (pid 3002) at nccl_init: NCCL_IB_AUTH_KEY cannot be compared: its name looks secret"
            in text)
    assert ("tp_rank 2 (pid 3002) at nccl_init: MY_SETTING is unset, expected '1'; launcher had unset; "
            "rewritten before spawning: no (nothing changed it") in text
    assert "MY_SETTING is not on the probe's default allow-list" in text
    # NCCL_ALGO=None means "must be unset": every process has it.
    assert text.count("NCCL_ALGO is 'Ring', expected unset") == 3
    snap = env_snapshots(collector.spans())[(3001, 1, "nccl_init")]
    assert snap.differs_from_launcher is None and snap.launcher_value("NCCL_PROTO") is UNKNOWN
    with pytest.raises(ValueError, match="expected: give the variables"):
        assert_env_propagated(collector, {})
    with pytest.raises(TypeError, match="ranks must be an iterable"):
        assert_env_propagated(collector, {"NCCL_PROTO": "LL"}, ranks=2)
    with pytest.raises(ValueError, match="unknown snapshot point 'nccl'"):
        assert_env_propagated(collector, {"NCCL_PROTO": "LL"}, at="nccl")


def test_nccl_confirmations_are_read_from_any_span(collector):
    spans = (two_points(LAUNCHER, LAUNCHER, tp_rank=0, pid=4000,
                        extra={"nccl.confirmed.NCCL_PROTO": "LL", "nccl.confirmed.NCCL_ALGO": "Ring"})
             + two_points(LAUNCHER, LAUNCHER, tp_rank=1, pid=4001)
             + two_points(LAUNCHER, LAUNCHER, tp_rank=2, pid=4002)
             # a span of its own, as SGL_PROBE_NCCL_CONFIRM=1 sends once NCCL has logged what it read
             + [snapshot_span("nccl_confirm", LAUNCHER, tp_rank=1, pid=4001,
                              extra={"nccl.confirmed.NCCL_PROTO": "Simple"})])
    export(collector, spans)
    conf = collector.wait_for_nccl_confirmations(["NCCL_PROTO"], ranks=[0, 1], timeout=10)
    assert conf == {(4000, 0): {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, (4001, 1): {"NCCL_PROTO": "Simple"}}
    assert nccl_confirmations(collector.spans(), ranks=[1]) == {(4001, 1): {"NCCL_PROTO": "Simple"}}
    snaps = collector.env_snapshots()
    assert snaps[(4001, 1, "nccl_init")].nccl_confirmed == {"NCCL_PROTO": "Simple"}
    assert snaps[(4001, 1, "nccl_confirm")].env["NCCL_PROTO"] == "LL"
    assert len(snaps.at("nccl_init")) == 3 and len(snaps.at("nccl_confirm")) == 1
    assert_env_propagated(snaps, {"NCCL_PROTO": "LL"})  # the environment itself is right everywhere
    with pytest.raises(EnvPropagationError) as info:
        assert_env_propagated(snaps, {"NCCL_PROTO": "LL", "CUDA_VISIBLE_DEVICES": "0,1"}, nccl_confirmed=True)
    text = str(info.value)
    assert "tp_rank 0" not in text.split("as expected:")[0]
    assert ("tp_rank 1 (pid 4001) at nccl_init: NCCL_PROTO='LL' is in the environment but NCCL reported "
            "'Simple' (nccl.confirmed.NCCL_PROTO)") in text
    assert ("tp_rank 2 (pid 4002) at nccl_init: NCCL_PROTO='LL' is in the environment but NCCL did not "
            "confirm reading it (no nccl.confirmed.NCCL_PROTO); this process sent no nccl.confirmed.* "
            "attribute at all") in text
    assert "CUDA_VISIBLE_DEVICES" not in text.split("\n", 1)[1]  # only NCCL_* names are confirmed by NCCL


# -- phase spans and waiting --------------------------------------------------------------------


def test_phase_span_queries(collector):
    t0 = time.time_ns()
    mk = lambda name, rank, graph, dt=0: plain_span(  # noqa: E731
        name, {"sglang.tp_rank": rank, "sglang.cuda_graph": graph, "sgl_probe.duration_ms": 1.5}, pid=5000 + rank,
        start_ns=t0 + dt)
    export(collector, [mk("sglang.extend", 0, False), mk("sglang.decode", 0, True, 1), mk("sglang.decode", 1, True, 2),
                       mk("sglang.verify", 1, False, 3), mk("sglang.step", 1, False, 4),
                       plain_span("sglang.decode", {"sglang.tp_rank": 1}, pid=9, run_id="run-b")])
    with pytest.raises(TimeoutError, match=r"1 x sglang.extend span\(s\) from each of tp ranks \[0, 1\]"):
        collector.wait_for_phase_spans("extend", ranks=range(2), timeout=1, run_id="run-a")
    got = collector.wait_for_phase_spans(["decode"], ranks=range(2), timeout=10, run_id="run-a")
    assert [(s.name, s.attributes["sglang.tp_rank"]) for s in got] == [("sglang.decode", 0), ("sglang.decode", 1)]
    assert len(collector.phase_spans("decode")) == 3 and len(collector.phase_spans("decode", run_id="run-b")) == 1
    assert [s.name for s in collector.phase_spans(run_id="run-a")] == [
        "sglang.extend", "sglang.decode", "sglang.decode", "sglang.verify"]
    graphless = phase_spans(collector.spans(), ["sglang.verify", "extend"], cuda_graph=False)
    assert [s.name for s in graphless] == ["sglang.extend", "sglang.verify"]
    assert [s.name for s in collector.phase_spans(ranks=[1], since_ns=t0 + 3, run_id="run-a")] == ["sglang.verify"]
    assert len(collector.step_spans(ranks=[1])) == 1
    with pytest.raises(ValueError, match="unknown phase 'prefill'"):
        collector.phase_spans("prefill")


def test_wait_ends_when_the_server_process_exits(collector):
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    t0 = time.monotonic()
    with pytest.raises(ServerExited) as info:
        collector.wait_for_env_snapshots(range(2), process=proc, timeout=60)
    assert time.monotonic() - t0 < 10
    assert "exited (rc=3) before env snapshots at nccl_init from tp ranks [0, 1]" in str(info.value)
    assert "nothing arrived: is sgl-probe installed in the server's Python" in str(info.value)


# -- receiver robustness, through the session fixture -------------------------------------------


def _post(url: str, body: bytes, content_type: str, **headers: str) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type, **headers})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_malformed_payloads_get_errors_and_never_break_the_fixture(sgl_probe_collector):
    c = sgl_probe_collector
    n_errors = len(c.errors)
    url = c.http_endpoint
    base = url[: -len("/v1/traces")]
    assert _post(url, b"\x0a\xff\xff\xff\xff\xff", "application/x-protobuf") == 400
    assert _post(url, b'{"resourceSpans": 7}', "application/json") == 400
    assert _post(url, b"not gzip", "application/x-protobuf", **{"Content-Encoding": "gzip"}) == 400
    assert _post(url, b"{}", "text/plain") == 415
    assert _post(base + "/v1/logs", b"", "application/x-protobuf") == 404
    # A client that promises more bytes than it sends and hangs up.
    host, port = base[len("http://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                  b"Content-Length: 1000\r\n\r\n\x0a\x05")
    with grpc.insecure_channel(c.grpc_endpoint.replace("http://", "")) as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                   request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as rpc:
            call(b"\xff\xfe junk", timeout=10)
        assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    deadline = time.monotonic() + 10
    while len(c.errors) < n_errors + 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(c.errors) >= n_errors + 7, c.errors
    # Still serving both transports, and the rejections show up in its diagnostics.
    run = c.env()["SGL_PROBE_RUN_ID"]
    export(c, two_points(LAUNCHER, LAUNCHER, tp_rank=0, pid=6000, run_id=run), "grpc")
    export(c, two_points(LAUNCHER, LAUNCHER, tp_rank=1, pid=6001, run_id=run), "http/protobuf")
    snaps = c.wait_for_env_snapshots(range(2), run_id=run, timeout=10)
    assert_env_propagated(snaps, {"NCCL_PROTO": "LL"}, ranks=range(2))
    # Which rejection is last depends on when the server thread gives up on the truncated body.
    assert any(e.startswith("grpc: malformed ExportTraceServiceRequest") for e in c.errors), c.errors
    assert f"{len(c.errors)} rejected payload(s), last: " in c.describe(run_id=run)


# -- user-style test files through pytest --------------------------------------------------------

USER_TEST = textwrap.dedent('''
    import json, time
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from sgl_probe import envsnap, spans
    from sgl_probe.config import DEFAULT_ENV_ALLOW
    from sgl_probe.testing import assert_env_propagated

    def send(collector, run, rank, pid, env):
        env = dict(env, SGL_PROBE_LAUNCHER_ENV=json.dumps({"NCCL_PROTO": "LL"}))
        res = Resource.create({"process.pid": pid, "sgl_probe.run_id": run})
        out = [spans.build_env_span(envsnap.snapshot_attributes(p, DEFAULT_ENV_ALLOW, env), time.time_ns(), run,
                                    {"tp_rank": rank}, res) for p in ("process_start", "nccl_init")]
        OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True).export(out)

    def check(collector, env_rank1):
        run = collector.env()["SGL_PROBE_RUN_ID"]
        send(collector, run, 0, 100, {"NCCL_PROTO": "LL"})
        send(collector, run, 1, 101, env_rank1)
        snaps = collector.wait_for_env_snapshots(ranks=range(2), run_id=run, timeout=20)
        assert_env_propagated(snaps, {"NCCL_PROTO": "LL"}, ranks=range(2))

    def test_ok(sgl_probe_collector):
        check(sgl_probe_collector, {"NCCL_PROTO": "LL"})

    def test_rank1_lost_it(sgl_probe_collector):
        check(sgl_probe_collector, {})
''')


def run_pytest(python: str, path: Path, *args: str, env: dict | None = None, timeout: float = 300,
               ) -> subprocess.CompletedProcess:
    """``pytest`` on one file in its own folder (no repo ini, no cache), as a user would run it."""
    return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(path.parent),
                           "-c", os.devnull, *args, str(path)], cwd=path.parent, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_user_test_file_through_pytest(tmp_path):
    path = tmp_path / "test_user.py"
    path.write_text(USER_TEST)
    out = run_pytest(sys.executable, path)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert re.search(r"^1 failed, 1 passed", text, re.M), text
    assert ("tp_rank 1 (pid 101) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had 'LL'; "
            "rewritten before spawning: yes") in text
    assert "as expected: tp_rank 0 (pid 100)" in text
    # The plugin adds what the collector saw to the failure report.
    assert re.search(r"-+ sgl-probe collector -+\nreceived \d+ span\(s\)", text), text
    # `-p no:sgl_probe` turns the plugin off.
    off = run_pytest(sys.executable, path, "-p", "no:sgl_probe")
    assert "fixture 'sgl_probe_collector' not found" in off.stdout, off.stdout[-2000:]


def test_literal_names_of_the_testing_api_equal_the_contract():
    """The testing API spells the span contract's names itself (an independent oracle); they must
    be the probe's."""
    from sgl_probe import contract
    from sgl_probe.testing import names

    for ours, theirs in names.CONTRACT_NAMES.items():
        assert getattr(names, ours) == getattr(contract, theirs), (ours, theirs)
    assert (names.TP_RANK, names.DP_RANK, names.PP_RANK) == tuple(contract.SPAN_PREFIX + r for r in contract.RANKS)
    assert names.LAUNCHER_ENV_VAR == envsnap.LAUNCHER_ENV_VAR


def test_docs_show_the_example_file_verbatim():
    doc = (ROOT / "docs" / "testing.md").read_text()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == EXAMPLE.read_text()


# -- placeholder "sglang": the example file in a fresh venv (wheel + pytest only) -------------

#: A package *named* ``sglang`` that is not SGLang: a launcher spawning one "scheduler" process per
#: tp rank (multiprocessing spawn, as SGLang does), classes with the names the probe's target table
#: wraps (Scheduler.__init__/run_batch, TpModelWorker.forward_batch_generation,
#: GroupCoordinator.__init__), and /health + /generate. It only exists to trigger the probe.
PLACEHOLDER = {
    "sglang/__init__.py": '"""Placeholder named sglang (sgl-probe tests); NOT SGLang."""\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/distributed/__init__.py": "",
    "sglang/srt/distributed/parallel_state.py": textwrap.dedent('''
        class GroupCoordinator:
            def __init__(self, ranks=(), backend="gloo"):
                self.ranks, self.backend = ranks, backend
    '''),
    "sglang/srt/managers/tp_worker.py": textwrap.dedent('''
        import enum, time

        class ForwardMode(enum.Enum):
            EXTEND = 1
            DECODE = 2

        class Batch:
            def __init__(self, mode, bs, tokens):
                self.forward_mode, self.seq_lens, self.extend_num_tokens = mode, [1] * bs, tokens

        class Result:
            can_run_cuda_graph = False

        class TpModelWorker:
            def forward_batch_generation(self, batch):
                time.sleep(0.002)
                return Result()
    '''),
    "sglang/srt/managers/scheduler.py": textwrap.dedent('''
        from sglang.srt.distributed.parallel_state import GroupCoordinator
        from sglang.srt.managers.tp_worker import Batch, ForwardMode, TpModelWorker

        class Scheduler:
            def __init__(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank):
                self.group = GroupCoordinator(ranks=list(range(server_args["tp"])))
                self.worker = TpModelWorker()

            def run_batch(self, batch):
                return self.worker.forward_batch_generation(batch)

        def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer):
            sched = Scheduler(server_args, port_args, gpu_id, tp_rank, 0, pp_rank, dp_rank)
            requests, replies = port_args
            pipe_writer.send("ready")
            while True:
                prompt_tokens, new_tokens = requests.get()
                sched.run_batch(Batch(ForwardMode.EXTEND, 1, prompt_tokens))
                for _ in range(new_tokens - 1):
                    sched.run_batch(Batch(ForwardMode.DECODE, 1, 0))
                replies.put(tp_rank)
    '''),
    "sglang/launch_server.py": textwrap.dedent('''
        import argparse, json, multiprocessing as mp, threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from sglang.srt.managers.scheduler import run_scheduler_process

        def main():
            ap = argparse.ArgumentParser()
            ap.add_argument("--tp", type=int, default=1)
            ap.add_argument("--host", default="127.0.0.1")
            ap.add_argument("--port", type=int, default=30000)
            args, _ = ap.parse_known_args()
            ctx = mp.get_context("spawn")
            queues = []
            for rank in range(args.tp):
                reader, writer = ctx.Pipe(duplex=False)
                q = (ctx.Queue(), ctx.Queue())
                ctx.Process(target=run_scheduler_process,
                            args=({"tp": args.tp}, q, rank, rank, 0, None, writer), daemon=True).start()
                reader.recv()
                queues.append(q)
            lock = threading.Lock()

            class Handler(BaseHTTPRequestHandler):
                def do_GET(self):
                    self.reply(200 if self.path == "/health" else 404, {})

                def do_POST(self):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    n = int(body.get("sampling_params", {}).get("max_new_tokens", 8))
                    with lock:
                        for requests, _ in queues:
                            requests.put((len(body["text"].split()), n))
                        for _, replies in queues:
                            replies.get(timeout=60)
                    self.reply(200, {"text": " x" * n, "output_ids": [1] * n, "meta_info": {}})

                def reply(self, code, obj):
                    data = json.dumps(obj).encode()
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

                def log_message(self, *a):
                    pass

            ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()

        if __name__ == "__main__":
            main()
    '''),
}

#: The launcher the failing runs use: SGLang (or the placeholder) is started normally, except that
#: the scheduler process of one tp rank is spawned while the variable is removed from os.environ,
#: so that process really starts without it (the launcher itself keeps it, and so does every
#: other process). Nothing in the probe or in SGLang is patched.
ONE_RANK_WITHOUT = textwrap.dedent('''
    """python one_rank_without.py NAME TP_RANK -- <sglang.launch_server arguments>"""
    import inspect, multiprocessing.process, os, runpy, sys

    NAME, RANK = sys.argv[1], int(sys.argv[2])
    ARGS = sys.argv[sys.argv.index("--") + 1:]
    _start = multiprocessing.process.BaseProcess.start


    def start(self):
        target = getattr(self, "_target", None)
        rank = None
        if getattr(target, "__name__", "") == "run_scheduler_process":
            try:
                rank = inspect.signature(target).bind_partial(*self._args, **self._kwargs).arguments.get("tp_rank")
            except TypeError:
                pass
        if rank != RANK:
            return _start(self)
        saved = os.environ.pop(NAME, None)
        try:
            return _start(self)
        finally:
            if saved is not None:
                os.environ[NAME] = saved
            note = f"one_rank_without: spawned the tp_rank {RANK} scheduler, pid {self.pid}, without {NAME}"
            print(note, file=sys.stderr, flush=True)
            if os.environ.get("ONE_RANK_WITHOUT_REPORT"):
                with open(os.environ["ONE_RANK_WITHOUT_REPORT"], "a") as fh:
                    fh.write(f"{self.pid}\\n")


    multiprocessing.process.BaseProcess.start = start
    sys.argv = ["sglang.launch_server", *ARGS]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
''')


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SGL_PROBE", "OTEL_", "PYTEST_", "NCCL_")) and k != "PYTHONPATH"}
    env.update(extra)
    return env


def expect_one_rank_failure(out: subprocess.CompletedProcess, report: Path) -> str:
    """The example failed only its env test, naming exactly the process spawned without the value."""
    text = out.stdout + out.stderr
    print(text[-4000:])
    assert out.returncode == 1, text[-6000:]
    assert re.search(r"^1 failed, 1 passed", text, re.M), text[-6000:]
    assert "FAILED test_sglang_env_propagation.py::test_launcher_env_reaches_every_scheduler" in text
    m = re.search(r"tp_rank 1 \(pid (\d+)\) at nccl_init: NCCL_PROTO is unset, expected 'LL'; launcher had 'LL'; "
                  r"rewritten before spawning: yes \(the process was spawned without it", text)
    assert m, text[-6000:]
    assert re.search(r"as expected: tp_rank 0 \(pid \d+\)", text), text[-6000:]
    assert "problem(s) in 1 of 2 scheduler process(es)" in text
    assert report.read_text().split() == [m.group(1)], "the failure must name the process the launcher spawned"
    return m.group(1)


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("example")
    shutil.copy(EXAMPLE, d / EXAMPLE.name)
    (d / "one_rank_without.py").write_text(ONE_RANK_WITHOUT)
    return d


def test_readme_example_in_fresh_venv_with_only_wheel_and_pytest(tmp_path, example_dir):
    from tests.harness.wheel import build_wheel, fresh_venv, pip_install

    venv = fresh_venv(tmp_path / "venv", build_wheel(tmp_path / "wheel"))
    pip_install(venv, "pytest")
    placeholder = tmp_path / "placeholder"
    for rel, text in PLACEHOLDER.items():
        (placeholder / rel).parent.mkdir(parents=True, exist_ok=True)
        (placeholder / rel).write_text(text)
    python = str(venv / "bin" / "python")
    env = clean_env(PYTHONPATH=str(placeholder), MODEL_PATH="placeholder", TP_SIZE="2", SERVER_STARTUP_S="60")
    example = example_dir / EXAMPLE.name

    ok = run_pytest(python, example, "-s", env=env, timeout=240)
    text = ok.stdout + ok.stderr
    assert ok.returncode == 0, text[-6000:]
    assert re.search(r"^2 passed", text, re.M), text
    assert "tp_rank 0 (pid" in text and "tp_rank 1 (pid" in text and "NCCL_PROTO='LL'" in text
    assert "PytestAssertRewriteWarning" not in text, text  # the plugin must not cost users a warning

    report = tmp_path / "spawned-without.txt"
    bad = run_pytest(python, example, env={**env, "ONE_RANK_WITHOUT_REPORT": str(report),
                                           "SERVER_LAUNCHER": f"{python} {example_dir / 'one_rank_without.py'}"
                                                              f" NCCL_PROTO 1 --"}, timeout=240)
    expect_one_rank_failure(bad, report)


# -- the real SGLang server on CPU ------------------------------------------------------------------

CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
            "--mem-fraction-static", "0.1", "--max-total-tokens", "2048", "--dtype", "float32",
            "--disable-radix-cache")


@pytest.fixture(scope="module")
def sglang_setup(tmp_path_factory):
    from tests.harness.model import ensure_tiny_model
    from tests.harness.server import CPU_ENV, cpu_bind_spec
    from tests.harness.venv import ensure_venv
    from tests.harness.wheel import build_wheel, install_wheel

    venv = ensure_venv("0.5.23")
    install_wheel(venv, build_wheel(tmp_path_factory.mktemp("wheel")))
    model = ensure_tiny_model(venv)
    env = clean_env(
        SGLANG_PYTHON=str(venv / "bin" / "python"), MODEL_PATH=str(model), TP_SIZE="2",
        SERVER_ARGS=shlex.join(CPU_ARGS), SERVER_STARTUP_S="600",
        **CPU_ENV, SGLANG_CPU_OMP_THREADS_BIND=cpu_bind_spec(2))  # the harness's CPU settings
    return venv, env


@pytest.mark.sglang
def test_example_against_real_sglang_tp2_passes_for_every_scheduler(sglang_setup, example_dir):
    _, env = sglang_setup
    out = run_pytest(sys.executable, example_dir / EXAMPLE.name, "-s", env=env, timeout=900)
    text = out.stdout + out.stderr
    print(text[-4000:])
    assert out.returncode == 0, text[-8000:]
    assert re.search(r"^2 passed", text, re.M), text[-8000:]
    lines = re.findall(r"^tp_rank (\d) \(pid (\d+)\): NCCL_PROTO='LL'", text, re.M)
    assert sorted(r for r, _ in lines) == ["0", "1"] and len({p for _, p in lines}) == 2, text[-8000:]


@pytest.mark.sglang
def test_example_against_real_sglang_fails_naming_the_rank_spawned_without_it(sglang_setup, example_dir, tmp_path):
    venv, env = sglang_setup
    launcher = f"{venv / 'bin' / 'python'} {example_dir / 'one_rank_without.py'} NCCL_PROTO 1 --"
    report = tmp_path / "spawned-without.txt"
    out = run_pytest(sys.executable, example_dir / EXAMPLE.name, "-s",
                     env={**env, "SERVER_LAUNCHER": launcher, "ONE_RANK_WITHOUT_REPORT": str(report)}, timeout=900)
    expect_one_rank_failure(out, report)
    # The other test of the file (phase spans from both ranks) still passed against that server.
    assert re.search(r"phase spans; extend/decode per rank: \{0: \d+, 1: \d+\}", out.stdout), out.stdout[-3000:]


def test_free_port_is_below_the_ephemeral_range_and_free():
    import socket

    from sgl_probe.testing import free_port

    port = free_port()
    assert 20000 <= port < 32000
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free a moment ago: nothing else here took it
