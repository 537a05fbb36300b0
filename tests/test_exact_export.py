"""Exact drop counts of the export queue: a collector that stalls costs exactly the spans that
found no room, counted once, and never a blocked caller. The SDK's own batch processor and queue
run for real; the collector is a stand-in exporter the test can stall and fail at will."""

from __future__ import annotations

import threading

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


def make_sink(monkeypatch, collector, queue: int = 8):
    monkeypatch.setattr(sinks, "otlp_exporter", lambda environ=None: collector)
    env = {"OTEL_BSP_MAX_QUEUE_SIZE": str(queue), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return sinks.SpanSink(None, 1)


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


@pytest.mark.parametrize("dropped,tail", [(0, ""), (15, " | dropped=15")])
def test_the_summary_line_names_the_exact_count(dropped, tail):
    from sgl_probe.resolved import ResolvedPhase

    s = Summary(1.0, {"tp_rank": 0})
    s.add((ResolvedPhase("decode", 0, 2_000_000, True, "DECODE", 1, 1, 0.1, "t"),))
    line = s.line(dropped=dropped)
    assert line.endswith("graph=100%" + tail)
