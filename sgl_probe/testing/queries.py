"""Queries on any list of received spans (what a Collector holds, or spans read elsewhere)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Optional

from sgl_probe.testing import fields, names
from sgl_probe.testing.receiver import ReceivedSpan
from sgl_probe.testing.snapshots import EnvSnapshot, EnvSnapshots

__all__ = ["env_snapshots", "phase_spans", "nccl_confirmations"]


def nccl_confirmations(spans: Iterable[ReceivedSpan], *, ranks: fields.Ranks = None, run_id: fields.RunFilter = None,
                       ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
    """``nccl.confirmed.<VAR>`` attributes per ``(pid, tp_rank)``, from any span or span event.

    Read generically: whichever span of a process carries them (its ``nccl_init`` snapshot or a
    span of its own), they are merged per process; the value is what the probe attached.
    """
    wanted = fields.rank_set(ranks)
    out: dict[tuple[Optional[int], Optional[int]], dict[str, Any]] = {}
    for span in sorted(fields.in_run(spans, run_id), key=lambda s: s.start_ns):
        found = fields.confirmed_in(span.attributes)
        for event in span.events:
            found.update(fields.confirmed_in(event.get("attributes") or {}))
        if not found:
            continue
        rank = fields.rank_of(span)
        if wanted is not None and rank not in wanted:
            continue
        out.setdefault((fields.pid_of(span), rank), {}).update(found)
    return out


def env_snapshots(spans: Iterable[ReceivedSpan], *, at: fields.Points = None,
                  ranks: fields.Ranks = None, run_id: fields.RunFilter = None) -> EnvSnapshots:
    """Decode every ``sgl_probe.env_snapshot`` span (optionally of one point, ranks or run)."""
    spans = fields.in_run(spans, run_id)
    points = fields.snapshot_points(at)
    wanted = fields.rank_set(ranks)
    confirmed_by_pid: dict[Optional[int], dict[str, Any]] = defaultdict(dict)
    for (pid, _rank_), values in nccl_confirmations(spans).items():
        confirmed_by_pid[pid].update(values)
    snaps = []
    for span in spans:
        if span.name != names.SNAPSHOT_SPAN:
            continue
        snap = EnvSnapshot.from_span(span, confirmed_by_pid.get(fields.pid_of(span)))
        if points is not None and snap.point not in points:
            continue
        if wanted is not None and snap.tp_rank not in wanted:
            continue
        snaps.append(snap)
    return EnvSnapshots(snaps)


def phase_spans(spans: Iterable[ReceivedSpan], phase: fields.Phases = None, *,
                ranks: fields.Ranks = None, run_id: fields.RunFilter = None, cuda_graph: Optional[bool] = None,
                since_ns: Optional[int] = None) -> list[ReceivedSpan]:
    """Phase spans (``sglang.decode``, ``.extend``, ``.draft``, ``.verify``, ``.draft_extend``).

    ``phase`` takes a name with or without the ``sglang.`` prefix, or several; ``cuda_graph``
    keeps only spans whose ``sglang.cuda_graph`` is that value; ``since_ns`` drops spans that
    started earlier (e.g. startup warmup, when given the time the load began)."""
    span_names = fields.phase_span_names(phase)
    wanted = fields.rank_set(ranks)
    out = []
    for s in fields.in_run(spans, run_id):
        if s.name not in span_names:
            continue
        if wanted is not None and fields.rank_of(s) not in wanted:
            continue
        if cuda_graph is not None and s.attributes.get(names.CUDA_GRAPH) is not cuda_graph:
            continue
        if since_ns is not None and s.start_ns < since_ns:
            continue
        out.append(s)
    return sorted(out, key=lambda s: s.start_ns)
