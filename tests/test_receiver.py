"""OTLPReceiver against real sockets and the stock OTel SDK exporters (no mocks)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Iterator

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan

SECRET = "hf_s3cr3t-token-0123456789"
TRACE_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_HEX = "eee19b7ec3c1b174"
PARENT_HEX = "eee19b7ec3c1b173"
BAD_HEX_ID_JSON = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "zz"}]}]}]}'


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rec:
        yield rec


@pytest.fixture(autouse=True)
def _no_ambient_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # An OTEL_* variable from the developer's shell would silently redirect or reshape the exports.
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def _export_sample(exporter: object) -> dict[str, str]:
    """Export a root span and an errored child carrying every attribute type; returns their hex ids."""
    provider = TracerProvider(resource=Resource.create({"service.name": "receiver-test", "gpu.count": 8}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    tracer = provider.get_tracer("sgl_probe.test")
    with tracer.start_as_current_span("request") as root:
        with tracer.start_as_current_span("decode") as child:
            child.set_attributes(
                {
                    "s": "text",
                    "b": True,
                    "i": 42,
                    "f": 1.5,
                    "ls": ["a", "b"],
                    "li": [1, 2],
                    "secret": SECRET,
                }
            )
            child.add_event("step", {"batch": 3})
            child.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    return {
        "trace": format(root.get_span_context().trace_id, "032x"),
        "root": format(root.get_span_context().span_id, "016x"),
        "child": format(child.get_span_context().span_id, "016x"),
    }


def _sdk_exporter(protocol: str) -> object:
    # Built from the environment only, as a child process's SDK would be.
    return GrpcSpanExporter() if protocol == "grpc" else HttpSpanExporter()


def _post(url: str, body: bytes, content_type: str, encoding: str | None = None) -> tuple[int, str, bytes]:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def _proto_request(name: str = "hand-built") -> trace_service_pb2.ExportTraceServiceRequest:
    span = trace_pb2.Span(
        name=name,
        trace_id=bytes.fromhex(TRACE_HEX),
        span_id=bytes.fromhex(SPAN_HEX),
        start_time_unix_nano=1_000_000,
        end_time_unix_nano=3_500_000,
        attributes=[common_pb2.KeyValue(key="secret", value=common_pb2.AnyValue(string_value=SECRET))],
    )
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=[span])])]
    )


@pytest.mark.parametrize(
    ("protocol", "compression"),
    [("grpc", None), ("grpc", "gzip"), ("http/protobuf", None), ("http/protobuf", "gzip")],
)
def test_sdk_exporter_roundtrip(
    receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch, protocol: str, compression: str | None
) -> None:
    for key, value in receiver.env(protocol).items():
        monkeypatch.setenv(key, value)
    if compression:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", compression)

    ids = _export_sample(_sdk_exporter(protocol))

    spans = receiver.wait_for(lambda s: len(s) >= 2, timeout=5)
    assert [s.name for s in spans] == ["decode", "request"]  # SimpleSpanProcessor exports on end
    child, root = receiver.spans("decode")[0], receiver.spans("request")[0]
    assert root.trace_id == child.trace_id == ids["trace"]
    assert (root.span_id, child.span_id) == (ids["root"], ids["child"])
    assert (root.parent_span_id, child.parent_span_id) == ("", ids["root"])
    assert child.attributes == {
        "s": "text",
        "b": True,
        "i": 42,
        "f": 1.5,
        "ls": ["a", "b"],
        "li": [1, 2],
        "secret": SECRET,
    }
    assert child.resource["service.name"] == "receiver-test"
    assert child.resource["gpu.count"] == 8
    assert child.scope == "sgl_probe.test"
    assert (child.status_code, child.status_message) == (2, "boom")
    assert root.status_code == 0
    assert [(e["name"], e["attributes"]) for e in child.events] == [("step", {"batch": 3})]
    assert child.events[0]["time_ns"] >= child.start_ns
    assert 0 <= child.duration_ms <= root.duration_ms
    assert child.kind == 1  # SPAN_KIND_INTERNAL
    assert {s.transport for s in spans} == {"grpc" if protocol == "grpc" else "http"}
    assert any(SECRET.encode() in p for p in receiver.raw_payloads())  # decompressed when gzipped
    assert receiver.errors == []


def test_otlp_json_post_with_hex_ids(receiver: OTLPReceiver) -> None:
    payload = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "json-scope", "version": "1"},
                        "spans": [
                            {
                                "traceId": TRACE_HEX,
                                "spanId": SPAN_HEX,
                                "parentSpanId": PARENT_HEX,
                                "name": "json-span",
                                "kind": 2,
                                "startTimeUnixNano": "1000000",
                                "endTimeUnixNano": "3500000",
                                "attributes": [
                                    {"key": "i", "value": {"intValue": "7"}},
                                    {"key": "f", "value": {"doubleValue": 0.25}},
                                    {"key": "b", "value": {"boolValue": False}},
                                    {"key": "raw", "value": {"bytesValue": "AAE="}},
                                    {"key": "arr", "value": {"arrayValue": {"values": [{"stringValue": "x"}]}}},
                                    {
                                        "key": "kv",
                                        "value": {"kvlistValue": {"values": [{"key": "k", "value": {"intValue": 1}}]}},
                                    },
                                ],
                                "events": [{"timeUnixNano": "2000000", "name": "ev", "attributes": []}],
                                "links": [{"traceId": TRACE_HEX, "spanId": PARENT_HEX}],
                                "status": {"code": 1},
                                "someFutureField": {"ignored": True},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    status, content_type, body = _post(receiver.http_endpoint, json.dumps(payload).encode(), "application/json")
    assert (status, content_type, json.loads(body)) == (200, "application/json", {})

    (span,) = receiver.spans()
    assert span == ReceivedSpan(
        name="json-span",
        trace_id=TRACE_HEX,
        span_id=SPAN_HEX,
        parent_span_id=PARENT_HEX,
        start_ns=1_000_000,
        end_ns=3_500_000,
        attributes={"i": 7, "f": 0.25, "b": False, "raw": b"\x00\x01", "arr": ["x"], "kv": {"k": 1}},
        resource={"service.name": "json-svc"},
        scope="json-scope",
        status_code=1,
        status_message="",
        events=[{"name": "ev", "time_ns": 2_000_000, "attributes": {}}],
        transport="http",
        kind=2,
        links=[{"trace_id": TRACE_HEX, "span_id": PARENT_HEX, "attributes": {}}],
    )
    assert span.duration_ms == 2.5


def test_gzip_protobuf_post(receiver: OTLPReceiver) -> None:
    raw = _proto_request().SerializeToString()
    status, content_type, body = _post(receiver.http_endpoint, gzip.compress(raw), "application/x-protobuf", "gzip")
    assert (status, content_type) == (200, "application/x-protobuf")
    trace_service_pb2.ExportTraceServiceResponse.FromString(body)
    assert [(s.name, s.trace_id, s.span_id) for s in receiver.spans()] == [("hand-built", TRACE_HEX, SPAN_HEX)]
    assert receiver.raw_payloads() == [raw]


@pytest.mark.parametrize(
    ("path", "content_type", "encoding", "body", "expected"),
    [
        ("/v1/traces", "application/x-protobuf", None, b"not a protobuf \xff\xff", 400),
        ("/v1/traces", "application/json", None, b'{"resourceSpans": [', 400),
        ("/v1/traces", "application/json", None, b'{"resourceSpans": [{"scopeSpans": 3}]}', 400),
        ("/v1/traces", "application/json", None, BAD_HEX_ID_JSON, 400),
        ("/v1/traces", "application/x-protobuf", "gzip", b"not gzip", 400),
        ("/v1/traces", "text/plain", None, b"hello", 415),
        ("/v1/logs", "application/x-protobuf", None, b"", 404),
        ("/", "application/json", None, b"{}", 404),
    ],
)
def test_http_rejects_bad_requests_and_keeps_working(
    receiver: OTLPReceiver, path: str, content_type: str, encoding: str | None, body: bytes, expected: int
) -> None:
    url = f"http://127.0.0.1:{receiver.http_port}{path}"
    status, _, _ = _post(url, body, content_type, encoding)
    assert status == expected
    assert len(receiver.errors) == 1 and str(expected) in receiver.errors[0]
    assert receiver.spans() == []

    status, _, _ = _post(receiver.http_endpoint, _proto_request("after").SerializeToString(), "application/x-protobuf")
    assert status == 200
    assert [s.name for s in receiver.spans()] == ["after"]


def test_grpc_garbage_gets_error_status_and_receiver_keeps_working(
    receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,
            response_deserializer=None,
        )
        with pytest.raises(grpc.RpcError) as caught:
            export(b"not a protobuf \xff\xff", timeout=5)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(receiver.errors) == 1 and receiver.errors[0].startswith("grpc: malformed")

        # The same raw channel still gets through with a well-formed request.
        export(_proto_request("raw-ok").SerializeToString(), timeout=5)

    for key, value in receiver.env("grpc").items():
        monkeypatch.setenv(key, value)
    _export_sample(GrpcSpanExporter())
    assert [s.name for s in receiver.spans()] == ["raw-ok", "decode", "request"]


def test_wait_for_wakes_on_arrival(receiver: OTLPReceiver) -> None:
    body = _proto_request("late").SerializeToString()
    timer = threading.Timer(0.2, _post, (receiver.http_endpoint, body, "application/x-protobuf"))
    timer.start()
    started = time.monotonic()
    spans = receiver.wait_for(lambda s: any(x.name == "late" for x in s), timeout=5)
    timer.join()
    assert [s.name for s in spans] == ["late"]
    assert time.monotonic() - started < 2


def test_wait_for_times_out_with_summary(receiver: OTLPReceiver) -> None:
    _post(receiver.http_endpoint, _proto_request("seen").SerializeToString(), "application/x-protobuf")
    _post(receiver.http_endpoint, _proto_request("seen").SerializeToString(), "application/x-protobuf")
    _post(receiver.http_endpoint, b"junk", "application/json")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"received 2 span\(s\): 'seen' x2; 1 rejected payload") as caught:
        receiver.wait_for(lambda s: len(s) >= 3, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 2
    assert "http 400" in str(caught.value)


def test_env(receiver: OTLPReceiver) -> None:
    assert receiver.env() == {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{receiver.grpc_port}",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
    }
    assert receiver.env("http/protobuf") == {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}/v1/traces",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    with pytest.raises(ValueError, match=r"'grpc', 'http/protobuf'"):
        receiver.env("http/json")


def test_spans_filter_and_clear(receiver: OTLPReceiver) -> None:
    for name in ("a", "b", "a"):
        _post(receiver.http_endpoint, _proto_request(name).SerializeToString(), "application/x-protobuf")
    _post(receiver.http_endpoint, b"junk", "application/x-protobuf")
    assert [s.name for s in receiver.spans("a")] == ["a", "a"]
    assert len(receiver.spans()) == 3 and len(receiver.raw_payloads()) == 4 and len(receiver.errors) == 1
    errors = receiver.errors
    receiver.clear()
    assert receiver.spans() == [] and receiver.raw_payloads() == [] and errors == []


def test_lifecycle() -> None:
    receiver = OTLPReceiver()
    with pytest.raises(RuntimeError, match="start"):
        receiver.grpc_endpoint
    with receiver:
        assert receiver.grpc_port > 0 and receiver.http_port > 0
        assert receiver.start() is receiver  # already running: no second bind
        assert receiver.http_endpoint == f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        http_port = receiver.http_port
    receiver.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", http_port), timeout=1).close()


def test_fixed_port_conflict_is_an_error(receiver: OTLPReceiver) -> None:
    # Without SO_REUSEPORT off, a second gRPC server could share the port and steal half the spans.
    with pytest.raises((RuntimeError, OSError)):
        OTLPReceiver(grpc_port=receiver.grpc_port).start()
    with pytest.raises(OSError):
        OTLPReceiver(http_port=receiver.http_port).start()
