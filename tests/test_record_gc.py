"""The C hot path's records and the garbage collector: a record lives about a second (from its step
to the drain pass that resolves it), so a tracked one is scanned by the young collections and
ends up in the oldest generation, where it counts toward a full collection of the server's heap.
The C wrappers' records, their phases lists and the CUDA timer's tokens start untracked; anything
that could lead back to a record (an exception, a Python-made phase, an attribute set from Python)
tracks it, and a cycle through it is collected. The records come from free lists, and the summary
line's window keeps no tuple per call."""

from __future__ import annotations

import gc
import logging
import weakref
from types import SimpleNamespace as NS

from sgl_probe import drain
from sgl_probe.instrument import Hook
from sgl_probe.recorder import PhaseRecord, Recorder
from tests.hotpaths import c_module
from tests.test_exact_recorder import FORWARD, STEP, ForwardMode
from tests.test_hotpath_c import _runtime_timer

LOG = logging.getLogger("sgl_probe.test")
BATCH = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))


class _Sentinel:
    """Something a cycle holds, whose collection a weak reference shows."""


def _recorder(hot: str):
    rec = Recorder("cpu", 10_000, LOG, hot)
    rec.ensure_timer()
    fwd = rec.phase_method(Hook(FORWARD), lambda worker, batch, fail=False: _raise() if fail else NS())
    step = rec.step_method(Hook(STEP), lambda sched, batch, body: body())
    return rec, step, fwd


def _raise():
    raise KeyError("sglang")


def test_the_c_wrappers_records_are_untracked_the_python_ones_tracked():
    c_module()
    for hot, tracked in (("python", True), ("c", False)):
        rec, step, fwd = _recorder(hot)
        for _ in range(3):
            step(None, BATCH, lambda: fwd(None, BATCH))
        st = rec.steps[0]
        assert rec.hotpath == hot
        assert (gc.is_tracked(st), gc.is_tracked(st.phases), gc.is_tracked(st.phases[0])) == (tracked,) * 3
        assert drain.take_ready(rec.steps, rec.timer, 0, False, 10, []) == 3


def test_the_cuda_timers_tokens_are_untracked(monkeypatch):
    ft, rt, timer = _runtime_timer(c_module(), monkeypatch)
    first = timer.start(10**12)
    end = timer.stop(first, 10**12 + 500)
    start = timer.start(10**12 + 10**9)
    end2 = timer.stop(start, 10**12 + 10**9 + 500)
    assert not any(map(gc.is_tracked, (first, end, start, end2)))
    assert gc.is_tracked(end[0]) and gc.is_tracked(timer._anchors)  # what they hold is as it was
    assert start[1] is end and end2[0] is not None  # the tokens hold what they held


def test_a_raising_phase_tracks_its_record_and_its_step():
    rec, step, fwd = _recorder(c_module() and "c")

    def body():
        fwd(None, BATCH)
        fwd(None, BATCH, fail=True)

    try:
        step(None, BATCH, body)
    except KeyError:
        pass
    (st,) = rec.steps
    ok, failed = st.phases
    assert isinstance(failed.error, KeyError) and isinstance(st.error, KeyError)
    assert gc.is_tracked(st) and gc.is_tracked(st.phases) and gc.is_tracked(failed)
    assert not gc.is_tracked(ok)


def test_a_cycle_made_from_python_through_a_record_is_collected():
    rec, step, fwd = _recorder(c_module() and "c")
    step(None, BATCH, lambda: fwd(None, BATCH))
    st = rec.steps.popleft()
    ph = st.phases[0]
    ph.accept_length = 2.0  # an atom: nothing to track
    assert not gc.is_tracked(ph)
    sentinel = _Sentinel()
    gone = weakref.ref(sentinel)
    sentinel.record = ph
    ph.no_graph_reason = sentinel  # ph -> sentinel -> ph
    assert gc.is_tracked(ph)
    del sentinel, ph, st
    gc.collect()
    assert gone() is None


def test_a_python_made_phase_in_a_c_step_tracks_the_step_and_a_cycle_through_it_is_collected():
    """The Python phase wrapper's frame, in the traceback of the error its record keeps, holds
    the step: step -> phases -> phase -> error -> traceback -> frame -> step."""
    rec, step, fwd = _recorder(c_module() and "c")
    gone = []

    def body():
        st = rec.tls.cur[0]
        sentinel = _Sentinel()
        gone.append(weakref.ref(sentinel))
        ph = PhaseRecord(("decode", "DECODE", 2, 2), "forward", 1, 1)
        try:
            raise KeyError("sglang")
        except KeyError as exc:
            ph.error = exc  # the frame (st, sentinel) is in its traceback
        st.phases.append(ph)

    step(None, BATCH, body)
    st = rec.steps.popleft()
    assert gc.is_tracked(st) and gc.is_tracked(st.phases)
    del st
    gc.collect()
    assert gone[0]() is None


def test_a_step_whose_error_leads_back_to_it_is_collected():
    """SGLang's call raised with a frame that holds the open step: step -> error -> traceback ->
    frame -> step."""
    rec, step, fwd = _recorder(c_module() and "c")
    gone = []

    def body():
        fwd(None, BATCH)
        st = rec.tls.cur[0]  # noqa: F841 (held by the frame)
        sentinel = _Sentinel()
        gone.append(weakref.ref(sentinel))
        raise KeyError("sglang")

    try:
        step(None, BATCH, body)
    except KeyError:
        pass
    st = rec.steps.popleft()
    assert gc.is_tracked(st) and not gc.is_tracked(st.phases[0])
    del st
    gc.collect()
    assert gone[0]() is None


def test_records_waiting_for_the_drain_do_not_count_toward_a_collection():
    """The C records come from a free list the drain fills, so a second of pending steps
    allocates nothing the collector counts; the Python records each count."""
    c_module()
    grown = {}
    for hot in ("python", "c"):
        rec, step, fwd = _recorder(hot)
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):  # the first passes fill the free list
                for _ in range(200):
                    step(None, BATCH, lambda: fwd(None, BATCH))
                drain.take_ready(rec.steps, rec.timer, 0, False, 10**6, [])
            before = gc.get_count()[0]
            for _ in range(200):
                step(None, BATCH, lambda: fwd(None, BATCH))
            grown[hot] = (gc.get_count()[0] - before) / 200
        finally:
            gc.enable()
    assert grown["python"] >= 2  # step, phase (and the phases list, where CPython's own free list is empty)
    assert grown["c"] < 0.1, grown


def test_a_record_made_again_from_the_free_list_is_a_fresh_one(monkeypatch):
    """Steps that raised, replayed graphs and waited for an accept length, drained; then plain
    steps from their memory read exactly as the Python hot path's fresh records."""
    c_module()
    from sgl_probe import recorder as recorder_module
    from tests.test_exact_recorder import VERIFY_V2
    from tests.test_hotpath_c import PHASE_FIELDS, STEP_FIELDS

    clock = [None]
    monkeypatch.setattr(recorder_module, "perf_counter_ns", lambda: next(clock[0]))

    def record(hot: str, first: bool) -> list:
        clock[0] = iter(range(1_000, 10**9, 1_000))
        rec, step, fwd = _recorder(hot)
        verify = rec.phase_method(Hook(VERIFY_V2), lambda worker, batch: NS(can_run_cuda_graph=True))
        mark = rec.graph_method(Hook(_graph_target()), lambda obj: None)
        if first:
            def busy():
                fwd(None, BATCH)
                mark(None)
                verify(None, BATCH)
                fwd(None, BATCH, fail=True)

            for _ in range(5):
                try:
                    step(None, BATCH, busy)
                except KeyError:
                    pass
            for ph in rec.awaiting_accept:
                ph.accept_length = 3.0
            rec.awaiting_accept.clear()
            drain.take_ready(rec.steps, rec.timer, 0, True, 10**6, [])
            clock[0] = iter(range(1_000, 10**9, 1_000))
        for _ in range(5):
            step(None, BATCH, lambda: fwd(None, BATCH))
        return [({f: getattr(st, f) for f in STEP_FIELDS},
                 [{f: getattr(ph, f) for f in PHASE_FIELDS} for ph in st.phases]) for st in rec.steps]

    fresh = record("python", False)
    assert fresh[0][0]["index"] == 1
    again = record("c", True)
    assert len(again) == len(fresh) == 5
    for (s1, p1), (s2, p2) in zip(fresh, again):
        s2["index"] -= 5  # the busy steps came first
        assert s1 == s2 and p1 == p2


def _graph_target():
    from tests.test_exact_recorder import _target

    return _target(role="graph")


def test_a_phases_list_held_elsewhere_is_left_whole_and_not_reused():
    rec, step, fwd = _recorder(c_module() and "c")
    step(None, BATCH, lambda: fwd(None, BATCH))
    st = rec.steps.popleft()
    held = st.phases
    (ph,) = held
    del st
    step(None, BATCH, lambda: fwd(None, BATCH))
    assert rec.steps[0].phases is not held and held == [ph] and ph.phase == "decode"


def test_the_summary_window_keeps_no_tracked_object_per_call():
    """The summary line's window holds every call of up to 30 s: as columns of floats, flags and
    shared shapes, so a steady stream of calls allocates nothing the collector counts (C and
    Python alike), and every call of a shape shares the one tuple ``seen`` keeps."""
    from sgl_probe.summary import _SHAPE, Summary

    def rows(n, start):
        ph = lambda i: ("decode", i * 10**6, i * 10**6 + 1_800_000 + i % 7, True, "DECODE", 16, 16, 0.01, "t",  # noqa: E731
                        None, None, None, None, 0.5)
        return [(i, 0, 1, "DECODE", 16, 16, 0.1, "cuda", (ph(i),), None) for i in range(start, start + n)]

    chunks = [rows(16, 16 * k) for k in range(60)]  # built before: the count is the summary's alone
    for fast in (None, c_module()):
        s = Summary(30, {"tp_rank": 0}, fast)
        for k in range(3):  # first calls, the window's columns
            s.add_rows(chunks[k])
        gc.collect()
        gc.disable()
        try:
            before = gc.get_count()[0]
            for k in range(3, 60):
                s.add_rows(chunks[k])
            grown = gc.get_count()[0] - before
        finally:
            gc.enable()
        assert grown < 5, (fast, grown)
        shapes = s._window["decode"][_SHAPE]
        assert len(shapes) == 60 * 16 and all(k is shapes[0] for k in shapes)
        assert shapes[0] is s._seen[shapes[0]]
