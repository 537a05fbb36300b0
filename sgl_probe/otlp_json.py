"""OTLP/JSON of a protobuf message the OpenTelemetry SDK encoded (``encode_spans``), for the trace dir.

The SDK builds the OTLP message; this only writes it as JSON, with protobuf's JSON mapping exactly
as ``json_format.MessageToDict`` applies it (camelCase names, 64-bit integers as strings, enums by
name, unset fields left out) and OTLP/JSON's one exception: trace and span ids in hex, not base64.
Why not ``MessageToDict``: it inspects every field of every message for options this format never
uses, ~85-110 µs per probe span on a CPU where the SDK's encoding costs ~70 and ``json.dumps``
~30, so the trace dir tripled the exporter process's CPU. Here each message type's fields are
looked up once and attributes that repeat between spans are converted once (~25 µs per span,
``benchmarks/trace_dir_cost.py``). A message this cannot write (a field kind OTLP's trace messages
do not have) falls back to ``MessageToDict``. ``tests/test_otlp_json.py`` checks equality with it
over every field kind.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Callable, Optional

from google.protobuf.descriptor import FieldDescriptor as FD

#: OTLP/JSON writes these bytes fields in hex (ids of traces and spans); every other bytes field
#: is base64, as in protobuf's JSON mapping.
HEX_FIELDS = frozenset(("trace_id", "span_id", "parent_span_id"))
_HEX_JSON = frozenset(("traceId", "spanId", "parentSpanId"))  # the same, as MessageToDict names them

_INT64 = frozenset((FD.TYPE_INT64, FD.TYPE_UINT64, FD.TYPE_SINT64, FD.TYPE_FIXED64, FD.TYPE_SFIXED64))


def _float(v: float) -> Any:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _b64(v: bytes) -> str:
    return base64.b64encode(v).decode("utf-8")


def _hex(v: bytes) -> str:
    return v.hex()


_plans: dict = {}  # message descriptor -> _Plan


class _Plan:
    """One message type's fields: by number, ``(json name, converter or None, repeated)`` (None:
    the value is its own JSON); ``oneof``: the name of the oneof that is the whole message
    (OTLP's ``AnyValue``, every attribute's value), read with one ``WhichOneof`` instead of
    ``ListFields``, with its fields by name in ``by_name``."""

    __slots__ = ("by_number", "by_name", "oneof")

    def __init__(self, desc: Any) -> None:
        for fd in desc.fields:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                raise TypeError("map fields are not part of OTLP's trace messages: %s" % fd.full_name)
        if desc.full_name.startswith("google.protobuf."):
            raise TypeError("well-known types are not part of OTLP's trace messages: %s" % desc.full_name)
        self.by_number = {fd.number: (fd.json_name, _converter(fd), _repeated(fd)) for fd in desc.fields}
        self.by_name = {fd.name: self.by_number[fd.number] for fd in desc.fields}
        whole = len(desc.oneofs) == 1 and desc.fields and len(desc.oneofs[0].fields) == len(desc.fields)
        self.oneof = desc.oneofs[0].name if whole else None


def _converter(fd: FD) -> Optional[Callable[[Any], Any]]:
    t = fd.type
    if t == FD.TYPE_MESSAGE:
        return to_dict
    if t in _INT64:
        return str
    if t == FD.TYPE_DOUBLE:
        return _float
    if t == FD.TYPE_FLOAT:  # protobuf rounds these to their shortest repr: not worth copying
        raise TypeError("float fields are not part of OTLP's trace messages: %s" % fd.full_name)
    if t == FD.TYPE_BYTES:
        return _hex if fd.name in HEX_FIELDS else _b64
    if t == FD.TYPE_ENUM:
        by_number = fd.enum_type.values_by_number
        return lambda v: by_number[v].name if v in by_number else v
    return None  # bool, string, 32-bit integers


def _repeated(fd: FD) -> bool:
    got = getattr(fd, "is_repeated", None)  # protobuf >= 5.29; ``label`` is gone from 7
    return bool(got) if got is not None else fd.label == FD.LABEL_REPEATED


#: Attributes repeat from span to span (the timer, the target, the ranks, the phase): their JSON
#: is kept by their serialized bytes, which protobuf makes in C. Shared, never mutated: the
#: result is only dumped.
_CACHED = "opentelemetry.proto.common.v1.KeyValue"
_CACHE_MAX = 4096
_cache: dict = {}


def _cached(msg: Any) -> dict:
    key = msg.SerializeToString()
    got = _cache.get(key)
    if got is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        got = _cache[key] = _convert(msg)
    return got


def to_dict(msg: Any) -> dict:
    """``msg`` as ``MessageToDict(msg)`` gives it, with ``HEX_FIELDS`` in hex."""
    if msg.DESCRIPTOR.full_name == _CACHED:
        return _cached(msg)
    return _convert(msg)


def _convert(msg: Any) -> dict:
    desc = msg.DESCRIPTOR
    plan = _plans.get(desc)
    if plan is None:
        plan = _plans[desc] = _Plan(desc)
    if plan.oneof is not None:
        field = msg.WhichOneof(plan.oneof)
        if field is None:
            return {}
        name, conv, repeated = plan.by_name[field]
        value = getattr(msg, field)
        if conv is None:
            return {name: list(value) if repeated else value}
        return {name: [conv(v) for v in value] if repeated else conv(value)}
    by_number = plan.by_number
    out = {}
    for fd, value in msg.ListFields():
        name, conv, repeated = by_number[fd.number]
        if conv is None:
            out[name] = list(value) if repeated else value
        else:
            out[name] = [conv(v) for v in value] if repeated else conv(value)
    return out


def message_to_dict(msg: Any) -> dict:
    """``to_dict``, or protobuf's own ``MessageToDict`` (ids made hex) where ``to_dict`` refuses."""
    try:
        return to_dict(msg)
    except TypeError:
        from google.protobuf import json_format

        out = json_format.MessageToDict(msg)
        _hex_ids(out)
        return out


def _hex_ids(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_JSON and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _hex_ids(value)
    elif isinstance(node, list):
        for value in node:
            _hex_ids(value)

