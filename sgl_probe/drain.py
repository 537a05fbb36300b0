"""Records -> resolved steps: the only part of the export that needs the timer (and so CUDA).

Runs on the drain thread of the process that recorded the step. Once a step is resolved it is
plain data (:mod:`sgl_probe.resolved`) and can go to the summary, the metrics and, over a pipe,
to the exporter process. The drain thread keeps it as a *row*: a plain tuple in
``ResolvedStep``'s field order, its phases plain tuples in ``ResolvedPhase``'s (``from_row``
names them): this runs for every step inside the server process, where building and pickling
the named forms cost several Python calls per step that plain tuples do in C.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Optional

from sgl_probe.contract import TIMER_HOST
from sgl_probe.recorder import PhaseRecord, StepRecord
from sgl_probe.resolved import ResolvedStep, from_row

log = logging.getLogger("sgl_probe")

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


def resolve_row(st: StepRecord, timer: Any) -> tuple:
    """The step as a row (see the module doc); its timers must have completed
    (:func:`step_ready`). The timer's events are not released here (the caller does, whatever
    happens)."""
    host = getattr(timer, "host_clock", False)
    untimed = getattr(timer, "untimed_steps", False)  # its int end tokens: steps left untimed
    offset = timer.offset if host else timer.wall(0)
    interval = timer.interval_kind
    kind_of_step = timer.kind
    lo = hi = None
    phases = []
    for ph in st.phases:
        t_end = ph.t_end
        if t_end is None:
            continue
        if host or (untimed and t_end.__class__ is int):  # (a CUDA timer's untimed step: host times)
            if not host:
                kind_of_step = TIMER_HOST
            t0 = ph.t_start + offset
            t1 = t_end + offset
            kind = None
        else:
            t0, t1, kind = interval(ph.t_start, t_end)
        if lo is None or t0 < lo:
            lo = t0
        if hi is None or t1 > hi:
            hi = t1
        graph = ph.graph
        graph = bool(graph if graph is not None else ph.graph_hook)  # graph_used, inline
        error = ph.error
        launch = ph.launch_ns
        if launch:
            # The GPU may still have been busy with earlier work when the graph was launched:
            # then the graph's time starts where the phase's does.
            launch += offset
            graph_ms = (t1 - (launch if launch > t0 else t0)) / 1e6
            if graph_ms < 0:
                graph_ms = 0.0
        else:
            graph_ms = None
        phases.append((
            ph.phase, t0, t1, graph, ph.mode, ph.batch_size, ph.num_tokens, (ph.host1 - ph.host0) / 1e6,
            ph.target, ph.accept_length, kind,
            None if graph else ph.no_graph_reason, None if error is None else error_text(error), graph_ms))
    if host:
        w0, w1 = st.host0 + offset, st.host1 + offset
    else:
        w0, w1 = timer.wall(st.host0), timer.wall(st.host1)
    error = st.error
    return (st.index, w0 if lo is None or w0 < lo else lo, w1 if hi is None or w1 > hi else hi,
            st.mode, st.batch_size, st.num_tokens, (st.host1 - st.host0) / 1e6, kind_of_step, tuple(phases),
            None if error is None else error_text(error))


def resolve_step(st: StepRecord, timer: Any) -> ResolvedStep:
    """:func:`resolve_row`, named."""
    return from_row(resolve_row(st, timer))


def release_step(st: StepRecord, timer: Any) -> None:
    for ph in st.phases:
        timer.release(ph.t_start, ph.t_end)


def _timers_done(steps: collections.deque, n: int, timer: Any) -> int:
    """How many of the first ``n`` steps have every timer completed. A timer that can tell
    completion for many ends at once (``ready_prefix``: the CUDA timer, one query per pass
    instead of one per phase) is asked so; any other phase by phase, in order."""
    prefix = getattr(timer, "ready_prefix", None)
    if prefix is None:
        ready = timer.ready
        for i, st in zip(range(n), steps):
            for ph in st.phases:
                if ph.t_end is not None and not ready(ph.t_start, ph.t_end):
                    return i
        return n
    ends: list = []
    owner: list = []
    for i, st in zip(range(n), steps):
        for ph in st.phases:
            # (an untimed step's host clock ends are ready once the timed steps before them are)
            if ph.t_end is not None and ph.t_end.__class__ is not int:
                ends.append(ph.t_end)
                owner.append(i)
    k = prefix(ends)
    return n if k == len(ends) else owner[k]


def _drop(st: StepRecord, exc: BaseException) -> None:
    log.debug("sgl-probe: dropping step %d: %r", st.index, exc)


def ready_steps(steps: collections.deque, n: int, timer: Any, now_ns: int) -> int:
    """How many of the first ``n`` steps may be taken before shutdown: those whose timers all
    completed, up to the first one that still waits (up to :data:`ACCEPT_WAIT_NS`) for SGLang's
    accept length."""
    if not getattr(timer, "host_clock", False):
        n = _timers_done(steps, n, timer)
    wait_from = now_ns - ACCEPT_WAIT_NS
    for i, st in zip(range(n), steps):
        if st.host1 <= wait_from:
            continue
        for ph in st.phases:  # a plain loop: this runs for every step
            if ph.phase == "verify" and ph.accept_length is None and ph.error is None:
                return i
    return n


def take_ready(steps: collections.deque, timer: Any, now_ns: int, final: bool, limit: int, out: list,
               packed: Any = None, summary: Any = None, metrics: Any = None, sampler: Any = None) -> int:
    """Move up to ``limit`` steps off the front of ``steps`` into ``out`` as rows, stopping at
    the first one not :func:`step_ready` (``final``: take them all). Every step taken has its
    events released; one that cannot be resolved (an event that never completed, at shutdown)
    is dropped with a debug line. Returns how many were taken.

    ``packed``: the packed pass (the C extension's ``PackedSteps``; every step exported, nothing
    else reads the rows): the steps the C wrappers recorded are written into that link message
    instead, not to ``out`` (which gets the rest as rows), and every step taken is added to
    ``summary`` (the :class:`~sgl_probe.summary.Summary`, or None) and ``metrics`` (the
    :class:`~sgl_probe.metrics.PhaseMetrics`, or None) here, in step order; ``sampler`` (the
    StepSampler of :meth:`~sgl_probe.sampling.StepSampling.c_state`, or None: every step goes)
    decides each step before it is written (one it drops is summed up, not written). Once the message is
    full (``packed.full``), the rest of the ``limit`` waits for the next call.

    :func:`step_ready` and :func:`release_step` inline, and nothing at all asked of a host-clock
    timer (always ready, nothing to release): this is the drain thread's per-step loop."""
    n = min(limit, len(steps))
    if not n:
        return 0
    host = getattr(timer, "host_clock", False)
    if not final:
        ready = getattr(timer, "ready_steps", None)  # the same checks in C (sgl_probe._hot.ready_steps)
        n = ready(steps, n, now_ns - ACCEPT_WAIT_NS) if ready is not None else ready_steps(steps, n, timer, now_ns)
    take = getattr(timer, "take_rows", None)
    # The C drain (sgl_probe._hot) first: the same loop, for the steps the C wrappers recorded.
    if take is None:
        taken = 0
    elif packed is None:
        taken = take(steps, n, out, error_text, _drop)
    else:
        sstate = None if summary is None else summary.c_state()
        mstate = None if metrics is None else metrics.c_state()
        taken = 0
        try:
            taken = take(steps, n, out, error_text, _drop, packed, sstate, mstate, sampler)
        finally:
            if mstate is not None:
                metrics.c_state_done(mstate, taken > 0)
        if packed.full:
            return taken
    first = len(out)
    for _ in range(n - taken):
        st = steps.popleft()
        try:
            out.append(resolve_row(st, timer))
        except Exception as exc:
            _drop(st, exc)
        finally:
            if not host:
                release_step(st, timer)
    if packed is not None and len(out) > first:
        if summary is not None:
            summary.add_rows(out[first:])
        if metrics is not None:
            metrics.observe_rows(out[first:])
    return n
