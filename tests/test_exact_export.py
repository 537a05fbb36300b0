"""Exact drop counts of the export queue: a collector that stalls costs exactly the spans that
found no room, counted once, and never a blocked caller. The SDK's own batch processor and queue
run for real; the collector is a stand-in exporter the test can stall and fail at will."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from sgl_probe import sinks, spans
from sgl_probe.summary import Summary

RES = Resource.create({"service.name": "sglang"})


class StalledCollector(SpanExporter):
    """Blocks every export until released; answers ``result`` afterwards."""

    def __init__(self, result=SpanExportResult.SUCCESS) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: list = []
        self.result = result

    def export(self, batch):
        self.entered.set()
        self.release.wait(30)
        self.got.extend(batch)
        return self.result

    def shutdown(self) -> None:
        self.release.set()


class SlowCollector(SpanExporter):
    """Healthy but slow: each batch takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.got: list = []

    def export(self, batch):
        time.sleep(self.seconds)
        self.got.extend(batch)
        return SpanExportResult.SUCCESS


def make_sink(monkeypatch, collector, queue: int = 8, trace_dir=None, room_wait_s: float = 0.0, still_wanted=None):
    monkeypatch.setattr(sinks, "otlp_exporter", lambda environ=None: collector)
    env = {"OTEL_BSP_MAX_QUEUE_SIZE": str(queue), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return sinks.SpanSink(trace_dir, 1, delay_ms=20, room_wait_s=room_wait_s, still_wanted=still_wanted)


def batch(n: int, tag: str) -> list:
    return [spans.build_env_span({"i": i}, i, "run", {}, RES, name=f"{tag}{i}") for i in range(n)]


def test_a_stalled_collector_drops_exactly_what_found_no_room(monkeypatch):
    collector = StalledCollector()
    sink = make_sink(monkeypatch, collector)
    try:
        sink.offer(batch(20, "a"))  # 8 fit in the queue, 12 do not
        assert sink.dropped == 12 and sink.exported == 20
        assert collector.entered.wait(10)  # the processor took its first batch and is stuck in it
        sink.offer(batch(3, "b"))  # still 8 in flight: no room at all
        assert sink.dropped == 15
        collector.release.set()
        sink.flush(10)
        assert sorted(s.name for s in collector.got) == sorted(f"a{i}" for i in range(8))
        assert sink.dropped == 15 and sink.settled == 23
        sink.offer(batch(5, "c"))  # room again: all five go through
        sink.flush(10)
        assert sink.dropped == 15 and len(collector.got) == 13
    finally:
        collector.release.set()
        sink.shutdown()


def test_a_failing_collector_counts_each_span_once(monkeypatch):
    collector = StalledCollector(SpanExportResult.FAILURE)
    collector.release.set()
    sink = make_sink(monkeypatch, collector, queue=64)
    try:
        sink.offer(batch(10, "f"))
        sink.flush(10)
        assert sink.dropped == 10 and len(collector.got) == 10 and sink.settled == 10
    finally:
        sink.shutdown()


def test_each_output_counts_its_own_drops(monkeypatch, tmp_path):
    """A stalled collector next to a healthy trace dir: the breakdown blames the collector only,
    and each output's count is exactly what it did not deliver."""
    collector = StalledCollector()
    sink = make_sink(monkeypatch, collector, trace_dir=str(tmp_path))
    trace_out = next(out for out in sink.outputs if out.name == "trace_dir")
    try:
        sink.offer(batch(6, "a"))  # both outputs take all six
        assert collector.entered.wait(10)
        deadline = time.monotonic() + 10
        while trace_out.counted.done < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        sink.offer(batch(6, "b"))  # the collector still holds six of its eight: four find no room
        assert sink.dropped_by == {"otlp": 4, "trace_dir": 0}
        collector.release.set()
        sink.flush(10)
        written = (tmp_path / "sgl-probe-1.jsonl").read_text().count('"spanId"')
        assert sink.dropped_by == {"otlp": 4, "trace_dir": 0} and sink.dropped == 4
        assert written == 12 and len(collector.got) == 12 - 4
        # exactly the spans it admitted: all of the first batch, the first two of the second
        assert sorted(s.name for s in collector.got) == sorted([f"a{i}" for i in range(6)] + ["b0", "b1"])
    finally:
        collector.release.set()
        sink.shutdown()


def test_a_pass_larger_than_the_queue_waits_for_room_while_the_collector_keeps_up(monkeypatch):
    """The exporter process's sink: a pass of 60 spans into a queue of 8, a collector taking 10 ms
    a batch of 4. Nothing is dropped: the rest of the pass is handed over as batches finish. The
    server's own sink (no wait) drops what did not fit, as before."""
    collector = SlowCollector(0.01)
    sink = make_sink(monkeypatch, collector, room_wait_s=5.0)
    try:
        t0 = time.monotonic()
        sink.offer(batch(60, "a"))
        waited = time.monotonic() - t0
        sink.flush(10)
        assert sink.dropped == 0 and sink.settled == 60
        assert [s.name for s in collector.got] == [f"a{i}" for i in range(60)]  # in order, each once
        assert 0.05 < waited < 4.0, waited  # it waited for batches, not for the whole allowance
    finally:
        sink.shutdown()
    server_side = make_sink(monkeypatch, SlowCollector(0.01))
    try:
        server_side.offer(batch(60, "b"))
        assert server_side.dropped == 52
    finally:
        server_side.shutdown()


def test_once_the_server_is_gone_nothing_waits_for_room(monkeypatch):
    """The exporter process whose server has exited exports what it has without waiting: the
    part of a pass that found no room is dropped at once (it must not outlive the server)."""
    collector = SlowCollector(0.2)  # waiting for the whole pass would take ~2.6 s
    server_up = [True]
    sink = make_sink(monkeypatch, collector, room_wait_s=30.0, still_wanted=lambda: server_up[0])
    try:
        server_up[0] = False
        spans_a = batch(60, "a")
        t0 = time.monotonic()
        sink.offer(spans_a)
        assert time.monotonic() - t0 < 1.0 and sink.dropped == 52
        server_up[0] = True
        sink.offer(batch(30, "b"))  # waited for again
        sink.flush(10)
        assert sink.dropped == 52 and len(collector.got) == 8 + 30
    finally:
        sink.shutdown()


def test_a_stalled_collector_costs_one_short_wait_then_none(monkeypatch):
    """A collector that finishes no batch: the pass waits STALL_S for it, then the rest is dropped
    and counted; later passes do not wait on it at all until it finishes a batch again."""
    monkeypatch.setattr(sinks, "STALL_S", 0.3)
    collector = StalledCollector()
    sink = make_sink(monkeypatch, collector, room_wait_s=30.0)
    try:
        t0 = time.monotonic()
        sink.offer(batch(20, "a"))  # 8 fit; the processor takes 4 into a batch that never ends
        first = time.monotonic() - t0
        assert sink.dropped == 12 and 0.25 < first < 5.0, (sink.dropped, first)
        t0 = time.monotonic()
        sink.offer(batch(5, "b"))
        assert sink.dropped == 17 and time.monotonic() - t0 < 0.2
        collector.release.set()
        sink.flush(10)
        sink.offer(batch(30, "c"))  # it finished batches since: waited on again, nothing dropped
        sink.flush(10)
        assert sink.dropped == 17 and len(collector.got) == 8 + 30
    finally:
        collector.release.set()
        sink.shutdown()


def test_a_collector_slower_than_the_stall_time_is_not_taken_for_stalled(monkeypatch):
    """Healthy batches that take longer than STALL_S (a distant collector): once the output has
    finished batches, it may take twice its slowest recent one before it counts as stalled, so a
    pass larger than the queue still arrives whole. With no batch seen yet, STALL_S applies."""
    monkeypatch.setattr(sinks, "STALL_S", 0.1)
    collector = SlowCollector(0.25)
    sink = make_sink(monkeypatch, collector, room_wait_s=10.0)
    out = sink.outputs[0]
    try:
        assert out.counted.stall_s() == 0.1
        sink.offer(batch(4, "w"))
        sink.flush(10)
        assert 0.5 <= out.counted.stall_s() < 2.0
        sink.offer(batch(24, "a"))  # 8 fit; 16 more wait through four 0.25 s batches
        sink.flush(10)
        assert sink.dropped == 0 and len(collector.got) == 28
    finally:
        sink.shutdown()
    # the same collector, first seen by the pass itself: its first batch outlasts STALL_S
    cold = make_sink(monkeypatch, SlowCollector(0.25), room_wait_s=10.0)
    try:
        cold.offer(batch(24, "b"))
        assert cold.dropped > 0
    finally:
        cold.shutdown()


def test_a_failed_batch_does_not_lengthen_the_stall_time(monkeypatch):
    """A batch that failed (an exporter's own timeout, typically) tells nothing of a healthy one."""
    monkeypatch.setattr(sinks, "STALL_S", 0.1)

    class SlowFailing(SlowCollector):
        def export(self, batch):
            super().export(batch)
            return SpanExportResult.FAILURE

    sink = make_sink(monkeypatch, SlowFailing(0.3), room_wait_s=10.0)
    try:
        sink.offer(batch(4, "f"))
        sink.flush(10)
        assert sink.dropped == 4 and sink.outputs[0].counted.stall_s() == 0.1
    finally:
        sink.shutdown()


def test_a_stalled_collector_does_not_hold_back_the_trace_dir(monkeypatch, tmp_path):
    """Two outputs, one stalled: the trace dir still gets every span of a pass larger than its
    queue, and the pass costs the stall's wait, not the whole allowance."""
    monkeypatch.setattr(sinks, "STALL_S", 0.3)
    collector = StalledCollector()
    sink = make_sink(monkeypatch, collector, trace_dir=str(tmp_path), room_wait_s=30.0)
    try:
        t0 = time.monotonic()
        sink.offer(batch(40, "a"))
        assert time.monotonic() - t0 < 5.0
        # (no flush: the stalled collector would hold it) the trace file gets the whole pass
        trace_out = next(out for out in sink.outputs if out.name == "trace_dir")
        deadline = time.monotonic() + 10
        while trace_out.counted.done < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        written = (tmp_path / "sgl-probe-1.jsonl").read_text().count('"spanId"')
        assert written == 40 and sink.dropped_by == {"otlp": 32, "trace_dir": 0}
    finally:
        collector.release.set()
        sink.shutdown()


@pytest.mark.parametrize("dropped,by,tail", [
    (0, {"pending": 0, "otlp": 0}, ""),
    (15, None, " | dropped=15"),
    (15, {"pending": 0, "link": 3, "otlp": 12, "trace_dir": 0}, " | dropped=15 (link=3 otlp=12)"),
])
def test_the_summary_line_names_the_exact_count(dropped, by, tail):
    from sgl_probe.resolved import ResolvedPhase

    s = Summary(1.0, {"tp_rank": 0})
    s.add((ResolvedPhase("decode", 0, 2_000_000, True, "DECODE", 1, 1, 0.1, "t"),))
    line = s.line(dropped=dropped, by=by)
    assert line.endswith("graph=100%" + tail)


def _pipeline_with_steps(n: int):
    import logging

    from sgl_probe import config
    from sgl_probe.export import Pipeline
    from sgl_probe.readers import Facts
    from sgl_probe.recorder import PhaseRecord, Recorder, StepRecord

    rec = Recorder("cpu", 100_000, logging.getLogger("sgl_probe"))
    rec.ensure_timer()
    for i in range(n):
        st = StepRecord(i, Facts("step", "DECODE", 1, 1), 1_000 * i)
        ph = PhaseRecord(Facts("decode", "DECODE", 1, 1), "t", 1_000 * i, 1_000 * i)
        ph.t_end = ph.host1 = st.host1 = 1_000 * i + 500
        st.phases.append(ph)
        rec.steps.append(st)
    cfg = config.load({"SGL_PROBE_TIMER": "cpu", "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_METRICS": "off"})
    return Pipeline(rec, cfg, "run", {"tp_rank": 0}, None)


@pytest.mark.parametrize("tick_ns, sleeps", [(600_000, 9), (1_000, 0)])
def test_the_drain_hands_the_gil_over_after_its_time_budget_not_per_chunk(monkeypatch, tick_ns, sleeps):
    """160 steps are 10 chunks: with 0.6 ms between the clock's readings every chunk with steps
    left after it ends in a hand-over (9); with 1 µs the whole pass stays under the 0.5 ms budget
    (none). Every step is resolved either way."""
    import types

    from sgl_probe import export

    clock = [0]
    slept: list = []

    def now() -> int:
        clock[0] += tick_ns
        return clock[0]

    monkeypatch.setattr(export, "time", types.SimpleNamespace(perf_counter_ns=now, sleep=slept.append))
    pipe = _pipeline_with_steps(10 * export.CHUNK)
    assert pipe.drain() == 10 * export.CHUNK and not pipe.recorder.steps
    assert len(slept) == sleeps and all(s == export.YIELD_S for s in slept)


def test_each_drain_pass_but_the_final_one_has_the_timer_replenish_once():
    """The CUDA timer's anchor events are made on the drain thread (CudaTimer.replenish): once a
    pass, whatever it resolved; not at shutdown's final drain."""
    pipe = _pipeline_with_steps(3 * 16 + 5)
    calls: list = []
    pipe.recorder.timer.replenish = lambda: calls.append(len(pipe.recorder.steps))
    assert pipe.drain() == 53 and calls == [0]
    assert pipe.drain() == 0 and calls == [0, 0]
    pipe.drain(final=True)
    assert calls == [0, 0]
