"""The periodic one-line per-phase summary in the server log: the verify-vs-decode split with no
collector at all, ending with the live speculative-decoding verdict once verify steps with accept
lengths and a decode time have been seen, e.g.

    sgl-probe summary [tp_rank=0 dp_rank=0 pp_rank=0]: decode n=12 ... | verify n=310 ... |
    spec 0.69× vs graph decode (τ 2.0, break-even 2.9; verify had no graph in 100 % of steps)

The verdict math is :func:`sgl_probe.report.verdict.evaluate`, the same as ``sgl-probe report``'s
(imported only once a verify has been seen).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional

from sgl_probe.contract import PHASES


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[idx]


def _item(item: Any) -> Optional[tuple]:
    """(phase, ms, graph, accept_length) from a ``(phase, ms, graph[, accept_length])`` tuple or a
    finished phase span (anything with ``.name`` and ``.attributes``); None for other spans."""
    if isinstance(item, tuple):
        return (item[0], item[1], bool(item[2]), item[3] if len(item) > 3 else None)
    name = getattr(item, "name", "")
    if not name.startswith("sglang.") or name == "sglang.step":
        return None
    attrs = item.attributes
    ms = attrs.get("sgl_probe.duration_ms")
    if ms is None:
        return None
    return (name[len("sglang."):], ms, attrs.get("sglang.cuda_graph") is True,
            attrs.get("sglang.spec.accept_length"))


class Summary:
    def __init__(self, every_s: float, ident: dict) -> None:
        self.every_ns = int(every_s * 1e9)
        self.ident = ident
        self._window: dict[str, list[tuple[float, bool]]] = {}
        self._accept: list[float] = []
        # Decode per-step time survives the window: a spec server decodes plainly only now and
        # then (or never: then the verdict needs `sgl-probe report --baseline`).
        self._decode: dict[bool, list] = {True: [0, 0.0], False: [0, 0.0]}
        self._last = time.monotonic_ns()

    def add(self, items: Iterable[Any]) -> None:
        """Phase durations of one step: ``(phase, ms, graph)`` / ``(phase, ms, graph, accept_length)``
        tuples, or the step's spans themselves (which carry the accept length)."""
        if self.every_ns <= 0:
            return
        for item in items:
            got = _item(item)
            if got is None:
                continue
            phase, ms, graph, accept = got
            self._window.setdefault(phase, []).append((ms, graph))
            if phase == "verify" and accept is not None:
                self._accept.append(accept)
            elif phase == "decode":
                ref = self._decode[graph]
                ref[0] += 1
                ref[1] += ms

    def verdict(self):
        """The live verdict for the current window, or None (no verify with an accept length, or
        no decode time seen yet)."""
        verify = self._window.get("verify")
        if not verify or not self._accept:
            return None
        graph_dec = self._decode_mean(True)
        eager_dec = self._decode_mean(False)
        if graph_dec is None and eager_dec is None:
            return None
        from sgl_probe.report.verdict import evaluate

        def mean(phase: str, graph: Optional[bool] = None) -> Optional[float]:
            vals = [ms for ms, g in self._window.get(phase, ()) if graph is None or g == graph]
            return sum(vals) / len(vals) if vals else None

        no_graph = sum(1 for _, g in verify if not g) / len(verify)
        graph_verify = mean("verify", True)
        decode_graph = graph_dec is not None
        t_decode = graph_dec if decode_graph else eager_dec
        return evaluate(
            sum(self._accept) / len(self._accept), t_decode, mean("verify"), mean("draft") or 0.0,
            mean("draft_extend") or 0.0, decode_graph=decode_graph, verify_no_graph=no_graph,
            verify_graph_ms=graph_verify if graph_verify is not None else (t_decode if decode_graph else None),
            verify_graph_source="measured" if graph_verify is not None else "one graph decode forward")

    def _decode_mean(self, graph: bool) -> Optional[float]:
        window = [ms for ms, g in self._window.get("decode", ()) if g == graph]
        if window:
            return sum(window) / len(window)
        n, total = self._decode[graph]
        return total / n if n else None

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
        try:
            v = self.verdict()
        except Exception:  # the summary line must never cost the drain thread
            v = None
        if v is not None:
            parts.append(v.short())
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
        self._accept = []
        return out
