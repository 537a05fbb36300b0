"""The hot path: what a wrapped SGLang call costs while the server runs.

On entry: read a few attributes, take the clock, start the timer. On exit: stop the timer and
append. Resolution (waiting for GPU events), span building and export happen on the drain thread
(:mod:`sgl_probe.export`); nothing here blocks, syncs the device or does I/O.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Optional

from sgl_probe import readers

perf_counter_ns = time.perf_counter_ns


class PhaseRecord:
    __slots__ = ("phase", "mode", "batch_size", "num_tokens", "host0", "host1", "t_start", "t_end",
                 "graph", "graph_hook", "error", "accept_length", "target")

    def __init__(self, facts: readers.Facts, target: str, host0: int, t_start: Any) -> None:
        self.phase = facts.phase
        self.mode = facts.mode
        self.batch_size = facts.batch_size
        self.num_tokens = facts.num_tokens
        self.target = target
        self.host0 = host0
        self.host1 = host0
        self.t_start = t_start
        self.t_end = None
        self.graph: Optional[bool] = None  # from the call's result, when SGLang reports it
        self.graph_hook = False  # a graph-replay target ran inside this call
        self.error: Optional[BaseException] = None
        self.accept_length: Optional[float] = None


class StepRecord:
    __slots__ = ("index", "mode", "batch_size", "num_tokens", "host0", "host1", "phases", "error",
                 "created")

    def __init__(self, index: int, facts: readers.Facts, host0: int) -> None:
        self.index = index
        self.mode = facts.mode
        self.batch_size = facts.batch_size
        self.num_tokens = facts.num_tokens
        self.host0 = host0
        self.host1 = host0
        self.phases: list[PhaseRecord] = []
        self.error: Optional[BaseException] = None
        self.created = host0


class _ThreadState(threading.local):
    step: Optional[StepRecord] = None
    phase: Optional[PhaseRecord] = None


class Recorder:
    """Per-process recording state. One scheduler thread drives it; the drain thread consumes."""

    def __init__(self, timer_choice: str, max_pending: int, log) -> None:
        self._timer_choice = timer_choice
        self._log = log
        self.max_pending = max_pending
        self.timer: Any = None
        self.tls = _ThreadState()
        self.steps: collections.deque[StepRecord] = collections.deque()
        # Verifies waiting for SGLang's accept-length sink, oldest first. Bounded: a version whose
        # sink is missing must not grow it forever (the oldest is dropped unreported).
        self.awaiting_accept: collections.deque[PhaseRecord] = collections.deque(maxlen=1024)
        self.step_count = 0
        self.dropped_steps = 0
        self.spec: dict = {}  # num_steps / topk / num_draft_tokens / algorithm, from server args

    def reset_after_fork(self) -> None:
        self.tls = _ThreadState()
        self.steps.clear()
        self.awaiting_accept.clear()
        self.timer = None

    # -- step -----------------------------------------------------------------------------
    def begin_step(self, target, args: tuple, kwargs: dict) -> StepRecord:
        if self.timer is None:
            from sgl_probe.timing import make_timer

            self.timer = make_timer(self._timer_choice, self._log)
        self.step_count += 1
        return StepRecord(self.step_count, readers.step(target, args, kwargs, self.spec), perf_counter_ns())

    def end_step(self, st: StepRecord) -> None:
        st.host1 = perf_counter_ns()
        if not st.phases and st.error is None:
            return  # nothing ran on the device (e.g. an idle batch): no span worth sending
        if len(self.steps) >= self.max_pending:
            self.dropped_steps += 1
            for ph in st.phases:
                self.timer.release(ph.t_start, ph.t_end)
            return
        self.steps.append(st)

    # -- phase ----------------------------------------------------------------------------
    def begin_phase(self, name: str, target, enter, args: tuple, kwargs: dict) -> Optional[PhaseRecord]:
        """``name`` is ``target.name``, computed once by the wrapper rather than on every call."""
        facts = enter(target, args, kwargs, self.spec)
        if facts.phase is None:
            return None
        now = perf_counter_ns()
        token = self.timer.start(now)
        if token is None:  # stream capture in progress: record nothing
            return None
        return PhaseRecord(facts, name, now, token)

    def end_phase(self, st: StepRecord, ph: PhaseRecord, leave, result: Any,
                  error: Optional[BaseException]) -> None:
        now = perf_counter_ns()
        ph.t_end = self.timer.stop(ph.t_start, now)
        ph.host1 = now
        st.phases.append(ph)
        if error is not None:
            ph.error = error
            return
        if leave is not None:
            ph.graph = leave(result)
        if ph.phase == "verify":
            self.awaiting_accept.append(ph)

    # -- accept-length sink ---------------------------------------------------------------
    def accept(self, args: tuple, kwargs: dict) -> None:
        """SGLang's accept-length sink (``update_spec_metrics``), called after the call returned.

        SGLang calls it once per verified decode batch, from the batch's result processing, in
        launch order: right after the step, or one step later under the overlap scheduler. So
        the oldest verify still waiting is the one being reported. A waiting verify whose batch
        size differs was never reported (SGLang skipped it, e.g. an idle or aborted batch): it
        is dropped and the next one is tried, so one skip cannot shift every later pairing.
        Runs on the scheduler thread, as does ``end_phase``; the drain thread only reads
        ``accept_length`` (waiting up to 2 s for it)."""
        got = readers.accept_length(args, kwargs)
        if got is None:
            return
        bs, length = got
        waiting = self.awaiting_accept
        while waiting:
            ph = waiting.popleft()
            if ph.batch_size in (None, bs):
                ph.accept_length = length
                return
