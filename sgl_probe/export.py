"""Off the hot path: resolve finished records, build spans, hand them to exporters, log a summary.

Exporters follow the standard OpenTelemetry variables (``OTEL_EXPORTER_OTLP_*``,
``OTEL_TRACES_SAMPLER*``, ``OTEL_SERVICE_NAME``, ``OTEL_BSP_*``). With no endpoint configured
nothing goes over the network. ``SGL_PROBE_TRACE_DIR`` adds one OTLP-JSON-lines file per process.
Every exporter sits behind the SDK's bounded BatchSpanProcessor, so a slow or unreachable
collector costs dropped spans, never a blocked scheduler step.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from typing import Any, Optional, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision

from sgl_probe import __version__, spans as spans_mod
from sgl_probe.resolved import ResolvedPhase
from sgl_probe.summary import Summary

log = logging.getLogger("sgl_probe")

_PROTOCOLS = ("grpc", "http/protobuf")


class JsonLinesExporter(SpanExporter):
    """One OTLP/JSON ``ExportTraceServiceRequest`` per line (ids as hex, as OTLP/JSON wants)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from google.protobuf import json_format
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        msg = json_format.MessageToDict(encode_spans(spans))
        for rs in msg.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                for sp in ss.get("spans", ()):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in sp:
                            sp[key] = _b64_to_hex(sp[key])
        line = json.dumps(msg, separators=(",", ":")) + "\n"
        try:
            with self._lock, open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            log.warning("sgl-probe: cannot write %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _b64_to_hex(value: str) -> str:
    import base64

    return base64.b64decode(value).hex()


def otlp_exporter(environ=os.environ) -> Optional[SpanExporter]:
    """The OTLP exporter the standard variables ask for, or None when none is configured."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    wanted = environ.get("OTEL_TRACES_EXPORTER")
    if wanted is not None and "otlp" not in [w.strip() for w in wanted.split(",")]:
        return None
    if not (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
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


def make_resource(ident: dict, run_id: str, sglang_version: Optional[str]) -> Resource:
    attrs: dict[str, Any] = {
        "process.pid": os.getpid(),
        "sgl_probe.version": __version__,
        "sgl_probe.run_id": run_id,
    }
    if sglang_version:
        attrs["sglang.version"] = sglang_version
    for key in ("tp_rank", "dp_rank", "pp_rank"):
        if ident.get(key) is not None:
            attrs["sglang." + key] = ident[key]
    res = Resource.create(attrs)
    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; otherwise the service is "sglang".
    if res.attributes.get("service.name", "").startswith("unknown_service"):
        res = res.merge(Resource({"service.name": "sglang"}))
    return res


def _resolved(st, timer) -> list[ResolvedPhase]:
    """The summary's input until the drain resolves each step once for spans and summary alike."""
    out = []
    for ph in st.phases:
        if ph.t_end is not None:
            t0, t1 = timer.interval(ph.t_start, ph.t_end)
            out.append(ResolvedPhase(ph.phase, t0, t1, spans_mod.graph_used(ph), ph.mode, ph.batch_size,
                                     ph.num_tokens, (ph.host1 - ph.host0) / 1e6, ph.target, ph.accept_length))
    return out


class Pipeline:
    """Drains the recorder into span processors on one daemon thread."""

    def __init__(self, recorder, cfg, run_id: str, ident: dict, sglang_version: Optional[str]) -> None:
        self.recorder = recorder
        self.cfg = cfg
        self.run_id = run_id
        self.ident = ident
        self.sglang_version = sglang_version
        self.resource = make_resource(ident, run_id, sglang_version)
        self.processors: list[BatchSpanProcessor] = []
        self.summary = Summary(cfg.summary_s, ident)
        self.export_dropped = 0
        self._sampler = None
        self._always = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()
        self._setup_processors()

    def _setup_processors(self) -> None:
        from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

        self._sampler = _get_from_env_or_default()
        # The default (parent-based always-on, and our steps are roots) keeps every step: skip
        # asking it per step.
        desc = self._sampler.get_description()
        self._always = desc == "AlwaysOnSampler" or desc.startswith("ParentBased{root:AlwaysOnSampler,")
        exporter = otlp_exporter()
        if exporter is not None:
            self.processors.append(BatchSpanProcessor(exporter))
        if self.cfg.trace_dir:
            try:
                os.makedirs(self.cfg.trace_dir, exist_ok=True)
                path = os.path.join(self.cfg.trace_dir, "sgl-probe-%d.jsonl" % os.getpid())
                self.processors.append(BatchSpanProcessor(JsonLinesExporter(path)))
            except OSError as exc:
                log.warning("sgl-probe: SGL_PROBE_TRACE_DIR=%r is not usable (%s); no trace files",
                            self.cfg.trace_dir, exc)

    def start(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sgl-probe-drain", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    def _run(self) -> None:
        interval = self.cfg.drain_interval_s
        while not self._stop.wait(interval):
            try:
                self.drain()
            except Exception as exc:  # keep draining; one bad record must not stop export
                log.warning("sgl-probe: drain error: %r", exc)

    def emit_env(self, attrs: dict, when_ns: int, name: str = "sgl_probe.env_snapshot") -> None:
        """An env snapshot span, or (``name``) another once-per-process span in the env trace."""
        span = spans_mod.build_env_span(attrs, when_ns, self.run_id, self.ident, self.resource, name)
        self._emit([span])

    def _emit(self, spans: list[ReadableSpan]) -> None:
        for proc in self.processors:
            # The SDK's queue drops silently when full (collector slow or down); count it.
            queue = getattr(getattr(proc, "_batch_processor", None), "_queue", None)
            room = (queue.maxlen - len(queue)) if queue is not None and queue.maxlen else len(spans)
            if room < len(spans):
                self.export_dropped += len(spans) - max(room, 0)
            for span in spans:
                proc.on_end(span)

    def _sampled(self, index: int) -> bool:
        """Whether step ``index`` is exported; the sampler sees the step's derived trace id."""
        if self._always:
            return True
        try:
            trace_id = spans_mod.step_trace_id(self.run_id, self.ident, index)
            res = self._sampler.should_sample(None, trace_id, "sglang.step")
            return res.decision == Decision.RECORD_AND_SAMPLE
        except Exception:
            return True

    def drain(self, final: bool = False) -> int:
        """Export every step whose timers have completed; returns how many were exported."""
        with self._lock:
            rec = self.recorder
            timer = rec.timer
            steps = rec.steps
            done = 0
            now = time.perf_counter_ns()
            while steps:
                st = steps[0]
                if not final and not self._step_ready(st, timer, now):
                    break
                steps.popleft()
                # Sampled out (or nothing to export to): the summary line still counts the step,
                # but no span objects are built or encoded. The sampler sees the derived trace id,
                # so a ratio sampler keeps the same steps on every rank.
                if not self.processors or not self._sampled(st.index):
                    try:
                        self.summary.add(_resolved(st, timer))
                    except Exception as exc:
                        log.debug("sgl-probe: dropping step %d: %r", st.index, exc)
                    finally:
                        for ph in st.phases:
                            timer.release(ph.t_start, ph.t_end)
                    done += 1
                    continue
                try:
                    phases = _resolved(st, timer)
                    _, spans = spans_mod.build_step_spans(
                        st, timer, self.run_id, self.ident, rec.spec, self.resource)
                except Exception as exc:  # e.g. an event that never completed at shutdown
                    log.debug("sgl-probe: dropping step %d: %r", st.index, exc)
                    continue
                finally:
                    for ph in st.phases:
                        timer.release(ph.t_start, ph.t_end)
                self.summary.add(phases)
                self._emit(spans)
                done += 1
            line = self.summary.maybe_line(dropped=rec.dropped_steps + self.export_dropped)
            if line:
                log.info(line)
            return done

    def _step_ready(self, st, timer, now: int) -> bool:
        for ph in st.phases:
            if ph.t_end is not None and not timer.ready(ph.t_start, ph.t_end):
                return False
            # Wait (up to 2 s) for SGLang's accept-length sink, which may run a step later.
            if ph.phase == "verify" and ph.accept_length is None and ph.error is None \
                    and now - st.host1 < 2_000_000_000:
                return False
        return True

    def flush(self, timeout_s: float = 5.0) -> None:
        self.drain()
        for proc in self.processors:
            proc.force_flush(int(timeout_s * 1000))

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Bounded: an unreachable collector must not hold the worker's exit hostage."""
        self._stop.set()

        def _finish() -> None:
            try:
                self.drain(final=True)
                for proc in self.processors:
                    proc.shutdown()
            except Exception:
                pass

        t = threading.Thread(target=_finish, name="sgl-probe-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)
