"""The exporter process: a real ``python -m sgl_probe.exporter_main`` per server process, fed over
its socket, exporting to a real OTLP receiver or a trace dir; killed, orphaned and sampled."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import workload
from tests.test_probe_inprocess import probe_factory, receiver  # noqa: F401  (fixtures)
from tests.workload import Batch, ForwardMode

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie with no thread left (who reaps it is up to its new
    parent). A zombie leader whose other threads are still exiting is not gone yet."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") and int(fields[17]) <= 1


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[16])


def _wait(cond, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def _fingerprint_sent() -> None:
    """The run fingerprint is sent once, from a thread of its own: wait for it."""
    import threading

    for t in threading.enumerate():
        if t.name == "sgl-probe-fingerprint":
            t.join(60)


def _decode(sched, n: int) -> None:
    for _ in range(n):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))


def test_exporter_killed_mid_run_is_counted_and_replaced(probe_factory, receiver, caplog, monkeypatch):  # noqa: F811
    """SIGKILL the exporter while spans wait in its queue: the server's steps go on untouched,
    the spans it had not exported count as dropped, one log line says so, and a new exporter
    takes the next steps. Past the restart budget, one more line and everything is counted."""
    from sgl_probe import exporter_process

    monkeypatch.setattr(exporter_process, "MAX_RESTARTS", 1)
    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    # Spans sit in the exporter's queue for a minute (no idle flush either): a kill loses them,
    # deterministically.
    probe = probe_factory({**receiver.env("grpc"), "OTEL_BSP_SCHEDULE_DELAY": "60000",
                           "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_IDLE_FLUSH_S": "3600"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    pipe = probe.pipeline
    sink = pipe.sink
    _fingerprint_sent()
    _decode(sched, 5)
    pipe.drain()
    assert _wait(lambda: (pipe.drain() is not None and sink.stats[0] == sink.sent), 30), (sink.stats, sink.sent)
    first = sink.proc.pid
    sent_to_first = sink.sent
    assert sink.stats[1] == 0  # nothing exported yet: all of it is in the exporter's queue
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: sink.proc.poll() is not None, 10)
        t0 = time.perf_counter()
        _decode(sched, 5)  # the scheduler never notices
        assert time.perf_counter() - t0 < 2.0
        pipe.drain()  # notices the death, opens a new link; the steps go to the next exporter
        assert sink.deaths == 1 and pipe.export_dropped == sent_to_first, (sink.deaths, pipe.export_dropped, sent_to_first)
        pipe.flush(60.0)
        assert sink.proc is not None and sink.proc.pid != first
        steps = receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= 5, timeout=30)
        assert sorted(s.attributes["sglang.step_index"] for s in steps if s.name == "sglang.step") \
            == list(range(6, 11))
        lines = [r.getMessage() for r in caplog.records if "exporter process" in r.getMessage()]
        assert len(lines) == 1 and "(1/1)" in lines[0], lines

        os.kill(sink.proc.pid, signal.SIGKILL)  # past the budget: given up
        assert _wait(lambda: sink.proc.poll() is not None, 10)
        pipe.drain()
        before = pipe.export_dropped
        _decode(sched, 3)
        pipe.drain()
        assert sink.given_up and pipe.export_dropped == before + 3 * 2
        lines = [r.getMessage() for r in caplog.records if "exporter process" in r.getMessage()]
        assert len(lines) == 2 and "no more spans" in lines[1], lines


#: A server process with the probe armed from its environment, decoding on the workload's
#: scheduler (``.format(root=...)``; a script goes on from ``sched``).
_SERVER_PREAMBLE = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from sgl_probe import config
    from sgl_probe.activate import Probe
    from tests.test_probe_inprocess import TABLE
    from tests import workload
    from tests.workload import Batch, ForwardMode

    probe = Probe(config.load(), targets=TABLE)
    probe.instrumentor.instrument()
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
""")

_ORPHAN_SCRIPT = _SERVER_PREAMBLE + textwrap.dedent("""
    for _ in range(7):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    sink = probe.pipeline.sink
    probe.pipeline.drain()
    print(sink.proc.pid, flush=True)
    # Wait until the exporter has every step, queued (it exports once a minute).
    while sink.stats[0] < sink.sent or sink.stats[0] < 14:
        time.sleep(0.1)
        sink.poll()
    print("received", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_exporter_outlives_its_server_process(tmp_path, sig):
    """Kill the server process (SIGKILL: no atexit, nothing): its exporter notices the closed
    link, writes what it still had queued to the trace dir, and exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGL_PROBE"))}
    env.update({"SGL_PROBE_TRACE_DIR": str(tmp_path), "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "3600",
                "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    server = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT.format(root=str(ROOT))], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        exporter = int(server.stdout.readline())
        assert server.stdout.readline().strip() == "received"
        assert not _gone(exporter)
        # Background work: it yields the CPU to the server's processes on a busy host.
        assert _nice(exporter) == min(19, _nice(server.pid) + 10)
        server.send_signal(sig)
        server.wait(30)
        assert _wait(lambda: _gone(exporter), 15), "exporter %d outlived its server" % exporter
    finally:
        if server.poll() is None:
            server.kill()
    names = []
    for line in (tmp_path / ("sgl-probe-%d.jsonl" % server.pid)).read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                names += [sp["name"] for sp in ss["spans"]]
    assert names.count("sglang.decode") == 7 and names.count("sglang.step") == 7


def test_sampled_run_keeps_the_slow_steps(probe_factory, receiver, caplog, monkeypatch):  # noqa: F811
    """A sampler that keeps nothing still exports the steps slower than the running p99 of their
    mode, marked ``sgl_probe.kept=slow`` and counted on the summary line."""
    from sgl_probe import contract

    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    probe = probe_factory({**receiver.env("grpc"), "OTEL_TRACES_SAMPLER": "always_off",
                           "SGL_PROBE_SUMMARY_S": "0.5"})
    sched = workload.Scheduler(None, tp_rank=0)
    slow = {150, 250, 350}  # under 1 % of the steps: each is in the tail when it comes
    for i in range(1, 401):
        sched.worker.work_s = 0.2 if i in slow else 0.0002
        sched.run_batch(Batch(ForwardMode.DECODE, 2))
    # With the C extension the drain decides in its packed pass (sgl_probe._hot.StepSampler).
    assert (probe.pipeline._packed_type is not None) == (probe.recorder.c is not None)
    probe.pipeline.flush(60.0)
    sampling = probe.pipeline.sampling
    receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= sampling.kept_slow, timeout=30)
    steps = {s.attributes["sglang.step_index"]: s for s in receiver.spans() if s.name == "sglang.step"}
    assert slow <= set(steps)
    assert len(steps) == sampling.kept_slow < 40  # the tail, not the run
    assert sampling.kept_slow + sampling.sampled_out == 400
    assert all(s.attributes[contract.KEPT] == contract.KEPT_SLOW for s in steps.values())
    assert {s.attributes["sglang.step_index"] for s in receiver.spans() if s.name == "sglang.decode"} == set(steps)
    time.sleep(0.6)
    with caplog.at_level(logging.INFO, logger="sgl_probe"):
        sched.run_batch(Batch(ForwardMode.DECODE, 2))  # something in the window, for the line
        assert _wait(lambda: any(f"kept_slow={sampling.kept_slow}" in r.getMessage() for r in caplog.records), 5)


def test_a_stalled_exporter_costs_counted_drops_never_a_wait(probe_factory, receiver, monkeypatch, caplog):  # noqa: F811
    """Stop the exporter (SIGSTOP): the link and then the bounded backlog fill, later steps are
    dropped and counted, and no drain waits; the server's log says so once. Once it runs again,
    everything kept arrives."""
    from sgl_probe import exporter_process, wire

    monkeypatch.setattr(wire, "_BUFFER", 16 << 10)  # whatever this machine's socket limits are
    monkeypatch.setattr(exporter_process, "MAX_BACKLOG_BYTES", 32 << 10)
    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_DRAIN_S": "3600", "OTEL_BSP_MAX_QUEUE_SIZE": "50000"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    pipe, sink = probe.pipeline, probe.pipeline.sink
    _fingerprint_sent()
    _decode(sched, 1)
    pipe.flush(60.0)  # the exporter is up
    pid = sink.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        slowest = 0.0
        for _ in range(10):
            _decode(sched, 300)
            t0 = time.perf_counter()
            pipe.drain()
            slowest = max(slowest, time.perf_counter() - t0)
        assert sink.backlogged and sink.link_dropped > 0 and slowest < 1.0, (sink.link_dropped, slowest)
    finally:
        os.kill(pid, signal.SIGCONT)
    pipe.flush(60.0)
    assert not sink.backlogged
    lost_steps = sink.link_dropped // 2
    assert pipe.export_dropped == sink.link_dropped
    # the summary line's breakdown blames the link (the exporter was stopped), not the collector
    assert {k: n for k, n in pipe.dropped_by().items() if n} == {"link": sink.link_dropped}
    hints = [r.getMessage() for r in caplog.records if "on the summary line counts them" in r.getMessage()]
    assert hints == [exporter_process.BEHIND % 0], hints  # (this test's backlog: 32 KiB)
    steps = receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= 3001 - lost_steps, timeout=60)
    assert sum(x.name == "sglang.step" for x in steps) == 3001 - lost_steps


@pytest.mark.parametrize("packed", [True, False], ids=["packed_pass", "rows"])
def test_a_link_whose_socket_takes_less_than_a_full_message_still_carries_every_step(probe_factory, receiver,
                                                                                   monkeypatch, packed):
    """A host that caps the link's send buffer below what the probe asks for (net.core.wmem_max):
    the messages, packed by the drain's packed pass or pickled as rows, stay under what that socket
    takes in one piece, so none is refused as too large (each would be dropped, counted); every
    step arrives."""
    from sgl_probe import wire

    monkeypatch.setattr(wire, "_BUFFER", 12 << 10)
    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_DRAIN_S": "3600", "OTEL_BSP_MAX_QUEUE_SIZE": "50000"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    pipe, sink = probe.pipeline, probe.pipeline.sink
    if packed and pipe._packed_type is None:
        pytest.skip("no C extension: no packed pass")
    if not packed:
        pipe._packed_type = None
    assert sink.max_message < wire.MAX_MESSAGE
    _decode(sched, 1200)
    pipe.flush(60.0)
    assert sink.link_dropped == 0 and pipe.export_dropped == 0
    steps = receiver.wait_for(lambda s: sum(x.name == "sglang.step" for x in s) >= 1200, timeout=60)
    assert sum(x.name == "sglang.step" for x in steps) == 1200


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is Python 3.11+")
def test_the_exporter_imports_the_probe_that_started_it_not_one_in_the_working_directory(tmp_path):
    """A server launched from a folder holding another ``sgl_probe`` (a checkout of another
    version, say): ``python -m`` would import that one in the exporter process."""
    other = tmp_path / "cwd" / "sgl_probe"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise ImportError('the sgl_probe of the working directory')\n")
    trace = tmp_path / "traces"
    script = (_SERVER_PREAMBLE + textwrap.dedent("""
        for _ in range(5):
            sched.run_batch(Batch(ForwardMode.DECODE, 2))
        print(probe.pipeline.sink is not None and probe.pipeline.sink.flush(30.0), flush=True)
    """)).format(root=str(ROOT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGL_PROBE", "PYTHONSAFEPATH"))}
    env.update({"SGL_PROBE_TRACE_DIR": str(trace), "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "0.05"})
    done = subprocess.run([sys.executable, "-c", script], cwd=other.parent, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True", done.stderr[-2000:]
    decode = [sp for f in trace.glob("*.jsonl") for line in f.read_text().splitlines()
              for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]
              if sp["name"] == "sglang.decode"]
    assert len(decode) == 5


def test_the_exporter_exports_where_the_probe_was_configured_to(probe_factory, receiver, monkeypatch):  # noqa: F811
    """The exporter process starts lazily, at the first drain; by then the process's environment
    may have changed (a library, a benchmark restoring its env). It exports with the OTLP settings
    the probe loaded its configuration with."""
    probe = probe_factory(receiver.env("grpc"))
    probe.ensure_pipeline()
    assert probe.pipeline.sink.proc is None  # not started yet
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
    sched = workload.Scheduler(None, tp_rank=0)
    _decode(sched, 3)
    probe.pipeline.flush(30.0)
    spans = receiver.wait_for(lambda s: sum(x.name == "sglang.decode" for x in s) >= 3, timeout=30)
    assert sum(x.name == "sglang.decode" for x in spans) == 3


def test_a_pass_larger_than_the_exporters_queue_arrives_whole(probe_factory, receiver):  # noqa: F811
    """One drain pass of 600 steps (1,200 spans) into an exporter process whose span queue holds
    64: the exporter process waits for room as its batches finish (the server never waits), and
    every span arrives, none dropped. Before, all but the queue's 64 of each pass were dropped."""
    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_DRAIN_S": "3600", "OTEL_BSP_MAX_QUEUE_SIZE": "64",
                           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "32"})
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.0
    pipe = probe.pipeline
    _fingerprint_sent()
    _decode(sched, 600)
    pipe.drain()
    pipe.flush(60.0)
    assert pipe.export_dropped == 0 and not any(pipe.dropped_by().values()), pipe.dropped_by()
    spans = receiver.wait_for(lambda s: sum(x.name == "sglang.decode" for x in s) >= 600, timeout=60)
    assert sum(x.name == "sglang.step" for x in spans) == 600
    assert sum(x.name == "sglang.decode" for x in spans) == 600
