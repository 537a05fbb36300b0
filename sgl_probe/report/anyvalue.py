"""OTLP/JSON ``AnyValue`` / ``KeyValue`` decoding: the one place that knows how an attribute's
value is spelled on the wire. Every value kind OTLP defines is decoded; a kind it does not know
becomes None, so spans with attributes this report has never seen still read."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Optional


def _array(v: dict) -> list:
    return [any_value(x) for x in v.get("values", ())]


def _kvlist(v: dict) -> dict:
    return {kv.get("key"): any_value(kv.get("value") or {}) for kv in v.get("values", ())}


_CONVERT = {
    "stringValue": str,
    "intValue": int,  # proto3 JSON writes int64 as a string
    "doubleValue": float,  # a number, or "NaN"/"Infinity" strings
    "boolValue": bool,
    "arrayValue": _array,
    "kvlistValue": _kvlist,
    "bytesValue": str,
}


def any_value(v: Any) -> Any:
    """The value of an ``AnyValue`` dict; None for an unknown kind or a value that does not fit
    its kind (one odd attribute must not cost the span)."""
    if not isinstance(v, dict):
        return v  # not an AnyValue: keep what is there
    for k, x in v.items():
        conv = _CONVERT.get(k)
        if conv is not None:
            try:
                return conv(x)
            except (ValueError, TypeError, AttributeError):
                return None
    return None


_PASS = frozenset(("stringValue", "boolValue"))


def _attributes_slow(kvs: Iterable[dict]) -> dict:
    out = {}
    for kv in kvs:
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            v = kv.get("value")
            out[kv["key"]] = any_value(v) if v else None
    return out


def attributes(kvs: Optional[Iterable[dict]]) -> dict:
    """OTLP ``KeyValue`` list -> dict. The fast path takes the shape every exporter writes (one
    key per ``AnyValue``); anything else goes the careful way."""
    out = {}
    if kvs:
        conv = _CONVERT
        passthrough = _PASS
        try:
            for kv in kvs:
                (k, x), = kv["value"].items()
                out[kv["key"]] = x if k in passthrough else conv[k](x)
        except (KeyError, ValueError, TypeError, AttributeError):
            return _attributes_slow(kvs)
    return out


_KEY = itemgetter("key")
_VALUE = itemgetter("value")


def raw_attributes(kvs: Optional[list]) -> dict:
    """OTLP ``KeyValue`` list -> {key: AnyValue dict}, built at C speed; values are decoded later,
    and only those somebody reads."""
    if not kvs:
        return {}
    try:
        return dict(zip(map(_KEY, kvs), map(_VALUE, kvs)))
    except (KeyError, TypeError):  # a KeyValue without a value (legal: an empty AnyValue)
        return {kv["key"]: kv.get("value") or {} for kv in kvs
                if isinstance(kv, dict) and isinstance(kv.get("key"), str)}
