"""One OTLP encoding per batch of spans, shared by every output, each output on a thread of its own.

The SDK's ``encode_spans`` is the largest cost of exporting a span (~35 µs per probe span on a CPU
where writing the trace file's JSON costs ~30 and sending the bytes over gRPC ~1). With OTLP and
a trace dir both on, one ``BatchSpanProcessor`` per output used to encode every span twice. Here
one processor batches the spans and :class:`SharedEncoding`, its exporter, encodes each batch once
and hands it to every :class:`Outlet` as an :class:`EncodedBatch`: the spans themselves (what any
``SpanExporter`` takes) with the encoded request beside them, which the probe's exporters use
instead of encoding again (:class:`sgl_probe.sinks.JsonLinesExporter`, the gRPC exporter of
:func:`sgl_probe.sinks.otlp_exporter`); another exporter just encodes the spans as usual.

Each outlet has its own queue and thread, so a collector that stalls holds back only its own spans:
the trace file keeps being written. Room is decided per output when spans are offered
(:meth:`Outlet.admit`), so each output drops and counts exactly what found no room in it; a batch
reaches an output that refused some of its spans as a fresh list of the rest (encoded again, only
then).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("sgl_probe")


class EncodedBatch(list):
    """A batch of spans with its OTLP ``ExportTraceServiceRequest`` (``request``), encoded once."""

    request: Any = None


def request_of(spans: Sequence[ReadableSpan]) -> Any:
    """The batch's shared encoding, or None when the spans came without one."""
    return getattr(spans, "request", None)


class Outlet:
    """One output: a bounded count of spans in flight (admitted, not yet exported or failed), a
    queue of batches and the thread that hands them to the output's exporter."""

    def __init__(self, name: str, exporter: SpanExporter, max_queue: int) -> None:
        self.name = name  # what the summary line's drop breakdown calls it
        self.exporter = exporter
        self.max_queue = max_queue
        self.admitted = 0
        self.full = 0    # refused at admission: no room
        self.failed = 0  # admitted, then the exporter failed (or raised)
        self.done = 0    # admitted and finished with, exported or failed
        self._refused: set[int] = set()  # id() of admitted-elsewhere spans this one refused
        self._queue: deque = deque()
        self._busy = False
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sgl-probe-out-" + name, daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        return self.full + self.failed

    def admit(self, spans: list) -> int:
        """How many of ``spans`` (a prefix) this output takes; the rest are counted as dropped."""
        with self._cv:
            room = self.max_queue - (self.admitted - self.done)
            take = len(spans) if room >= len(spans) else max(room, 0)
            self.admitted += take
            self.full += len(spans) - take
            return take

    def refuse(self, spans: Sequence[ReadableSpan]) -> None:
        """Spans another output admitted and this one did not: leave them out of its batches."""
        with self._cv:
            self._refused.update(map(id, spans))

    def put(self, batch: EncodedBatch) -> None:
        with self._cv:
            if self._refused:
                mine = [s for s in batch if id(s) not in self._refused]
                self._refused.difference_update(map(id, batch))
                if len(mine) < len(batch):
                    batch = EncodedBatch(mine)  # no shared request: the exporter encodes these
                if not batch:
                    return
            self._queue.append(batch)
            self._cv.notify_all()

    def fail(self, batch: Sequence[ReadableSpan]) -> None:
        """The batch could not be encoded: every span of it this output admitted is lost."""
        with self._cv:
            n = len(batch) - sum(1 for s in batch if id(s) in self._refused)
            self._refused.difference_update(map(id, batch))
            self.failed += n
            self.done += n
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = self._queue.popleft()
                self._busy = True
            try:
                ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception as exc:
                log.warning("sgl-probe: exporter %s failed: %r", type(self.exporter).__name__, exc)
                ok = False
            with self._cv:
                self._busy = False
                self.done += len(batch)
                if not ok:
                    self.failed += len(batch)
                self._cv.notify_all()

    def wait_idle(self, deadline: float) -> bool:
        """Until every batch handed here is exported, or ``deadline`` (``time.monotonic()``)."""
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(left)
            return True

    def close(self, deadline: float) -> None:
        """Export what is queued (until ``deadline``), then shut the exporter down."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        try:
            self.exporter.shutdown()
        except Exception as exc:
            log.warning("sgl-probe: exporter %s shutdown failed: %r", type(self.exporter).__name__, exc)


class SharedEncoding(SpanExporter):
    """The batch processor's exporter: encodes each batch once and hands it to every outlet."""

    def __init__(self, outlets: Sequence[Outlet]) -> None:
        self.outlets = outlets

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # Imported here: the server process imports this module (through sinks) but encodes
        # nothing unless it exports in-process.
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        batch = EncodedBatch(spans)
        try:
            batch.request = encode_spans(batch)
        except Exception as exc:
            log.warning("sgl-probe: cannot encode %d spans: %r; they are dropped and counted", len(batch), exc)
            for out in self.outlets:
                out.fail(batch)
            return SpanExportResult.FAILURE
        for out in self.outlets:
            out.put(batch)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass
