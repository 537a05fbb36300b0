"""OTLP/JSON text of a protobuf message the OpenTelemetry SDK encoded (``encode_spans``), for the trace dir.

The SDK builds the OTLP message; this only writes it as JSON: exactly the text
``json.dumps(json_format.MessageToDict(msg), separators=(",", ":"))`` gives (camelCase names,
64-bit integers as strings, enums by name, unset fields left out), with OTLP/JSON's one exception:
trace and span ids in hex, not base64.
Why not ``MessageToDict`` and ``json.dumps``: the first inspects every field of every message for
options this format never uses (~85-110 µs per probe span on a CPU where the SDK's encoding costs
~70), and the second walks the dicts it built again (~30). Here each message type's fields are
looked up once, each value is written as text straight away, and attributes that repeat between
spans (the timer, the target, the ranks, the phase) are written once and kept as text
(``benchmarks/trace_dir_cost.py``). A message this cannot write (a field kind OTLP's trace
messages do not have) falls back to ``MessageToDict``. ``tests/test_otlp_json.py`` checks the text
against protobuf's over every field kind.
"""

from __future__ import annotations

import base64
import json
import math
from json.encoder import encode_basestring_ascii as _string  # what json.dumps quotes strings with
from typing import Any, Callable

from google.protobuf.descriptor import FieldDescriptor as FD

#: OTLP/JSON writes these bytes fields in hex (ids of traces and spans); every other bytes field
#: is base64, as in protobuf's JSON mapping.
HEX_FIELDS = frozenset(("trace_id", "span_id", "parent_span_id"))
_HEX_JSON = frozenset(("traceId", "spanId", "parentSpanId"))  # the same, as MessageToDict names them

_INT64 = frozenset((FD.TYPE_INT64, FD.TYPE_UINT64, FD.TYPE_SINT64, FD.TYPE_FIXED64, FD.TYPE_SFIXED64))
_INT32 = frozenset((FD.TYPE_INT32, FD.TYPE_UINT32, FD.TYPE_SINT32, FD.TYPE_FIXED32, FD.TYPE_SFIXED32))


def _double(v: float) -> str:
    if math.isnan(v):
        return '"NaN"'
    if math.isinf(v):
        return '"Infinity"' if v > 0 else '"-Infinity"'
    return float.__repr__(v)  # as json.dumps writes a float


def _int64(v: int) -> str:
    return '"%d"' % v


def _int(v: int) -> str:
    return "%d" % v


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _b64(v: bytes) -> str:
    return '"' + base64.b64encode(v).decode("ascii") + '"'


def _hex(v: bytes) -> str:
    return '"' + v.hex() + '"'


_plans: dict = {}  # message descriptor -> _Plan


class _Plan:
    """One message type's fields: by number, ``(the JSON name with its colon, writer, repeated)``;
    ``oneof``: the name of the oneof that is the whole message (OTLP's ``AnyValue``, every
    attribute's value), read with one ``WhichOneof`` instead of ``ListFields``, with its fields by
    name in ``by_name``."""

    __slots__ = ("by_number", "by_name", "oneof")

    def __init__(self, desc: Any) -> None:
        for fd in desc.fields:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                raise TypeError("map fields are not part of OTLP's trace messages: %s" % fd.full_name)
        if desc.full_name.startswith("google.protobuf."):
            raise TypeError("well-known types are not part of OTLP's trace messages: %s" % desc.full_name)
        self.by_number = {fd.number: (_string(fd.json_name) + ":", _writer(fd), _repeated(fd)) for fd in desc.fields}
        self.by_name = {fd.name: self.by_number[fd.number] for fd in desc.fields}
        whole = len(desc.oneofs) == 1 and desc.fields and len(desc.oneofs[0].fields) == len(desc.fields)
        self.oneof = desc.oneofs[0].name if whole else None


def _writer(fd: FD) -> Callable[[Any], str]:
    t = fd.type
    if t == FD.TYPE_MESSAGE:
        return to_json
    if t in _INT64:
        return _int64
    if t in _INT32:
        return _int
    if t == FD.TYPE_DOUBLE:
        return _double
    if t == FD.TYPE_BOOL:
        return _bool
    if t == FD.TYPE_STRING:
        return _string
    if t == FD.TYPE_BYTES:
        return _hex if fd.name in HEX_FIELDS else _b64
    if t == FD.TYPE_ENUM:
        names = {n: _string(v.name) for n, v in fd.enum_type.values_by_number.items()}
        return lambda v: names.get(v) or _int(v)
    # float (protobuf rounds these to their shortest repr: not worth copying), groups
    raise TypeError("fields of type %d are not part of OTLP's trace messages: %s" % (t, fd.full_name))


def _repeated(fd: FD) -> bool:
    got = getattr(fd, "is_repeated", None)  # protobuf >= 5.29; ``label`` is gone from 7
    return bool(got) if got is not None else fd.label == FD.LABEL_REPEATED


#: Attributes repeat from span to span: their JSON is kept by their serialized bytes, which
#: protobuf makes in C.
_CACHED = "opentelemetry.proto.common.v1.KeyValue"
_CACHE_MAX = 4096
_cache: dict = {}


def to_json(msg: Any) -> str:
    """``msg`` as ``json.dumps(MessageToDict(msg), separators=(",", ":"))`` writes it, with
    ``HEX_FIELDS`` in hex. TypeError for a message OTLP's trace messages do not contain."""
    desc = msg.DESCRIPTOR
    if desc.full_name != _CACHED:
        return _write(msg, desc)
    key = msg.SerializeToString()
    got = _cache.get(key)
    if got is None:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        got = _cache[key] = _write(msg, desc)
    return got


def _write(msg: Any, desc: Any) -> str:
    plan = _plans.get(desc)
    if plan is None:
        plan = _plans[desc] = _Plan(desc)
    if plan.oneof is not None:
        field = msg.WhichOneof(plan.oneof)
        if field is None:
            return "{}"
        name, write, repeated = plan.by_name[field]
        value = getattr(msg, field)
        return "{" + name + ("[" + ",".join(map(write, value)) + "]" if repeated else write(value)) + "}"
    by_number = plan.by_number
    parts = []
    for fd, value in msg.ListFields():
        name, write, repeated = by_number[fd.number]
        parts.append(name + ("[" + ",".join(map(write, value)) + "]" if repeated else write(value)))
    return "{" + ",".join(parts) + "}"


def message_to_json(msg: Any) -> str:
    """``to_json``, or :func:`via_message_to_dict` where ``to_json`` refuses."""
    try:
        return to_json(msg)
    except TypeError:
        return via_message_to_dict(msg)


def via_message_to_dict(msg: Any) -> str:
    """The same text the slow way: protobuf's own ``MessageToDict``, the ids made hex, dumped."""
    from google.protobuf import json_format

    out = json_format.MessageToDict(msg)
    _hex_ids(out)
    return json.dumps(out, separators=(",", ":"))


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
