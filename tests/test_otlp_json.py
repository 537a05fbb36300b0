"""The trace dir's OTLP/JSON (sgl_probe.otlp_json) against protobuf's own MessageToDict, dumped."""

from __future__ import annotations

import base64
import json
import math

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from sgl_probe import otlp_json
from sgl_probe.sinks import JsonLinesExporter

IDS = ("traceId", "spanId", "parentSpanId")


def reference(msg) -> dict:
    """Protobuf's JSON mapping, then OTLP/JSON's hex ids wherever an id appears (links too)."""
    def fix(node):
        if isinstance(node, dict):
            return {k: base64.b64decode(v).hex() if k in IDS and isinstance(v, str) else fix(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node
    return fix(json_format.MessageToDict(msg))


def dumped(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def spans_of_every_kind() -> list:
    spans = []
    for service in ("a", "b"):  # two resources in one batch
        mem = InMemorySpanExporter()
        tp = TracerProvider(resource=Resource.create({"service.name": service, "sglang.tp_rank": 3, "f": 0.5}),
                            span_limits=SpanLimits(max_span_attributes=15, max_event_attributes=2))
        tp.add_span_processor(SimpleSpanProcessor(mem))
        tr = tp.get_tracer("sgl_probe", "0.1.0")
        other = tp.get_tracer("other-scope")  # no version
        attrs = {"old1": 1, "old2": 2, "s": "x", "empty": "", "t": True, "f": False, "zero": 0, "neg": -7, "big": 2**62 + 1,
                 "pi": 3.25, "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "ss": ["a", ""],
                 "bb": [True, False], "ii": [1, -2], "dd": [0.5, -1.5]}  # 17 > 15: the two oldest dropped
        with tr.start_as_current_span("root", kind=SpanKind.SERVER, attributes=attrs) as root:
            root.add_event("ev", {"k": 1, "j": "v", "dropped": 2.0}, timestamp=123)
            root.add_event("bare")
            with tr.start_as_current_span("child", kind=SpanKind.CLIENT,
                                          links=[Link(root.get_span_context(), {"why": "test"})]) as child:
                child.set_status(Status(StatusCode.ERROR, "went wrong"))
            with other.start_as_current_span("ok") as ok:
                ok.set_status(Status(StatusCode.OK))
        spans += mem.get_finished_spans()
    return spans


def test_spans_of_every_kind_come_out_as_message_to_dict_writes_them_with_hex_ids():
    msg = encode_spans(spans_of_every_kind())
    text = otlp_json.to_json(msg)
    assert text == dumped(reference(msg))  # the same text, byte for byte: names, order, numbers
    assert otlp_json.to_json(msg) == text  # again, its attributes from the cache
    got = json.loads(text)
    # The comparison means something: ids hex, 64-bit integers strings, enums names, NaN spelled out.
    span = next(sp for sp in got["resourceSpans"][0]["scopeSpans"][0]["spans"] if sp["name"] == "root")
    assert span["droppedAttributesCount"] == 2 and "old1" not in str(span["attributes"])
    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16
    assert isinstance(span["startTimeUnixNano"], str) and span["kind"].startswith("SPAN_KIND_")
    values = {kv["key"]: kv["value"] for kv in span["attributes"]}
    assert values["nan"] == {"doubleValue": "NaN"} and values["big"] == {"intValue": str(2**62 + 1)}
    assert values["empty"] == {"stringValue": ""} and values["zero"] == {"intValue": "0"}


def test_values_the_probe_does_not_send_but_otlp_allows_match_too():
    value = AnyValue(kvlist_value=KeyValueList(values=[
        KeyValue(key="b", value=AnyValue(bytes_value=b"\x00\xff")),
        KeyValue(key="arr", value=AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=5), AnyValue()]))),
        KeyValue(key="unset")]))
    assert otlp_json.to_json(value) == dumped(json_format.MessageToDict(value))
    assert otlp_json.to_json(AnyValue()) == "{}" == dumped(json_format.MessageToDict(AnyValue()))
    odd = AnyValue(string_value='é "quoted" \\ \n\u2028 ☃')  # escapes as json.dumps writes them
    assert otlp_json.to_json(odd) == dumped(json_format.MessageToDict(odd))
    for x in (-0.0, 1e-300, 1e300, 0.1 + 0.2, 2.0**53 + 1):
        assert otlp_json.to_json(AnyValue(double_value=x)) == dumped(json_format.MessageToDict(AnyValue(double_value=x)))
    for n in (-(2**63), 2**63 - 1):
        assert otlp_json.to_json(AnyValue(int_value=n)) == dumped(json_format.MessageToDict(AnyValue(int_value=n)))


def test_a_message_it_cannot_write_falls_back_to_protobufs_own_mapping():
    from google.protobuf import struct_pb2

    msg = struct_pb2.Struct()
    msg.update({"traceId": base64.b64encode(b"\x01\x02").decode(), "n": 1})
    with pytest.raises(TypeError):
        otlp_json.to_json(msg)
    assert json.loads(otlp_json.message_to_json(msg)) == {"traceId": "0102", "n": 1.0}


def test_the_trace_file_holds_the_same_json(tmp_path):
    spans = spans_of_every_kind()
    path = tmp_path / "t.jsonl"
    JsonLinesExporter(str(path)).export(spans)
    line = path.read_text().splitlines()[0]
    assert line == dumped(reference(encode_spans(spans)))


def test_the_server_process_side_of_the_export_does_not_import_protobuf():
    """The trace file is written in the exporter process; the scheduler process only imports the
    modules that hold the writer."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; import sgl_probe.export, sgl_probe.sinks; "
            "print(sorted(m for m in sys.modules if m.startswith('google.protobuf')))")
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
