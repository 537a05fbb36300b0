"""Where resolved steps become spans and leave: OTLP and the trace dir, behind bounded queues.

A :class:`SpanSink` builds the spans of a resolved step (:mod:`sgl_probe.spans`) and hands them to
one SDK ``BatchSpanProcessor`` per exporter. It runs in the exporter process
(:mod:`sgl_probe.exporter_main`); in the server's own process only where a benchmark measures the
design before that process (``export.InProcessSink``).

Exporters follow the standard OpenTelemetry variables (``OTEL_EXPORTER_OTLP_*``,
``OTEL_SERVICE_NAME``, ``OTEL_BSP_*``). Drops are counted through public interfaces only: each
exporter is wrapped to count the spans it has finished with, and a span is handed to a processor
only while fewer than ``OTEL_BSP_MAX_QUEUE_SIZE`` are in flight there (so the SDK's own queue
never overflows silently); a span that finds no room, or whose export failed, is dropped and
counted. In the exporter process a span that finds no room first waits for it, while the
exporter keeps finishing batches (:data:`ROOM_WAIT_S`): a drain pass hands over a second of
spans at once, more than the queue holds on a fast server, and that burst is no reason to drop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping, Optional, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from sgl_probe import __version__, contract as C, spans as spans_mod
from sgl_probe.resolved import ResolvedStep

log = logging.getLogger("sgl_probe")

_PROTOCOLS = ("grpc", "http/protobuf")
_DEFAULT_QUEUE = 2048  # the SDK's default for OTEL_BSP_MAX_QUEUE_SIZE
#: In the exporter process, how long the spans of one message from the server (a drain pass
#: comes as messages of up to a few hundred steps) may wait for queue room in all: the server's
#: link buffers behind it meanwhile, and drops (counted) what does not fit there.
ROOM_WAIT_S = 2.0
#: An output that finishes no batch for this long is stalled (a collector gone, a file system
#: hung): the rest of the message is dropped for it, and the next messages do not wait on it until
#: it finishes a batch again, so one stalled output never holds the other back for long. An output
#: whose healthy batches take longer (a distant collector, large batches) gets twice its slowest
#: recent batch instead (:meth:`_Counted.stall_s`): slow is not stalled.
STALL_S = 0.5
#: How many of an output's latest successful batches its stall time is taken from.
_RECENT_BATCHES = 16


class JsonLinesExporter(SpanExporter):
    """One OTLP/JSON ``ExportTraceServiceRequest`` per line (ids as hex, as OTLP/JSON wants).

    A file system that is full or read-only costs one log line when writing starts to fail and
    one when it works again, not one per batch; a line that did not fit is cut off again, so the
    file never holds half a line.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._failing = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # Here, not at the top: the server process imports this module but writes no trace file
        # (the exporter process does), and needs no protobuf.
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        from sgl_probe import otlp_json

        data = (otlp_json.message_to_json(encode_spans(spans)) + "\n").encode("utf-8")
        with self._lock:
            try:
                self._append(data)
            except OSError as exc:
                if not self._failing:
                    self._failing = True
                    log.warning("sgl-probe: cannot write %s: %s; its spans are dropped and counted "
                                "(dropped= on the summary line) until it can be written again", self.path, exc)
                return SpanExportResult.FAILURE
            if self._failing:
                self._failing = False
                log.warning("sgl-probe: writing %s again", self.path)
        return SpanExportResult.SUCCESS

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)

    def shutdown(self) -> None:
        pass


def otlp_exporter(environ: Mapping[str, str] = os.environ) -> Optional[SpanExporter]:
    """The OTLP exporter the standard variables ask for, or None when none is configured."""
    if not otlp_configured(environ):
        return None
    raw = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
           or "grpc").strip().lower()
    if raw not in _PROTOCOLS:
        log.warning("sgl-probe: ignoring OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=%r: accepted values are %s; "
                    "using 'grpc'", raw, ", ".join(_PROTOCOLS))
        raw = "grpc"
    if raw == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def otlp_configured(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    wanted = environ.get("OTEL_TRACES_EXPORTER")
    if wanted is not None and "otlp" not in [w.strip() for w in wanted.split(",")]:
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def trace_file(trace_dir: str, pid: int) -> str:
    return os.path.join(trace_dir, "sgl-probe-%d.jsonl" % pid)


def make_resource(ident: dict, run_id: str, sglang_version: Optional[str], pid: Optional[int] = None) -> Resource:
    """``pid`` is the server process the spans describe (not the exporter process)."""
    attrs: dict[str, Any] = {
        "process.pid": os.getpid() if pid is None else pid,
        C.PROBE_VERSION: __version__,
        C.RUN_ID: run_id,
    }
    if sglang_version:
        attrs[C.SGLANG_VERSION] = sglang_version
    attrs.update(spans_mod.rank_attributes(ident))
    res = Resource.create(attrs)
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; otherwise the service is "sglang".
    if res.attributes.get("service.name", "").startswith("unknown_service"):
        res = res.merge(Resource({"service.name": C.DEFAULT_SERVICE_NAME}))
    return res


def _queue_size(environ: Mapping[str, str]) -> int:
    raw = environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "").strip()
    try:
        size = int(raw) if raw else _DEFAULT_QUEUE
    except ValueError:
        size = 0
    if size <= 0:
        log.warning("sgl-probe: ignoring OTEL_BSP_MAX_QUEUE_SIZE=%r: accepted values are integers > 0; "
                    "using %d", raw, _DEFAULT_QUEUE)
        size = _DEFAULT_QUEUE
    return size


class _Counted(SpanExporter):
    """Counts the spans its exporter has finished with (exported or failed), and tells
    ``progress`` each time."""

    def __init__(self, inner: SpanExporter, progress: threading.Condition) -> None:
        self.inner = inner
        self.progress = progress
        self.done = 0
        self.failed = 0
        self._recent_s: deque[float] = deque(maxlen=_RECENT_BATCHES)  # successful batches only
        # Written by the processor's thread only, read by the sink's: one attribute, not the deque.
        self.slowest_s = 0.0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        t0 = time.monotonic()
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            log.warning("sgl-probe: exporter %s failed: %r", type(self.inner).__name__, exc)
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        else:  # a failure's time (often the exporter's own timeout) says nothing of a healthy batch
            self._recent_s.append(time.monotonic() - t0)
            self.slowest_s = max(self._recent_s)
        with self.progress:
            self.done += len(spans)
            self.progress.notify_all()
        return result

    def stall_s(self) -> float:
        """How long this output may finish nothing before it counts as stalled."""
        return max(STALL_S, 2 * self.slowest_s)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _Bounded:
    """A BatchSpanProcessor that is handed a span only when its queue has room."""

    def __init__(self, name: str, exporter: SpanExporter, max_queue: int, delay_ms: Optional[int],
                 progress: threading.Condition) -> None:
        self.name = name  # what the summary line's drop breakdown calls it
        self.counted = _Counted(exporter, progress)
        self.max_queue = max_queue
        self.handed = 0
        self.full = 0
        # Given up on while waiting for room: its finished count then. Waited on again once it
        # finishes a batch more.
        self.stalled_at: Optional[int] = None
        self.processor = BatchSpanProcessor(self.counted, max_queue_size=max_queue, schedule_delay_millis=delay_ms)

    def hand(self, spans: list) -> list:
        """Hands the processor what fits in its queue; returns the rest."""
        room = self.max_queue - (self.handed - self.counted.done)
        rest: list = []
        if room < len(spans):
            room = max(room, 0)
            spans, rest = spans[:room], spans[room:]
        self.handed += len(spans)
        on_end = self.processor.on_end
        for span in spans:
            on_end(span)
        return rest

    @property
    def dropped(self) -> int:
        return self.full + self.counted.failed


class SpanSink:
    """Builds spans and exports them; ``dropped`` counts every span that did not make it."""

    def __init__(self, trace_dir: Optional[str], pid: int, environ: Mapping[str, str] = os.environ,
                 delay_ms: Optional[int] = None, room_wait_s: float = 0.0,
                 still_wanted: Optional[Callable[[], bool]] = None) -> None:
        """``delay_ms``: the batch delay when ``OTEL_BSP_SCHEDULE_DELAY`` does not set one (the
        SDK's default otherwise). ``room_wait_s``: how long :meth:`offer` may wait for queue room
        (0: never; the server's own process, where the drain thread must not wait), and only while
        ``still_wanted()`` (the exporter process: while its server runs) says so."""
        self.outputs: list[_Bounded] = []
        self.exported = 0
        self.room_wait_s = room_wait_s
        self._still_wanted = still_wanted
        self._progress = threading.Condition()
        queue = _queue_size(environ)
        if (environ.get("OTEL_BSP_SCHEDULE_DELAY") or "").strip():
            delay_ms = None
        exporters: list[tuple[str, SpanExporter]] = []
        try:
            exporter = otlp_exporter(environ)
            if exporter is not None:
                exporters.append(("otlp", exporter))
        except Exception as exc:
            log.warning("sgl-probe: cannot set up the OTLP exporter: %r; no spans over OTLP", exc)
        if trace_dir:
            try:
                os.makedirs(trace_dir, exist_ok=True)
                exporters.append(("trace_dir", JsonLinesExporter(trace_file(trace_dir, pid))))
            except OSError as exc:
                log.warning("sgl-probe: %s=%r is not usable (%s); no trace files", C.ENV_TRACE_DIR, trace_dir, exc)
        for name, exporter in exporters:
            try:
                self.outputs.append(_Bounded(name, exporter, queue, delay_ms, self._progress))
            except ValueError as exc:  # e.g. OTEL_BSP_MAX_EXPORT_BATCH_SIZE above the queue size
                log.warning("sgl-probe: OTEL_BSP_* settings rejected (%s); using the SDK defaults", exc)
                self.outputs.append(_Bounded(name, exporter, _DEFAULT_QUEUE, delay_ms, self._progress))

    def steps(self, steps: Sequence[ResolvedStep], run_id: str, ident: dict, spec: dict, resource: Any,
              kept_slow: Sequence[bool] = ()) -> None:
        spans: list = []
        build = spans_mod.build_step_spans
        for i, step in enumerate(steps):
            extra = _KEPT_SLOW if i < len(kept_slow) and kept_slow[i] else None
            spans += build(step, run_id, ident, spec, resource, extra)
        self.offer(spans)

    def offer(self, spans: list) -> None:
        self.exported += len(spans)
        waiting = []
        for out in self.outputs:
            rest = out.hand(spans)
            if rest:
                waiting.append((out, rest))
        if waiting and self.room_wait_s > 0:
            waiting = self._wait_for_room(waiting)
        for out, rest in waiting:
            out.full += len(rest)

    def _wait_for_room(self, waiting: list) -> list:
        """Hands each output the rest of its spans as its exporter makes room, until
        ``room_wait_s`` has passed or the output stalls; returns ``(output, spans still left)``."""
        progress = self._progress
        now = time.monotonic()
        deadline = now + self.room_wait_s
        given_up = []
        # [output, spans left, its finished count when last seen, since when, its stall time]
        entries = []
        for out, rest in waiting:
            if out.stalled_at == out.counted.done:
                given_up.append((out, rest))  # no batch finished since it stalled: no wait
            else:
                out.stalled_at = None
                entries.append([out, rest, out.counted.done, now, out.counted.stall_s()])
        wanted = self._still_wanted
        while entries and now < deadline and (wanted is None or wanted()):
            with progress:  # _Counted changes ``done`` under it: no wake-up is missed
                if all(e[0].counted.done == e[2] for e in entries):
                    progress.wait(min(deadline - now, min(e[4] for e in entries)))
            now = time.monotonic()
            still = []
            for e in entries:
                out, done = e[0], e[0].counted.done
                if done != e[2]:
                    e[2], e[3], e[4] = done, now, out.counted.stall_s()
                    e[1] = out.hand(e[1])
                    if e[1]:
                        still.append(e)
                elif now - e[3] >= e[4]:
                    out.stalled_at = done
                    given_up.append((out, e[1]))
                else:
                    still.append(e)
            entries = still
        return given_up + [(e[0], e[1]) for e in entries]

    @property
    def dropped(self) -> int:
        """Summed over the outputs: a span neither of two outputs delivered counts twice."""
        return sum(out.dropped for out in self.outputs)

    @property
    def dropped_by(self) -> dict[str, int]:
        """Per output (``otlp``, ``trace_dir``): with two outputs, which one is losing spans."""
        return {out.name: out.dropped for out in self.outputs}

    @property
    def settled(self) -> int:
        """Spans every output has finished with (exported, failed or refused)."""
        if not self.outputs:
            return self.exported
        return min(out.counted.done + out.full for out in self.outputs)

    def flush(self, timeout_s: float) -> None:
        for out in self.outputs:
            out.processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        for out in self.outputs:
            out.processor.shutdown()


_KEPT_SLOW = {C.KEPT: C.KEPT_SLOW}
