"""Records -> resolved steps: the only part of the export that needs the timer (and so CUDA).

Runs on the drain thread of the process that recorded the step. Once a step is resolved it is
plain data (:mod:`sgl_probe.resolved`) and can go to the summary, the metrics and, over a pipe,
to the exporter process.
"""

from __future__ import annotations

from typing import Any, Optional

from sgl_probe.recorder import PhaseRecord, StepRecord
from sgl_probe.resolved import ResolvedPhase, ResolvedStep

#: How long a verify may wait for SGLang's accept-length sink, which may run a step later.
ACCEPT_WAIT_NS = 2_000_000_000


def graph_used(ph: PhaseRecord) -> bool:
    """SGLang's own report from the call's result wins; else whether a graph-replay target ran."""
    return bool(ph.graph if ph.graph is not None else ph.graph_hook)


def error_text(error: Optional[BaseException]) -> Optional[str]:
    return None if error is None else f"{type(error).__name__}: {error}"


def step_ready(st: StepRecord, timer: Any, now_ns: int) -> bool:
    """Every timer of the step has completed (and a verify has its accept length, or gave up)."""
    for ph in st.phases:
        if ph.t_end is not None and not timer.ready(ph.t_start, ph.t_end):
            return False
        if ph.phase == "verify" and ph.accept_length is None and ph.error is None \
                and now_ns - st.host1 < ACCEPT_WAIT_NS:
            return False
    return True


def resolve_step(st: StepRecord, timer: Any) -> ResolvedStep:
    """The step as plain data; its timers must have completed (:func:`step_ready`). The timer's
    events are not released here (the caller does, whatever happens)."""
    interval = timer.interval
    start_kind = getattr(timer, "start_kind", None)
    lo = hi = None
    phases = []
    for ph in st.phases:
        if ph.t_end is None:
            continue
        t0, t1 = interval(ph.t_start, ph.t_end)
        if lo is None or t0 < lo:
            lo = t0
        if hi is None or t1 > hi:
            hi = t1
        graph = bool(ph.graph if ph.graph is not None else ph.graph_hook)  # graph_used, inline
        phases.append(ResolvedPhase(
            ph.phase, t0, t1, graph, ph.mode, ph.batch_size, ph.num_tokens, (ph.host1 - ph.host0) / 1e6,
            ph.target, ph.accept_length,
            start_kind(ph.t_start) if start_kind is not None else None,
            None if graph else getattr(ph, "no_graph_reason", None),
            None if ph.error is None else error_text(ph.error)))
    w0, w1 = timer.wall(st.host0), timer.wall(st.host1)
    return ResolvedStep(
        st.index, w0 if lo is None or w0 < lo else lo, w1 if hi is None or w1 > hi else hi,
        st.mode, st.batch_size, st.num_tokens, (st.host1 - st.host0) / 1e6, timer.kind, tuple(phases),
        error_text(st.error))


def release_step(st: StepRecord, timer: Any) -> None:
    for ph in st.phases:
        timer.release(ph.t_start, ph.t_end)
