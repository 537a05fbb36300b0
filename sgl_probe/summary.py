"""The periodic one-line per-phase summary in the server log: the verify-vs-decode split with no
collector at all, why phases ran without a CUDA graph, and the live speculative-decoding verdict
once verify steps with accept lengths and a decode time have been seen, e.g.

    sgl-probe summary [tp_rank=0 dp_rank=0 pp_rank=0]: decode n=12 p50=12.10ms p90=12.30ms
    graph=100% launch@0.35ms | verify n=310 p50=29.00ms p90=29.80ms graph=0% (graphs_disabled)
    warm-up=1 | verdict from medians, 1 warm-up call left out | spec 0.69× vs graph decode (τ 2.0, ...)

``launch@`` (graph phases that carry ``sgl_probe.graph_ms``): how long after the call the graph
was launched, median over the window: the host-side preparation the GPU waited for.

Times are over the window's steady calls: warm-up calls (:func:`sgl_probe.stats.is_warmup`) are
counted in ``n`` and named, never in p50 / p90 or the verdict. The verdict math is
:func:`sgl_probe.stats.evaluate`, the same as ``sgl-probe report``'s.
"""

from __future__ import annotations

import collections
import time
from itertools import chain, compress
from operator import itemgetter, not_, truth
from typing import Any, Iterable, Optional

from sgl_probe.contract import PHASES, RANKS, TIMER_HOST
from sgl_probe.resolved import PHASES as PHASES_AT
from sgl_probe.resolved import TIMER as TIMER_AT
from sgl_probe.resolved import ResolvedPhase
from sgl_probe.stats import VERDICT_STATISTIC, Verdict, evaluate, is_warmup, median, percentile

#: Shapes remembered per process to tell a first call; beyond this, new shapes are not flagged.
MAX_SHAPES = 4096
#: Steady decode calls remembered across windows (a spec server decodes plainly only now and then).
DECODE_HISTORY = 512

# A phase's window: five lists of one entry per call (ms, graph, no_graph_reason, shape, whether it
# was the shape's first call). Columns, not a tuple per call: a window holds every call of up to
# 30 s, and a tuple per call would be a collector-tracked object each, starting collections of
# the server's heap; a float, a shared flag and a shared shape are not (the shapes are the ones
# kept in ``_seen``).
_MS, _GRAPH, _REASON, _SHAPE, _FIRST = range(5)


class Summary:
    def __init__(self, every_s: float, ident: dict, fast: Any = None) -> None:
        """``fast``: the C hot path module (:mod:`sgl_probe.hotpath`), whose ``summary_add`` does
        :meth:`add_rows` in C; None: Python."""
        self.every_ns = int(every_s * 1e9)
        self._fast_add = getattr(fast, "summary_add", None)
        self.ident = ident
        self._window: dict[str, tuple[list, list, list, list, list]] = {}  # phase -> its columns
        self._accept: list[float] = []
        self._launch: dict[str, list[float]] = {}  # phase -> ms from the call to its graph's launch
        self._seen: dict = {}  # shape -> the same shape: every call of a shape shares one tuple
        # Survives the window: a spec server may decode plainly only now and then (or never:
        # then the verdict needs `sgl-probe report --baseline`). First calls are kept out.
        self._decode: dict[bool, collections.deque] = {
            True: collections.deque(maxlen=DECODE_HISTORY), False: collections.deque(maxlen=DECODE_HISTORY)}
        self._last = time.monotonic_ns()
        self.last_verdict = None

    def add_rows(self, rows: list) -> None:
        """:meth:`add` for the phases of steps as the drain resolves them (rows, see
        :mod:`sgl_probe.drain`); in C with the C hot path (the same work, for every phase the
        server runs)."""
        if self.every_ns <= 0:
            return
        # The phases of a step the CUDA timer left untimed hold host times (TIMER_HOST): a
        # window of GPU times keeps them out.
        if any(row[TIMER_AT] == TIMER_HOST for row in rows):
            rows = [row for row in rows if row[TIMER_AT] != TIMER_HOST]
        if self._fast_add is not None:
            self._fast_add(rows, PHASES_AT, self._seen, MAX_SHAPES, self._window, self._launch, self._accept,
                           self._decode)
        else:
            self.add(chain.from_iterable(map(itemgetter(PHASES_AT), rows)))

    def c_state(self) -> Optional[tuple]:
        """What the C extension adds phases to, for the drain's packed pass (``drain.take_ready``):
        None where there is no summary or no C extension. Valid until the next line."""
        if self.every_ns <= 0 or self._fast_add is None:
            return None
        return (self._seen, MAX_SHAPES, self._window, self._launch, self._accept, self._decode)

    def add(self, phases: Iterable[ResolvedPhase]) -> None:
        """The resolved phases of one step."""
        if self.every_ns <= 0:
            return
        seen = self._seen
        window = self._window
        launch = self._launch
        for phase, t0, t1, graph, mode, bs, ntok, _host, _target, accept, _start, reason, _err, graph_ms in phases:
            ms = (t1 - t0) / 1e6
            if graph_ms is not None and graph:  # as the report: SGLang's graph flag decides
                got = launch.get(phase)
                if got is None:
                    got = launch[phase] = []
                got.append(ms - graph_ms)
            # sgl_probe.stats.shape_key, inline: this runs for every phase of every step
            key = (phase, mode, bs, graph, (ntok - 1).bit_length() if type(ntok) is int and ntok > 0 else None)
            known = seen.get(key)
            if known is not None:
                key, first = known, False
            else:
                first = len(seen) < MAX_SHAPES
                if first:
                    seen[key] = key
            cols = window.get(phase)
            if cols is None:
                cols = window[phase] = ([], [], [], [], [])
            cols[_MS].append(ms)
            cols[_GRAPH].append(graph)
            cols[_REASON].append(reason)
            cols[_SHAPE].append(key)
            cols[_FIRST].append(first)
            if phase == "verify":
                if accept is not None:
                    self._accept.append(accept)
            elif phase == "decode" and not first:
                self._decode[graph].append(ms)

    # -- the window's steady state ---------------------------------------------------------------
    def _steady(self) -> dict[str, tuple[list[int], int]]:
        """phase -> (the indices of its steady calls, warm-up count) for the current window. A
        first call is compared with its shape's other calls in the window, else with the phase's
        other calls of the same graph flag."""
        out = {}
        for phase, (ms, graph, _reason, shape, first) in self._window.items():
            if not any(first):
                out[phase] = (range(len(ms)), 0)
                continue
            by_shape: dict = {}
            by_graph: dict = {}
            for i, f in enumerate(first):
                if not f:
                    by_shape.setdefault(shape[i], []).append(ms[i])
                    by_graph.setdefault(graph[i], []).append(ms[i])
            warm = set()
            for i, f in enumerate(first):
                if f:
                    ref = by_shape.get(shape[i]) or by_graph.get(graph[i])
                    if ref and is_warmup(ms[i], median(ref)):
                        warm.add(i)
            out[phase] = ([i for i in range(len(ms)) if i not in warm], len(warm))
        return out

    def verdict(self, steady: Optional[dict] = None) -> Optional[Verdict]:
        """The live verdict for the current window, or None (no verify with an accept length, or
        no decode time seen yet)."""
        steady = self._steady() if steady is None else steady
        verify = self._window.get("verify")
        if not verify or not self._accept:
            return None

        def med(phase: str, graph: Optional[bool] = None) -> Optional[float]:
            cols = self._window.get(phase)
            if cols is None:
                return None
            vals = [cols[_MS][i] for i in steady[phase][0] if graph is None or cols[_GRAPH][i] == graph]
            return median(vals) if vals else None

        decode = {g: (median(self._decode[g]) if self._decode[g] else med("decode", g)) for g in (True, False)}
        decode_graph = decode[True] is not None
        t_decode = decode[True] if decode_graph else decode[False]
        if t_decode is None:
            return None
        no_graph = sum(1 for g in verify[_GRAPH] if not g) / len(verify[_GRAPH])
        graph_verify = med("verify", True)
        return evaluate(
            sum(self._accept) / len(self._accept), t_decode, med("verify"), med("draft") or 0.0,
            med("draft_extend") or 0.0, decode_graph=decode_graph, verify_no_graph=no_graph,
            verify_graph_ms=graph_verify if graph_verify is not None else (t_decode if decode_graph else None),
            verify_graph_source="measured" if graph_verify is not None else "one graph decode forward")

    def line(self, dropped: int = 0, by: Optional[dict] = None) -> Optional[str]:
        if not self._window:
            return None
        who = " ".join(f"{k}={self.ident[k]}" for k in RANKS if self.ident.get(k) is not None)
        steady = self._steady()
        parts = []
        warm_total = 0
        for phase in sorted(self._window, key=lambda p: PHASES.index(p) if p in PHASES else 99):
            cols = self._window[phase]
            kept, warm = steady[phase]
            warm_total += warm
            # Over a window's every call (~20,000 on a launch-bound server) in one stretch of the
            # drain thread's GIL, which the scheduler thread waits out: C loops, not generators.
            n = len(cols[_MS])
            ms = sorted(cols[_MS] if len(kept) == n else map(cols[_MS].__getitem__, kept))
            graph = sum(map(truth, cols[_GRAPH])) / n
            part = (f"{phase} n={n} p50={percentile(ms, .5):.2f}ms "
                    f"p90={percentile(ms, .9):.2f}ms graph={graph:.0%}{_reasons(cols)}")
            launch = self._launch.get(phase)
            if launch:  # the host's share of a graph phase: its graph started this late (p50)
                part += f" launch@{median(launch):.2f}ms"
            parts.append(part + (f" warm-up={warm}" if warm else ""))
        try:
            v = self.verdict(steady)
        except Exception:  # the summary line must never cost the drain thread
            v = None
        self.last_verdict = v  # the live verdict gauge (sgl_probe.metrics) reads it
        if v is not None:
            calls = "call" if warm_total == 1 else "calls"
            parts.append(f"verdict from {VERDICT_STATISTIC}s, {warm_total} warm-up {calls} left out")
            parts.append(v.short())
        tail = f" | dropped={dropped}" if dropped else ""
        where = " ".join(f"{k}={n}" for k, n in (by or {}).items() if n)
        if dropped and where:
            tail += f" ({where})"
        return f"sgl-probe summary [{who or 'pid'}]: " + " | ".join(parts) + tail

    def maybe_line(self, dropped: int = 0, by: Optional[dict] = None) -> Optional[str]:
        if self.every_ns <= 0:
            return None
        now = time.monotonic_ns()
        if now - self._last < self.every_ns:
            return None
        self._last = now
        out = self.line(dropped, by)
        self._window = {}
        self._accept = []
        self._launch = {}
        return out


def _reasons(cols: tuple) -> str:
    """`` (graphs_disabled)``, or the shares when several reasons: why no graph ran."""
    counts = collections.Counter(compress(cols[_REASON], map(not_, cols[_GRAPH])))
    for r in [r for r in counts if not r]:  # a phase without a reason (None, "")
        del counts[r]
    if not counts:
        return ""
    if len(counts) == 1:
        return f" ({next(iter(counts))})"
    total = sum(counts.values())
    return " (" + ", ".join(f"{r} {n / total:.0%}" for r, n in counts.most_common(3)) + ")"
