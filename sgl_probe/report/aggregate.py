"""Streaming aggregation: every span is seen once and folded into compact arrays, so a report over
a million spans holds a few numbers per span and never the spans themselves.

What is kept:
- phase durations and step indices per shape (phase, cuda_graph, batch-size bucket, rank,
  forward mode, batch size, token-count class), as ``array('d')`` / ``array('q')``; :meth:`finish`
  finds each shape's first call, leaves it out as warm-up when :func:`sgl_probe.stats.is_warmup`
  says so, and folds the rest into ``groups`` per (phase, cuda_graph, batch-size bucket, rank);
- per rank, dense arrays indexed by step index (the probe's per-process step counter, the same on
  every TP rank): the step span's start / end / batch size, and per phase the summed duration of
  that phase's calls in that step. Step composition (spec cycle vs decode step), the overlap-clipped
  step time and the same-step straggler view are computed from these in :meth:`finish` (warm-up
  steps left out), so the order spans arrive in does not matter and partial aggregators (one per
  file chunk, read in parallel) merge exactly: :meth:`merge`;
- per phase, calls per start kind and per no-graph reason;
- accept lengths, speculative settings, timers, versions, env snapshots.
"""

from __future__ import annotations

import collections
import math
from array import array
from typing import Any, Optional

from sgl_probe.contract import (TIMER_HOST, DIST_BACKEND, SNAPSHOT_TRIGGER, ENV_ATTR_PREFIX, ENV_DIFFERS, ENV_WITHHELD, FINGERPRINT_SPAN, LAUNCHER_ENV_PREFIX,
                                PHASES, PROBE_VERSION, RUN_ID, SGLANG_VERSION, SNAPSHOT_POINT, SPEC_PREFIX,
                                SPEC_SETTINGS)
from sgl_probe.report.fields import TP, DP, PP, accept_length, num, phase_fields, step_fields
from sgl_probe.report.model import ENV, PHASE_NAMES, STEP, Span
from sgl_probe.stats import WARMUP_MIN_MS, bucket, is_warmup, median

NAN = float("nan")
#: A step index beyond this is not trusted for the dense per-step arrays.
MAX_STEP_INDEX = 50_000_000
NO_BS = -1
#: Step index of a call that has none: after every real one, so never a shape's first call
#: while one with an index exists.
NO_IDX = MAX_STEP_INDEX + 1

RankKey = tuple  # (run_id, dp, pp, tp, pid-when-no-tp)


def _list(x: Any) -> list:
    """Array attributes: a list from OTLP, a JSON string from Jaeger."""
    if isinstance(x, list):
        return x
    if isinstance(x, str) and x.startswith("["):
        import json

        try:
            val = json.loads(x)
            return val if isinstance(val, list) else []
        except ValueError:
            return []
    return []


def _grow(arr: array, idx: int, fill) -> None:
    if idx >= len(arr):
        n = max(idx + 1 - len(arr), len(arr), 64)
        arr.extend(array(arr.typecode, [fill]) * n)


def _fold_pair(into: dict, key: Any, pair: tuple[array, array]) -> None:
    """Append a pair of parallel arrays to ``into[key]``'s (taking the pair itself when new)."""
    mine = into.get(key)
    if mine is None:
        into[key] = pair
    else:
        mine[0].extend(pair[0])
        mine[1].extend(pair[1])


def _merge_dense(dst: array, src: array, absent, add: bool, lo: int = 0) -> None:
    """Fold ``src`` into ``dst`` by index (from ``lo``, below which ``src`` holds nothing): absent
    slots take the other's value; where both are present, durations add (a phase called in two
    chunks of one step) and the rest keep ``dst``."""
    _grow(dst, len(src) - 1, absent)
    nan = absent != absent
    for i in range(lo, len(src)):
        v = src[i]
        if (v != v) if nan else (v == absent):
            continue
        d = dst[i]
        if (d != d) if nan else (d == absent):
            dst[i] = v
        elif add:
            dst[i] = d + v


class RankSteps:
    """One rank's steps, dense by step index."""

    __slots__ = ("start", "end", "bs", "decode_graph", "lo")

    def __init__(self) -> None:
        self.lo = MAX_STEP_INDEX + 1  # lowest step index seen (chunks of a file start late)
        self.start = array("q")  # 0: no step span with this index
        self.end = array("q")
        self.bs = array("q")
        self.decode_graph = bytearray()  # 0 unknown, 1 eager, 2 graph

    def put(self, idx: int, start: int, end: int, bs: Optional[int]) -> None:
        if idx < self.lo:
            self.lo = idx
        _grow(self.start, idx, 0)
        _grow(self.end, idx, 0)
        _grow(self.bs, idx, NO_BS)
        self.start[idx] = start or 1
        self.end[idx] = end
        if bs is not None:
            self.bs[idx] = bs

    def phase_bs(self, idx: int, bs: Optional[int]) -> None:
        if idx < self.lo:
            self.lo = idx
        if bs is None:
            return
        _grow(self.bs, idx, NO_BS)
        if self.bs[idx] == NO_BS:
            self.bs[idx] = bs

    def merge(self, other: "RankSteps") -> None:
        lo = min(other.lo, len(other.start))
        _merge_dense(self.start, other.start, 0, False, lo)
        _merge_dense(self.end, other.end, 0, False, lo)
        _merge_dense(self.bs, other.bs, NO_BS, False, min(other.lo, len(other.bs)))
        dg, odg = self.decode_graph, other.decode_graph
        if len(odg) > len(dg):
            dg.extend(bytes(len(odg) - len(dg)))
        for i in range(min(other.lo, len(odg)), len(odg)):
            v = odg[i]
            if v and not dg[i]:
                dg[i] = v
        self.lo = min(self.lo, other.lo)


class Aggregator:
    def __init__(self) -> None:
        self.n_spans = 0
        self.n_steps = 0
        self.n_phase_spans = 0
        self.unknown_names: collections.Counter = collections.Counter()
        self.errors: collections.Counter = collections.Counter()
        # (phase, graph, bucket, rank, mode, batch size, token class, start kind, no-graph reason)
        # -> (ms, step index). The last two ride in the key so that counting them costs nothing
        # per span; finish() counts them and folds them out of the shape.
        self.shapes: dict[tuple, tuple[array, array]] = {}
        self.steps: dict[RankKey, RankSteps] = {}
        self.by_step: dict[tuple, array] = {}  # (rank, phase) -> ms by step index (NaN: none)
        self.step_traces: dict[tuple, dict[int, str]] = {}
        self.accept: dict[str, list] = {}  # bucket -> [n, sum] over verify spans
        self.spec_settings: dict[str, Any] = {}
        self.timers: collections.Counter = collections.Counter()
        self.runs: dict[str, dict] = {}
        self.ranks: set = set()
        self.env: dict[RankKey, list] = {}
        self.fingerprints: dict[RankKey, dict] = {}  # the sgl_probe.fingerprint span's attributes
        self.t_min: Optional[int] = None
        self.t_max: Optional[int] = None
        # phase -> (graph ms, ms before the graph's launch) of the graph phases that carry
        # sgl_probe.graph_ms; every call, warm-up included: the report shows medians.
        self.graph_launch: dict[str, tuple[array, array]] = {}
        # Filled by finish():
        self.starts: dict[tuple, int] = {}  # (phase, start kind) -> calls
        self.no_graph: dict[tuple, int] = {}  # (phase, reason or None) -> calls without a graph
        self.groups: dict[tuple, array] = {}  # (phase, graph, bucket, rank) -> steady ms
        self.warmup_groups: dict[tuple, array] = {}  # the same keys -> warm-up ms
        self.warmup_steps: dict[RankKey, set] = {}  # step indices holding a warm-up call
        self.warmup_step_ms = 0.0
        self.step_ms: dict[RankKey, array] = {}
        # Per steady step, one value per array: bucket -> [draft, verify, draft_extend, other]
        self.spec_steps: dict[str, list[array]] = {}
        self.decode_steps: dict[tuple, list[array]] = {}  # (graph, bucket) -> [decode, other]
        self._labels: Optional[dict] = None
        self._finished = False
        self._interned: dict[RankKey, RankKey] = {}
        self._by_rank_phase: dict[RankKey, dict[str, array]] = {}
        self._buckets: dict[Optional[int], str] = {}

    # -- input --------------------------------------------------------------------------------
    @staticmethod
    def rank_of(span: Span) -> RankKey:
        a, r = span.attrs, span.resource.attrs
        tp = a.get(TP, r.get(TP))
        return (r.get(RUN_ID, ""), a.get(DP, r.get(DP)), a.get(PP, r.get(PP)), tp,
                r.get("process.pid") if tp is None else None)

    def _rank(self, span: Span, key: tuple) -> RankKey:
        """The span's rank key, one tuple object per (resource, ranks): the hot path neither
        rebuilds nor re-registers it. ``key``: the span's own rank attributes, as read."""
        cache = span.resource.rank_cache
        rank = cache.get(key)
        if rank is None:
            rank = self.rank_of(span)
            rank = cache[key] = self._interned.setdefault(rank, rank)
            if rank not in self.ranks:
                self._new_rank(rank, span)
        return rank

    def add(self, span: Span) -> None:
        self.n_spans += 1
        phase = PHASE_NAMES.get(span.name)
        if phase is None:
            self._add_other(span)
            return
        ms, graph, bs, idx, timer, rkey, mode, ntok, start, reason, graph_ms = phase_fields(span)
        rank = self._rank(span, rkey)
        self.n_phase_spans += 1
        if span.error:
            self.errors[span.name] += 1
        if timer is not None:
            self.timers[timer] += 1
            if timer == TIMER_HOST:  # an untimed step's host times: no GPU-time statistic takes them
                self._spec_facts(phase, span, bs)
                return
        if type(ms) is not float or ms != ms:
            ms = num(ms)
            if ms is None:
                ms = max(0, span.end_ns - span.start_ns) / 1e6
        if graph_ms is not None:
            launch = self.graph_launch.get(phase)
            if launch is None:
                launch = self.graph_launch[phase] = (array("d"), array("d"))
            launch[0].append(graph_ms)
            launch[1].append(ms - graph_ms)
        buckets = self._buckets
        b = buckets.get(bs)
        if b is None:
            b = buckets[bs] = bucket(bs)
        # token_class(ntok), inline: the hot loop
        key = (phase, graph, b, rank, mode, bs, (ntok - 1).bit_length() if type(ntok) is int and ntok > 0 else None,
               start, reason)
        pair = self.shapes.get(key)
        if pair is None:
            pair = self.shapes[key] = (array("d"), array("i"))
        pair[0].append(ms)
        if idx is None or not 0 <= idx <= MAX_STEP_INDEX:
            pair[1].append(NO_IDX)
        else:
            pair[1].append(idx)
            per_rank = self._by_rank_phase.get(rank)
            if per_rank is None:
                per_rank = self._by_rank_phase[rank] = {}
            arr = per_rank.get(phase)
            if arr is None:
                arr = per_rank[phase] = self.by_step[(rank, phase)] = array("d")
            if idx >= len(arr):
                _grow(arr, idx, NAN)
            old = arr[idx]
            arr[idx] = ms if old != old else old + ms
            steps = self.steps.get(rank)
            if steps is None:
                steps = self.steps[rank] = RankSteps()
            steps.phase_bs(idx, bs)
            if phase == "decode":
                dg = steps.decode_graph
                if idx >= len(dg):
                    dg.extend(bytes(max(idx + 1 - len(dg), len(dg), 64)))
                dg[idx] = 2 if graph else 1
        self._spec_facts(phase, span, bs, b)

    def _spec_facts(self, phase: str, span: Span, bs: Any, b: Any = None) -> None:
        """A verify's accept length (by batch bucket ``b``) and the speculative settings."""
        if phase == "verify":
            if b is None:
                b = self._buckets.get(bs)
                if b is None:
                    b = self._buckets[bs] = bucket(bs)
            acc_len = accept_length(span)
            if acc_len is not None:
                a = self.accept.get(b)
                if a is None:
                    a = self.accept[b] = [0, 0.0]
                a[0] += 1
                a[1] += acc_len
            if not self.spec_settings:
                self._settings(span.attrs)
        elif phase == "draft" and not self.spec_settings:
            self._settings(span.attrs)

    def _settings(self, attrs: dict) -> None:
        for k in SPEC_SETTINGS:
            v = attrs.get(SPEC_PREFIX + k)
            if v is not None:
                self.spec_settings[k] = v

    def _add_other(self, span: Span) -> None:
        name = span.name
        if name == ENV:
            self._add_env(span)
            return
        if name == FINGERPRINT_SPAN:
            self.fingerprints.setdefault(self.rank_of(span), dict(span.attrs))
            return
        if name != STEP:
            self.unknown_names[name] += 1
            return
        bs, idx, rkey = step_fields(span)
        rank = self._rank(span, rkey)
        start, end = span.start_ns, span.end_ns
        if start and (self.t_min is None or start < self.t_min):
            self.t_min = start
        if end and (self.t_max is None or end > self.t_max):
            self.t_max = end
        if span.error:
            self.errors[name] += 1
        self.n_steps += 1
        if idx is None or not 0 <= idx <= MAX_STEP_INDEX:
            return
        steps = self.steps.get(rank)
        if steps is None:
            steps = self.steps[rank] = RankSteps()
        steps.put(idx, start, end, bs)
        traces = self.step_traces.get(rank[:3])
        if traces is None:
            traces = self.step_traces[rank[:3]] = {}
        if idx not in traces:
            traces[idx] = span.trace_id

    def _new_rank(self, rank: RankKey, span: Span) -> None:
        self.ranks.add(rank)
        if rank[0] not in self.runs:
            r = span.resource.attrs
            self.runs[rank[0]] = {"run_id": rank[0], "service": span.resource.service,
                                  "sglang_version": r.get(SGLANG_VERSION),
                                  "sgl_probe_version": r.get(PROBE_VERSION)}

    def _add_env(self, span: Span) -> None:
        a = span.attrs
        snap = {
            "point": a.get(SNAPSHOT_POINT),
            "time_ns": span.start_ns,
            "vars": {k[len(ENV_ATTR_PREFIX):]: v for k, v in a.items() if k.startswith(ENV_ATTR_PREFIX)},
            "launcher": {k[len(LAUNCHER_ENV_PREFIX):]: v for k, v in a.items() if k.startswith(LAUNCHER_ENV_PREFIX)},
            "differs_from_launcher": _list(a.get(ENV_DIFFERS)),
            "withheld": _list(a.get(ENV_WITHHELD)),
        }
        for k in (DIST_BACKEND, SNAPSHOT_TRIGGER):
            if k in a:
                snap[k.split(".", 1)[1]] = a[k]
        self.env.setdefault(self.rank_of(span), []).append(snap)

    # -- partial aggregators (parallel chunks) -----------------------------------------------
    def merge(self, other: "Aggregator") -> "Aggregator":
        """Fold in another partial aggregator (spans read elsewhere, e.g. by a worker process)."""
        assert not self._finished and not other._finished
        self.n_spans += other.n_spans
        self.n_steps += other.n_steps
        self.n_phase_spans += other.n_phase_spans
        self.unknown_names.update(other.unknown_names)
        self.errors.update(other.errors)
        self.timers.update(other.timers)
        for key, pair in other.shapes.items():
            _fold_pair(self.shapes, key, pair)
        for phase, pair in other.graph_launch.items():
            _fold_pair(self.graph_launch, phase, pair)
        for key, arr in other.by_step.items():
            mine = self.by_step.get(key)
            if mine is None:
                self.by_step[key] = arr
            else:
                ost = other.steps.get(key[0])
                _merge_dense(mine, arr, NAN, True, min(ost.lo, len(arr)) if ost is not None else 0)
        for rank, st in other.steps.items():
            mine = self.steps.get(rank)
            if mine is None:
                self.steps[rank] = st
            else:
                mine.merge(st)
        for key, traces in other.step_traces.items():
            mine = self.step_traces.setdefault(key, {})
            for idx, tid in traces.items():
                mine.setdefault(idx, tid)
        for b, (n, s) in other.accept.items():
            a = self.accept.setdefault(b, [0, 0.0])
            a[0] += n
            a[1] += s
        if not self.spec_settings:
            self.spec_settings = dict(other.spec_settings)
        for run, info in other.runs.items():
            self.runs.setdefault(run, info)
        self.ranks |= other.ranks
        for rank, snaps in other.env.items():
            self.env.setdefault(rank, []).extend(snaps)
        for rank, fp in other.fingerprints.items():
            self.fingerprints.setdefault(rank, fp)
        if other.t_min is not None and (self.t_min is None or other.t_min < self.t_min):
            self.t_min = other.t_min
        if other.t_max is not None and (self.t_max is None or other.t_max > self.t_max):
            self.t_max = other.t_max
        self._by_rank_phase = {}  # add() may follow (e.g. Jaeger's answer after the files)
        for (rank, phase), arr in self.by_step.items():
            self._by_rank_phase.setdefault(rank, {})[phase] = arr
        return self

    # -- after the last span ----------------------------------------------------------------
    def finish(self) -> "Aggregator":
        """Leave warm-up out, then fold the per-step arrays into step times, spec cycles and
        decode steps."""
        if self._finished:
            return self
        self._finished = True
        self._split_warmup()
        for rank, st in self.steps.items():
            phase_arrays = [(p, self.by_step[(rank, p)]) for p in PHASES if (rank, p) in self.by_step]
            warm = self.warmup_steps.get(rank, ())
            for idx in warm:  # the straggler view compares steady steps only, like everything else
                for _p, arr in phase_arrays:
                    if idx < len(arr):
                        arr[idx] = NAN
            step_ms = self.step_ms[rank] = array("d")
            eff = array("d", [NAN]) * len(st.start)
            prev_end = None
            starts, ends, sizes, dgraph = st.start, st.end, st.bs, st.decode_graph
            for idx in range(len(starts)):
                start = starts[idx]
                if not start:
                    continue
                end = ends[idx]
                # Overlap scheduling: step N may begin on the host while step N-1 still runs on
                # the device. Clip to the previous step's end so that time is not counted twice.
                if prev_end is not None and prev_end > start:
                    start = min(prev_end, end)
                prev_end = end
                dur = max(0, end - start) / 1e6
                if idx in warm:
                    self.warmup_step_ms += dur
                    continue
                eff[idx] = dur
                step_ms.append(dur)
                phases = {}
                for p, arr in phase_arrays:
                    if idx < len(arr):
                        v = arr[idx]
                        if v == v:
                            phases[p] = v
                if not phases:
                    continue
                other = max(0.0, dur - math.fsum(phases.values()))
                b = bucket(sizes[idx] if sizes[idx] != NO_BS else None)
                if "verify" in phases:
                    s = self.spec_steps.get(b)
                    if s is None:
                        s = self.spec_steps[b] = [array("d") for _ in range(4)]
                    s[0].append(phases.get("draft", 0.0))
                    s[1].append(phases["verify"])
                    s[2].append(phases.get("draft_extend", 0.0))
                    s[3].append(other)
                elif len(phases) == 1 and "decode" in phases:
                    key = (idx < len(dgraph) and dgraph[idx] == 2, b)
                    d = self.decode_steps.get(key)
                    if d is None:
                        d = self.decode_steps[key] = [array("d"), array("d")]
                    d[0].append(phases["decode"])
                    d[1].append(other)
            self.by_step[(rank, "step")] = eff
        for run in self.runs.values():
            run["ranks"] = sum(1 for r in self.ranks if r[0] == run["run_id"])
        return self

    def _split_warmup(self) -> None:
        """Each shape's first call (lowest step index) is warm-up when :func:`is_warmup` says so
        against the median of the shape's other calls (a shape called once: the other calls of
        its phase and graph flag on that rank that are not a shape's first). Fills ``groups``
        with the steady calls, ``warmup_groups`` and ``warmup_steps``."""
        shapes: dict[tuple, tuple[array, array]] = {}
        for key, (vals, idxs) in self.shapes.items():
            phase, graph, start, reason = key[0], key[1], key[7], key[8]
            if start is not None:
                self.starts[(phase, start)] = self.starts.get((phase, start), 0) + len(vals)
            if not graph:
                self.no_graph[(phase, reason)] = self.no_graph.get((phase, reason), 0) + len(vals)
            _fold_pair(shapes, key[:7], (vals, idxs))
        self.shapes = shapes
        firsts = {key: idxs.index(min(idxs)) for key, (_v, idxs) in shapes.items()}
        # Shapes called once compare with their (phase, graph, rank)'s other calls; collected
        # only where such a call is slow enough to be a candidate at all.
        fallback = {(k[0], k[1], k[3]): [] for k, (vals, _i) in shapes.items()
                    if len(vals) == 1 and vals[0] >= WARMUP_MIN_MS}
        if fallback:
            for k, (vals, _i) in shapes.items():
                got = fallback.get((k[0], k[1], k[3]))
                if got is not None and len(vals) > 1:
                    pos = firsts[k]
                    got += vals[:pos]
                    got += vals[pos + 1:]
        fallback_ref = {k: median(v) for k, v in fallback.items()}

        for key in list(shapes):
            vals, idxs = shapes.pop(key)  # freed as the groups grow: no second copy at the peak
            gkey = key[:4]
            steady = self.groups.get(gkey)
            if steady is None:
                steady = self.groups[gkey] = array("d")
            pos = firsts[key]
            first = vals[pos]
            # is_warmup needs the call >= WARMUP_MIN_MS over a median >= 0: most shapes end here.
            if first >= WARMUP_MIN_MS:
                rest = vals[:pos] + vals[pos + 1:]
                ref = median(rest) if rest else fallback_ref[(key[0], key[1], key[3])]
                if is_warmup(first, ref if ref == ref else None):
                    steady.extend(rest)
                    self.warmup_groups.setdefault(gkey, array("d")).append(first)
                    if idxs[pos] != NO_IDX:
                        self.warmup_steps.setdefault(key[3], set()).add(idxs[pos])
                    continue
            steady.extend(vals)

    def warmup(self) -> dict:
        """What was left out as warm-up: calls, steps, time, per phase."""
        by_phase: dict[str, int] = {}
        for (phase, _g, _b, _r), arr in self.warmup_groups.items():
            by_phase[phase] = by_phase.get(phase, 0) + len(arr)
        return {"calls": sum(by_phase.values()), "steps": sum(len(v) for v in self.warmup_steps.values()),
                "calls_ms": math.fsum(math.fsum(a) for a in self.warmup_groups.values()),
                "steps_ms": self.warmup_step_ms, "by_phase": by_phase}

    # -- queries --------------------------------------------------------------------------------
    def values(self, phase: Optional[str] = None, graph: Optional[bool] = None,
               bkt: Optional[str] = None, rank: Optional[RankKey] = None) -> array:
        out = array("d")
        for (p, g, b, r), arr in self.groups.items():
            if (phase is None or p == phase) and (graph is None or g == graph) \
                    and (bkt is None or b == bkt) and (rank is None or r == rank):
                out.extend(arr)
        return out

    def step_total_ms(self, rank: Optional[RankKey] = None) -> float:
        if rank is not None:
            return math.fsum(self.step_ms.get(rank, ()))
        return math.fsum(math.fsum(a) for a in self.step_ms.values())

    def label(self, rank: RankKey) -> str:
        """``tp1``; ``dp1/tp0`` with data parallelism; ``run2/tp0`` when several runs are read."""
        if self._labels is None:
            runs = sorted({r[0] for r in self.ranks})
            self._labels = {"runs": {run: i + 1 for i, run in enumerate(runs)},
                            "dp": len({r[1] for r in self.ranks}) > 1,
                            "pp": len({r[2] for r in self.ranks}) > 1}
        ctx = self._labels
        run, dp, pp, tp, pid = rank
        parts = []
        if len(ctx["runs"]) > 1:
            parts.append(f"run{ctx['runs'].get(run, '?')}")
        if ctx["dp"] or dp not in (0, None):
            parts.append(f"dp{dp}")
        if ctx["pp"] or pp not in (0, None):
            parts.append(f"pp{pp}")
        parts.append(f"tp{tp}" if tp is not None else f"pid{pid}")
        return "/".join(parts)

    @staticmethod
    def rank_sort_key(rank: RankKey) -> tuple:
        return tuple((0, v) if isinstance(v, int) else (1, str(v)) for v in rank)

    def tau(self, bkt: Optional[str] = None) -> tuple[int, float]:
        """(verify spans with an accept length, mean accept length)."""
        items = [v for b, v in self.accept.items() if bkt is None or b == bkt]
        n = sum(v[0] for v in items)
        return n, (sum(v[1] for v in items) / n if n else NAN)
