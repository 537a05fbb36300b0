"""Which start a phase used, as both timers report it (``start_kind``)."""

from __future__ import annotations

from sgl_probe.contract import START_VALUES
from sgl_probe.timing import GPU_EVENT, HOST_CLOCK, CpuTimer, CudaTimer
from tests.test_gpu_free_parts import _FakeTorch


def test_cpu_timer_has_no_start_kind():
    timer = CpuTimer()
    tok = timer.start(10**12)
    assert timer.start_kind(tok) is None and timer.start_kind(None) is None


def test_cuda_timer_start_kind_follows_the_start_it_took():
    assert {GPU_EVENT, HOST_CLOCK} == set(START_VALUES)
    ft = _FakeTorch()
    timer = CudaTimer(ft)
    timer.relax_capture_mode = False
    base = 10**12
    anchor = timer.start(base)  # no anchor yet: a start event, which becomes the anchor
    assert timer.start_kind(anchor) == GPU_EVENT
    ft.gpu_ms = ft.queued_ms = 1.0
    timer.stop(anchor, base + 1)
    idle = timer.start(base + 2)  # the stream is idle: the host clock at the call
    assert idle[0] is None and timer.start_kind(idle) == HOST_CLOCK
    ft.queued_ms = 5.0  # the GPU falls behind: an event queued behind its work
    end = timer.stop(idle, base + 3)
    busy = timer.start(base + 4)
    assert busy[0] is end[0] and timer.start_kind(busy) == GPU_EVENT  # the shared boundary
    timer.stop(busy, base + 5)
    timer.share_boundaries = False
    fresh = timer.start(base + 6)
    assert fresh[0] is not None and timer.start_kind(fresh) == GPU_EVENT
    timer.stop(fresh, base + 7)
    ft.gpu_ms = ft.queued_ms
    timer.host_starts = False  # switched off: an idle stream records an event too
    assert timer.start_kind(timer.start(base + 8)) == GPU_EVENT
    ft.capturing = True  # nothing recorded while SGLang captures a graph
    assert timer.start(base + 9) is None and timer.start_kind(None) is None


def test_without_idle_queries_only_a_due_anchor_asks_the_stream():
    """``idle_queries`` off (a benchmark switch): a start with a fresh anchor records an event
    without asking the stream; once the anchor is due the stream is asked again, and an idle one
    takes the new anchor. Intervals stay exact either way."""
    ft = _FakeTorch()
    timer = CudaTimer(ft)
    timer.relax_capture_mode = False
    asked = []
    query = timer._stream_query
    timer._stream_query = lambda stream: asked.append(stream) or query(stream)
    base = 10**12
    first = timer.start(base)  # no anchor yet: asked, and the start event is the anchor
    assert len(asked) == 1 and first[0] is first[1][0]
    ft.gpu_ms = ft.queued_ms = 1.0
    timer.stop(first, base + 1)
    timer.idle_queries = False
    ev_start = timer.start(base + 2)  # idle, but not asked: an event, not the host clock
    assert len(asked) == 1 and ev_start[0] is not None and timer.start_kind(ev_start) == GPU_EVENT
    ft.queued_ms = 3.0
    end = timer.stop(ev_start, base + 3)
    ft.gpu_ms = 3.0
    t0, t1 = timer.interval(ev_start, end)
    assert t1 - t0 == 2_000_000
    due = timer.start(base + CudaTimer._ANCHOR_EVERY_NS)  # the anchor is due: asked, re-anchored
    assert len(asked) == 2 and due[1] is not first[1] and due[0] is due[1][0]
    timer.idle_queries = True
    timer.stop(due, base + CudaTimer._ANCHOR_EVERY_NS + 1)
    assert timer.start_kind(timer.start(base + CudaTimer._ANCHOR_EVERY_NS + 2)) == HOST_CLOCK
    assert len(asked) == 3
