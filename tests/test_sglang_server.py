"""The probe inside a real, unpatched SGLang server on this CPU machine.

sgl-probe is installed into the harness venv from the built wheel, exactly as a user would; the
server is launched with ``NCCL_PROTO=LL`` (and two planted secrets) in the launcher's env and
exports over real OTLP to a receiver on a socket: gRPC for 0.5.23 (tp 2), HTTP/protobuf for
0.5.9 (tp 1). The same prompts are then sent to a server started with ``SGL_PROBE=0``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan
from tests.harness.model import ensure_tiny_model
from tests.harness.server import SGLangServer, output_ids
from tests.harness.venv import ensure_venv
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

NEW_TOKENS = 8
SEQUENTIAL = ["hello world the quick", "once upon a time there"]
CONCURRENT = ["brown fox jumps over lazy", "speculative decoding scheduler", "tensor parallel request"]
SECRETS = {"HF_TOKEN": "hf_PLANTEDSECRET0001", "MY_API_KEY": "sk-PLANTEDSECRET0002"}
# Exact token accounting needs every prompt prefilled in full: no prefix cache reuse.
ARGS = ("--disable-radix-cache", "--dtype", "float32", "--enable-metrics", "--enable-metrics-for-all-schedulers")

CASES = {
    "0.5.23": {"tp": 2, "protocol": "grpc"},
    "0.5.9": {"tp": 1, "protocol": "http/protobuf"},
}


@dataclass
class Run:
    version: str
    tp: int
    responses: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    payloads: list = field(default_factory=list)
    log: str = ""
    metrics: str = ""
    t_load: int = 0
    trace_dir: Path | None = None


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def sglang_venvs(wheel) -> dict[str, Path]:
    out = {}
    for version in CASES:
        venv = ensure_venv(version)
        install_wheel(venv, wheel)
        out[version] = venv
    return out


@pytest.fixture(scope="session")
def tiny_model(sglang_venvs) -> Path:
    return ensure_tiny_model(sglang_venvs["0.5.23"])


def send_load(server: SGLangServer) -> list[dict]:
    out = [server.generate(t, NEW_TOKENS, ignore_eos=True) for t in SEQUENTIAL]
    out += server.generate_many(CONCURRENT, NEW_TOKENS)
    return out


@pytest.fixture(scope="session", params=list(CASES))
def probed_run(request, sglang_venvs, tiny_model, tmp_path_factory) -> Run:
    version = request.param
    case = CASES[version]
    tmp = tmp_path_factory.mktemp(f"run-{version}")
    with OTLPReceiver() as receiver:
        env = {**receiver.env(case["protocol"]), **SECRETS, "NCCL_PROTO": "LL", "SGL_PROBE": "1",
               "SGL_PROBE_SUMMARY_S": "1", "SGL_PROBE_TRACE_DIR": str(tmp / "traces"),
               "OTEL_BSP_SCHEDULE_DELAY": "200", "SGL_PROBE_RUN_ID": None,
               # Stale, as if left by an earlier launch in the same shell: the launch hook must
               # replace it with this launch's env (checked in the env-snapshot test).
               "SGL_PROBE_LAUNCHER_ENV": '{"NCCL_PROTO": "stale"}'}
        run = Run(version, case["tp"], trace_dir=tmp / "traces")
        with SGLangServer(sglang_venvs[version], tiny_model, tp=case["tp"], env=env, extra_args=ARGS,
                          log_path=tmp / "server.log") as server:
            run.t_load = time.time_ns()
            n_log = len(server.log_text().splitlines())
            run.responses = send_load(server)
            expected_decode = len(SEQUENTIAL + CONCURRENT) * (NEW_TOKENS - 1)

            def complete(spans: list[ReceivedSpan]) -> bool:
                per_rank = defaultdict(int)
                for s in spans:
                    if s.name == "sglang.decode" and s.start_ns >= run.t_load:
                        per_rank[s.attributes.get("sglang.tp_rank")] += s.attributes["sglang.batch_size"]
                return len(per_rank) == case["tp"] and all(v >= expected_decode for v in per_rank.values())

            try:
                receiver.wait_for(complete, timeout=60)
            except TimeoutError:
                pass  # the assertions below say what is missing
            # The 1 s summary line of the load's decode steps.
            run.log = server.wait_for_log(lambda log: any(
                "sgl-probe summary" in ln and "decode n=" in ln for ln in log.splitlines()[n_log:]))
            run.metrics = server.request_text("/metrics")
        run.spans = receiver.spans()
        run.payloads = receiver.raw_payloads()
    return run


class Baseline(dict):
    """Output ids by version, and ``streamed``: by version, the ``data:`` lines of one streamed
    request sent by the GPU benchmark's own client (``benchmarks/gpu_sglang/device.py``)."""

    streamed: dict[str, list[bytes]]


STREAM_TOKENS = 12


def gpu_device():
    """The GPU benchmark's driver module (``benchmarks/gpu_sglang/device.py``), for its client."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sglang"))
    import device

    return device


@pytest.fixture(scope="session")
def baseline_outputs(sglang_venvs, tiny_model, tmp_path_factory) -> Baseline:
    device = gpu_device()
    out = Baseline()
    out.streamed = {}
    for version, case in CASES.items():
        tmp = tmp_path_factory.mktemp(f"baseline-{version}")
        with SGLangServer(sglang_venvs[version], tiny_model, tp=case["tp"], extra_args=ARGS,
                          env={"SGL_PROBE": "0"}, log_path=tmp / "server.log") as server:
            out[version] = [output_ids(r) for r in send_load(server)]
            client = object.__new__(device.Server)
            client.port = server.port
            out.streamed[version] = [line for _, line in client.stream("a streamed count", STREAM_TOKENS)]
            log = server.log_text()
        assert "sgl-probe" not in log, "SGL_PROBE=0 must keep the probe out entirely"
    return out


def in_load(run: Run, name: str) -> list[ReceivedSpan]:
    return [s for s in run.spans if s.name == name and s.start_ns >= run.t_load]


def test_phase_spans_from_every_scheduler(probed_run: Run):
    run = probed_run
    n_req = len(SEQUENTIAL + CONCURRENT)
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in run.responses)
    assert all(r["meta_info"]["completion_tokens"] == NEW_TOKENS for r in run.responses)
    extend, decode = in_load(run, "sglang.extend"), in_load(run, "sglang.decode")
    steps = {s.span_id: s for s in in_load(run, "sglang.step")}
    ranks = sorted({s.attributes["sglang.tp_rank"] for s in extend + decode})
    assert ranks == list(range(run.tp))
    pids = {s.resource["process.pid"] for s in extend + decode}
    assert len(pids) == run.tp, "one scheduler process per tp rank"
    for rank in ranks:
        ext = [s for s in extend if s.attributes["sglang.tp_rank"] == rank]
        dec = [s for s in decode if s.attributes["sglang.tp_rank"] == rank]
        # Every prompt is prefilled exactly once, and every token after the first is one decode
        # row, however the scheduler batched them.
        assert sum(s.attributes["sglang.num_tokens"] for s in ext) == prompt_tokens
        assert sum(s.attributes["sglang.batch_size"] for s in ext) == n_req
        # Every token after the first is one decode row. The overlap scheduler of 0.5.9 also runs
        # one look-ahead decode for a request whose last token is still in flight (0.5.23 does
        # not); the step count itself is checked exactly against SGLang's counter below.
        rows = sum(s.attributes["sglang.batch_size"] for s in dec)
        assert n_req * (NEW_TOKENS - 1) <= rows <= n_req * NEW_TOKENS
        assert max(s.attributes["sglang.batch_size"] for s in dec) > 1, "concurrent requests batched"
        for s in ext + dec:
            a = s.attributes
            assert a["sgl_probe.timer"] == "cpu" and a["sglang.cuda_graph"] is False
            # Why, from SGLang's own state (--disable-cuda-graph; the CPU engine builds no runner);
            # the cpu timer has no GPU start to tell apart.
            assert a["sglang.no_graph_reason"] == "graphs_disabled" and "sgl_probe.start" not in a
            assert a["sglang.forward_mode"] == ("EXTEND" if s.name == "sglang.extend" else "DECODE")
            assert a["sgl_probe.duration_ms"] > 0
            assert a["sglang.dp_rank"] == 0 and a["sglang.pp_rank"] == 0
            parent = steps[s.parent_span_id]
            assert parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns
            assert s.resource["sglang.version"] == run.version
            assert s.resource["service.name"] == "sglang"
        for s in dec:  # a decode row of the tiny model cannot cost more than its whole step
            assert s.attributes["sgl_probe.duration_ms"] <= steps[s.parent_span_id].attributes[
                "sgl_probe.duration_ms"] + 1e-6


def test_step_counts_equal_sglangs_own_counter(probed_run: Run):
    """SGLang counts forward passes by mode per scheduler (``cuda_graph_passes_total``); the probe
    must have one span for each, in every rank, warmup included."""
    import re

    counted = defaultdict(float)
    for line in probed_run.metrics.splitlines():
        m = re.match(r'sglang:cuda_graph_passes_total\{(.*)\} ([0-9.e+]+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            counted[(int(labels["tp_rank"]), labels["mode"])] += float(m.group(2))
    assert {r for r, _ in counted} == set(range(probed_run.tp)), probed_run.metrics[:2000]
    for (rank, mode), n in counted.items():
        name = "sglang.decode" if mode.startswith("decode") else "sglang.extend"
        graph = mode.endswith("cuda_graph")
        seen = [s for s in probed_run.spans if s.name == name and s.attributes["sglang.tp_rank"] == rank
                and s.attributes["sglang.cuda_graph"] is graph]
        assert len(seen) == n, (rank, mode)
    assert any(mode == "decode_none" and n > 0 for (_, mode), n in counted.items())


def test_ranks_share_trace_ids_per_step(probed_run: Run):
    if probed_run.tp < 2:
        pytest.skip("single rank")
    by_rank = defaultdict(set)
    for s in in_load(probed_run, "sglang.step"):
        by_rank[s.attributes["sglang.tp_rank"]].add((s.attributes["sglang.step_index"], s.trace_id))
    assert len(by_rank) == 2 and by_rank[0] == by_rank[1]


def test_env_snapshots_at_both_points_in_every_scheduler(probed_run: Run):
    snaps = [s for s in probed_run.spans if s.name == "sgl_probe.env_snapshot"]
    seen = Counter((s.resource["process.pid"], s.attributes["sgl_probe.snapshot_point"]) for s in snaps)
    pids = {pid for pid, _ in seen}
    assert len(pids) == probed_run.tp
    for pid in pids:
        assert seen[(pid, "process_start")] == 1 and seen[(pid, "nccl_init")] == 1
    for s in snaps:
        assert s.attributes["env.NCCL_PROTO"] == "LL"
        assert s.attributes["sglang.tp_rank"] in range(probed_run.tp)
    ranks = {s.attributes["sglang.tp_rank"] for s in snaps}
    assert ranks == set(range(probed_run.tp))
    nccl = [s for s in snaps if s.attributes["sgl_probe.snapshot_point"] == "nccl_init"]
    assert all(s.attributes["sgl_probe.dist_backend"] == "gloo" for s in nccl)
    # SGLang's launcher rewrites some variables before spawning; the diff names them.
    assert all("NCCL_PROTO" not in s.attributes["sgl_probe.env.differs_from_launcher"] for s in snaps)


def test_no_secret_in_any_exported_byte(probed_run: Run):
    blob = b"".join(probed_run.payloads)
    assert b"NCCL_PROTO" in blob
    files = b"".join(p.read_bytes() for p in probed_run.trace_dir.glob("*.jsonl"))
    assert b"NCCL_PROTO" in files
    for value in SECRETS.values():
        assert value.encode() not in blob and value.encode() not in files


def test_trace_dir_has_one_file_per_worker(probed_run: Run):
    files = sorted(probed_run.trace_dir.glob("sgl-probe-*.jsonl"))
    assert len(files) == probed_run.tp
    names = Counter()
    for f in files:
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    names.update(sp["name"] for sp in ss["spans"])
    otlp = Counter(s.name for s in probed_run.spans)
    assert names == otlp


def test_summary_line_in_server_log(probed_run: Run):
    lines = [l for l in probed_run.log.splitlines() if "sgl-probe summary" in l]
    assert lines, probed_run.log[-3000:]
    assert any("decode n=" in l and "p50=" in l and "graph=0%" in l for l in lines)


def test_generated_tokens_identical_without_probe(probed_run: Run, baseline_outputs):
    with_probe = [output_ids(r) for r in probed_run.responses]
    assert with_probe == baseline_outputs[probed_run.version]


def test_streamed_chunks_carry_the_count_the_gpu_benchmark_clocks_steps_by(baseline_outputs):
    """The GPU benchmark counts a window's decode steps from one streamed request's chunks
    (``device.stream_tokens``): each chunk's ``completion_tokens``, which the real server sends in
    every chunk and sums where it coalesces queued outputs. Every chunk carries it, it never goes
    back, and the last equals the tokens asked for."""
    device = gpu_device()
    for version, lines in baseline_outputs.streamed.items():
        data = [line for line in lines if not line.startswith(b"data: [DONE]")]
        counts = [device.chunk_tokens(line, 0) for line in data]  # 0: a chunk without the count
        assert data and 0 not in counts, (version, lines[:3])
        assert counts == sorted(counts) and counts[-1] == STREAM_TOKENS, (version, counts)


@pytest.mark.parametrize("version", list(CASES))
def test_doctor_resolves_every_target(sglang_venvs, version):
    venv = sglang_venvs[version]
    out = subprocess.run([str(venv / "bin" / "sgl-probe"), "doctor", "--json"], capture_output=True,
                         text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    data = json.loads(out.stdout)
    assert data["sglang_version"] == version
    phases = {r["phase"] for r in data["targets"]}
    assert {"decode", "extend", "draft", "verify", "draft_extend", "graph", "accept", "nccl_init",
            "launch", "step", "identity"} <= phases
    missing = [r for r in data["targets"] if not r["resolved"]]
    assert missing == [], missing
    assert out.returncode == 0


def test_unreachable_collector_and_bad_config_do_not_hurt_the_server(sglang_venvs, tiny_model,
                                                                     baseline_outputs, tmp_path):
    """A collector that is down and a bad SGL_PROBE_* value: same tokens, one clear log line each
    bad variable, and the server stops promptly (the exporter's shutdown is bounded)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{dead}", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
           "SGL_PROBE_SUMMARY_S": "often", "SGL_PROBE_TIMER": "gpu"}
    server = SGLangServer(sglang_venvs["0.5.9"], tiny_model, tp=1, extra_args=ARGS, env=env,
                          log_path=tmp_path / "server.log")
    with server:
        t0 = time.perf_counter()
        got = [output_ids(r) for r in send_load(server)]
        load_s = time.perf_counter() - t0
        time.sleep(2)
        t_stop = time.perf_counter()
    stop_s = time.perf_counter() - t_stop
    log = server.log_text()
    assert got == baseline_outputs["0.5.9"]
    for name, accepted in (("SGL_PROBE_SUMMARY_S", "seconds >= 0"), ("SGL_PROBE_TIMER", "auto, cuda, cpu")):
        lines = [l for l in log.splitlines() if f"ignoring {name}=" in l]
        assert lines and accepted in lines[0], log[-3000:]
    assert "disabled after an internal error" not in log and "activation failed" not in log
    assert load_s < 60 and stop_s < 30, (load_s, stop_s)


def test_report_reads_the_real_trace_dir(probed_run: Run):
    """``sgl-probe report`` on the files a real server wrote agrees with what arrived over OTLP."""
    import sys

    out = subprocess.run([sys.executable, "-m", "sgl_probe.cli", "report", str(probed_run.trace_dir), "--json",
                          "--by-rank"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    counts = Counter()
    for row in doc["phases"]:
        counts[row["phase"]] += row["count"] + row.get("warmup_calls", 0)  # warm-up: apart, not lost
    otlp = Counter(s.name[len("sglang."):] for s in probed_run.spans
                   if s.name.startswith("sglang.") and s.name != "sglang.step")
    assert counts == otlp
    assert not doc["problems"]


def decode_rows(log: str) -> int:
    """Decode steps counted by rank 0's summary lines."""
    import re

    return sum(int(m.group(1)) for line in log.splitlines() if "sgl-probe summary [tp_rank=0" in line
               for m in [re.search(r"decode n=(\d+)", line)] if m)


def test_summary_line_with_no_collector_at_all(sglang_venvs, tiny_model, tmp_path):
    """No OTEL endpoint, no trace dir: nothing is exported, yet the server log shows the split."""
    env = {"SGL_PROBE_SUMMARY_S": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": None,
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": None, "SGL_PROBE_TRACE_DIR": None}
    with SGLangServer(sglang_venvs["0.5.23"], tiny_model, tp=1, extra_args=ARGS, env=env,
                      log_path=tmp_path / "server.log") as server:
        responses = send_load(server)
        # at least one decode step per generated token after the first, for the sequential requests
        want = len(SEQUENTIAL) * (NEW_TOKENS - 1)
        log = server.wait_for_log(lambda text: decode_rows(text) >= want)
    lines = [l for l in log.splitlines() if "sgl-probe summary [tp_rank=0" in l]
    assert lines, log[-3000:]
    assert decode_rows(log) >= want
    assert all(r["meta_info"]["completion_tokens"] == NEW_TOKENS for r in responses)
