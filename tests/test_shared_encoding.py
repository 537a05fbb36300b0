"""One OTLP encoding per batch, shared by the gRPC exporter and the trace file (sgl_probe.outlets),
against a real OTLP receiver on a socket."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.common import trace_encoder
from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_trace_exporter
from opentelemetry.sdk.resources import Resource

from sgl_probe import sinks, spans
from sgl_probe.testing.receiver import OTLPReceiver

IDENT = {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0}


@pytest.fixture
def encodings(monkeypatch):
    """Every span the SDK's encoder is given, wherever it is called from."""
    seen: list = []
    real = trace_encoder.encode_spans

    def counting(batch):
        seen.extend(s.name for s in batch)
        return real(batch)

    monkeypatch.setattr(trace_encoder, "encode_spans", counting)
    monkeypatch.setattr(grpc_trace_exporter, "encode_spans", counting)
    return seen


def env_spans(n: int) -> list:
    res = sinks.make_resource(IDENT, "run", "0.5.23", pid=7)
    return [spans.build_env_span({"i": i}, 1_000 + i, "run", IDENT, res, name=f"s{i}") for i in range(n)]


def file_names(path) -> list:
    names = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                names += [sp["name"] for sp in ss["spans"]]
    return names


def test_grpc_and_the_trace_file_share_one_encoding(tmp_path, monkeypatch, encodings):
    with OTLPReceiver() as rcv:
        for key, value in {**rcv.env("grpc"), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16"}.items():
            monkeypatch.setenv(key, value)
        sink = sinks.SpanSink(str(tmp_path), 7)
        try:
            sink.offer(env_spans(40))
            sink.flush(10)
            got = rcv.wait_for(lambda s: len(s) >= 40, timeout=10)
        finally:
            sink.shutdown()
    want = sorted(f"s{i}" for i in range(40))
    assert sorted(s.name for s in got) == want
    assert sorted(file_names(tmp_path / "sgl-probe-7.jsonl")) == want
    assert sorted(encodings) == want  # each span encoded once, not once per output
    assert sink.dropped == 0 and sink.settled == 40


def test_http_encodes_its_own_and_still_gets_everything(tmp_path, monkeypatch, encodings):
    with OTLPReceiver() as rcv:
        for key, value in rcv.env("http/protobuf").items():
            monkeypatch.setenv(key, value)
        sink = sinks.SpanSink(str(tmp_path), 7)
        try:
            sink.offer(env_spans(10))
            sink.flush(10)
            got = rcv.wait_for(lambda s: len(s) >= 10, timeout=10)
        finally:
            sink.shutdown()
    assert sorted(s.name for s in got) == sorted(f"s{i}" for i in range(10))
    assert len(file_names(tmp_path / "sgl-probe-7.jsonl")) == 10
    assert len(encodings) == 20  # the shared encoding (the file's) and the HTTP exporter's own


def test_a_batch_that_cannot_be_encoded_is_dropped_by_every_output(tmp_path, monkeypatch, caplog):
    def broken(batch):
        raise ValueError("no")

    monkeypatch.setattr(trace_encoder, "encode_spans", broken)
    with OTLPReceiver() as rcv:
        for key, value in rcv.env("grpc").items():
            monkeypatch.setenv(key, value)
        sink = sinks.SpanSink(str(tmp_path), 7)
        try:
            sink.offer(env_spans(5))
            sink.flush(10)
        finally:
            sink.shutdown()
    assert sink.dropped_by == {"otlp": 5, "trace_dir": 5} and sink.settled == 5
    assert sum("cannot encode 5 spans" in r.getMessage() for r in caplog.records) == 1


def test_the_resource_hashes_once_and_equals_the_sdks():
    res = sinks.make_resource(IDENT, "run", "0.5.23", pid=7)
    plain = Resource(res.attributes, res.schema_url)
    assert res == plain and hash(res) == hash(plain)
    res._attributes = Resource({"other": 1}).attributes  # a later change is not seen: computed once
    assert hash(res) == hash(plain)
