"""The periodic one-line per-phase summary in the server log: the verify-vs-decode split with no
collector at all."""

from __future__ import annotations

import time
from typing import Iterable, Optional

from sgl_probe.targets import PHASES


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[idx]


class Summary:
    def __init__(self, every_s: float, ident: dict) -> None:
        self.every_ns = int(every_s * 1e9)
        self.ident = ident
        self._window: dict[str, list[tuple[float, bool]]] = {}
        self._last = time.monotonic_ns()

    def add(self, durations: Iterable[tuple[str, float, bool]]) -> None:
        if self.every_ns <= 0:
            return
        for phase, ms, graph in durations:
            self._window.setdefault(phase, []).append((ms, graph))

    def line(self, dropped: int = 0) -> Optional[str]:
        if not self._window:
            return None
        who = " ".join(f"{k}={self.ident[k]}" for k in ("tp_rank", "dp_rank", "pp_rank")
                       if self.ident.get(k) is not None)
        parts = []
        for phase in sorted(self._window, key=lambda p: PHASES.index(p) if p in PHASES else 99):
            vals = self._window[phase]
            ms = sorted(v for v, _ in vals)
            graph = sum(1 for _, g in vals if g) / len(vals)
            parts.append(f"{phase} n={len(vals)} p50={percentile(ms, .5):.2f}ms "
                         f"p90={percentile(ms, .9):.2f}ms graph={graph:.0%}")
        tail = f" | dropped={dropped}" if dropped else ""
        return f"sgl-probe summary [{who or 'pid'}]: " + " | ".join(parts) + tail

    def maybe_line(self, dropped: int = 0) -> Optional[str]:
        if self.every_ns <= 0:
            return None
        now = time.monotonic_ns()
        if now - self._last < self.every_ns:
            return None
        self._last = now
        out = self.line(dropped)
        self._window = {}
        return out
