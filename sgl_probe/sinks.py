"""Where resolved steps become spans and leave: OTLP and the trace dir, behind bounded queues.

A :class:`SpanSink` builds the spans of a resolved step (:mod:`sgl_probe.spans`) and hands them to
one SDK ``BatchSpanProcessor``, whose batches are encoded once and written by every output
(:mod:`sgl_probe.outlets`). It runs in the exporter process (:mod:`sgl_probe.exporter_main`), or
in the server's process when that one cannot be started.

Exporters follow the standard OpenTelemetry variables (``OTEL_EXPORTER_OTLP_*``,
``OTEL_SERVICE_NAME``, ``OTEL_BSP_*``). Drops are counted through public interfaces only: each
output counts the spans its exporter has finished with, and takes a span only while fewer than
``OTEL_BSP_MAX_QUEUE_SIZE`` of its spans are in flight (so the SDK's own queue never overflows
silently); a span that finds no room, or whose export failed, is dropped and counted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from sgl_probe import __version__, contract as C, spans as spans_mod
from sgl_probe.outlets import Outlet, SharedEncoding, request_of
from sgl_probe.resolved import ResolvedStep

log = logging.getLogger("sgl_probe")

_PROTOCOLS = ("grpc", "http/protobuf")
_DEFAULT_QUEUE = 2048  # the SDK's default for OTEL_BSP_MAX_QUEUE_SIZE
_DEFAULT_BATCH = 512  # and for OTEL_BSP_MAX_EXPORT_BATCH_SIZE


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

        request = request_of(spans)
        msg = otlp_json.message_to_dict(request if request is not None else encode_spans(spans))
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8")
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
        return _shared_encoding_grpc()()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


_grpc_class: Optional[type] = None


def _shared_encoding_grpc() -> type:
    """The SDK's gRPC span exporter, sending a batch's shared encoding (:mod:`sgl_probe.outlets`)
    when it has one. ``_translate_data`` is that exporter's own step from spans to the request it
    sends (every release since 1.20 has it and calls it once per attempt); spans without an encoding go
    through it unchanged. The HTTP exporter has no such step and encodes the spans itself."""
    global _grpc_class
    if _grpc_class is None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        class SharedEncodingOTLPSpanExporter(OTLPSpanExporter):
            def _translate_data(self, data: Any) -> Any:
                request = request_of(data)
                return request if request is not None else super()._translate_data(data)

        _grpc_class = SharedEncodingOTLPSpanExporter
    return _grpc_class


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
    return HashedOnce(res.attributes, res.schema_url)


class HashedOnce(Resource):
    """A resource whose hash is computed once. The SDK's encoder groups spans by resource, hashing
    each span's, and ``Resource.__hash__`` writes all its attributes as JSON every time (~8 µs per
    span on a CPU where the rest of the encoding costs ~30); a resource never changes."""

    def __init__(self, attributes: Any, schema_url: Optional[str] = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


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


class SpanSink:
    """Builds spans and exports them; ``dropped`` counts every span that did not make it.

    One ``BatchSpanProcessor`` batches the spans for every output and encodes each batch once
    (:mod:`sgl_probe.outlets`); each output takes a span only while fewer than
    ``OTEL_BSP_MAX_QUEUE_SIZE`` of its spans are in flight, so the processor's own queue (as large)
    never overflows silently."""

    def __init__(self, trace_dir: Optional[str], pid: int, environ: Mapping[str, str] = os.environ,
                 delay_ms: Optional[int] = None) -> None:
        """``delay_ms``: the batch delay when ``OTEL_BSP_SCHEDULE_DELAY`` does not set one (the
        SDK's default otherwise)."""
        self.outputs: list[Outlet] = []
        self.exported = 0
        self._lock = threading.Lock()
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
        self.processor: Optional[BatchSpanProcessor] = None
        if not exporters:
            return
        outlets: list[Outlet] = []  # filled once the processor has accepted the OTEL_BSP_* settings
        encoding = SharedEncoding(outlets)
        try:
            self.processor = BatchSpanProcessor(encoding, max_queue_size=queue, schedule_delay_millis=delay_ms)
        except ValueError as exc:  # e.g. OTEL_BSP_MAX_EXPORT_BATCH_SIZE above the queue size
            log.warning("sgl-probe: OTEL_BSP_* settings rejected (%s); using the SDK defaults", exc)
            queue = _DEFAULT_QUEUE
            self.processor = BatchSpanProcessor(encoding, max_queue_size=queue, schedule_delay_millis=delay_ms,
                                                max_export_batch_size=_DEFAULT_BATCH)
        outlets += [Outlet(name, exporter, queue) for name, exporter in exporters]
        self.outputs = outlets

    def steps(self, steps: Sequence[ResolvedStep], run_id: str, ident: dict, spec: dict, resource: Any,
              kept_slow: Sequence[bool] = ()) -> None:
        spans: list = []
        build = spans_mod.build_step_spans
        for i, step in enumerate(steps):
            extra = _KEPT_SLOW if i < len(kept_slow) and kept_slow[i] else None
            spans += build(step, run_id, ident, spec, resource, extra)
        self.offer(spans)

    def offer(self, spans: list) -> None:
        with self._lock:  # admission and hand-over in one order for every output
            self.exported += len(spans)
            if self.processor is None:
                return
            takes = [out.admit(spans) for out in self.outputs]
            most = max(takes)
            for out, take in zip(self.outputs, takes):
                if take < most:
                    out.refuse(spans[take:most])
            on_end = self.processor.on_end
            for span in spans[:most]:
                on_end(span)

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
        return min(out.done + out.full for out in self.outputs)

    def flush(self, timeout_s: float) -> None:
        if self.processor is None:
            return
        deadline = time.monotonic() + timeout_s
        self.processor.force_flush(int(timeout_s * 1000))
        for out in self.outputs:
            out.wait_idle(deadline)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        if self.processor is None:
            return
        deadline = time.monotonic() + timeout_s
        self.processor.shutdown()
        for out in self.outputs:
            out.close(deadline)


_KEPT_SLOW = {C.KEPT: C.KEPT_SLOW}
