"""The hot path: what a wrapped SGLang call costs while the server runs.

On entry: read a few attributes, take the clock, start the timer. On exit: stop the timer and
append; a phase that ran without a graph also reads why from SGLang's objects
(:mod:`sgl_probe.no_graph`), which a phase with a graph never pays for. Resolution (waiting for GPU events), span building and export happen on the drain thread
(:mod:`sgl_probe.export`); nothing here blocks, syncs the device or does I/O.

The wrapped methods are built here (``Recorder.step_method`` and friends), as plain functions that
replace the originals in their classes. Between two scheduler steps SGLang issues hundreds of
kernel launches, which evict the probe's code and data from the CPU caches, so on a launch-bound
GPU loop what a step costs the probe is roughly its number of Python calls times a cache-cold
call: on the H200 host a wrapt layer cost ~4 µs per step there and a plain function under 1 µs,
and the probe's own code ~5x what it costs in a warm micro-loop (BENCHMARKS.md). Hence one
closure per role with the bookkeeping inline, readers that build their result in C, and no
per-step objects beyond the two records.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Optional

from sgl_probe import hotpath, no_graph, readers

perf_counter_ns = time.perf_counter_ns


class PhaseRecord:
    __slots__ = ("phase", "mode", "batch_size", "num_tokens", "host0", "host1", "t_start", "t_end",
                 "graph", "graph_hook", "launch_ns", "no_graph_reason", "error", "accept_length", "target")

    def __init__(self, facts: readers.Facts, target: str, host0: int, t_start: Any) -> None:
        self.phase, self.mode, self.batch_size, self.num_tokens = facts
        self.target = target
        self.host0 = host0
        self.host1 = host0
        self.t_start = t_start
        self.t_end = None
        self.graph: Optional[bool] = None  # from the call's result, when SGLang reports it
        self.graph_hook = False  # a graph-replay target ran inside this call
        self.launch_ns = 0  # host clock at the first CUDA graph launch inside this call (0: none)
        self.no_graph_reason: Optional[str] = None  # contract.NO_GRAPH_REASONS, when no graph ran
        self.error: Optional[BaseException] = None
        self.accept_length: Optional[float] = None


class StepRecord:
    __slots__ = ("index", "mode", "batch_size", "num_tokens", "host0", "host1", "phases", "error")

    def __init__(self, index: int, facts: readers.Facts, host0: int) -> None:
        self.index = index
        _, self.mode, self.batch_size, self.num_tokens = facts
        self.host0 = host0
        self.host1 = host0
        self.phases: list[PhaseRecord] = []
        self.error: Optional[BaseException] = None


class _ThreadState(threading.local):
    """``cur``: [open step, open phase] of this thread, one list so that a wrapped call reads the
    thread-local once (each read of a ``threading.local`` attribute costs a dict look-up of the
    thread's state) and works on the list after."""

    def __init__(self) -> None:
        self.cur: list = [None, None]

    @property
    def step(self) -> Optional[StepRecord]:
        return self.cur[0]

    @step.setter
    def step(self, st: Optional[StepRecord]) -> None:
        self.cur[0] = st

    @property
    def phase(self) -> Optional[PhaseRecord]:
        return self.cur[1]

    @phase.setter
    def phase(self, ph: Optional[PhaseRecord]) -> None:
        self.cur[1] = ph


class Recorder:
    """Per-process recording state. One scheduler thread drives it; the drain thread consumes."""

    # Slots for what the C wrappers read (and the step count they write) on every step: a slot is
    # read at a fixed offset in the object, the attribute machinery takes a few cache-cold
    # look-ups (sgl_probe._hot's attr_at). Everything else stays in the instance dict.
    __slots__ = ("timer", "step_count", "max_pending", "__dict__", "__weakref__")

    def __init__(self, timer_choice: str, max_pending: int, log, hot: str = "auto", hold_s: float = 1.0,
                 gpu_every_ms: float = 0.0) -> None:
        self._timer_choice = timer_choice
        self._gpu_every_ns = int(gpu_every_ms * 1e6)  # the CUDA timer's step sampling (CudaTimer)
        self._hold_s = hold_s  # seconds between two drain passes: the CUDA timer sizes its stock by it
        self._log = log
        # The C versions of step_method / phase_method and of the CUDA timer's start / stop, or None
        # (sgl_probe.hotpath).
        self.c = hotpath.load(hot)
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

    @property
    def hotpath(self) -> str:
        """Which hot path this recorder's wrappers run: ``c`` or ``python``."""
        return hotpath.name(self.c)

    def reset_after_fork(self) -> None:
        # In place: the wrapped methods hold these objects. The forking thread is the only one
        # left in the child, so clearing its slots clears the thread-local state.
        self.tls.cur[:] = [None, None]
        self.steps.clear()
        self.awaiting_accept.clear()
        self.timer = None

    def ensure_timer(self) -> Any:
        if self.timer is None:
            from sgl_probe.timing import make_timer

            self.timer = make_timer(self._timer_choice, self._log, self.c, self._hold_s, self.max_pending,
                                    self._gpu_every_ns)
        return self.timer

    def drop(self, st: StepRecord) -> None:
        """A finished step with no room left in the queue (the drain thread is behind)."""
        self.dropped_steps += 1
        for ph in st.phases:
            self.timer.release(ph.t_start, ph.t_end)

    # -- the wrapped methods, one shape per role ------------------------------------------------
    # Each takes the hook (whose ``fail`` logs once and disables it) and the original function,
    # and returns the replacement. The original runs exactly once, with its own arguments; its
    # exceptions propagate unchanged; the probe's own work sits in ``try`` blocks.

    def step_method(self, hook, orig: Callable) -> Callable:
        """A scheduler iteration: the parent of the phases called inside it."""
        rec, tls, steps, spec = self, self.tls, self.steps, self.spec
        target = hook.target
        read = readers.ENTER[target.reader]
        if self.c is not None:
            return self.c.StepHook(rec, tls, steps, spec, hook, target, read, orig, globals(), *readers.c_reader(target))

        def step(obj, *args, **kwargs):
            cur = tls.cur
            if cur[0] is not None or not hook.enabled:
                return orig(obj, *args, **kwargs)
            try:
                if rec.timer is None:
                    rec.ensure_timer()
                index = rec.step_count = rec.step_count + 1
                st = StepRecord(index, read(target, args, kwargs, spec), perf_counter_ns())
            except Exception as exc:
                hook.fail(exc)
                return orig(obj, *args, **kwargs)
            cur[0] = st
            try:
                # Without keywords (how SGLang calls it) no dict is copied for the call.
                return orig(obj, *args, **kwargs) if kwargs else orig(obj, *args)
            except BaseException as exc:
                st.error = exc
                raise
            finally:
                cur[0] = cur[1] = None
                try:
                    st.host1 = perf_counter_ns()
                    # A step with nothing timed (e.g. an idle batch) is not worth a span.
                    if st.phases or st.error is not None:
                        if len(steps) < rec.max_pending:
                            steps.append(st)
                        else:
                            rec.drop(st)
                except Exception as exc:
                    hook.fail(exc)

        return step

    def phase_method(self, hook, orig: Callable) -> Callable:
        """A timed call inside a step (decode, extend, draft, verify, draft-extend)."""
        rec, tls, spec, awaiting = self, self.tls, self.spec, self.awaiting_accept
        target = hook.target
        name = target.name
        read = readers.ENTER[target.reader]
        leave = readers.LEAVE.get(target.reader)
        # SGLang's result objects carry the flag as an attribute: read it here, the reader only
        # when it is not there.
        leave_attr = leave is readers.result_graph_attr
        why = no_graph.reason_for(target.runner)
        if self.c is not None:
            return self.c.PhaseHook(rec, tls, awaiting, spec, hook, target, name, read, leave, leave_attr, why, orig,
                                    globals(), *readers.c_reader(target))

        def phase(obj, *args, **kwargs):
            cur = tls.cur
            st = cur[0]
            # Outside a scheduler step (startup warmup, graph capture) or nested inside another
            # phase (verify -> target forward): not a phase of its own.
            if st is None or cur[1] is not None or not hook.enabled:
                return orig(obj, *args, **kwargs)
            ph = None
            try:
                facts = read(target, args, kwargs, spec)
                if facts[0] is not None:
                    now = perf_counter_ns()
                    # (the step's index at its first phase: the CUDA timer decides per step)
                    ph = PhaseRecord(facts, name, now, rec.timer.start(now, None if st.phases else st.index))
            except Exception as exc:
                hook.fail(exc)
            if ph is None:
                return orig(obj, *args, **kwargs)
            cur[1] = ph
            try:
                result = orig(obj, *args, **kwargs) if kwargs else orig(obj, *args)
            except BaseException as exc:
                cur[1] = None
                try:
                    rec.close_phase(st, ph, exc)
                except Exception as inner:
                    hook.fail(inner)
                raise
            cur[1] = None
            try:
                now = perf_counter_ns()
                t_end = ph.t_end = rec.timer.stop(ph.t_start, now)
                if t_end is None:  # a graph was being captured: nothing recorded, nothing to report
                    return result
                ph.host1 = now
                st.phases.append(ph)
                # The graph flag as the span builder reads it: SGLang's own report from the result
                # wins, else whether a graph-replay target ran. Only a graph-less phase pays for
                # asking why.
                if leave is not None:
                    graph = getattr(result, "can_run_cuda_graph", None) if leave_attr else None
                    if graph.__class__ is not bool:
                        graph = leave(result)
                    ph.graph = graph
                    if not graph and (graph is False or not ph.graph_hook):
                        ph.no_graph_reason = why(obj, facts[1], facts[2])
                elif not ph.graph_hook:
                    ph.no_graph_reason = why(obj, facts[1], facts[2])
                if facts[0] == "verify":
                    awaiting.append(ph)
            except Exception as exc:
                hook.fail(exc)
            return result

        return phase

    def close_phase(self, st: StepRecord, ph: PhaseRecord, error: BaseException) -> None:
        """A phase whose call raised: its events are kept (and released later), the error noted."""
        now = perf_counter_ns()
        ph.t_end = self.timer.stop(ph.t_start, now)
        ph.host1 = now
        ph.error = error
        if ph.t_end is not None:  # else a graph capture: nothing recorded
            st.phases.append(ph)

    def graph_method(self, hook, orig: Callable) -> Callable:
        """A graph replay: marks the open phase as having run a captured graph."""
        tls = self.tls
        if self.c is not None:
            return self.c.MarkHook(tls, hook, orig, "graph", globals())

        def graph(obj, *args, **kwargs):
            ph = tls.cur[1]
            if ph is not None:
                ph.graph_hook = True
            return orig(obj, *args, **kwargs) if kwargs else orig(obj, *args)

        return graph

    def launch_method(self, hook, orig: Callable) -> Callable:
        """torch's ``CUDAGraph.replay``: the host clock at the open phase's first graph launch.
        SGLang's runners prepare the graph's inputs on the host before it (tens to hundreds of
        microseconds), so this, not the runner's entry, is where the graph's GPU time starts."""
        tls = self.tls
        if self.c is not None:
            return self.c.MarkHook(tls, hook, orig, "launch", globals())

        def launch(obj, *args, **kwargs):
            ph = tls.cur[1]
            if ph is not None and not ph.launch_ns and hook.enabled:
                ph.launch_ns = perf_counter_ns()
            return orig(obj, *args, **kwargs) if kwargs else orig(obj, *args)

        return launch

    def accept_method(self, hook, orig: Callable) -> Callable:
        """SGLang's accept-length sink (``update_spec_metrics``), read after it returned (the counts
        are final by then).

        SGLang calls it once per verified decode batch, from the batch's result processing, in
        launch order: right after the step, or one step later under the overlap scheduler. So
        the oldest verify still waiting is the one being reported. A waiting verify whose batch
        size differs was never reported (SGLang skipped it, e.g. an idle or aborted batch): it
        is dropped and the next one is tried, so one skip cannot shift every later pairing.
        Runs on the scheduler thread, as do the phases; the drain thread only reads
        ``accept_length`` (waiting up to 2 s for it)."""
        waiting = self.awaiting_accept
        read = readers.accept_length

        def accept(obj, *args, **kwargs):
            result = orig(obj, *args, **kwargs)
            if waiting and hook.enabled:  # nothing waiting (no spec decoding): nothing to read
                try:
                    got = read(args, kwargs)
                    if got is not None:
                        bs, length = got
                        while waiting:
                            ph = waiting.popleft()
                            if ph.batch_size in (None, bs):
                                ph.accept_length = length
                                break
                except Exception as exc:
                    hook.fail(exc)
            return result

        return accept
