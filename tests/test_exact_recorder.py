"""The recorder's bookkeeping with exact expectations: which verify an accept-length report lands
on (late reports, skipped batches), how many steps a full queue drops, and which graph signal
wins when SGLang's own flag and the graph-replay hook disagree. Driven through the real wrapped
methods, with objects laid out as SGLang lays them out."""

from __future__ import annotations

import enum
import logging
from types import SimpleNamespace as NS

import pytest

from sgl_probe import config, targets
from sgl_probe.instrument import Hook
from sgl_probe.recorder import Recorder
from sgl_probe.timing import CpuTimer
from tests.hotpaths import both_hotpaths, recorder_hotpath  # noqa: F401  (every test: C and Python)

try:  # the one place the span builder and the summary read the graph flag from
    from sgl_probe.drain import graph_used
except ImportError:
    from sgl_probe.spans import graph_used

LOG = logging.getLogger("sgl_probe.test")


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    IDLE = 4


def _target(**match) -> targets.Target:
    return next(t for t in targets.TARGETS if all(getattr(t, k) == v for k, v in match.items()))


STEP = _target(role="step")
FORWARD = _target(reader="forward")
VERIFY_V2 = _target(reader="verify_v2")
VERIFY_V1 = _target(reader="verify_v1")
DRAFT = _target(role="phase", reader="spec_call", phases=("draft",), since="0.5.5")
ACCEPT = _target(role="accept", since="0.5.13")


class CountingTimer(CpuTimer):
    def __init__(self) -> None:
        super().__init__()
        self.released: list[tuple] = []

    def release(self, start, end) -> None:
        self.released.append((start, end))


class Rig:
    """One recorder with a step wrapper around a verify, a decode and a graph-replay call, and
    SGLang's accept-length sink, each wrapped by the recorder's own method."""

    def __init__(self, max_pending: int = 100, verify=VERIFY_V2) -> None:
        self.rec = Recorder("cpu", max_pending, LOG)
        self.rec.timer = self.timer = CountingTimer()
        self.hooks = {name: Hook(t) for name, t in
                      (("step", STEP), ("verify", verify), ("forward", FORWARD), ("accept", ACCEPT))}
        self.sink_calls: list[tuple] = []
        self.replay = self.rec.graph_method(Hook(_target(role="graph")), lambda obj: "replayed")

        def verify_body(worker, batch, result=None, replay=False):
            if replay:
                self.replay(None)
            return result

        def forward_body(worker, batch, result=None, replay=False):
            if replay:
                self.replay(None)
            return result

        self.verify = self.rec.phase_method(self.hooks["verify"], verify_body)
        self.forward = self.rec.phase_method(self.hooks["forward"], forward_body)
        self.step = self.rec.step_method(self.hooks["step"], lambda sched, batch, call: call())
        self.accept = self.rec.accept_method(
            self.hooks["accept"], lambda metrics, *a, **k: self.sink_calls.append((a, k)) or "sink-result")

    def verify_step(self, bs, result=None, replay=False):
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0] * bs if bs is not None else None)
        self.step(None, b, lambda: self.verify(None, b, result, replay))
        return self.rec.steps[-1].phases[-1]

    def decode_step(self, bs, result=None, replay=False):
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0] * bs)
        self.step(None, b, lambda: self.forward(None, b, result, replay))
        return self.rec.steps[-1].phases[-1]


# -- accept-length pairing ------------------------------------------------------------------------

def test_accept_report_right_after_each_step():
    rig = Rig()
    a = rig.verify_step(2)
    assert rig.accept(None, 2, 1, 5) == "sink-result"  # 0.5.23: (bs, correct drafts, accept tokens)
    b = rig.verify_step(4)
    rig.accept(None, 4, 6, 10)
    assert (a.accept_length, b.accept_length) == (2.5, 2.5)
    assert list(rig.rec.awaiting_accept) == []


def test_lagged_report_lands_on_the_oldest_waiting_verify():
    # The overlap scheduler reports step N while step N+1 already ran: two verifies wait.
    rig = Rig()
    a = rig.verify_step(2)
    b = rig.verify_step(3)
    assert list(rig.rec.awaiting_accept) == [a, b]
    rig.accept(None, 2, num_accept_tokens=7)
    assert (a.accept_length, b.accept_length) == (3.5, None)
    assert list(rig.rec.awaiting_accept) == [b]
    c = rig.verify_step(3)
    rig.accept(None, 3, num_accept_tokens=6)
    assert (b.accept_length, c.accept_length) == (2.0, None)
    rig.accept(None, 3, num_accept_tokens=12)
    assert c.accept_length == 4.0
    assert list(rig.rec.awaiting_accept) == []


def test_skipped_batch_is_dropped_and_later_pairings_stay_aligned():
    # SGLang never reported the bs=2 verify (an aborted batch): the bs=5 report skips it, and the
    # verifies after it pair one to one again.
    rig = Rig()
    skipped = rig.verify_step(2)
    a = rig.verify_step(5)
    b = rig.verify_step(2)
    rig.accept(None, 5, 10)  # 0.5.5-0.5.14: (bs, accepted drafts) -> (10 + 5) / 5
    assert (skipped.accept_length, a.accept_length, b.accept_length) == (None, 3.0, None)
    assert list(rig.rec.awaiting_accept) == [b]
    rig.accept(None, 2, 2)
    assert b.accept_length == 2.0
    assert list(rig.rec.awaiting_accept) == []


def test_report_matching_nothing_empties_the_queue_without_assigning():
    rig = Rig()
    a, b = rig.verify_step(2), rig.verify_step(3)
    rig.accept(None, 7, 7)
    assert (a.accept_length, b.accept_length) == (None, None)
    assert list(rig.rec.awaiting_accept) == []


def test_verify_of_unknown_batch_size_takes_any_report():
    rig = Rig()
    a = rig.verify_step(None)
    b = rig.verify_step(4)
    assert a.batch_size is None
    rig.accept(None, 4, 4)
    assert (a.accept_length, b.accept_length) == (2.0, None)
    rig.accept(None, 4, 0)
    assert b.accept_length == 1.0


@pytest.mark.parametrize("args,kwargs", [
    ((0, 3), {}),            # no requests: nothing to divide by
    (("2", 3), {}),          # not a count
    ((2,), {}),              # no accept count at all
    ((), {"bs": 2}),
])
def test_unreadable_report_leaves_the_waiting_verifies_alone(args, kwargs):
    rig = Rig()
    a = rig.verify_step(2)
    rig.accept(None, *args, **kwargs)
    assert a.accept_length is None and list(rig.rec.awaiting_accept) == [a]
    assert rig.sink_calls == [(args, kwargs)]  # SGLang's own sink ran with its own arguments
    assert rig.hooks["accept"].enabled


def test_keyword_spellings_of_the_sink():
    rig = Rig()
    a, b, c = rig.verify_step(2), rig.verify_step(2), rig.verify_step(2)
    rig.accept(None, bs=2, num_accepted_tokens=4)
    rig.accept(None, bs=2, num_correct_drafts=2)
    rig.accept(None, bs=2, num_correct_drafts=0, num_accept_tokens=8)
    assert (a.accept_length, b.accept_length, c.accept_length) == (3.0, 2.0, 4.0)


def test_only_verifies_wait_and_a_disabled_sink_reads_nothing():
    rig = Rig()
    rig.decode_step(2)
    assert list(rig.rec.awaiting_accept) == []
    rig.accept(None, 2, 2)  # nothing waiting: SGLang's call only
    assert rig.sink_calls == [((2, 2), {})]
    a = rig.verify_step(2)
    rig.hooks["accept"].enabled = False
    rig.accept(None, 2, 2)
    assert a.accept_length is None and list(rig.rec.awaiting_accept) == [a]


def test_waiting_verifies_are_bounded_oldest_dropped():
    rig = Rig(max_pending=10_000)
    made = [rig.verify_step(1) for _ in range(1030)]
    waiting = rig.rec.awaiting_accept
    assert len(waiting) == 1024 and waiting[0] is made[6] and waiting[-1] is made[-1]
    rig.accept(None, 1, 1)
    assert made[6].accept_length == 2.0 and made[5].accept_length is None


def test_a_raising_reader_disables_only_the_accept_hook(caplog):
    rig = Rig()
    a = rig.verify_step(2)

    class Odd(int):  # an int whose division fails inside the probe's reader
        def __rtruediv__(self, other):
            raise ZeroDivisionError("odd")

    with caplog.at_level(logging.ERROR, logger="sgl_probe"):
        assert rig.accept(None, Odd(2), num_accept_tokens=4) == "sink-result"
    assert not rig.hooks["accept"].enabled and rig.hooks["verify"].enabled
    assert a.accept_length is None
    assert sum("disabled after an internal error" in r.getMessage() for r in caplog.records) == 1


# -- the pending-step queue -----------------------------------------------------------------------

def test_full_queue_drops_exactly_the_overflow_and_releases_its_events():
    cfg = config.load({"SGL_PROBE_MAX_PENDING": "3"})
    assert cfg.max_pending == 3
    rig = Rig(max_pending=cfg.max_pending)
    made = [rig.decode_step(1) for _ in range(3)]
    assert rig.rec.dropped_steps == 0 and rig.timer.released == []
    for _ in range(4):
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
        rig.step(None, b, lambda: rig.forward(None, b))
    assert rig.rec.dropped_steps == 4
    assert len(rig.rec.steps) == 3 and [st.phases[0] for st in rig.rec.steps] == made
    assert len(rig.timer.released) == 4  # one per phase of each dropped step
    assert rig.rec.step_count == 7
    # Room again: the next step is kept, the count stays.
    rig.rec.steps.popleft()
    rig.decode_step(1)
    assert rig.rec.dropped_steps == 4 and len(rig.rec.steps) == 3


def test_steps_without_phases_neither_queue_nor_drop():
    rig = Rig(max_pending=1)
    idle = NS(forward_mode=ForwardMode.IDLE, seq_lens=[])
    for _ in range(3):
        rig.step(None, idle, lambda: rig.forward(None, idle))
    assert len(rig.rec.steps) == 0 and rig.rec.dropped_steps == 0 and rig.rec.step_count == 3


def test_a_raising_step_is_kept_with_its_error():
    rig = Rig(max_pending=1)
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])

    def boom():
        rig.forward(None, b)
        raise KeyError("sglang")

    with pytest.raises(KeyError):
        rig.step(None, b, boom)
    st = rig.rec.steps[-1]
    assert isinstance(st.error, KeyError) and len(st.phases) == 1 and st.phases[0].error is None
    assert rig.rec.tls.step is None and rig.rec.tls.phase is None


# -- which graph signal wins -----------------------------------------------------------------------

@pytest.mark.parametrize("flag,replay,want", [
    (False, True, False),   # SGLang says no graph although a replay target ran: SGLang wins
    (True, False, True),    # SGLang says graph though no replay target was seen: SGLang wins
    (None, True, True),     # no flag in the result: the replay hook decides
    (None, False, False),
])
def test_sglang_flag_wins_over_the_replay_hook(flag, replay, want):
    rig = Rig()
    result = NS(can_run_cuda_graph=flag) if flag is not None else NS()
    ph = rig.decode_step(2, result=result, replay=replay)
    assert ph.graph is flag and ph.graph_hook is replay
    assert graph_used(ph) is want
    # Only a phase that ran without a graph carries a reason (none known on this bare worker).
    assert (ph.no_graph_reason is None) is want
    if not want:
        assert ph.no_graph_reason == "unknown"


@pytest.mark.parametrize("flag,replay,want", [
    (False, True, False), (True, False, True), (None, True, True), (None, False, False)])
def test_v1_verify_tuple_flag_wins_over_the_replay_hook(flag, replay, want):
    rig = Rig(verify=VERIFY_V1)
    result = ("logits", "out", "batch", flag) if flag is not None else ("logits", "out", "batch")
    ph = rig.verify_step(2, result=result, replay=replay)
    assert ph.graph is flag and graph_used(ph) is want and ph.mode == "TARGET_VERIFY"


def test_replay_outside_a_phase_marks_nothing():
    rig = Rig()
    assert rig.replay(None) == "replayed"
    ph = rig.decode_step(2, result=NS())
    assert ph.graph_hook is False and ph.graph is None


# -- the graph's launch: where a graph phase's GPU time starts -----------------------------------------

LAUNCH = _target(role="graph_launch")


def test_graph_launch_notes_the_first_launch_of_the_open_phase_only(monkeypatch):
    from sgl_probe import recorder

    rig = Rig()
    clock = iter(range(1_000, 100_000, 1_000))
    monkeypatch.setattr(recorder, "perf_counter_ns", lambda: next(clock))
    calls = []
    launch = rig.rec.launch_method(Hook(LAUNCH), lambda graph, *a, **k: calls.append((graph, a, k)) or "launched")
    assert launch("g0") == "launched" and calls == [("g0", (), {})]  # outside a phase: noted nowhere
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0])

    def body(worker, batch):
        assert launch("g1") == "launched"
        assert launch("g2", 7, k=1) == "launched"  # a second graph (breakable graphs): not the start
        assert launch("g3", 8) == "launched"
        return NS(can_run_cuda_graph=True)

    forward = rig.rec.phase_method(Hook(FORWARD), body)
    rig.step(None, b, lambda: forward(None, b))
    ph = rig.rec.steps[-1].phases[-1]
    # step entry 1000, phase entry 2000, first launch 3000, phase end 4000 ...
    assert (ph.host0, ph.launch_ns) == (2_000, 3_000)
    assert calls[1:] == [("g1", (), {}), ("g2", (7,), {"k": 1}), ("g3", (8,), {})]
    rig.decode_step(2, result=NS(can_run_cuda_graph=False))
    assert rig.rec.steps[-1].phases[-1].launch_ns == 0  # no launch in that phase
    off = Hook(LAUNCH)
    off.enabled = False
    quiet = rig.rec.launch_method(off, lambda graph: "launched")
    forward = rig.rec.phase_method(Hook(FORWARD), lambda worker, batch: quiet("g") and NS())
    rig.step(None, b, lambda: forward(None, b))
    assert rig.rec.steps[-1].phases[-1].launch_ns == 0


@pytest.mark.parametrize("launch,t0,want_ms", [
    (0, 10, None),             # no graph launched: no attribute
    (13, 10, 0.000002),        # launched 3 ns after the GPU start: from the launch to the end (15)
    (7, 10, 0.000005),         # the GPU was still busy at the launch: from the phase's start
    (40, 10, 0.0),             # a launch mapped after the end (clock noise) is clamped
])
def test_graph_ms_runs_from_the_launch_or_the_gpu_start_whichever_is_later(launch, t0, want_ms):
    drain = _drain()
    timer = TokenTimer()
    st = _step_with(timer, ("decode", True))
    st.phases[0].launch_ns = launch
    (ph,) = drain.resolve_step(st, timer).phases
    assert (ph.start_ns, ph.end_ns) == (t0, 15) and ph.graph_ms == want_ms


def test_graph_ms_of_a_gpu_timer_maps_the_launch_through_its_wall_clock():
    """The launch is a host-clock reading: a GPU timer maps it with ``wall``, as it maps a
    host-clock start (its ``offset`` is not used)."""
    drain = _drain()

    class Shifted(TokenTimer):
        offset = 5

        def interval_kind(self, start, end):
            return 1_000 + start[1] * 10, 1_000 + end[1] * 10 + 5, None

        def wall(self, host_ns):
            return host_ns + 1_000

    timer = Shifted()
    st = _step_with(timer, ("decode", True))
    st.phases[0].launch_ns = 12  # wall 1012; the phase runs 1010 .. 1015
    (ph,) = drain.resolve_step(st, timer).phases
    assert ph.graph_ms == 0.000003


def test_graph_ms_of_a_host_clock_timer_maps_the_launch_with_its_offset():
    drain = _drain()
    timer = CpuTimer()
    st = _step_with(timer, ("decode", True))
    st.phases[0].t_start, st.phases[0].t_end = 100, 1_100_100
    st.phases[0].launch_ns = 100_100
    (ph,) = drain.resolve_step(st, timer).phases
    assert ph.graph_ms == 1.0 and ph.start_ns == 100 + timer.offset


# -- the timer's tokens: what is stopped, checked and released ---------------------------------------

class TokenTimer:
    """Each start hands out a fresh token; the test says which intervals are ready."""

    kind = "gpu-ish"

    def __init__(self) -> None:
        self.n = 0
        self.stops: list[tuple] = []
        self.released: list[tuple] = []
        self.not_ready: set = set()
        self.asked: list[tuple] = []

    def start(self, now, first=True):
        self.n += 1
        return ("start", self.n)

    def stop(self, token, now):
        self.stops.append((token, now))
        return ("end", token[1])

    def ready(self, start, end):
        self.asked.append((start, end))
        return start not in self.not_ready

    def release(self, start, end):
        self.released.append((start, end))

    def interval_kind(self, start, end):
        return start[1] * 10, end[1] * 10 + 5, None

    def wall(self, host_ns):
        return host_ns


def test_dropped_steps_release_exactly_their_own_events():
    rig = Rig(max_pending=1)
    rig.rec.timer = timer = TokenTimer()
    rig.decode_step(1)
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    rig.step(None, b, lambda: (rig.forward(None, b), rig.forward(None, b)))
    assert rig.rec.dropped_steps == 1
    # Both phases of the dropped step; the kept step's events stay held for the drain.
    assert timer.released == [(("start", 2), ("end", 2)), (("start", 3), ("end", 3))]


def test_a_raising_phase_is_closed_with_its_own_token_and_time():
    rig = Rig()
    rig.rec.timer = timer = TokenTimer()
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0])

    def raising(worker, batch):
        raise ValueError("inside SGLang")

    phase = rig.rec.phase_method(rig.hooks["forward"], raising)
    with pytest.raises(ValueError):
        rig.step(None, b, lambda: phase(None, b))
    ph = rig.rec.steps[-1].phases[0]
    (token, now), = timer.stops
    assert token == ("start", 1) and ph.t_end == ("end", 1) and ph.host1 == now >= ph.host0
    assert isinstance(ph.error, ValueError) and ph.no_graph_reason is None
    assert rig.rec.tls.phase is None


def test_reset_after_fork_clears_in_place():
    rig = Rig()
    a = rig.verify_step(2)
    steps, waiting = rig.rec.steps, rig.rec.awaiting_accept
    rig.rec.tls.step, rig.rec.tls.phase = "s", a
    rig.rec.reset_after_fork()
    assert rig.rec.steps is steps and rig.rec.awaiting_accept is waiting  # the wrappers hold these
    assert len(steps) == 0 and len(waiting) == 0
    assert rig.rec.tls.step is None and rig.rec.tls.phase is None and rig.rec.timer is None
    rig.decode_step(1)  # works again: a fresh timer on the next step
    assert rig.rec.timer is not None and len(rig.rec.steps) == 1


def test_timer_is_made_from_the_configured_choice(caplog):
    rec = Recorder("cpu", 4, LOG)
    assert rec.ensure_timer().kind == "cpu" and rec.ensure_timer() is rec.timer
    rec = Recorder("cuda", 4, logging.getLogger("sgl_probe.test.cuda"))
    with caplog.at_level(logging.WARNING, logger="sgl_probe.test.cuda"):
        timer = rec.ensure_timer()
    if timer.kind == "cpu":  # no CUDA here: the recorder's own logger says so
        assert [r.name for r in caplog.records] == ["sgl_probe.test.cuda"]


# -- the drain side: when a step is ready, what is released ------------------------------------------

def _drain():
    from sgl_probe import drain

    return drain


def _step_with(timer, *phases):
    from sgl_probe.readers import Facts
    from sgl_probe.recorder import PhaseRecord, StepRecord

    st = StepRecord(1, Facts("step", "DECODE", 2, 2), 0)
    st.host1 = 1_000
    for name, done in phases:
        ph = PhaseRecord(Facts(name, "DECODE", 2, 2), "t", 0, timer.start(0))
        if done:
            ph.t_end = timer.stop(ph.t_start, 1)
        st.phases.append(ph)
    return st


def test_step_ready_waits_for_every_timer_and_the_accept_length():
    drain = _drain()
    timer = TokenTimer()
    st = _step_with(timer, ("decode", True), ("draft", True))
    assert drain.step_ready(st, timer, 1_000) is True
    assert timer.asked == [(("start", 1), ("end", 1)), (("start", 2), ("end", 2))]
    timer.not_ready.add(("start", 2))
    assert drain.step_ready(st, timer, 1_000) is False
    timer.asked.clear()
    st = _step_with(timer, ("decode", False))  # never stopped (e.g. capture): nothing to wait for
    assert drain.step_ready(st, timer, 1_000) is True and timer.asked == []
    st = _step_with(timer, ("verify", True))
    wait = drain.ACCEPT_WAIT_NS
    assert drain.step_ready(st, timer, st.host1 + wait - 1) is False  # SGLang may report a step late
    assert drain.step_ready(st, timer, st.host1 + wait) is True       # ... but not forever
    st.phases[0].accept_length = 2.0
    assert drain.step_ready(st, timer, st.host1) is True
    st.phases[0].accept_length = None
    st.phases[0].error = RuntimeError("x")  # a verify that raised gets no report
    assert drain.step_ready(st, timer, st.host1) is True
    st = _step_with(timer, ("draft", True))  # only verifies wait for a report
    assert drain.step_ready(st, timer, st.host1) is True


def test_release_step_releases_each_phase_once():
    drain = _drain()
    timer = TokenTimer()
    st = _step_with(timer, ("decode", True), ("draft", False))
    drain.release_step(st, timer)
    assert timer.released == [(("start", 1), ("end", 1)), (("start", 2), None)]



def test_take_ready_resolves_in_order_and_releases_every_step_it_takes():
    import collections

    drain = _drain()
    timer = TokenTimer()
    a, b, c = (_step_with(timer, ("decode", True)) for _ in range(3))
    timer.not_ready.add(b.phases[0].t_start)
    steps, rows = collections.deque([a, b, c]), []
    assert drain.take_ready(steps, timer, 1_000, False, 10, rows) == 1  # b is not done: c waits behind it
    assert list(steps) == [b, c] and rows == [tuple(drain.resolve_step(a, timer))]
    assert rows[0][8] == (("decode", 10, 15, False, "DECODE", 2, 2, 0.0, "t", None, None, None, None, None),)
    assert timer.released == [(a.phases[0].t_start, a.phases[0].t_end)]
    assert drain.take_ready(steps, timer, 1_000, True, 1, rows) == 1 and list(steps) == [c]  # final; limit
    assert len(rows) == 2 and len(timer.released) == 2

    v = _step_with(timer, ("verify", True))
    steps = collections.deque([v])
    assert drain.take_ready(steps, timer, v.host1, False, 10, rows) == 0 and list(steps) == [v]
    v.phases[0].accept_length = 2.0
    assert drain.take_ready(steps, timer, v.host1, False, 10, rows) == 1 and rows[-1][8][0][9] == 2.0

    broken = _step_with(timer, ("decode", True))
    broken.phases[0].t_end = ("end", "not a number")  # resolving it raises: dropped, still released
    released = len(timer.released)
    assert drain.take_ready(collections.deque([broken]), timer, 1_000, False, 10, rows) == 1
    assert len(rows) == 3 and len(timer.released) == released + 1


def test_take_ready_asks_a_host_clock_timer_nothing():
    import collections

    from sgl_probe.timing import CpuTimer

    drain = _drain()

    class Host(CpuTimer):
        def ready(self, *a):
            raise AssertionError("asked")

        release = interval = interval_kind = ready

    timer = Host()
    st = _step_with(timer, ("decode", True), ("draft", False))
    rows: list = []
    assert drain.take_ready(collections.deque([st]), timer, 1_000, False, 10, rows) == 1
    (row,) = rows
    off = timer.offset
    assert row[:8] == (1, off, 1_000 + off, "DECODE", 2, 2, 1e-3, "cpu") and row[9] is None
    assert row[8] == (("decode", off, 1 + off, False, "DECODE", 2, 2, 0.0, "t", None, None, None, None, None),)

# -- readers: every spelling SGLang passes ---------------------------------------------------------

@pytest.mark.parametrize("batch,want", [
    (NS(extend_num_tokens=7, extend_seq_lens_cpu=[1, 2]), 7),
    (NS(extend_seq_lens_cpu=[3, 4]), 7),
    (NS(extend_seq_lens_cpu=[], extend_lens=(2, 2)), 4),
    (NS(extend_lens=[5]), 5),
    (NS(extend_num_tokens="7"), None),
    (NS(extend_seq_lens_cpu="34"), None),
    (NS(), None),
])
def test_extend_tokens(batch, want):
    from sgl_probe import readers

    assert readers.extend_tokens(batch) == want


@pytest.mark.parametrize("mode,phase", [("DECODE", "decode"), ("EXTEND", "extend"), ("MIXED", "extend"),
                                        ("TARGET_VERIFY", "verify"), ("DRAFT_EXTEND", "draft_extend"),
                                        ("DRAFT_EXTEND_V2", "draft_extend"), ("IDLE", None), (None, None),
                                        ("draft_extend", None)])
def test_forward_reader_phase_per_mode(mode, phase):
    from sgl_probe import readers

    fm = getattr(ForwardMode, mode, None) if mode in ForwardMode.__members__ else (
        NS(name=mode) if mode else None)
    b = NS(forward_mode=fm, seq_lens=[0, 0, 0], extend_num_tokens=11)
    f = readers.forward(FORWARD, (b,), {}, {"num_draft_tokens": 4})
    assert f.phase == phase


def test_forward_reader_argument_spellings():
    from sgl_probe import readers

    spec = {"num_draft_tokens": 4}
    dec = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0])
    ext = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[0], extend_num_tokens=9)
    assert readers.forward(FORWARD, (), {"model_worker_batch": dec}, spec) == ("decode", "DECODE", 2, 2)
    assert readers.forward(FORWARD, (), {"batch": ext}, spec) == ("extend", "EXTEND", 1, 9)
    # A spec worker hands over a ForwardBatch: batch None, the forward batch second or by keyword.
    assert readers.forward(FORWARD, (None, dec), {}, spec) == ("decode", "DECODE", 2, 2)
    assert readers.forward(FORWARD, (None,), {"forward_batch": dec}, spec) == ("decode", "DECODE", 2, 2)
    # is_verify as the fourth positional argument or by keyword; only True counts.
    assert readers.forward(FORWARD, (dec, None, None, True), {}, spec) == ("verify", "TARGET_VERIFY", 2, 8)
    assert readers.forward(FORWARD, (dec, None, None, 1), {}, spec).phase == "decode"
    assert readers.forward(FORWARD, (dec,), {"is_verify": True}, spec).phase == "verify"
    assert readers.forward(FORWARD, (dec, None, None, True), {"is_verify": False}, spec).phase == "decode"
    assert readers.forward(FORWARD, (), {}, spec) == (None, None, None, None)


def test_spec_readers_tokens_from_server_args():
    from sgl_probe import readers

    spec = {"num_draft_tokens": 4, "topk": 2, "num_steps": 3}
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0])
    assert readers.spec_call(DRAFT, (b,), {}, spec) == ("draft", "DECODE", 3, 3 * 2 * 2)
    assert readers.spec_call(DRAFT, (b,), {}, {}) == ("draft", "DECODE", 3, 0)  # one step: no forwards
    assert readers.spec_call(VERIFY_V2, (), {"batch": b}, spec) == ("verify", "TARGET_VERIFY", 3, 12)
    assert readers.spec_call(VERIFY_V2, (b,), {}, {}) == ("verify", "TARGET_VERIFY", 3, 3)
    idle = NS(forward_mode=ForwardMode.IDLE, seq_lens=[])
    assert readers.spec_call(VERIFY_V2, (idle,), {}, spec) == (None, "IDLE", 0, 0)


def test_v1_draft_extend_after_decode_reruns_only_the_accepted_tokens():
    from sgl_probe import readers

    t = _target(reader="draft_extend_v1_decode")
    spec = {"num_draft_tokens": 4}
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0], spec_info=NS(accept_length_cpu=[2, 0, 3]))
    assert readers.draft_extend_after_decode_v1(t, (b,), {}, spec) == ("draft_extend", "DRAFT_EXTEND", 3, 5 + 3)
    b.spec_info.accept_length_cpu = [2, 1]  # requests that finished are not re-run
    assert readers.draft_extend_after_decode_v1(t, (), {"batch": b}, spec) == ("draft_extend", "DRAFT_EXTEND", 2, 5)
    for odd in (None, [1.0, 2.0], "12"):
        b.spec_info.accept_length_cpu = odd  # no host copy: the verify window, from server args
        assert readers.draft_extend_after_decode_v1(t, (b,), {}, spec) == ("draft_extend", "DRAFT_EXTEND", 3, 12)
    for bare in (NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0]),
                 NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0], spec_info=NS())):
        assert readers.draft_extend_after_decode_v1(t, (bare,), {}, spec) == ("draft_extend", "DRAFT_EXTEND", 3, 12)
    idle = NS(forward_mode=ForwardMode.IDLE, seq_lens=[], spec_info=NS(accept_length_cpu=[1]))
    assert readers.draft_extend_after_decode_v1(t, (idle,), {}, spec) == (None, "IDLE", 0, 0)


@pytest.mark.parametrize("result,want", [
    (("l", "o", "b", True), True), (("l", "o", "b", False, "x"), False), (("l", "o", "b", 1), None),
    (("l", "o", "b"), None), (NS(can_run_cuda_graph=True), True), (NS(can_run_graph=False), False),
    ([1, 2, 3, True], None), (None, None),
])
def test_v1_verify_graph_flag(result, want):
    from sgl_probe import readers

    assert readers.result_graph_v1_verify(result) is want


# -- the original always runs once, with exactly its own arguments ------------------------------------

class Spy:
    def __init__(self, result="orig-result", raises=None) -> None:
        self.calls: list[tuple] = []
        self.result, self.raises = result, raises

    def __call__(self, obj, *args, **kwargs):
        self.calls.append((obj, args, kwargs))
        if self.raises is not None:
            raise self.raises
        return self.result


def test_every_wrapper_path_calls_the_original_exactly_once_with_its_arguments(caplog):
    rec = Recorder("cpu", 100, LOG)
    obj, b = object(), NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    args, kwargs = (b, "x"), {"k": 1}

    def check(wrapper, spy, n=1):
        assert wrapper(obj, *args, **kwargs) == "orig-result"
        assert spy.calls == [(obj, args, kwargs)] * n
        spy.calls.clear()

    for build, hook in ((rec.step_method, Hook(STEP)), (rec.phase_method, Hook(FORWARD)),
                        (rec.graph_method, Hook(_target(role="graph"))), (rec.accept_method, Hook(ACCEPT))):
        spy = Spy()
        check(build(hook, spy), spy)  # outside a step / nothing waiting
        hook.enabled = False
        check(build(hook, spy), spy)  # switched off
    # Inside a step: the phase is timed and still called once; a nested step is not a step.
    spy_phase, spy_inner = Spy(), Spy()
    phase = rec.phase_method(Hook(FORWARD), spy_phase)
    inner = rec.step_method(Hook(STEP), spy_inner)
    seen = []

    def body(sched, *a, **k):
        seen.append(phase(obj, *args, **kwargs))
        seen.append(inner(obj, *args, **kwargs))
        return "step-result"

    assert rec.step_method(Hook(STEP), body)(obj, b) == "step-result"
    assert seen == ["orig-result", "orig-result"]
    assert spy_phase.calls == [(obj, args, kwargs)] and spy_inner.calls == [(obj, args, kwargs)]
    assert rec.steps[-1].phases[0].target == FORWARD.name
    assert rec.step_count == 2  # the enabled step above, and this one: not the nested one
    # A nested phase (verify -> target forward) runs untimed, once.
    nested = Spy()
    nphase = rec.phase_method(Hook(FORWARD), nested)
    outer = rec.phase_method(Hook(FORWARD), lambda o, *a, **k: nphase(o, *a, **k))
    rec.step_method(Hook(STEP), lambda s, *a, **k: outer(obj, *args, **kwargs))(obj, b)
    assert nested.calls == [(obj, args, kwargs)] and len(rec.steps[-1].phases) == 1


def test_a_failing_reader_disables_the_hook_and_sglang_runs_on(caplog):
    rec = Recorder("cpu", 100, LOG)
    obj = object()
    bad = object()  # no forward_mode: the step reader copes; a raising reader is what is tested
    for build, target, reader_name in ((rec.step_method, STEP, "step"), (rec.phase_method, FORWARD, "forward")):
        hook = Hook(target)
        spy = Spy()
        boom = KeyError("reader")
        from sgl_probe import readers

        real = readers.ENTER[reader_name]
        readers.ENTER[reader_name] = lambda *a: (_ for _ in ()).throw(boom)
        try:
            wrapper = build(hook, spy)
        finally:
            readers.ENTER[reader_name] = real
        if build == rec.phase_method:
            run = lambda: rec.step_method(Hook(STEP), lambda s, *a, **k: wrapper(obj, bad, k=2))(obj, NS())
        else:
            run = lambda: wrapper(obj, bad, k=2)
        with caplog.at_level(logging.ERROR, logger="sgl_probe"):
            caplog.clear()
            run()
        assert spy.calls == [(obj, (bad,), {"k": 2})]
        assert not hook.enabled
        assert [r.getMessage() for r in caplog.records] == [
            f"sgl-probe: hook {target.name} disabled after an internal error: KeyError('reader') (SGLang is unaffected)"]
    assert rec.tls.step is None and rec.tls.phase is None


def test_stream_capture_records_nothing_and_runs_the_call():
    rec = Recorder("cpu", 100, LOG)
    rec.timer = NS(start=lambda now, first=True: None)  # the timer says: a CUDA graph is being captured
    spy = Spy()
    phase = rec.phase_method(Hook(FORWARD), spy)
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    rec.step_method(Hook(STEP), lambda s, *a, **k: phase("w", b))("sched", b)
    assert spy.calls == [("w", (b,), {})] and len(rec.steps) == 0


def test_no_graph_reason_is_asked_with_the_phase_mode_and_size(monkeypatch):
    from sgl_probe import no_graph

    asked = []
    monkeypatch.setattr(no_graph, "reason_for", lambda runner: lambda obj, mode, bs: asked.append((obj, mode, bs))
                        or "runner_refused")
    rig = Rig()
    ph = rig.decode_step(3, result=NS(can_run_cuda_graph=False))
    assert asked == [(None, "DECODE", 3)] and ph.no_graph_reason == "runner_refused"


# -- readers: shapes and spellings -------------------------------------------------------------------

class Shape:
    """A tensor's ``seq_lens``: a shape, and no cheap len()."""

    def __init__(self, *shape) -> None:
        self.shape = shape

    def __len__(self):
        raise TypeError("len() of a tensor is Python code: the reader must use the shape")


@pytest.mark.parametrize("batch,want", [
    (NS(seq_lens=Shape(3, 7)), 3),
    (NS(seq_lens=Shape(), batch_size=5), 5),     # a 0-d shape: the size comes from elsewhere
    (NS(seq_lens=[0, 0]), 2),
    (NS(seq_lens=object(), batch_size=4), 4),
    (NS(batch_size=lambda: 6), 6),
    (NS(batch_size="6"), None),
    (NS(), None),
])
def test_batch_size(batch, want):
    from sgl_probe import readers

    assert readers.batch_size(batch) == want


def test_mode_name_follows_the_object_it_is_given():
    from sgl_probe import readers

    mode = NS(name="DECODE")  # not an Enum: must not be cached by identity
    b = NS(forward_mode=mode)
    assert readers.mode_name(b) == "DECODE"
    mode.name = "EXTEND"
    assert readers.mode_name(b) == "EXTEND"
    assert readers.mode_name(NS(forward_mode=object())) is None
    assert readers.mode_name(NS()) is None
    assert readers.mode_name(NS(forward_mode=ForwardMode.IDLE)) == "IDLE"
    assert readers.mode_name(NS(forward_mode=ForwardMode.IDLE)) == "IDLE"  # from the cache


def test_step_reader():
    from sgl_probe import readers

    ext = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[0, 0], extend_num_tokens=30)
    dec = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0], extend_num_tokens=30)
    assert readers.step(STEP, (ext,), {}, {}) == ("step", "EXTEND", 2, 30)
    assert readers.step(STEP, (), {"batch": dec}, {}) == ("step", "DECODE", 3, 3)
    assert readers.step(STEP, (), {"schedule_batch": dec}, {}) == ("step", "DECODE", 3, 3)
    assert readers.step(STEP, (), {}, {}) == ("step", None, None, None)


def test_draft_extend_after_prefill_counts_the_prompt_tokens():
    from sgl_probe import readers

    t = _target(reader="spec_call", phases=("draft_extend",), mode=None, since="0.5.5")
    spec = {"num_draft_tokens": 4, "num_steps": 3}
    b = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[0, 0], extend_num_tokens=21)
    assert readers.spec_call(t, (b,), {}, spec) == ("draft_extend", "EXTEND", 2, 21)
    after_verify = _target(reader="spec_call", phases=("draft_extend",), mode="DRAFT_EXTEND_V2")
    d = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0], extend_num_tokens=21)
    # After a verify the batch arrives in decode mode: the verified window is re-run.
    assert readers.spec_call(after_verify, (d,), {}, spec) == ("draft_extend", "DRAFT_EXTEND_V2", 2, 8)
    assert readers.spec_call(DRAFT, (d,), {}, {"num_steps": 3}) == ("draft", "DECODE", 2, 4)  # topk 1


# -- the recorder's own failures: one line naming the error, SGLang's call unaffected -----------------

def _errors(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.fixture
def errors(caplog):
    logger = logging.getLogger("sgl_probe")
    old, logger.propagate = logger.propagate, True
    with caplog.at_level(logging.ERROR, logger="sgl_probe"):
        yield caplog
    logger.propagate = old


def test_step_record_carries_the_index_and_the_batch():
    rig = Rig()
    rig.decode_step(1)
    b = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[0, 0], extend_num_tokens=13)
    rig.step(None, b, lambda: rig.forward(None, b))
    st = rig.rec.steps[-1]
    assert (st.index, st.mode, st.batch_size, st.num_tokens) == (2, "EXTEND", 2, 13)
    assert st.host1 >= st.host0 and [s.index for s in rig.rec.steps] == [1, 2]


def test_failure_while_queueing_a_step_is_logged_with_its_error(errors):
    rig = Rig(max_pending=1)
    rig.decode_step(1)

    def release(start, end):
        raise RuntimeError("release failed")

    rig.timer.release = release
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    assert rig.step(None, b, lambda: rig.forward(None, b) or "sglang") == "sglang"
    assert _errors(errors) == [f"sgl-probe: hook {STEP.name} disabled after an internal error: "
                               "RuntimeError('release failed') (SGLang is unaffected)"]


def test_failure_while_closing_a_phase_is_logged_with_its_error(errors):
    rig = Rig()
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])

    def stop(token, now):
        raise RuntimeError("stop failed")

    rig.timer.stop = stop
    assert rig.step(None, b, lambda: rig.forward(None, b, "ok")) == "ok"
    rig = Rig()  # and when SGLang's call raised: its exception still propagates
    rig.timer.stop = stop
    raising = rig.rec.phase_method(Hook(FORWARD), lambda w, bb: (_ for _ in ()).throw(KeyError("sglang")))
    with pytest.raises(KeyError):
        rig.step(None, b, lambda: raising(None, b))
    assert _errors(errors) == [
        f"sgl-probe: hook {FORWARD.name} disabled after an internal error: RuntimeError('stop failed') "
        "(SGLang is unaffected)"] * 2


def test_accept_reader_failure_names_the_error(errors):
    rig = Rig()
    rig.verify_step(2)

    class Odd(int):
        def __rtruediv__(self, other):
            raise ZeroDivisionError("odd")

    rig.accept(None, Odd(2), num_accept_tokens=4)
    assert _errors(errors) == [f"sgl-probe: hook {ACCEPT.name} disabled after an internal error: "
                               "ZeroDivisionError('odd') (SGLang is unaffected)"]


def test_a_call_that_is_not_a_phase_leaves_the_hook_on():
    rig = Rig()
    idle = NS(forward_mode=ForwardMode.IDLE, seq_lens=[])
    assert rig.step(None, idle, lambda: rig.forward(None, idle, "idle-result")) == "idle-result"
    assert rig.hooks["forward"].enabled and len(rig.rec.steps) == 0


def test_a_phase_after_a_raising_phase_in_the_same_step_is_timed():
    rig = Rig()
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    raising = rig.rec.phase_method(Hook(FORWARD), lambda w, bb: (_ for _ in ()).throw(KeyError("x")))

    def body():
        try:
            raising(None, b)
        except KeyError:
            pass
        rig.forward(None, b, NS(can_run_cuda_graph=True))

    rig.step(None, b, body)
    phases = rig.rec.steps[-1].phases
    assert [p.error is not None for p in phases] == [True, False] and phases[1].graph is True


def test_a_flagless_phase_asks_why_with_its_mode_and_size_and_keeps_the_hook_flag(monkeypatch):
    from sgl_probe import no_graph

    asked = []
    monkeypatch.setattr(no_graph, "reason_for", lambda runner: lambda obj, mode, bs: asked.append((mode, bs))
                        or "graphs_disabled")
    rig = Rig(verify=DRAFT)  # the draft reports no flag of its own
    plain = rig.verify_step(3)
    hooked = rig.verify_step(2, replay=True)
    assert asked == [("DECODE", 3)]
    assert plain.graph is None and plain.no_graph_reason == "graphs_disabled" and graph_used(plain) is False
    assert hooked.graph is None and hooked.no_graph_reason is None and graph_used(hooked) is True


def test_a_step_whose_batch_comes_by_keyword():
    rec = Recorder("cpu", 10, LOG)
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b: "r")
    step = rec.step_method(Hook(STEP), lambda sched, batch: fwd(None, batch))
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0, 0])
    assert step("sched", batch=b) == "r"
    st = rec.steps[-1]
    assert (st.mode, st.batch_size, st.num_tokens) == ("DECODE", 4, 4)


# -- gaps the mutation run of the drain-rows / hot-path rework showed ---------------------------------

def test_every_wrapper_passes_a_keyword_less_call_through_unchanged():
    # SGLang calls these methods without keywords, and the wrappers take a path of their own then.
    rec = Recorder("cpu", 100, LOG)
    obj, b = object(), NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    for build, hook in ((rec.step_method, Hook(STEP)), (rec.phase_method, Hook(FORWARD)),
                        (rec.graph_method, Hook(_target(role="graph"))), (rec.accept_method, Hook(ACCEPT))):
        spy = Spy()
        assert build(hook, spy)(obj, b, "x") == "orig-result"
        assert spy.calls == [(obj, (b, "x"), {})]
    # inside a step and a phase, the replay keeps its receiver and its arguments too
    replay_spy, fwd_spy = Spy(), Spy(result=NS())
    replay = rec.graph_method(Hook(_target(role="graph")), replay_spy)
    phase = rec.phase_method(Hook(FORWARD), lambda w, batch: replay("runner", batch, 3) and fwd_spy(w, batch))
    rec.step_method(Hook(STEP), lambda s, batch: phase("worker", batch))("sched", b)
    assert replay_spy.calls == [("runner", (b, 3), {})] and fwd_spy.calls == [("worker", (b,), {})]
    assert rec.steps[-1].phases[0].graph_hook is True


def test_no_graph_reason_is_asked_with_the_batch_size_not_the_token_count(monkeypatch):
    from sgl_probe import no_graph

    asked = []
    monkeypatch.setattr(no_graph, "reason_for", lambda runner: lambda obj, mode, bs: asked.append((mode, bs))
                        or "mode_not_captured")
    rec = Recorder("cpu", 100, LOG)
    rec.timer = CpuTimer()
    phase = rec.phase_method(Hook(FORWARD), lambda w, batch: NS(can_run_cuda_graph=False))
    b = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[5, 6, 7], extend_num_tokens=18)
    rec.step_method(Hook(STEP), lambda s, batch: phase("w", batch))("sched", b)
    ph = rec.steps[-1].phases[0]
    assert (ph.batch_size, ph.num_tokens) == (3, 18) and asked == [("EXTEND", 3)]


@pytest.mark.parametrize("reader", ["forward", "step"])
def test_readers_take_the_batch_size_from_a_tensor_shape(reader):
    from sgl_probe import readers

    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=Shape(5))
    facts = readers.ENTER[reader](FORWARD if reader == "forward" else STEP, (b,), {}, {})
    assert facts[1:] == ("DECODE", 5, 5)


def test_error_text_names_the_type_and_keeps_none_for_no_error():
    drain = _drain()
    assert drain.error_text(None) is None
    assert drain.error_text(ValueError("a: b")) == "ValueError: a: b"


def test_a_graph_phase_carries_no_no_graph_reason_whatever_the_record_says():
    drain = _drain()
    timer = TokenTimer()
    st = _step_with(timer, ("decode", True))
    st.phases[0].graph, st.phases[0].no_graph_reason = True, "batch_too_large"
    assert drain.resolve_step(st, timer).phases[0].no_graph_reason is None
    st.phases[0].graph = False
    assert drain.resolve_step(st, timer).phases[0].no_graph_reason == "batch_too_large"


def test_take_ready_counts_what_it_takes_honours_the_limit_and_asks_each_phase_its_own_end():
    import collections

    drain = _drain()
    timer = TokenTimer()
    steps = collections.deque(_step_with(timer, ("decode", True)) for _ in range(5))
    ends = [(st.phases[0].t_start, st.phases[0].t_end) for st in steps]
    rows: list = []
    assert drain.take_ready(steps, timer, 1_000, False, 3, rows) == 3 and len(steps) == 2
    assert timer.asked == ends[:3]
    assert drain.take_ready(steps, timer, 1_000, False, 10, rows) == 2 and len(rows) == 5
    # before the first step no timer exists yet: the drain's tick finds nothing to do
    assert drain.take_ready(collections.deque(), None, 1_000, False, 10, rows) == 0


def test_take_ready_waits_for_an_accept_report_exactly_as_long_as_step_ready():
    import collections

    drain = _drain()
    timer = TokenTimer()
    v = _step_with(timer, ("verify", True))
    wait = drain.ACCEPT_WAIT_NS
    for now in (v.host1 + wait - 1, v.host1 + wait):
        got = drain.take_ready(collections.deque([v]), timer, now, False, 10, [])
        assert got == (1 if drain.step_ready(v, timer, now) else 0)
    assert drain.step_ready(v, timer, v.host1 + wait) is True


def test_take_ready_logs_the_index_and_error_of_a_step_it_must_drop(caplog):
    import collections

    drain = _drain()

    class Broken(TokenTimer):
        def interval_kind(self, start, end):
            raise RuntimeError("event never completed")

    timer = Broken()
    broken = _step_with(timer, ("decode", True))
    broken.index = 41
    with caplog.at_level(logging.DEBUG, logger="sgl_probe"):
        assert drain.take_ready(collections.deque([broken]), timer, 1_000, False, 10, []) == 1
    assert [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()] == [
        "sgl-probe: dropping step 41: RuntimeError('event never completed')"]


@pytest.mark.parametrize("mode,phase", [(ForwardMode.DECODE, "decode"), (ForwardMode.EXTEND, "extend"),
                                        (ForwardMode.TARGET_VERIFY, "verify"), (ForwardMode.IDLE, None)])
def test_forward_reader_phase_on_a_cold_and_a_warm_cache(monkeypatch, mode, phase):
    # The reader caches mode -> phase per process: the first call (cold) and later ones must agree.
    from sgl_probe import readers

    monkeypatch.setattr(readers, "_PHASE_OF", {})
    monkeypatch.setattr(readers, "_MODE_NAMES", {})
    b = NS(forward_mode=mode, seq_lens=[0, 0])
    cold = readers.forward(FORWARD, (b,), {}, {})
    warm = readers.forward(FORWARD, (b,), {}, {})
    assert cold[0] == warm[0] == phase and cold[1] == warm[1] == mode.name
