"""Small numeric helpers shared by the aggregation and the renderers."""

from __future__ import annotations

import math
from typing import Iterable, Optional

from sgl_probe.summary import percentile  # the summary line's definition: one percentile in the tool

__all__ = ["percentile", "bucket", "bucket_order", "describe"]


def bucket(bs: Optional[int]) -> str:
    """Batch-size bucket: 1, 2, 3-4, 5-8, 9-16, ... ("?" when unknown)."""
    if not isinstance(bs, int) or bs <= 0:
        return "?"
    if bs <= 2:
        return str(bs)
    hi = 1 << (bs - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def bucket_order(label: str) -> int:
    if label == "?":
        return 1 << 40
    return int(label.split("-")[0])


def describe(values: Iterable[float]) -> dict:
    """count, mean, p50, p90, p99, sum (ms) of one group of durations."""
    vals = sorted(values)
    n = len(vals)
    total = math.fsum(vals)
    return {"count": n, "sum_ms": total, "mean_ms": total / n if n else float("nan"),
            "p50_ms": percentile(vals, 0.5), "p90_ms": percentile(vals, 0.9),
            "p99_ms": percentile(vals, 0.99), "max_ms": vals[-1] if n else float("nan")}
