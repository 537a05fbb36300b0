"""In-process OTLP trace and metrics receiver for tests.

Listens on loopback for OTLP/gRPC and OTLP/HTTP (protobuf or JSON) so that servers started in
other processes can export spans and metrics with the stock OpenTelemetry SDK exporters, pointed
here with ``OTLPReceiver.env()``. Every payload is decoded with the ``opentelemetry-proto``
messages.

    with OTLPReceiver() as receiver:
        subprocess.run(cmd, env={**os.environ, **receiver.env("grpc", signals=("traces", "metrics"))})
        receiver.wait_for(lambda spans: any(s.name == "decode" for s in spans), timeout=10)
        receiver.wait_for_metrics(lambda points: any(p.name == "x" for p in points), timeout=10)

Metrics arrive as one :class:`ReceivedMetric` per data point (cumulative exporters resend every
point each interval; :meth:`OTLPReceiver.latest_metrics` keeps the newest per series).
"""

from __future__ import annotations

import base64
import gzip
import json
import socket
import socketserver
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2

__all__ = ["OTLPReceiver", "ReceivedMetric", "ReceivedSpan"]

_Request = trace_service_pb2.ExportTraceServiceRequest
_Response = trace_service_pb2.ExportTraceServiceResponse
_MetricsRequest = metrics_service_pb2.ExportMetricsServiceRequest
_MetricsResponse = metrics_service_pb2.ExportMetricsServiceResponse

_TRACES_PATH = "/v1/traces"
_METRICS_PATH = "/v1/metrics"
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
_METRICS_SERVICE = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name
# Large batches from a busy server must not trip gRPC's 4 MiB default and look like lost spans.
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_SIGNALS = ("traces", "metrics")
_PROTOCOLS = ("grpc", "http/protobuf")

# OTLP/JSON spells these as hex, where proto3 JSON (json_format) expects base64 for bytes fields.
_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str  # "" when root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[dict]  # {"name", "time_ns", "attributes"}
    transport: str  # "grpc" | "http"
    kind: int = 0  # SpanKind proto enum: 1 internal, 2 server, 3 client, 4 producer, 5 consumer
    links: list[dict] = field(default_factory=list)  # {"trace_id", "span_id", "attributes"}

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class ReceivedMetric:
    """One data point of one metric, as exported (cumulative points repeat every interval)."""

    name: str
    kind: str  # "sum" | "gauge" | "histogram" | "exponential_histogram" | "summary"
    unit: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    start_ns: int
    time_ns: int
    transport: str  # "grpc" | "http"
    value: float | int | None = None  # sum and gauge points
    count: int | None = None  # histogram-like points
    sum: float | None = None
    bucket_counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    explicit_bounds: list[float] = field(default_factory=list)
    monotonic: bool | None = None  # sums only
    temporality: int = 0  # AggregationTemporality proto enum: 1 delta, 2 cumulative

    def series(self) -> tuple:
        """What identifies the time series: name, attributes and resource."""
        return (self.name, tuple(sorted(self.attributes.items())), tuple(sorted(self.resource.items())))


class _Reject(Exception):
    """A request the receiver answers with an HTTP error status and logs in ``errors``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class OTLPReceiver:
    def __init__(self, host: str = "127.0.0.1", grpc_port: int = 0, http_port: int = 0) -> None:
        self.host = host
        self.grpc_port = grpc_port
        self.http_port = http_port
        self.errors: list[str] = []
        self._requested_ports = (grpc_port, http_port)
        self._spans: list[ReceivedSpan] = []
        self._metrics: list[ReceivedMetric] = []
        self._payloads: list[bytes] = []
        self._cond = threading.Condition()
        self._grpc_server: grpc.Server | None = None
        self._http_server: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> OTLPReceiver:
        if self._http_server is not None:
            return self
        grpc_port, http_port = self._requested_ports
        http_server = _HTTPServer((self.host, http_port), self)
        try:
            grpc_server, bound_grpc_port = self._start_grpc(grpc_port)
        except BaseException:
            http_server.server_close()
            raise
        self._http_server, self._grpc_server = http_server, grpc_server
        self.http_port, self.grpc_port = http_server.server_address[1], bound_grpc_port
        # A short poll interval keeps stop() fast; serve_forever only checks for shutdown between polls.
        self._http_thread = threading.Thread(
            target=http_server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-http-{self.http_port}",
            daemon=True,
        )
        self._http_thread.start()
        return self

    def _start_grpc(self, port: int) -> tuple[grpc.Server, int]:
        # The raw request bytes reach _export untouched (no deserializer) so raw_payloads() holds what
        # was sent and junk becomes an INVALID_ARGUMENT plus an `errors` line rather than a grpc-internal failure.
        handler = grpc.unary_unary_rpc_method_handler(
            self._export, request_deserializer=None, response_serializer=_Response.SerializeToString
        )
        metrics_handler = grpc.unary_unary_rpc_method_handler(
            self._export_metrics, request_deserializer=None,
            response_serializer=_MetricsResponse.SerializeToString,
        )
        server = grpc.server(
            ThreadPoolExecutor(max_workers=8, thread_name_prefix="otlp-grpc"),
            handlers=[grpc.method_handlers_generic_handler(_SERVICE, {"Export": handler}),
                      grpc.method_handlers_generic_handler(_METRICS_SERVICE, {"Export": metrics_handler})],
            options=[
                # SO_REUSEPORT would let a fixed port be "bound" twice, splitting spans between two receivers.
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ],
        )
        try:
            bound = server.add_insecure_port(_host_port(self.host, port))
            if not bound:  # older grpcio reports bind failures as port 0 instead of raising
                raise OSError(f"cannot bind OTLP/gRPC receiver to {_host_port(self.host, port)}")
            server.start()
        except BaseException:
            server.stop(None)
            raise
        return server, bound

    def stop(self) -> None:
        http_server, http_thread, grpc_server = self._http_server, self._http_thread, self._grpc_server
        self._http_server = self._http_thread = self._grpc_server = None
        if http_server is not None:
            http_server.shutdown()
            http_server.server_close()
        if http_thread is not None:
            http_thread.join(timeout=5)
        if grpc_server is not None:
            grpc_server.stop(grace=None).wait(timeout=5)

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- where to send -------------------------------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        return f"http://{_host_port(self.host, self._port(self.grpc_port))}"

    @property
    def http_endpoint(self) -> str:
        return f"http://{_host_port(self.host, self._port(self.http_port))}{_TRACES_PATH}"

    @property
    def http_metrics_endpoint(self) -> str:
        return f"http://{_host_port(self.host, self._port(self.http_port))}{_METRICS_PATH}"

    def env(self, protocol: str = "grpc", signals: Iterable[str] = ("traces",)) -> dict[str, str]:
        """The ``OTEL_EXPORTER_OTLP_<SIGNAL>_*`` variables that point the SDK exporters here.

        With ``"metrics"`` in ``signals`` this also sets ``OTEL_METRICS_EXPORTER=otlp``."""
        if protocol not in _PROTOCOLS:
            accepted = ", ".join(repr(p) for p in _PROTOCOLS)
            raise ValueError(f"unknown OTLP protocol {protocol!r}; accepted: {accepted}")
        out: dict[str, str] = {}
        for signal in signals:
            if signal not in _SIGNALS:
                accepted = ", ".join(repr(s) for s in _SIGNALS)
                raise ValueError(f"unknown OTLP signal {signal!r}; accepted: {accepted}")
            var = f"OTEL_EXPORTER_OTLP_{signal.upper()}_"
            if protocol == "grpc":
                out.update({var + "ENDPOINT": self.grpc_endpoint, var + "PROTOCOL": "grpc", var + "INSECURE": "true"})
            else:
                # The signal-specific endpoint variable is used verbatim, so it carries the /v1/<signal> path.
                endpoint = self.http_endpoint if signal == "traces" else self.http_metrics_endpoint
                out.update({var + "ENDPOINT": endpoint, var + "PROTOCOL": "http/protobuf"})
            if signal == "metrics":
                out["OTEL_METRICS_EXPORTER"] = "otlp"
        return out

    @staticmethod
    def _port(port: int) -> int:
        if not port:
            raise RuntimeError("OTLPReceiver has no port yet: call start() first")
        return port

    # -- what arrived --------------------------------------------------------------------------

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self._spans if name is None or s.name == name]

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        return self._wait(self._spans, predicate, timeout, "wait_for", "span(s)")

    def metrics(self, name: str | None = None) -> list[ReceivedMetric]:
        """Every data point received, in arrival order."""
        with self._cond:
            return [m for m in self._metrics if name is None or m.name == name]

    def latest_metrics(self, name: str | None = None) -> list[ReceivedMetric]:
        """The newest point of each series (cumulative exporters resend all points)."""
        latest: dict[tuple, ReceivedMetric] = {}
        for point in self.metrics(name):
            key = point.series()
            if key not in latest or point.time_ns >= latest[key].time_ns:
                latest[key] = point
        return list(latest.values())

    def wait_for_metrics(
        self, predicate: Callable[[list[ReceivedMetric]], bool], timeout: float = 30.0
    ) -> list[ReceivedMetric]:
        return self._wait(self._metrics, predicate, timeout, "wait_for_metrics", "metric point(s)")

    def _wait(self, items: list, predicate: Callable[[list], bool], timeout: float, who: str, what: str) -> list:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                snapshot = list(items)
                if predicate(snapshot):
                    return snapshot
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            errors = list(self.errors)
        summary = _summary(snapshot, errors, what)
        raise TimeoutError(f"OTLPReceiver.{who}: predicate still false after {timeout:g}s; {summary}")

    def take(self) -> list[ReceivedSpan]:
        """The spans received so far, forgotten here with the raw payloads: for runs long enough
        that keeping everything would cost too much memory."""
        with self._cond:
            out = list(self._spans)
            self._spans.clear()
            self._payloads.clear()
            return out

    def raw_payloads(self) -> list[bytes]:
        """Every payload received (traces and metrics), decompressed."""
        with self._cond:
            return list(self._payloads)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()
            self._metrics.clear()
            self._payloads.clear()
            self.errors.clear()  # in place: callers may hold a reference to the list

    # -- intake (called from server threads) ---------------------------------------------------

    def _keep_payload(self, body: bytes) -> None:
        with self._cond:
            self._payloads.append(body)

    def _error(self, line: str) -> None:
        line = " ".join(line.split())  # one line per problem, whatever the exception text holds
        with self._cond:
            self.errors.append(line[:500])
            self._cond.notify_all()

    def _accept(self, spans: list[ReceivedSpan]) -> None:
        with self._cond:
            self._spans.extend(spans)
            self._cond.notify_all()

    def _accept_metrics(self, points: list[ReceivedMetric]) -> None:
        with self._cond:
            self._metrics.extend(points)
            self._cond.notify_all()

    def _export(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        return self._grpc_intake(raw, context, _TRACES)

    def _export_metrics(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        return self._grpc_intake(raw, context, _METRICS)

    def _grpc_intake(self, raw: bytes, context: grpc.ServicerContext, signal: "_Signal") -> Any:
        # Never raise out of here: a failing servicer would only surface as an opaque UNKNOWN status.
        try:
            self._keep_payload(raw)
            items = signal.decode(signal.request.FromString(raw), "grpc")
        except Exception as exc:
            message = f"malformed {signal.request.__name__} ({len(raw)} bytes): {_describe(exc)}"
            self._error(f"grpc: {message}")
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(message[:500])
            return signal.response()
        signal.accept(self, items)
        return signal.response()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], receiver: OTLPReceiver) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.receiver = receiver
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can stall for seconds on CI hosts.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_POST(self) -> None:
        receiver = self.server.receiver
        try:
            self._post(receiver)
        except _Reject as reject:
            receiver._error(f"http {reject.status}: POST {self.path}: {reject.message}")
            self._reply_quietly(reject.status, "text/plain; charset=utf-8", reject.message.encode() + b"\n")
        except Exception as exc:  # the receiver must outlive any request, including its own bugs
            receiver._error(f"http 500: POST {self.path}: {_describe(exc)}")
            self._reply_quietly(500, "text/plain; charset=utf-8", b"internal error\n")

    def _post(self, receiver: OTLPReceiver) -> None:
        raw = self._read_body()  # always drained, so an error reply is not lost to a connection reset
        signal = _BY_PATH.get(urlsplit(self.path).path)
        if signal is None:
            raise _Reject(404, f"not found; OTLP/HTTP traces go to POST {_TRACES_PATH}, "
                               f"metrics to POST {_METRICS_PATH}")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            body = _decompress(raw, self.headers.get("Content-Encoding"))
        except _Reject:
            raise
        except Exception as exc:
            receiver._keep_payload(raw)
            raise _Reject(400, f"cannot decompress body ({len(raw)} bytes): {_describe(exc)}") from exc
        receiver._keep_payload(body)
        try:
            request = _parse(body, content_type, signal)
            items = signal.decode(request, "http")
        except _Reject:
            raise
        except Exception as exc:
            raise _Reject(400, f"malformed {content_type} body ({len(body)} bytes): {_describe(exc)}") from exc
        signal.accept(receiver, items)
        if content_type == _JSON_TYPE:
            self._reply(200, content_type, json_format.MessageToJson(signal.response()).encode())
        else:
            self._reply(200, content_type, signal.response().SerializeToString())

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise _Reject(411, "Content-Length required")
        try:
            size = int(length)
            if size < 0:
                raise ValueError(length)
        except ValueError:
            raise _Reject(400, f"bad Content-Length {length!r}") from None
        return self.rfile.read(size)

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply_quietly(self, status: int, content_type: str, body: bytes) -> None:
        # The client may already be gone; nothing useful can be done about that here.
        try:
            self._reply(status, content_type, body)
        except Exception:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass  # per-request access lines would drown test output; problems land in `errors`


def _decompress(body: bytes, encoding: str | None) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise _Reject(415, f"unsupported Content-Encoding {encoding!r}")


def _parse(body: bytes, content_type: str, signal: "_Signal") -> Any:
    if content_type in _PROTOBUF_TYPES:
        return signal.request.FromString(body)
    if content_type == _JSON_TYPE:
        payload = json.loads(body)
        if signal is _TRACES:
            _hex_ids_to_base64(payload)
        # Receivers must tolerate fields from newer OTLP versions, per the OTLP spec.
        return json_format.ParseDict(payload, signal.request(), ignore_unknown_fields=True)
    accepted = ", ".join((*_PROTOBUF_TYPES, _JSON_TYPE))
    raise _Reject(415, f"unsupported Content-Type {content_type!r}; accepted: {accepted}")


def _hex_ids_to_base64(payload: Any) -> None:
    for resource_spans in _json_list(payload, "resourceSpans", "resource_spans"):
        for scope_spans in _json_list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _json_list(scope_spans, "spans"):
                for link in _json_list(span, "links"):
                    _hex_ids_in(link)
                _hex_ids_in(span)


def _json_list(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in keys:
        if key in obj:
            value = obj[key]
            if value is None:
                return []
            if not isinstance(value, list):
                raise ValueError(f"{key!r} must be a JSON array, got {type(value).__name__}")
            return value
    return []


def _hex_ids_in(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                raise ValueError(f"{key} {value!r} is not hex (OTLP/JSON ids are hex, not base64)") from None


def _decode(request: Any, transport: str) -> list[ReceivedSpan]:
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        # Decoded per span so that tests mutating one span's dict cannot affect another.
                        resource=_attributes(resource_spans.resource.attributes),
                        scope=scope_spans.scope.name,
                        status_code=int(span.status.code),
                        status_message=span.status.message,
                        events=[
                            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
                            for e in span.events
                        ],
                        transport=transport,
                        kind=int(span.kind),
                        links=[
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "attributes": _attributes(link.attributes),
                            }
                            for link in span.links
                        ],
                    )
                )
    return spans


_POINT_KINDS = ("sum", "gauge", "histogram", "exponential_histogram", "summary")


def _decode_metrics(request: Any, transport: str) -> list[ReceivedMetric]:
    points: list[ReceivedMetric] = []
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind not in _POINT_KINDS:
                    continue
                data = getattr(metric, kind)
                for dp in data.data_points:
                    point = ReceivedMetric(
                        name=metric.name, kind=kind, unit=metric.unit,
                        attributes=_attributes(dp.attributes), resource=dict(resource),
                        scope=scope_metrics.scope.name, start_ns=dp.start_time_unix_nano,
                        time_ns=dp.time_unix_nano, transport=transport,
                        temporality=int(getattr(data, "aggregation_temporality", 0)),
                    )
                    if kind in ("sum", "gauge"):
                        point.value = getattr(dp, dp.WhichOneof("value")) if dp.WhichOneof("value") else None
                        point.monotonic = bool(data.is_monotonic) if kind == "sum" else None
                    else:
                        point.count, point.sum = int(dp.count), float(dp.sum)
                        if kind == "histogram":
                            point.bucket_counts = [int(c) for c in dp.bucket_counts]
                            point.explicit_bounds = [float(b) for b in dp.explicit_bounds]
                    points.append(point)
    return points


@dataclass(frozen=True)
class _Signal:
    request: Any
    response: Any
    decode: Callable[[Any, str], list]
    accept: Callable[[OTLPReceiver, list], None]


_TRACES = _Signal(_Request, _Response, _decode, OTLPReceiver._accept)
_METRICS = _Signal(_MetricsRequest, _MetricsResponse, _decode_metrics, OTLPReceiver._accept_metrics)
_BY_PATH = {_TRACES_PATH: _TRACES, _METRICS_PATH: _METRICS}


def _attributes(key_values: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in key_values}


def _any_value(value: common_pb2.AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None if which is None else getattr(value, which)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _summary(items: list, errors: list[str], what: str = "span(s)") -> str:
    counts = Counter(item.name for item in items)
    text = f"received {len(items)} {what}"
    if counts:
        text += ": " + ", ".join(f"{name!r} x{n}" for name, n in counts.most_common())
    if errors:
        text += f"; {len(errors)} rejected payload(s), last: {errors[-1]}"
    return text
