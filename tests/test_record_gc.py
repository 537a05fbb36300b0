"""The C hot path's records and the garbage collector: a record lives about a second (from its step
to the drain pass that resolves it), so a tracked one is scanned by the young collections and
ends up in the oldest generation, where it counts toward a full collection of the server's heap.
The C wrappers' records, their phases lists, the CUDA timer's tokens and the drain's rows start
untracked; anything that could lead back to a record (an exception, a Python-made phase, an
attribute set from Python) tracks it, and a cycle through it is collected."""

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


def test_the_c_wrappers_records_and_the_drains_rows_are_untracked_the_python_ones_tracked():
    c_module()
    for hot, tracked in (("python", True), ("c", False)):
        rec, step, fwd = _recorder(hot)
        for _ in range(3):
            step(None, BATCH, lambda: fwd(None, BATCH))
        st = rec.steps[0]
        assert rec.hotpath == hot
        assert (gc.is_tracked(st), gc.is_tracked(st.phases), gc.is_tracked(st.phases[0])) == (tracked,) * 3
        rows: list = []
        assert drain.take_ready(rec.steps, rec.timer, 0, False, 10, rows) == 3
        if hot == "c":
            assert not any(gc.is_tracked(r) or gc.is_tracked(r[8]) or gc.is_tracked(r[8][0]) for r in rows)


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


def test_a_row_with_a_field_that_is_not_an_atom_stays_tracked(monkeypatch):
    c_module()
    rec, step, fwd = _recorder("c")
    odd = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    step(None, odd, lambda: fwd(None, odd))
    rec.steps[0].phases[0].target = _Sentinel()  # as a reader could return any object
    rows: list = []
    drain.take_ready(rec.steps, rec.timer, 0, False, 10, rows)
    (row,) = rows
    assert gc.is_tracked(row[8][0]) and gc.is_tracked(row[8]) and gc.is_tracked(row)


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
