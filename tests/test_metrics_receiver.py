"""The testing API's receiver takes OTLP metrics: JSON and protobuf over HTTP, gRPC, junk rejected."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest

from sgl_probe.testing import ReceivedMetric
from sgl_probe.testing.receiver import OTLPReceiver

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

JSON_PAYLOAD = {"resourceMetrics": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "sglang"}}]},
    "scopeMetrics": [{"scope": {"name": "sgl_probe"}, "metrics": [
        {"name": "g", "unit": "1", "gauge": {"dataPoints": [
            {"asDouble": 1.5, "timeUnixNano": "20", "attributes": [{"key": "tp_rank", "value": {"stringValue": "1"}}]}]}},
        {"name": "c", "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
            {"asInt": "7", "startTimeUnixNano": "1", "timeUnixNano": "20"}]}},
        {"name": "h", "unit": "s", "histogram": {"aggregationTemporality": 2, "dataPoints": [
            {"count": "3", "sum": 0.5, "bucketCounts": ["1", "2", "0"], "explicitBounds": [0.1, 1.0],
             "timeUnixNano": "20"}]}},
    ]}]}]}


def _post(url: str, body: bytes, content_type: str) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with _OPENER.open(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def receiver():
    with OTLPReceiver() as r:
        yield r


def test_json_metrics_over_http(receiver):
    assert _post(receiver.http_metrics_endpoint, json.dumps(JSON_PAYLOAD).encode(), "application/json") == 200
    points = {p.name: p for p in receiver.wait_for_metrics(lambda pts: len(pts) == 3, timeout=5)}
    assert points["g"] == ReceivedMetric(
        name="g", kind="gauge", unit="1", attributes={"tp_rank": "1"}, resource={"service.name": "sglang"},
        scope="sgl_probe", start_ns=0, time_ns=20, transport="http", value=1.5)
    assert (points["c"].value, points["c"].monotonic, points["c"].temporality) == (7, True, 2)
    h = points["h"]
    assert (h.count, h.sum, h.bucket_counts, h.explicit_bounds) == (3, 0.5, [1, 2, 0], [0.1, 1.0])
    assert receiver.spans() == []  # metrics never show up as spans, nor the other way round
    # Cumulative exporters resend every point: latest_metrics keeps one per series.
    later = json.loads(json.dumps(JSON_PAYLOAD))
    later["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][1]["sum"]["dataPoints"][0].update(
        asInt="9", timeUnixNano="40")
    assert _post(receiver.http_metrics_endpoint, json.dumps(later).encode(), "application/json") == 200
    receiver.wait_for_metrics(lambda pts: len(pts) == 6, timeout=5)
    assert [p.value for p in receiver.latest_metrics("c")] == [9]


def test_junk_is_rejected_on_both_transports(receiver):
    assert _post(receiver.http_metrics_endpoint, b"\xff\x00junk", "application/x-protobuf") == 400
    assert _post(receiver.http_endpoint.replace("/v1/traces", "/v1/logs"), b"", "application/x-protobuf") == 404
    with grpc.insecure_channel(receiver.grpc_endpoint.removeprefix("http://")) as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                                   request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\xff\x00junk", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert any("ExportMetricsServiceRequest" in e for e in receiver.errors), receiver.errors
    assert any("POST /v1/metrics" in e for e in receiver.errors), receiver.errors
    with pytest.raises(TimeoutError, match=r"received 0 metric point\(s\); 3 rejected"):
        receiver.wait_for_metrics(lambda pts: bool(pts), timeout=0.2)


def test_env_for_both_signals(receiver):
    env = receiver.env("http/protobuf", signals=("traces", "metrics"))
    assert env == {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.http_metrics_endpoint,
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_METRICS_EXPORTER": "otlp",
    }
    assert receiver.http_metrics_endpoint.endswith("/v1/metrics")
    with pytest.raises(ValueError, match="'traces', 'metrics'"):
        receiver.env("grpc", signals=("logs",))
