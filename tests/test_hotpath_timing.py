"""The CUDA timer against a stand-in torch (logic only): one event per phase, where each phase
starts, anchors, the pool; and what the CPU timer reports in their place.

In the stand-in, host nanoseconds and fake GPU milliseconds are one clock (``host(ms)``), so an
anchor recorded on an idle stream maps GPU times exactly and every expected time can be written
down."""

from __future__ import annotations

import collections

from sgl_probe.contract import START_VALUES
from sgl_probe.timing import GPU_EVENT, HOST_CLOCK, CpuTimer, CudaTimer
from tests.hotpaths import c_module
from tests.test_gpu_free_parts import _counting_timer, _FakeTorch
import pytest

BASE = 10**12


def host(ms: float) -> int:
    return BASE + int(round(ms * 1e6))


@pytest.fixture(autouse=True, params=["c", "python"])
def timer_hotpath(request, monkeypatch):
    """Every test here runs with the C start / stop (sgl_probe._hot.CudaFast) and the Python ones."""
    monkeypatch.setitem(FAST, "fast", c_module() if request.param == "c" else None)
    return request.param


FAST: dict = {"fast": None}


def _timer(ft=None):
    ft = ft or _FakeTorch()
    timer = CudaTimer(ft, FAST["fast"])
    timer.relax_capture_mode = False
    return ft, timer


def _phase(ft, timer, at_ms: float, gpu_until_ms: float, stop_ms=None):
    """A phase called at host ``at_ms`` whose GPU work runs until ``gpu_until_ms``."""
    tok = timer.start(host(at_ms))
    ft.queued_ms = max(ft.queued_ms, gpu_until_ms)
    return tok, timer.stop(tok, host(at_ms + 0.01 if stop_ms is None else stop_ms))


def _driver_calls(ft, timer):
    """Counts every driver-facing call the timer makes on its hot side."""
    calls = collections.Counter()
    for name in ("_capturing", "_stream_key", "_stream_query", "_record", "_query", "_new"):
        fn = getattr(timer, name)
        setattr(timer, name, (lambda fn, name: lambda *a: calls.update([name]) or fn(*a))(fn, name))
    return calls


def test_cpu_timer_has_no_start_kind():
    timer = CpuTimer()
    tok = timer.start(BASE)
    assert timer.interval_kind(tok, timer.stop(tok, BASE + 5)) == (BASE + timer.offset, BASE + 5 + timer.offset, None)


def test_a_start_makes_no_driver_call_and_a_stop_records_one_event():
    assert {GPU_EVENT, HOST_CLOCK} == set(START_VALUES)
    ft, timer = _timer()
    first, end = _phase(ft, timer, 0.0, 0.0)  # the first start takes the anchor: the stream is idle
    assert timer._anchors[0][1] == host(0.0)
    timer.release(first, end)  # as the drain does: the next end comes from the pool
    calls = _driver_calls(ft, timer)
    for i in range(1, 6):
        before = dict(calls)
        tok = timer.start(host(i))
        assert calls == before and tok == (host(i), timer._last_end)
        timer.release(tok, timer.stop(tok, host(i + 0.5)))
        assert calls == {"_capturing": i, "_stream_key": i, "_record": i}
    assert len(ft.records) == 1 + 1 + 5  # the anchor, the first phase's end, five ends


def test_on_an_idle_gpu_a_phase_starts_at_the_call():
    ft, timer = _timer()
    _, e1 = _phase(ft, timer, 0.0, 2.0)  # anchor at 0, the phase's GPU work until 2 ms
    ft.gpu_ms = 3.0  # the host did 1 ms of scheduler work; the GPU went idle at 2 ms
    tok, e2 = _phase(ft, timer, 3.0, 4.5, stop_ms=3.1)
    ft.gpu_ms = 4.5
    assert timer.interval_kind(tok, e2) == (timer.wall(host(3.0)), timer.wall(host(4.5)), HOST_CLOCK)
    # A phase without GPU work: its end passes as soon as it is recorded (at its stop call).
    ft.gpu_ms = 5.6
    tok3, e3 = _phase(ft, timer, 5.5, 0.0, stop_ms=5.6)
    assert timer.interval_kind(tok3, e3) == (timer.wall(host(5.5)), timer.wall(host(5.6)), HOST_CLOCK)
    assert timer._bad_anchor is None


def test_while_the_gpu_is_behind_a_phase_starts_at_the_previous_end():
    ft, timer = _timer()
    t1, e1 = _phase(ft, timer, 0.0, 5.0)  # the GPU is 5 ms behind the host from here on
    t2, e2 = _phase(ft, timer, 0.2, 9.0)
    ft.gpu_ms = ft.queued_ms = 20.0  # the GPU catches up and goes idle
    t3, e3 = _phase(ft, timer, 20.0, 23.0)
    ft.gpu_ms = 30.0
    assert t2[1] is e1 and t3[1] is e2
    assert timer.interval_kind(t1, e1) == (timer.wall(host(0)), timer.wall(host(5)), HOST_CLOCK)
    assert timer.interval_kind(t2, e2) == (timer.wall(host(5)), timer.wall(host(9)), GPU_EVENT)
    # Idle time before a call is not counted: the previous end is earlier than the call.
    assert timer.interval_kind(t3, e3) == (timer.wall(host(20)), timer.wall(host(23)), HOST_CLOCK)


def test_the_previous_end_counts_only_on_the_same_stream_and_only_once_resolved():
    ft, timer = _timer()
    t1, e1 = _phase(ft, timer, 0.0, 5.0)
    ft.current = (9, 0, 1)  # the next phase runs on another stream: no order between the two
    t2, e2 = _phase(ft, timer, 0.2, 6.0)
    ft.current = (3, 0, 1)
    t3, e3 = _phase(ft, timer, 0.4, 8.0)
    t4, e4 = _phase(ft, timer, 0.6, 9.0)
    ft.gpu_ms = 10.0
    timer.interval_kind(t1, e1)
    assert timer.interval_kind(t2, e2)[::2] == (timer.wall(host(0.2)), HOST_CLOCK)
    # t3's previous end (e2, the other stream's) is not this stream's: the call's entry.
    assert timer.interval_kind(t3, e3)[::2] == (timer.wall(host(0.4)), HOST_CLOCK)
    # A previous phase the drain never mapped (e.g. its step was dropped): the call's entry.
    t5, e5 = _phase(ft, timer, 0.8, 11.0)
    t6, e6 = _phase(ft, timer, 1.0, 12.0)
    ft.gpu_ms = 12.0
    assert timer.interval_kind(t6, e6) == (timer.wall(host(1.0)), timer.wall(host(12.0)), HOST_CLOCK)


def test_nothing_is_recorded_while_a_graph_is_captured():
    ft, timer = _timer()
    _phase(ft, timer, 0.0, 1.0)
    ft.gpu_ms = 1.0
    n = len(ft.records)
    ft.capturing = True
    tok = timer.start(host(2) + CudaTimer._ANCHOR_EVERY_NS)  # an anchor is due, but not now
    assert tok is not None and timer.stop(tok, host(3)) is None and len(ft.records) == n
    ft.capturing = False
    timer.start(host(4) + CudaTimer._ANCHOR_EVERY_NS)
    assert len(ft.records) == n + 1 and timer._anchors[0][1] == host(4) + CudaTimer._ANCHOR_EVERY_NS


def test_anchors_come_from_an_idle_stream_and_are_refreshed_when_due():
    ft, timer = _timer()
    asked = []
    query = timer._stream_query
    timer._stream_query = lambda stream: asked.append(stream) or query(stream)
    ft.queued_ms = 3.0  # SGLang's own work already queued: the first phase finds the GPU busy
    t1, e1 = _phase(ft, timer, 0.0, 4.0)
    # No idle stream yet: the first end is its own anchor (never pooled) and every start asks.
    assert e1[3][0] is e1[0] and timer._anchor_due == 0 and len(asked) == 1
    timer.release(t1, e1)
    assert e1[0] not in timer._returned
    ft.gpu_ms = ft.queued_ms = 5.0
    t2, e2 = _phase(ft, timer, 5.0, 6.0)  # idle now: a proper anchor, used from this phase's end on
    assert len(asked) == 2 and e2[3] is timer._anchors[0] and e2[3][1] == host(5.0)
    ft.gpu_ms = 6.0
    assert timer.interval_kind(t2, e2) == (timer.wall(host(5.0)), timer.wall(host(6.0)), HOST_CLOCK)
    _phase(ft, timer, 7.0, 8.0)
    assert len(asked) == 2  # fresh: nobody asks
    due = CudaTimer._ANCHOR_EVERY_NS / 1e6
    busy, _ = _phase(ft, timer, 7.5 + due, 9.0 + due)  # due, but the GPU is busy (8 ms > 7.5): asked, kept
    assert len(asked) == 3 and timer._anchors[0] is e2[3] and busy[2:] == (None,)
    ft.gpu_ms = ft.queued_ms
    retry = CudaTimer._ANCHOR_RETRY_NS / 1e6
    # Idle now, but within the retry window of the busy answer: not asked, still marked as seen busy.
    t, _ = _phase(ft, timer, 7.5 + due + retry - 0.5, 7.6 + due + retry)
    assert len(asked) == 3 and timer._anchors[0] is e2[3] and t[2:] == (None,)
    ft.gpu_ms = ft.queued_ms
    t, _ = _phase(ft, timer, 7.5 + due + retry, 7.9 + due + retry)  # the window over: asked, idle, replaced
    assert len(asked) == 4 and timer._anchors[0][1] == host(7.5 + due + retry) and len(t) == 2


def test_a_busy_stream_is_asked_once_per_retry_window_not_at_every_start():
    """A GPU that runs ahead of the host (the overlap scheduler, a GPU-bound model) keeps the stream
    busy at nearly every start: once the anchor is due, the stream is asked again only
    _ANCHOR_RETRY_NS after a busy answer, every start in between marked as seen busy; the drain's
    distrust (``_anchor_due = 0``) still has the very next start ask."""
    ft, timer = _timer()
    _phase(ft, timer, 0.0, 0.0)  # the anchor, at 0
    ft.gpu_ms = 0.0
    calls = _driver_calls(ft, timer)
    due = CudaTimer._ANCHOR_EVERY_NS / 1e6
    retry = CudaTimer._ANCHOR_RETRY_NS / 1e6
    toks = []
    ft.queued_ms = due
    for i in range(400):  # 0.25 ms apart for 100 ms, the GPU always 1 ms behind
        at = due + 0.25 * i
        ft.gpu_ms = at - 1.0
        toks.append(_phase(ft, timer, at, at + 0.2)[0])
    assert calls["_stream_query"] == 100 / retry  # once per window, not 400 times
    assert calls["_capturing"] == 400 + 100 / retry  # each stop, and each ask
    assert all(t[2:] == (None,) for t in toks) and timer._anchors[0][1] == host(0.0)
    last_ask = host(due + 100 - retry)  # asked at 0, 10, ... 90 ms into the loop
    assert timer._anchor_busy and timer._anchor_due == last_ask + CudaTimer._ANCHOR_RETRY_NS
    timer._anchor_due = 0  # the drain distrusts the anchor: asked at the next start
    ft.gpu_ms = ft.queued_ms
    t, _ = _phase(ft, timer, due + 100.1, due + 100.2)
    assert calls["_stream_query"] == 100 / retry + 1 and len(t) == 2 and timer._anchors[0][1] == host(due + 100.1)
    assert not timer._anchor_busy and timer._anchor_due == host(due + 100.1) + CudaTimer._ANCHOR_EVERY_NS


def test_an_anchor_that_maps_ends_before_their_record_is_replaced():
    """An anchor whose record ran late (its GPU time is behind its host stamp) maps ends before
    their own record call: clamped to the record call, and the next start re-anchors."""
    ft, timer = _timer()
    _phase(ft, timer, 0.0, 1.0)
    late = timer._anchors[0]
    late[0].t += 1.0  # its record ran 1 ms after its host stamp
    ft.gpu_ms = 5.7
    tok, end = _phase(ft, timer, 5.7, 6.0, stop_ms=5.9)
    ft.gpu_ms = 6.0
    assert timer.interval_kind(tok, end) == (timer.wall(host(5.7)), timer.wall(host(5.9)), HOST_CLOCK)
    assert timer._bad_anchor is late[0] and timer._anchor_due == 0
    _phase(ft, timer, 6.1, 6.2)
    assert timer._anchors[0] is not late and timer._anchors[0][1] == host(6.1)


def test_ended_events_come_back_from_the_pool():
    ft, timer = _timer()
    t1, e1 = _phase(ft, timer, 0.0, 1.0)
    ft.gpu_ms = 1.0
    timer.release(t1, e1)
    created = ft.Event.created
    t2, e2 = _phase(ft, timer, 2.0, 3.0)
    assert e2[0] is e1[0] and ft.Event.created == created


def test_the_pool_keeps_the_events_of_every_step_the_queue_can_hold():
    """The events of the steps pending between two drain passes come back at once: the pool keeps
    as many as the queue holds steps (``max_pending``; 4,096 at least), so the next pass's steps
    make none. Beyond the cap the rest are let go and made again."""
    for max_pending, made_again in ((6000, 0), (0, 5000 - CudaTimer._POOL_MAX)):
        ft = _FakeTorch()
        timer = CudaTimer(ft, FAST["fast"], max_pending=max_pending)
        timer.relax_capture_mode = False
        ends = [_phase(ft, timer, i * 0.01, i * 0.01 + 0.005) for i in range(5000)]
        ft.gpu_ms = ft.queued_ms
        for tok, end in ends:  # the drain's pass over them all
            timer.release(tok, end)
        created = ft.Event.created
        for i in range(5000):  # before the anchor is due again (100 ms after the first): no anchor made
            _phase(ft, timer, 50.01 + i * 0.0099, 50.01 + i * 0.0099 + 0.005)
        assert ft.Event.created - created == made_again


def test_the_anchor_stock_covers_the_seconds_between_two_drain_passes():
    """Ten anchors a second at most, topped up once a pass: 16 for each second between two passes
    (``hold_s``, the drain's interval; 16 at least, 1,024 at most)."""
    ft = _FakeTorch()
    assert CudaTimer(ft, FAST["fast"])._FRESH_STOCK == CudaTimer._FRESH_STOCK == 16
    assert CudaTimer(ft, FAST["fast"], hold_s=0.1)._FRESH_STOCK == 16
    assert CudaTimer(ft, FAST["fast"], hold_s=30)._FRESH_STOCK == 480
    assert CudaTimer(ft, FAST["fast"], hold_s=3600)._FRESH_STOCK == 1024


def test_record_starts_gives_every_phase_its_own_start_event():
    """The benchmark switch: two events per phase, the interval between them."""
    ft, timer = _timer()
    _phase(ft, timer, 0.0, 0.0)
    timer.record_starts()
    ft.queued_ms = 2.0  # busy: the start event lands behind the queued work
    n = len(ft.records)
    tok, end = _phase(ft, timer, 0.5, 3.5)
    ft.gpu_ms = 3.5
    assert len(ft.records) == n + 2 and len(tok) == 3
    assert timer.interval_kind(tok, end) == (timer.wall(host(2.0)), timer.wall(host(3.5)), GPU_EVENT)
    timer.release(tok, end)
    assert set(map(id, timer._returned)) == {id(tok[2]), id(end[0])}


def test_the_portable_stream_path_without_torchs_c_look_up():
    ft = _FakeTorch()
    del ft._C._cuda_getCurrentStream
    ft, timer = _timer(ft)
    assert not timer.fast_stream
    t1, e1 = _phase(ft, timer, 0.0, 5.0)
    t2, e2 = _phase(ft, timer, 0.2, 6.0)  # a new Stream object per call, still the same stream
    ft.gpu_ms = 6.0
    timer.interval_kind(t1, e1)
    assert timer.interval_kind(t2, e2) == (timer.wall(host(5.0)), timer.wall(host(6.0)), GPU_EVENT)


def test_take_ready_resolves_a_pass_of_cuda_steps_with_one_query_and_one_elapsed_per_phase():
    """The drain's per-step driver calls: a pass over finished steps asks one readiness query and
    maps each phase's end with one elapsed time."""
    from sgl_probe import drain
    from sgl_probe.readers import Facts
    from sgl_probe.recorder import PhaseRecord, StepRecord

    ft, timer, calls = _counting_timer()
    steps = collections.deque()
    for i in range(30):  # back to back, the GPU behind: each phase starts at the previous end
        tok, end = _phase(ft, timer, 0.1 * i, 1.0 + i)
        st = StepRecord(i, Facts("step", "DECODE", 2, 2), 0)
        st.host1 = 1_000
        ph = PhaseRecord(Facts("decode", "DECODE", 2, 2), "t", 0, tok)
        ph.t_end = end
        st.phases.append(ph)
        steps.append(st)
    ft.gpu_ms = 1e6
    calls["query"] = calls["elapsed"] = 0
    rows: list = []
    assert drain.take_ready(steps, timer, 10**12, False, 64, rows) == 30 and not steps
    assert calls["query"] == 1 and calls["elapsed"] == 30
    got = [(r[8][0][1], r[8][0][2], r[8][0][10]) for r in rows]
    want = [(timer.wall(host(0)), timer.wall(host(1)), HOST_CLOCK)]
    want += [(timer.wall(host(i)), timer.wall(host(1 + i)), GPU_EVENT) for i in range(1, 30)]
    assert got == want


def test_a_step_run_while_a_graph_is_captured_queues_nothing():
    """SGLang captures graphs at startup, possibly through wrapped code: the phase's end is not
    recorded, so neither the phase nor its step is reported; the next step is timed as usual."""
    from tests.test_exact_recorder import Rig

    rig = Rig()
    ft, timer = _timer()
    rig.rec.timer = timer
    rig.decode_step(2)
    n_records, n_steps = len(ft.records), len(rig.rec.steps)
    ft.capturing = True
    try:
        rig.decode_step(2)
    except IndexError:  # decode_step reads the newest queued step's phases: there are none
        pass
    assert len(ft.records) == n_records and len(rig.rec.steps) == n_steps
    ft.capturing = False
    ph = rig.decode_step(2)
    assert len(rig.rec.steps) == n_steps + 1 and ph.t_end is not None and len(ft.records) == n_records + 1


def test_with_a_due_anchor_and_a_busy_stream_the_query_decides_not_the_anchor():
    """A GPU-bound server may find no idle stream for minutes, so its anchor drifts (up to ~10 ppm
    measured). Once the anchor is due, every start asks the stream: a busy one means the previous
    end starts the phase even where the drifted anchor maps that end before the call; an end that
    maps earlier than any drift could explain (the stream busy with other work after a gap) does
    not."""
    ft, timer = _timer()
    _phase(ft, timer, 0.0, 0.0)  # the anchor, at 0
    t1, e1 = _phase(ft, timer, 10.0, 11.0)
    ft.gpu_ms = 11.0
    timer.interval_kind(t1, e1)
    later = 300_000.0  # five minutes on, the GPU busy ever since: no idle stream, no new anchor
    ft.gpu_ms, ft.queued_ms = later - 5.0, later + 1.0
    t2, e2 = _phase(ft, timer, later - 8.0, later + 2.0)
    t3, e3 = _phase(ft, timer, later, later + 6.0)
    assert t2[2:] == (None,) and t3[2:] == (None,)  # due, asked, busy
    ft.gpu_ms = later + 6.0
    timer._anchors[0][0].t += 3.0  # the anchor drifted (10 ppm): every later end maps 3 ms early
    got2 = timer.interval_kind(t2, e2)
    got3 = timer.interval_kind(t3, e3)
    assert got2 == (timer.wall(host(later - 8.0)), timer.wall(host(later - 1.0)), HOST_CLOCK)
    # e2 maps 1 ms before t3's call; the stream was busy, and 1 ms is within what five minutes of
    # drift can explain: e2 starts t3.
    assert got3 == (got2[1], got2[1] + 4_000_000, GPU_EVENT)
    # The stream busy with other work 60 ms after the previous end: drift cannot explain that gap.
    ft.gpu_ms, ft.queued_ms = later + 60.0, later + 70.0
    t4, e4 = _phase(ft, timer, later + 66.0, later + 70.0)
    assert t4[2:] == (None,)
    ft.gpu_ms = later + 70.0
    assert timer.interval_kind(t4, e4) == (timer.wall(host(later + 66.0)), timer.wall(host(later + 67.0)), HOST_CLOCK)


def _tokens(ft, timer, anchor_host: int, end_ms: float, end_host: int):
    """An anchor at ``anchor_host`` (GPU time 0) and an end token whose event the GPU passed
    ``end_ms`` after it, recorded on the host at ``end_host``."""
    anchor_ev, end_ev = ft.cuda.Event(enable_timing=True), ft.cuda.Event(enable_timing=True)
    anchor_ev.t, end_ev.t = 0.0, end_ms
    stream = next(iter(timer._streams.values()))
    return stream, (end_ev, stream, end_host, (anchor_ev, anchor_host))


def test_an_end_mapping_early_within_the_tolerance_is_clamped_beyond_it_distrusts_the_anchor():
    ft, timer = _timer()
    off, tol = timer._offset, timer._ANCHOR_TOLERANCE_NS
    timer._anchor_due = 777
    _, end = _tokens(ft, timer, 0, 1.0, 1_000_000 + tol // 2)  # maps tol/2 before its own record
    t0, t1, _ = timer.interval_kind((0, None), end)
    assert t1 == off + 1_000_000 + tol // 2 and timer._bad_anchor is None and timer._anchor_due == 777
    _, end = _tokens(ft, timer, 0, 1.0, 1_000_000 + tol + 1)
    t0, t1, _ = timer.interval_kind((0, None), end)
    assert t1 == off + 1_000_000 + tol + 1 and timer._bad_anchor is end[3][0] and timer._anchor_due == 0


def test_a_due_anchors_drift_allowance_and_the_end_never_before_the_start():
    ft, timer = _timer()
    off, tol = timer._offset, timer._ANCHOR_TOLERANCE_NS

    def start_after(prev_mapped: int, start_host: int, anchor_host: int, busy_due: bool = True):
        stream, prev = _tokens(ft, timer, anchor_host, 0.0, 0)
        timer._chain = (prev, prev_mapped)
        _, end = _tokens(ft, timer, anchor_host, 0.0, 0)
        end = (end[0], stream, end[2], end[3])
        start = (start_host, prev, None) if busy_due else (start_host, prev)
        return timer.interval_kind(start, end)

    # A start 1 s after a due anchor (stream busy): the previous end counts if it mapped no earlier
    # than the entry minus 20 ppm of the anchor's age (20 µs) minus the tolerance.
    s = 10**9
    assert start_after(off + s - 40_000 + 1, s, 0)[2] == GPU_EVENT
    assert start_after(off + s - 40_000, s, 0)[2] == HOST_CLOCK
    assert start_after(off + s - 1, s, 0, busy_due=False)[2] == HOST_CLOCK  # only a due anchor allows it
    # An entry before the anchor (a negative age) floors as Python's // does: -70,001 // 50,000 == -2.
    assert start_after(off + s - tol + 2 + 1, s, s + 70_001)[2] == GPU_EVENT
    assert start_after(off + s - tol + 2, s, s + 70_001)[2] == HOST_CLOCK
    # A previous end mapped after this end's own mapping: the end is put at the start, never before.
    t0, t1, kind = start_after(off + 5 * s, s, 0, busy_due=False)
    assert (t0, t1, kind) == (off + 5 * s, off + 5 * s, GPU_EVENT)


def test_the_probe_sizes_its_cuda_timer_by_the_drain_interval_and_the_queue(monkeypatch):
    """``SGL_PROBE_DRAIN_S``, ``SGL_PROBE_MAX_PENDING`` and ``SGL_PROBE_GPU_EVERY_MS`` reach the CUDA
    timer the probe's recorder makes."""
    from sgl_probe import activate, config, timing

    asked = []
    monkeypatch.setattr(timing, "make_timer", lambda choice, log, fast=None, hold_s=1.0, max_pending=0, every_ns=0:
                        asked.append((choice, hold_s, max_pending, every_ns)) or "timer")
    monkeypatch.setenv(activate.RUN_ID_VAR, "run")  # a Probe sets these where they are missing
    monkeypatch.setenv(activate.envsnap.LAUNCHER_ENV_VAR, "{}")
    cfg = config.load({"SGL_PROBE_DRAIN_S": "7.5", "SGL_PROBE_MAX_PENDING": "20000", "SGL_PROBE_TIMER": "cuda",
                       "SGL_PROBE_GPU_EVERY_MS": "2.5"})
    probe = activate.Probe(cfg, targets=())
    assert probe.recorder.ensure_timer() == "timer" and asked == [("cuda", 7.5, 20000, 2_500_000)]
