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
