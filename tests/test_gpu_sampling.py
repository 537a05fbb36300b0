"""SGL_PROBE_GPU_EVERY_MS: the CUDA timer times a share of the steps on the GPU; the other steps
keep host times and carry the timer kind "host", which no GPU-time statistic may take in (the
summary window, the phase histograms, the report's phase statistics), while step counts and
accept lengths still count them."""

from __future__ import annotations

import logging
import time

import pytest

from sgl_probe import config, contract, metrics
from sgl_probe.recorder import Recorder
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.model import Resource, Span
from sgl_probe.resolved import ResolvedPhase, ResolvedStep
from sgl_probe.summary import Summary
from tests.test_export_process import _wait
from tests.test_probe_inprocess import probe_factory, receiver  # noqa: F401  (fixtures)

VAR = "SGL_PROBE_GPU_EVERY_MS"
MS = 1_000_000


# --- config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("env,want", [({}, 40.0), ({VAR: "0"}, 0.0), ({VAR: "2.5"}, 2.5)])
def test_gpu_every_ms_accepted_values(env, want):
    cfg = config.load(env)
    assert cfg.gpu_every_ms == want and cfg.problems == ()


@pytest.mark.parametrize("value", ["-1", "abc"])
def test_gpu_every_ms_bad_value_gives_one_line_and_the_default(value, caplog):
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        logging.getLogger("sgl_probe").propagate = True
        cfg = config.load({VAR: value})
    assert cfg.gpu_every_ms == 40.0
    assert len(cfg.problems) == 1
    line = cfg.problems[0]
    assert VAR in line and repr(value) in line and "milliseconds >= 0" in line, line
    assert cfg == config.Config()
    assert [r.getMessage() for r in caplog.records if VAR in r.getMessage()] == [line]


def test_recorder_hands_the_interval_to_the_timer_in_ns():
    assert Recorder("cpu", 10, logging.getLogger("x"), "python", 1.0, 2.5)._gpu_every_ns == 2_500_000
    assert Recorder("cpu", 10, logging.getLogger("x"), "python", 1.0, 0.0)._gpu_every_ns == 0


# --- resolved rows: the summary and the metrics ----------------------------------------------

def phase(name, ms, mode="DECODE", accept=None, graph=True):
    return ResolvedPhase(name, 1_000, 1_000 + int(ms * MS), graph, mode, 4, 4, 0.05, "target", accept)


def spec_step(index, timer, draft_ms, verify_ms, accept):
    phases = (phase("draft", draft_ms, "DRAFT_EXTEND"), phase("verify", verify_ms, "TARGET_VERIFY", accept))
    return ResolvedStep(index, 1_000, 1_000 + max(p.end_ns for p in phases), "TARGET_VERIFY", 4, 4, 0.1,
                        timer, phases)


# GPU times near 1-3 ms; host times far off (500+ ms) so that one leaking in shows in every statistic.
CUDA_ROWS = [spec_step(0, "cuda", 1.0, 3.0, 2.0), spec_step(2, "cuda", 1.5, 2.5, 3.0)]
HOST_ROWS = [spec_step(1, "host", 500.0, 900.0, 4.0), spec_step(3, "host", 700.0, 800.0, 1.0)]
MIXED = [CUDA_ROWS[0], HOST_ROWS[0], CUDA_ROWS[1], HOST_ROWS[1]]


def test_summary_window_holds_only_the_gpu_timed_phases():
    s = Summary(30, {"tp_rank": 0})  # fast=None: the Python path
    s.add_rows(MIXED)
    got = {ph: pytest.approx(cols[0]) for ph, cols in s._window.items()}
    assert got == {"draft": [1.0, 1.5], "verify": [3.0, 2.5]}
    assert s._accept == [2.0, 3.0]  # the summary's accept lengths come from its window


def test_summary_of_only_host_rows_is_empty():
    s = Summary(30, {"tp_rank": 0})
    s.add_rows(HOST_ROWS)
    assert s._window == {}


def test_metrics_count_host_steps_and_accepts_but_not_their_phases():
    m = metrics.PhaseMetrics(ident={"tp_rank": 0}, sinks=[], flush_s=3600)  # fast=None
    m.observe_rows(MIXED)
    assert not m.failed
    snap = m.snapshot()
    assert {labels["forward_mode"]: n for labels, n in snap.steps} == {"TARGET_VERIFY": 4}
    phases = {h.labels["phase"]: h for h in snap.phases}
    assert {name: h.count for name, h in phases.items()} == {"draft": 2, "verify": 2}
    # Sums and maxima in seconds: a host phase's 500+ ms would show here.
    assert phases["verify"].sum == pytest.approx(0.0055) and phases["verify"].max == pytest.approx(0.003)
    assert phases["draft"].sum == pytest.approx(0.0025)
    assert snap.accept_length.count == 4 and snap.accept_length.sum == pytest.approx(10.0)


# --- the report's aggregation ----------------------------------------------------------------

RES = Resource({"sgl_probe.run_id": "run", "service.name": "sglang", "sglang.tp_rank": 0})


def span(name, idx, ms, timer, accept=None, graph_ms=None):
    attrs = {contract.DURATION_MS: float(ms), contract.CUDA_GRAPH: True, contract.BATCH_SIZE: 4,
             contract.STEP_INDEX: idx, contract.TIMER: timer, "sglang.tp_rank": 0, "sglang.num_tokens": 4,
             "sglang.forward_mode": "TARGET_VERIFY" if name == "verify" else "DECODE"}
    if accept is not None:
        attrs[contract.ACCEPT_LENGTH] = accept
    if graph_ms is not None:
        attrs[contract.GRAPH_MS] = graph_ms
    t = 1_700_000_000_000_000_000 + idx * 1000 * MS
    return Span("sglang." + name, "t%d" % idx, "%s%d" % (name, idx), "s%d" % idx, t, t + round(ms * MS), attrs, RES)


def cuda_spans():
    return [s for i, ms in enumerate((4.0, 5.0, 4.5)) for s in
            (span("decode", i, ms, "cuda", graph_ms=ms - 0.5), span("verify", i, ms * 2, "cuda", accept=2.0))]


def host_spans():
    # Step indices of their own, as sampling leaves them: the same shapes, durations 100x off.
    return [s for i, ms in ((10, 400.0), (11, 900.0)) for s in
            (span("decode", i, ms, "host", graph_ms=ms - 300.0), span("verify", i, ms * 2, "host", accept=5.0))]


def aggregate(spans):
    agg = Aggregator()
    for s in spans:
        agg.add(s)
    return agg


def phase_stats(agg):
    return ({k: (list(ms), list(idx)) for k, (ms, idx) in agg.shapes.items()},
            # by_step pads with NaN (no call), which never equals itself: compare the set steps
            {k: {i: v for i, v in enumerate(arr) if v == v} for k, arr in agg.by_step.items()},
            {k: (list(a), list(b)) for k, (a, b) in agg.graph_launch.items()})


def test_report_keeps_host_phases_out_of_phase_statistics():
    only_cuda = aggregate(cuda_spans())
    mixed = aggregate(cuda_spans() + host_spans())
    assert mixed.shapes and phase_stats(mixed) == phase_stats(only_cuda)
    assert mixed.n_phase_spans == 10
    assert mixed.timers == {"cuda": 6, "host": 4}
    # The host verifies' accept lengths (5.0 each) still count.
    assert only_cuda.accept == {mixed_bucket(only_cuda): [3, 6.0]}
    assert mixed.accept == {mixed_bucket(only_cuda): [5, 16.0]}
    # and the finished statistics (steady groups) match too
    only_cuda.finish(), mixed.finish()
    assert {k: list(v) for k, v in mixed.groups.items()} == {k: list(v) for k, v in only_cuda.groups.items()}


def mixed_bucket(agg):
    (b,) = agg.accept
    return b


def test_every_rank_times_the_same_steps():
    """The timed steps are chosen by step index (a power-of-two stride from the steps' period),
    not by each process's clock: ranks whose steps take a little longer or started a little later
    time the same steps, and a rank whose stride came out twice as large times a subset of them
    (the report compares ranks step by step)."""
    from sgl_probe.timing import CudaTimer
    from tests.test_gpu_free_parts import _FakeTorch

    def timed(period_ns, offset_ns):
        timer = CudaTimer(_FakeTorch(), None, every_ns=10_000_000)
        timer.relax_capture_mode = False
        t, out = 10**12 + offset_ns, set()
        for index in range(400):
            token = timer.start(t, index)
            timer.release(token, timer.stop(token, t + 100_000))
            if index >= 20 and type(token) is not int:  # (after the period has settled)
                out.add(index)
            t += period_ns
        return out

    a, b, c = timed(1_600_000, 0), timed(1_700_000, 700_000), timed(1_200_000, 300_000)
    assert a == b == {i for i in range(20, 400) if i % 16 < 4}
    assert c == {i for i in range(20, 400) if i % 32 < 4}


def test_a_run_of_timed_steps_chains_on_its_own_ends():
    """The GPU times runs of consecutive steps: the first step of a run records a start event,
    the run's others start from the step before's end event, so one-phase steps at k = 4 (1.6 ms
    steps, 10 ms) record 5 events every 16 steps where one step timed in four recorded 8."""
    from sgl_probe.timing import CudaTimer
    from tests.test_gpu_free_parts import _FakeTorch

    ft = _FakeTorch()
    timer = CudaTimer(ft, None, every_ns=10_000_000)
    timer.relax_capture_mode = False
    t, leads, timed = 10**12, 0, 0
    for index in range(48):
        if index == 16:
            del ft.records[:]  # (once the period has settled: k is 4 from the second step on)
            leads = timed = 0
        token = timer.start(t, index)
        if type(token) is not int:
            timed += 1
            leads += len(token) > 2 and token[2] is not None
        timer.release(token, timer.stop(token, t + 100_000))
        t += 1_600_000
    assert timer.gpu_stride == 4 and (timed, leads) == (8, 2)
    assert len(ft.records) == 10  # 5 / 16 a step


@pytest.mark.parametrize("period_ns, every_ns, stride, records", [
    (5_100_000, 10_000_000, 1, 64),   # longer than half the setting: every step timed
    (5_000_000, 10_000_000, 2, 40),   # two steps fit: runs of four in eight, 5 records a run
    (2_000_000, 10_000_000, 4, 20),   # the default up to h100-32 on the tiny server: 5 every 16 steps
    (2_000_000, 40_000_000, 16, 5),   # the default since (and ``selfsparse``): 5 every 64 steps
    (2_600_000, 10_000_000, 2, 40),   # h100-32's ~2.6 ms steps: every other step at 10 ms,
    (2_600_000, 40_000_000, 8, 10),   # one in eight at 40 ms
    (12_000_000, 40_000_000, 2, 40),  # a 12 ms decode step (Kimi-K2.5's): half of them at 40 ms
    (20_100_000, 40_000_000, 1, 64),  # longer than half of 40 ms: every step
])
def test_the_stride_and_the_records_follow_the_setting(period_ns, every_ns, stride, records):
    """What README and docs/gpu.md say of ``SGL_PROBE_GPU_EVERY_MS``: steps longer than half of it
    are all timed; shorter ones in runs of four, one run every 4k steps, each run one start event
    plus one end per step (one-phase steps, 64 of them once the period has settled; the clock
    anchor's event every 100 ms comes on top)."""
    from sgl_probe.timing import CudaTimer
    from tests.test_gpu_free_parts import _FakeTorch

    timer = CudaTimer(_FakeTorch(), None, every_ns=every_ns)
    timer.relax_capture_mode = False
    t, got = 10**12, 0
    for index in range(128):
        token = timer.start(t, index)
        if index >= 64 and type(token) is not int:  # (the period settled long before)
            got += 1 + (len(token) > 2 and token[2] is not None)  # its end, and a run's start event
        timer.release(token, timer.stop(token, t + 100_000))
        t += period_ns
    assert timer.gpu_stride == stride and got == records


def test_the_readme_states_the_default_the_config_has():
    """README's configuration row for ``SGL_PROBE_GPU_EVERY_MS`` gives the default and the step
    length above which every step is timed (half of it): both as the code has them, so that a
    change of the default cannot leave the table behind."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{VAR}` |"))
    default, half = re.fullmatch(r"\| `\w+` \| `([\d.]+)` \|.*?Steps longer than half of it \(([\d.]+) ms\).*",
                                 row).groups()
    want = config.Config().gpu_every_ms
    assert float(default) == want and float(half) == want / 2


def test_a_probe_with_a_sampled_cuda_timer_exports_every_step_and_says_the_share(probe_factory, receiver, caplog,
                                                                                   monkeypatch):
    """End to end, the probe's pipeline over a stand-in GPU (``_FakeTorch``: events complete at
    once): 2-5 ms steps with 40 ms give one timed step in 8 or 16 (this machine's own speed
    decides), by index; every step reaches the collector, the others as ``sgl_probe.timer=host``,
    and the summary line says the share."""
    import re

    from sgl_probe.timing import CudaTimer
    from tests import workload
    from tests.test_gpu_free_parts import _FakeTorch
    from tests.workload import Batch, ForwardMode

    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    probe = probe_factory({**receiver.env("grpc"), "SGL_PROBE_SUMMARY_S": "0.3"})
    ft = _FakeTorch()
    ft.gpu_ms = 1e12  # every event done as soon as it is recorded
    timer = CudaTimer(ft, probe.recorder.c, every_ns=40 * MS)
    timer.relax_capture_mode = False
    probe.recorder.timer = timer
    sched = workload.Scheduler(None, tp_rank=0)
    sched.worker.work_s = 0.002
    with caplog.at_level(logging.INFO, logger="sgl_probe"):
        for _ in range(120):
            sched.run_batch(Batch(ForwardMode.DECODE, 2))
        probe.pipeline.flush(30.0)
        spans = receiver.wait_for(lambda s: sum(x.name == "sglang.decode" for x in s) >= 120, timeout=30)
        time.sleep(0.4)
        sched.run_batch(Batch(ForwardMode.DECODE, 2))  # something in the window, for the line
        assert _wait(lambda: any("gpu_timed=1/" in r.getMessage() for r in caplog.records), 5)
    said = {int(m) for r in caplog.records for m in re.findall(r"gpu_timed=1/(\d+)", r.getMessage())}
    decode = [s for s in spans if s.name == "sglang.decode"]
    timed = sorted(s.attributes["sglang.step_index"] for s in decode if s.attributes[contract.TIMER] == "cuda")
    host = [s for s in decode if s.attributes[contract.TIMER] == "host"]
    assert len(decode) == 120 and len(timed) + len(host) == 120
    assert said and said <= {4, 8, 16, 32} and timer.gpu_stride in (2, 4, 8, 16, 32)
    assert 120 // 32 <= len(timed) <= 120 // 4 + 3 and all(i % 16 < 4 for i in timed[3:])  # (the period settles)
    assert all(contract.START not in s.attributes for s in host)
