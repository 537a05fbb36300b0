"""The probe's real machinery (wrappers, recorder, span builder, exporters) driven in-process
through a target table of the test's own, against a real OTLP receiver on a socket."""

from __future__ import annotations

import logging
import time

import pytest

from sgl_probe import config, wire
from sgl_probe.activate import Probe
from sgl_probe.targets import Target
from sgl_probe.testing.receiver import OTLPReceiver
from tests import workload
from tests.workload import Batch, ForwardMode

M = "tests.workload"
TABLE = (
    Target("step", ("step",), M, "Scheduler.run_batch", "step"),
    Target("identity", ("identity",), M, "Scheduler.__init__", "identity"),
    Target("phase", ("decode", "extend"), M, "Worker.forward_batch_generation", "forward"),
    Target("graph", ("graph",), M, "GraphRunner.replay", "graph"),
)


@pytest.fixture
def receiver():
    with OTLPReceiver() as rcv:
        yield rcv


def make_probe(monkeypatch, env: dict, targets=TABLE) -> Probe:
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME", "SGL_PROBE_RUN_ID",
                "SGL_PROBE_LAUNCHER_ENV"):
        monkeypatch.delenv(key, raising=False)
    env = {"SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "0.05", "OTEL_BSP_SCHEDULE_DELAY": "50", **env}
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    probe = Probe(config.load(), targets=targets)
    probe.instrumentor.instrument()
    return probe


@pytest.fixture
def probe_factory(monkeypatch):
    made = []

    def factory(env: dict, targets=TABLE) -> Probe:
        probe = make_probe(monkeypatch, env, targets)
        made.append(probe)
        return probe

    yield factory
    for probe in made:
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()


def run_steps(sched: workload.Scheduler, n_decode: int = 3) -> None:
    sched.run_batch(Batch(ForwardMode.EXTEND, 2, extend_tokens=11))
    for _ in range(n_decode):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    sched.run_batch(Batch(ForwardMode.IDLE, 0))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_phase_spans_over_otlp(receiver, probe_factory, protocol):
    probe = probe_factory({**receiver.env(protocol), "NCCL_PROTO": "LL"})
    sched = workload.Scheduler(None, tp_rank=1, pp_rank=0, dp_rank=None)
    run_steps(sched)
    probe.pipeline.flush()
    spans = receiver.wait_for(lambda s: sum(x.name == "sglang.decode" for x in s) >= 3, timeout=10)
    steps = [s for s in spans if s.name == "sglang.step"]
    extend = [s for s in spans if s.name == "sglang.extend"]
    decode = [s for s in spans if s.name == "sglang.decode"]
    assert len(steps) == 4 and len(extend) == 1 and len(decode) == 3  # the idle step sends nothing
    by_id = {s.span_id: s for s in steps}
    for child in extend + decode:
        parent = by_id[child.parent_span_id]
        assert parent.trace_id == child.trace_id
        assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns
        a = child.attributes
        assert a["sgl_probe.timer"] == "cpu"
        assert a["sglang.tp_rank"] == 1 and a["sglang.dp_rank"] == 0 and a["sglang.pp_rank"] == 0
        assert a["sglang.batch_size"] == 2
        assert 1.5 < a["sgl_probe.duration_ms"] < 500  # the workload spins 2 ms
        assert abs(a["sgl_probe.duration_ms"] - child.duration_ms) < 0.01
        assert child.transport == ("grpc" if protocol == "grpc" else "http")
    assert extend[0].attributes["sglang.forward_mode"] == "EXTEND"
    assert extend[0].attributes["sglang.num_tokens"] == 11
    assert extend[0].attributes["sglang.cuda_graph"] is False
    assert all(d.attributes["sglang.cuda_graph"] is True for d in decode)
    assert all(d.attributes["sglang.num_tokens"] == 2 for d in decode)
    assert len({s.trace_id for s in steps}) == 4
    res = steps[0].resource
    assert res["service.name"] == "sglang" and res["sglang.tp_rank"] == 1
    env = [s for s in spans if s.name == "sgl_probe.env_snapshot"]
    assert [e.attributes["sgl_probe.snapshot_point"] for e in env] == ["process_start"]


def _one_rank(env: dict, tp_rank: int) -> None:
    """A scheduler process of its own (spawned): its own probe, the run's env, two steps."""
    import os

    os.environ.update(env)
    probe = Probe(config.load(), targets=TABLE)
    probe.instrumentor.instrument()
    run_steps(workload.Scheduler(None, tp_rank=tp_rank), n_decode=1)
    probe.pipeline.flush()
    probe.pipeline.shutdown()


def test_trace_ids_shared_across_processes_of_one_run(receiver):
    """Ranks of one server agree on the trace id of step N because it is derived, not random:
    two real processes of one run, one per rank, exporting to one receiver."""
    import multiprocessing

    from sgl_probe.spans import derived_trace_id

    run_id = "cross-process-run"
    env = {**receiver.env("grpc"), "SGL_PROBE_RUN_ID": run_id, "SGL_PROBE_SUMMARY_S": "0",
           "SGL_PROBE_DRAIN_S": "0.05", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_one_rank, args=(env, rank)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    spans = receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= 4, timeout=30)
    by_rank: dict = {}
    for s in spans:
        if s.name == "sglang.step":
            by_rank.setdefault(s.resource["sglang.tp_rank"], {})[s.attributes["sglang.step_index"]] = s
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0][1].resource["process.pid"] != by_rank[1][1].resource["process.pid"]
    assert sorted(by_rank[0]) == sorted(by_rank[1]) == [1, 2]
    for index in (1, 2):
        want = "%032x" % derived_trace_id(run_id, "dp0", "step", index)
        assert by_rank[0][index].trace_id == by_rank[1][index].trace_id == want


def test_wrapped_exception_propagates_and_marks_span(probe_factory, receiver):
    probe = probe_factory(receiver.env("grpc"))
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.fail_on = ForwardMode.DECODE
    with pytest.raises(RuntimeError, match="boom from the workload"):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    sched.run_batch(Batch(ForwardMode.EXTEND, 1, extend_tokens=3))  # still works afterwards
    probe.pipeline.flush()
    spans = receiver.wait_for(lambda s: any(x.name == "sglang.extend" for x in s), timeout=10)
    bad = [s for s in spans if s.name == "sglang.decode"][0]
    assert bad.status_code == 2 and "boom from the workload" in bad.status_message
    assert bad.events and bad.events[0]["name"] == "exception"
    step = [s for s in spans if s.span_id == bad.parent_span_id][0]
    assert step.status_code == 2


def test_probe_failure_disables_hook_not_sglang(probe_factory, receiver, monkeypatch, caplog):
    from sgl_probe import readers

    def broken(*a, **k):
        raise ZeroDivisionError("probe bug")

    monkeypatch.setitem(readers.ENTER, "forward", broken)
    probe = probe_factory(receiver.env("grpc"))
    sched = workload.Scheduler(None, tp_rank=0)
    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="sgl_probe"):
        results = [sched.run_batch(Batch(ForwardMode.DECODE, 1)) for _ in range(3)]
    assert all(r.can_run_cuda_graph is True for r in results)
    lines = [r for r in caplog.records if "disabled after an internal error" in r.getMessage()]
    assert len(lines) == 1 and "ZeroDivisionError" in lines[0].getMessage()
    hook = [h for h in probe.instrumentor.hooks if h.target.reader == "forward"][0]
    assert hook.enabled is False


def test_uninstrument_restores_originals(probe_factory):
    original = vars(workload.Worker)["forward_batch_generation"]
    probe = probe_factory({})
    assert vars(workload.Worker)["forward_batch_generation"] is not original
    probe.instrumentor.uninstrument()
    assert vars(workload.Worker)["forward_batch_generation"] is original


def test_never_wraps_twice(probe_factory):
    probe = probe_factory({})
    wrapped_once = vars(workload.Worker)["forward_batch_generation"]
    for t in TABLE:
        assert probe.instrumentor.apply(t, workload) is True
    assert vars(workload.Worker)["forward_batch_generation"] is wrapped_once
    assert len(probe.instrumentor.hooks) == len(TABLE)


def test_secrets_never_exported(probe_factory, receiver):
    probe = probe_factory({**receiver.env("http/protobuf"), "HF_TOKEN": "hf_SECRETVALUE123",
                           "MY_API_KEY": "sk-SECRETVALUE456", "NCCL_IB_PASSWORD": "pw-SECRETVALUE789",
                           "SGL_PROBE_ENV_ALLOW": "MY_API_KEY,HF_*", "NCCL_PROTO": "LL"})
    probe._start_env = dict(__import__("os").environ)
    sched = workload.Scheduler(None, tp_rank=0)
    run_steps(sched, n_decode=1)
    probe.pipeline.flush()
    spans = receiver.wait_for(lambda s: any(x.name == "sgl_probe.env_snapshot" for x in s), timeout=10)
    env = [s for s in spans if s.name == "sgl_probe.env_snapshot"][0].attributes
    assert env["env.NCCL_PROTO"] == "LL"
    assert set(env["sgl_probe.env.withheld"]) >= {"HF_TOKEN", "MY_API_KEY", "NCCL_IB_PASSWORD"}
    blob = b"".join(receiver.raw_payloads())
    assert b"NCCL_PROTO" in blob
    for secret in (b"SECRETVALUE123", b"SECRETVALUE456", b"SECRETVALUE789"):
        assert secret not in blob


def test_unreachable_endpoint_does_not_block_steps(probe_factory):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = probe_factory({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}",
                           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    t0 = time.perf_counter()
    for _ in range(300):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    per_step_ms = (time.perf_counter() - t0) / 300 * 1e3
    assert per_step_ms < 5, per_step_ms  # pure bookkeeping; an export stall would cost seconds
    t0 = time.perf_counter()
    probe.pipeline.shutdown(timeout_s=2.0)
    assert time.perf_counter() - t0 < 3.0


def test_trace_dir_writes_otlp_json_lines(probe_factory, tmp_path):
    import json
    import os

    probe = probe_factory({"SGL_PROBE_TRACE_DIR": str(tmp_path)})
    sched = workload.Scheduler(None, tp_rank=0)
    run_steps(sched, n_decode=2)
    probe.pipeline.flush()
    path = tmp_path / ("sgl-probe-%d.jsonl" % os.getpid())
    lines = path.read_text().splitlines()
    names, ids = [], []
    for line in lines:
        msg = json.loads(line)
        for rs in msg["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    names.append(sp["name"])
                    ids.append(sp["traceId"])
    assert names.count("sglang.decode") == 2 and names.count("sglang.extend") == 1
    assert all(len(i) == 32 and int(i, 16) for i in ids)


def test_forked_child_reinitialises_export(probe_factory, receiver):
    """Fork copies the recorder but not its threads: the child must export on its own."""
    import os

    probe = probe_factory(receiver.env("grpc"))
    sched = workload.Scheduler(None, tp_rank=0)
    run_steps(sched, n_decode=1)
    pid = os.fork()
    if pid == 0:  # child: new steps, exported by a fresh pipeline, then a hard exit
        code = 1
        try:
            run_steps(sched, n_decode=2)
            probe.pipeline.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    probe.pipeline.flush()
    spans = receiver.wait_for(lambda s: {x.resource["process.pid"] for x in s if x.name == "sglang.decode"}
                              == {os.getpid(), pid}, timeout=15)
    child = [s for s in spans if s.name == "sglang.decode" and s.resource["process.pid"] == pid]
    assert len(child) == 2


def test_full_export_queue_drops_are_counted(probe_factory, caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = probe_factory({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}",
                           "OTEL_BSP_MAX_QUEUE_SIZE": "8", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4",
                           "OTEL_BSP_SCHEDULE_DELAY": "60000", "SGL_PROBE_DRAIN_S": "60",
                           "SGL_PROBE_SUMMARY_S": "3600"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    for _ in range(50):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    deadline = time.monotonic() + 15  # the exporter process reports its counts every 0.5 s
    while probe.pipeline.drain() is not None and probe.pipeline.export_dropped == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probe.pipeline.export_dropped > 0
    line = probe.pipeline.summary.line(dropped=probe.pipeline.export_dropped)
    assert f"dropped={probe.pipeline.export_dropped}" in line
    # said once, in the server's log, with the settings that change it
    hints = [r.getMessage() for r in caplog.records if "on the summary line counts them" in r.getMessage()]
    assert len(hints) == 1 and hints[0].startswith("sgl-probe: spans not delivered over OTLP"), hints
    assert "OTEL_BSP_MAX_QUEUE_SIZE" in hints[0] and "SGL_PROBE_DRAIN_S=60 s" in hints[0]
    for _ in range(50):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    dropped = probe.pipeline.export_dropped
    deadline = time.monotonic() + 15
    while probe.pipeline.drain() is not None and probe.pipeline.export_dropped == dropped \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probe.pipeline.export_dropped > dropped
    assert sum("on the summary line counts them" in r.getMessage() for r in caplog.records) == 1


def test_steps_the_drain_has_no_room_for_are_said_once_naming_the_settings(probe_factory, caplog):
    """...and counted by cause on the metrics (the summary line's breakdown)."""
    import logging

    from prometheus_client import CollectorRegistry, generate_latest

    from sgl_probe import metrics
    from sgl_probe.metrics_prom import PrometheusSink

    probe = probe_factory({"SGL_PROBE_MAX_PENDING": "5", "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_SUMMARY_S": "3600"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    caplog.set_level(logging.INFO, logger="sgl_probe")

    def said() -> list:
        return [r.getMessage() for r in caplog.records if "on the summary line counts them" in r.getMessage()]

    for _ in range(5):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    probe.pipeline.drain()
    assert probe.recorder.dropped_steps == 0 and said() == []  # a full queue, nothing dropped yet
    for _ in range(12):  # five fit in the emptied queue
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    assert probe.recorder.dropped_steps == 7
    assert said() == []  # not on the scheduler's thread: the drain says it
    reg = CollectorRegistry()  # what a server's /metrics would carry (--enable-metrics)
    probe.pipeline.metrics = metrics.PhaseMetrics({"tp_rank": 0}, [PrometheusSink(registry=reg)], flush_s=0)
    probe.pipeline.drain()
    (line,) = said()
    assert line.startswith("sgl-probe: steps dropped: more than SGL_PROBE_MAX_PENDING=5 steps")
    assert "SGL_PROBE_DRAIN_S=3600 s" in line and "pending=" in line
    assert 'sgl_probe_dropped_total{cause="pending",dp_rank="",pp_rank="",tp_rank="0"} 7.0' \
        in generate_latest(reg).decode()
    for _ in range(10):
        sched.run_batch(Batch(ForwardMode.DECODE, 1))
    probe.pipeline.drain()
    assert probe.recorder.dropped_steps > 7 and len(said()) == 1


def test_each_launch_gets_a_fresh_run_id_and_launcher_env(probe_factory, monkeypatch):
    import json
    import os

    monkeypatch.setenv("NCCL_PROTO", "LL")
    probe = probe_factory({})
    first = probe.run_id
    probe.on_launch(None, None, (), {})
    second = os.environ["SGL_PROBE_RUN_ID"]
    assert second == probe.run_id != first
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    probe.on_launch(None, None, (), {})
    assert os.environ["SGL_PROBE_RUN_ID"] not in (first, second)
    assert json.loads(os.environ["SGL_PROBE_LAUNCHER_ENV"])["NCCL_PROTO"] == "Simple"


def test_a_given_run_id_is_kept_across_launches(probe_factory):
    import os

    probe = probe_factory({"SGL_PROBE_RUN_ID": "my-multi-node-run"})
    probe.on_launch(None, None, (), {})
    assert os.environ["SGL_PROBE_RUN_ID"] == probe.run_id == "my-multi-node-run"


def test_summary_without_any_exporter_matches_the_span_path(probe_factory, receiver, caplog, monkeypatch):
    """With no collector and no trace dir the drain thread builds no spans, only the summary; its
    numbers must be those of the span path."""
    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    lines = {}
    for label, env in (("spans", receiver.env("grpc")), ("summary_only", {})):
        probe = probe_factory({**env, "SGL_PROBE_SUMMARY_S": "3600"})
        sched = workload.Scheduler(None, tp_rank=0)
        sched.worker.work_s = 0.0
        sched.run_batch(Batch(ForwardMode.EXTEND, 2, extend_tokens=5))
        for _ in range(4):
            sched.run_batch(Batch(ForwardMode.DECODE, 2))
        probe.pipeline.drain()
        assert (probe.pipeline.sink is not None) == (label == "spans")
        line = probe.pipeline.summary.line()
        lines[label] = line.split("]: ", 1)[1]
        probe.instrumentor.uninstrument()
    counts = [p.split(" p50=")[0] for p in lines["summary_only"].split(" | ")]
    assert counts == ["decode n=4", "extend n=1"]
    assert [p.split(" p50=")[0] for p in lines["spans"].split(" | ")] == counts
    assert all("graph=100%" in p for p in lines["summary_only"].split(" | ") if p.startswith("decode"))


class _NotPlain:
    @staticmethod
    def run_batch(batch):
        return batch


def test_per_step_target_that_is_not_a_plain_method_is_left_alone(probe_factory, caplog):
    """Per-step roles are replaced by functions taking ``self``: anything else in that slot (here
    a staticmethod) is left as it is, said once in the log, and shown unresolved by doctor."""
    import sys

    from sgl_probe.instrument import check_targets

    odd = Target("step", ("step",), __name__, "_NotPlain.run_batch", "step")
    probe = probe_factory({}, targets=TABLE)
    before = vars(_NotPlain)["run_batch"]
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        assert probe.instrumentor.apply(odd, sys.modules[__name__]) is False
    assert vars(_NotPlain)["run_batch"] is before and _NotPlain.run_batch(3) == 3
    assert "not a plain method" in caplog.text
    (row,) = check_targets((odd,))
    assert row["resolved"] is False and "staticmethod" in row["error"]
    (ok,) = [r for r in check_targets(TABLE) if r["target"].endswith("Scheduler.run_batch")]
    assert ok["resolved"] is True and "error" not in ok


def test_sampled_out_steps_build_no_spans_but_count_in_the_summary(probe_factory, receiver, monkeypatch):
    """OTEL_TRACES_SAMPLER decides before any span is built; the steps it keeps are the ones the
    same sampler keeps for the derived trace id (so every rank keeps the same steps), and the
    summary line still counts every step."""
    from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

    from sgl_probe import spans as spans_mod

    probe = probe_factory({**receiver.env("grpc"), "OTEL_TRACES_SAMPLER": "traceidratio",
                           "OTEL_TRACES_SAMPLER_ARG": "0.5", "SGL_PROBE_SUMMARY_S": "3600"})
    sched = workload.Scheduler(None, tp_rank=0)
    built = []  # steps that leave this process (spans are built from them in the exporter process)
    sink = probe.pipeline.sink
    real_send = sink._send

    def send(data: bytes, spans: int) -> bool:  # rows or the packed pass: every STEPS message
        kind, payload = wire.decode(data)
        if kind == wire.STEPS:
            built.extend(st[0] for st in payload[0])  # rows: index first
        return real_send(data, spans)

    monkeypatch.setattr(sink, "_send", send)
    sched.worker.work_s = 0.0
    n = 40
    for _ in range(n):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    probe.pipeline.flush()
    ratio = TraceIdRatioBased(0.5)
    want = {i for i in range(1, n + 1)
            if ratio.should_sample(None, spans_mod.step_trace_id(probe.run_id, probe.ident, i), "x").decision
            == Decision.RECORD_AND_SAMPLE}
    assert 0 < len(want) < n
    receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= len(want), timeout=10)
    time.sleep(0.2)
    got = {s.attributes["sglang.step_index"] for s in receiver.spans() if s.name == "sglang.step"}
    assert got == want and sorted(built) == sorted(want)
    assert probe.pipeline.summary.line().split("]: ", 1)[1].startswith(f"decode n={n} ")
    assert probe.pipeline.sampling.sampled_out == n - len(want)


class _Refill:
    """A PackedSteps already finished, handed on as one (its message and spans)."""

    def __init__(self, data, spans):
        self.rows, self.spans, self._data = 1, spans, data

    def finish(self):
        return self._data


@pytest.mark.parametrize("packed", [True, False], ids=["packed_pass", "rows"])
def test_a_long_pass_sends_what_it_kept_before_each_hand_over_of_the_gil(probe_factory, receiver, monkeypatch, packed):
    """A pass over a backlog hands the GIL over between stretches, and every step arrives once.
    Rows (without the C extension, or with anything else reading them) leave before each
    hand-over, so no stretch pickles the whole pass (the last one used to). The packed pass,
    which wrote its steps as it took them, sends once, at the end of the pass: each send would
    hand the GIL to the scheduler thread again."""
    from sgl_probe import export

    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_SUMMARY_S": "3600", "SGL_PROBE_DRAIN_S": "3600"})
    monkeypatch.setattr(export, "YIELD_AFTER_NS", 0)  # hand over after every chunk that leaves steps behind
    monkeypatch.setattr(export, "CHUNK", 16)  # the pass's steps fit one packed message
    sched = workload.Scheduler(None, tp_rank=0)  # the pipeline starts with the scheduler
    sched.worker.work_s = 0.0
    events = []
    sink = probe.pipeline.sink
    if packed:
        if probe.pipeline._packed_type is None:
            pytest.skip("no C extension: no packed pass")
        real_packed = sink.send_packed

        def send_packed(pk):
            data = pk.finish()
            rows, _slow = probe.recorder.c.unpack_steps(data)
            events.append(("send", [st[0] for st in rows]))
            return real_packed(_Refill(data, len(rows) + sum(len(r[8]) for r in rows)))  # sent as it was

        monkeypatch.setattr(sink, "send_packed", send_packed)
        monkeypatch.setattr(sink, "send_steps", lambda steps, slow: events.append(("rows", len(steps))))
    else:
        probe.pipeline._packed_type = None
        real_send = sink.send_steps
        monkeypatch.setattr(sink, "send_steps",
                            lambda steps, slow: events.append(("send", [st[0] for st in steps])) or real_send(steps, slow))
    real_time = export.time

    class _Time:
        perf_counter_ns = staticmethod(real_time.perf_counter_ns)

        @staticmethod
        def sleep(s):
            events.append(("yield", s))
            real_time.sleep(s)

    monkeypatch.setattr(export, "time", _Time)
    n = 3 * export.CHUNK + 5
    for _ in range(n):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    assert probe.pipeline.drain() == n
    kinds = [e[0] for e in events]
    sent = [e[1] for e in events if e[0] == "send"]
    if packed:
        assert kinds == ["yield"] * 3 + ["send"]
        assert [len(b) for b in sent] == [n]
    else:
        assert kinds == ["send", "yield"] * 3 + ["send"]
        assert [len(b) for b in sent] == [export.CHUNK] * 3 + [5]
    assert [i for b in sent for i in b] == list(range(1, n + 1))
    receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= n, timeout=10)
    time.sleep(0.2)
    assert sorted(s.attributes["sglang.step_index"] for s in receiver.spans() if s.name == "sglang.step") == list(range(1, n + 1))


def test_the_packed_pass_sends_a_message_only_once_it_is_full(probe_factory, receiver, monkeypatch):
    """A pass larger than one message: the packed pass sends once the take found the message full
    (the rest of the chunk goes into the next), not every few steps, and at the pass's end; every
    message stays under the limit and every step arrives once."""
    from sgl_probe import export, wire

    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_SUMMARY_S": "3600", "SGL_PROBE_DRAIN_S": "3600"})
    sched = workload.Scheduler(None, tp_rank=0)  # the pipeline starts with the scheduler
    sched.worker.work_s = 0.0
    if probe.pipeline._packed_type is None:
        pytest.skip("no C extension: no packed pass")
    sink, sent = probe.pipeline.sink, []
    real_packed = sink.send_packed

    def send_packed(pk):
        due = export.packed_due(pk)
        data = pk.finish()
        rows, _slow = probe.recorder.c.unpack_steps(data)
        sent.append((due, len(data), [st[0] for st in rows]))
        return real_packed(_Refill(data, len(rows) + sum(len(r[8]) for r in rows)))

    monkeypatch.setattr(sink, "send_packed", send_packed)
    n = 800  # over two messages, under the exporter's span queue (2048)
    for _ in range(n):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    assert probe.pipeline.drain() == n
    per_step = sum(m[1] for m in sent) / n
    assert len(sent) >= 2 and all(m[1] <= wire.MAX_MESSAGE for m in sent)
    assert all(due for due, _, _ in sent[:-1])  # none sent before it had to be
    limit = export.packed_limit(sink)
    assert all(m[1] > limit for m in sent[:-1])
    assert len(sent) == -(-n * per_step // limit)
    assert [i for m in sent for i in m[2]] == list(range(1, n + 1))
    receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= n, timeout=10)


def test_a_packed_message_whose_reads_go_ahead_is_due_before_a_chunk_might_overflow_its_own_limit(monkeypatch):
    """Where the take reads a chunk's GPU times ahead, the message goes before the next chunk might
    not fit under its own limit (the link's, smaller than MAX_MESSAGE on a capped socket), not
    only once full; where the reads keep the GIL, only once full."""
    from types import SimpleNamespace

    from sgl_probe import export

    monkeypatch.setattr(export, "CHUNK", 100)
    pk = SimpleNamespace(full=False, nbytes=600, rows=6, max_bytes=10_000)  # 100 bytes a step
    assert export.packed_due(pk, True) and not export.packed_due(pk, False)
    pk.max_bytes = 10_600
    assert not export.packed_due(pk, True)
    pk.full = True
    assert export.packed_due(pk, True) and export.packed_due(pk, False)


def test_shutdown_waits_for_a_drain_pass_already_under_way(probe_factory, tmp_path):
    """A drain pass that began just before the stop would otherwise feed the summary line and
    the metrics after their final export (a live verdict gauge one window behind the log)."""
    import threading

    probe = probe_factory({"SGL_PROBE_DRAIN_S": "0.05", "SGL_PROBE_TRACE_DIR": str(tmp_path)})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    sched.run_batch(Batch(ForwardMode.DECODE, 2))
    pipe = probe.pipeline
    real, entered, seen = pipe.drain, threading.Event(), []

    def late_pass(final: bool = False):
        if threading.current_thread() is pipe._thread and not entered.is_set():
            entered.set()
            time.sleep(0.5)  # past the stop check, not yet at the lock
        return real(final)

    pipe.drain = late_pass
    assert entered.wait(5)
    real_shutdown = pipe.sink.shutdown
    pipe.sink.shutdown = lambda t: (seen.append(pipe._thread.is_alive()), real_shutdown(t))
    pipe.shutdown(3.0)
    assert seen == [False]


def test_a_second_shutdown_changes_nothing(probe_factory, tmp_path, caplog):
    """The atexit entry runs after an explicit shutdown: it must not drain again (a summary line
    and a metrics update after the metrics' final export: the OTLP verdict gauge behind the log)."""
    probe = probe_factory({"SGL_PROBE_DRAIN_S": "0.05", "SGL_PROBE_SUMMARY_S": "0.01",
                           "SGL_PROBE_TRACE_DIR": str(tmp_path)})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    sched.run_batch(Batch(ForwardMode.DECODE, 2))
    pipe = probe.pipeline
    pipe.shutdown(3.0)
    drains = []
    real = pipe.drain
    pipe.drain = lambda final=False: (drains.append(final), real(final))[1]
    time.sleep(0.05)  # past the summary interval: a second final drain would print a line
    with caplog.at_level("INFO", logger="sgl_probe"):
        pipe.shutdown(3.0)
    assert drains == [] and "sgl-probe summary" not in caplog.text
