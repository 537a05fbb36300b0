"""Interval timers behind one interface: CUDA events on the GPU, perf_counter_ns on the CPU.

Hot side (the scheduler thread): ``start(now_ns) -> token | None`` and ``stop(token, now_ns)``.
Drain side (the export thread): ``ready``, ``interval``, ``wall``, ``release``, ``start_kind``.

The CUDA timer never synchronizes: events come from a pool, are recorded on the current stream
around the call, and are later asked ``query()`` by the drain thread; only completed pairs are
read, on the probe's own threads with the CUDA runtime's ``cudaEventElapsedTime`` (one call, the
GIL released; :func:`runtime_elapsed`), elsewhere with torch's ``elapsed_time``. Nothing is
recorded on a stream that is being captured into a CUDA graph (SGLang captures at startup), so
capture stays valid.

What one timed call costs on the hot path is, in this order: one capture check, one look-up of
the current stream (a C call and a dict hit: ``torch.cuda.current_stream()`` would build a new
Python ``Stream`` object every time, which costs more than the driver's record itself), one
stream query, and one event record for the end, made through the C method with that stream. A
start event is recorded only when the stream is busy and the previous phase's end event cannot
serve as the start (see ``CudaTimer``). The end event goes on the stream the start went on, so the
interval is one stream's.

The drain thread queries events that were recorded before any capture; CUDA forbids such queries
from other threads while a capture in the default "global" mode is under way (the capture is
invalidated: PyTorch hit this with its NCCL watchdog). So the first time a thread resolves events
it switches its own CUDA stream-capture interaction mode to thread-local, as PyTorch's watchdog
does; it never captures anything itself.

GPU timestamps become wall-clock span times through an *anchor*: an event recorded while the
stream was idle, paired with the host clock at that moment (one per device). Anchors are
refreshed every 100 ms, when the stream is found idle: the two clocks drifted apart by 0 to
10 ppm on the H200 hosts measured (``benchmarks/gpu_clock.py``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Optional, Tuple

from sgl_probe.contract import START_VALUES

log = logging.getLogger("sgl_probe")

GPU_EVENT, HOST_CLOCK = START_VALUES
perf_counter_ns = time.perf_counter_ns

#: cudaStreamCaptureModeThreadLocal: other threads' captures no longer restrict this thread.
_CAPTURE_MODE_THREAD_LOCAL = 1


class CpuTimer:
    """SGLang's CPU engine runs the forward synchronously on the calling thread.

    ``host_clock``: tokens are host ``perf_counter_ns`` values, always ready, nothing to release,
    mapped to the wall clock by adding ``offset``; the drain thread does that inline instead of
    calling ``ready`` / ``interval`` / ``start_kind`` / ``release`` for every phase."""

    kind = "cpu"
    host_clock = True

    def __init__(self) -> None:
        self._offset = self.offset = time.time_ns() - perf_counter_ns()

    def start(self, now_ns: int) -> Any:
        return now_ns

    def stop(self, token: Any, now_ns: int) -> Any:
        return now_ns

    def ready(self, start: Any, end: Any) -> bool:
        return True

    def interval(self, start: Any, end: Any) -> Tuple[int, int]:
        return start + self._offset, end + self._offset

    def wall(self, host_ns: int) -> int:
        return host_ns + self._offset

    def release(self, start: Any, end: Any) -> None:
        pass

    def start_kind(self, start: Any) -> Optional[str]:
        """Host-clock intervals only: there is no GPU start to tell apart."""
        return None


def _cudart() -> Any:
    """The CUDA runtime torch already loaded (a ``ctypes.CDLL``), or None."""
    import ctypes

    path = None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if "libcudart.so" in line:
                    path = line.split()[-1]
                    break
    except OSError:
        return None
    return None if path is None else ctypes.CDLL(path)


def _exchange_capture_mode(cudart: Any) -> Any:
    """The runtime's ``cudaThreadExchangeStreamCaptureMode``."""
    import ctypes

    fn = cudart.cudaThreadExchangeStreamCaptureMode
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int
    return fn


def runtime_elapsed(cudart: Any, refused: Any, keep_gil: bool = False) -> Any:
    """``(start_event, end_event) -> ms`` through the runtime's ``cudaEventElapsedTime`` on the two
    torch events' handles; where the runtime refuses, ``refused(start_event, end_event, error)``
    answers instead. ``keep_gil``: called without releasing the GIL (ctypes releases it around
    every call otherwise, and a scheduler thread waiting for it takes it at each read: gpu_bench's
    drainprof measured the drain thread's CPU per step up ~50 % with the release, run 20).

    Why not ``Event.elapsed_time``: torch asks both events ``cudaEventQuery`` and sets the device
    around the call, four more runtime calls per interval, made by the drain thread while it holds
    the GIL. The drain only resolves steps whose ends it has seen complete (``ready_prefix``), so
    those queries only repeat what is known; on the real tiny server the CUDA timer's drain took
    ~13 µs more CPU per step than the CPU timer's (BENCHMARKS.md, run h200-13)."""
    import ctypes

    fn = library = cudart.cudaEventElapsedTime
    fn.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    if keep_gil:  # the same entry point, through a prototype that keeps the GIL
        proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)
        fn = proto(ctypes.cast(library, ctypes.c_void_p).value)
    c_float, byref = ctypes.c_float, ctypes.byref

    def elapsed(start: Any, end: Any) -> float:
        ms = c_float()
        error = fn(byref(ms), start.cuda_event, end.cuda_event)
        return refused(start, end, error) if error else ms.value

    elapsed.entry = fn  # type: ignore[attr-defined]  # what is called (tests look at its flags)
    elapsed.library = library  # type: ignore[attr-defined]  # keeps the library's function alive
    return elapsed


class CudaTimer:
    """Token of ``start``: ``(start_event, anchor, stream)``, ``(end_event, anchor, stream, None,
    end_token)`` for a shared boundary, or ``(None, anchor, stream, host_ns)`` for a host-clock
    start; ``anchor`` is ``(event, perf_counter_ns)``. A start event that is its
    anchor's own event is not pooled (anchors stay alive).

    Host-clock starts: on a launch-bound loop the GPU has drained its queue by the time the next
    phase starts, and a start event would only say "now, plus the launch latency". When the
    stream is idle (one ``cudaStreamQuery``), the start is the host clock at the call's entry and
    only the end event is recorded; the end's host time comes from the anchor plus
    ``elapsed_time(anchor, end)``. The span then includes the launch latency of the phase's first
    kernel (10-21 µs on the H200 hosts measured by ``benchmarks/gpu_clock.py``; 80-100 µs when
    the GPU had been idle for 50 ms or more and wakes up): time the phase really took, but not
    GPU execution. Halves the events on exactly the loops where the host is the bottleneck.
    Durations of host-clock starts depend on the anchor, so an end that maps to before its own
    record call (an anchor whose record ran late) is clamped there and the anchor replaced.

    Shared boundaries: recording a timing event costs the GPU a few microseconds too (it waits for
    the work before it to finish before it writes its timestamp). When a phase starts while the
    previous phase's end event, on the same stream, has not completed yet, the GPU cannot go idle
    between the two, so a fresh start event would complete right after that end event anyway
    (plus only whatever was launched on that stream in between, which this phase then includes):
    that end event is reused as this phase's start. On a GPU-bound loop this halves the events per
    phase; when the GPU has caught up (CPU-bound loops), a fresh start is recorded as before.

    Events come back from the drain thread through ``_returned``; only the hot thread moves them
    into the pool, so an end event reused as a start is pooled exactly once, after both of its
    phases were released (``_claimed`` counts the second owner)."""

    kind = "cuda"
    host_clock = False
    # Host and GPU clocks drift apart by up to ~10 ppm on the H200 hosts measured (gpu_clock.py):
    # 100 ms between anchors keeps that under 1 µs, for one extra event per 100 ms.
    _ANCHOR_EVERY_NS = 100_000_000
    _POOL_MAX = 4096
    _STREAMS_MAX = 256

    def __init__(self, torch_mod: Any) -> None:
        cuda = torch_mod.cuda
        C = torch_mod._C
        Event = cuda.Event
        self._new = lambda: Event(enable_timing=True)
        self._Stream = cuda.Stream
        self._current_stream = cuda.current_stream
        self._capturing = getattr(C, "_cuda_isCurrentStreamCapturing", None) or cuda.is_current_stream_capturing
        base = getattr(C, "_CudaEventBase", None)
        # The C methods take (event, stream) without the Python wrappers' current_stream() call.
        self._record = getattr(base, "record", None) or Event.record
        self._query = getattr(base, "query", None) or Event.query
        self._elapsed = getattr(base, "elapsed_time", None) or Event.elapsed_time
        self._stream_query = getattr(getattr(C, "_CudaStreamBase", None), "query", None) or cuda.Stream.query
        self._stream_key = getattr(C, "_cuda_getCurrentStream", None)
        self._streams: dict = {}
        self._pool: list = []
        self._returned: collections.deque = collections.deque()  # appended by the drain thread
        self._claimed: set = set()  # ids of end events reused as a start (hot thread only)
        self._last_end: Optional[tuple] = None  # (event, stream, host ns) of the latest stop()
        self._bad_anchor: Any = None  # an anchor event the drain thread caught mapping wrong
        self._chain: tuple = (None, 0, 0)  # drain side: the last end token mapped (see interval)
        self.share_boundaries = True  # benchmarks switch these two off to measure what they save
        self.host_starts = True
        # Off: the stream is asked whether it is idle only when an anchor is due; every other start
        # records an event. In a real launch-bound server the query cost about as much as the record
        # it can save (BENCHMARKS.md, h200-16): benchmarks switch it off to measure that.
        self.idle_queries = True
        self._offset = time.time_ns() - perf_counter_ns()
        self._anchors: dict = {}  # device index -> (event, perf_counter_ns), one per device
        self._prepared = threading.local()
        self.relax_capture_mode = True  # benchmarks switch it off to show the hazard it avoids
        self.runtime_elapsed = True  # benchmarks switch it off to measure what it saves
        self.elapsed_keeps_gil = False  # benchmarks switch it on (runtime_elapsed's keep_gil)
        self._elapsed_checks = self._ELAPSED_CHECKS
        # What the drain thread reads intervals with: "torch", or "cuda_runtime" once its checks
        # passed ("cuda_runtime_gil" with elapsed_keeps_gil; for benchmarks and tests to see which
        # ran).
        self.elapsed_source = "torch"
        self.fast_stream = False
        if self._stream_key is not None:
            try:
                official = self._current_stream()  # first: it runs torch's lazy CUDA init
                self.fast_stream = self._lookup_stream() == official
            except Exception:
                self.fast_stream = False
        if not self.fast_stream:
            self.start = self._start_portable  # type: ignore[method-assign]

    # -- hot side ---------------------------------------------------------------------------
    def _lookup_stream(self) -> Any:
        key = self._stream_key(-1)  # (stream id, device index, device type) of the current stream
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= self._STREAMS_MAX:
                self._streams.clear()
            stream = self._Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            self._streams[key] = stream
        return stream

    def _pop(self) -> Any:
        pool = self._pool
        if pool:
            return pool.pop()
        returned, claimed = self._returned, self._claimed
        while returned:
            ev = returned.popleft()
            if id(ev) in claimed:
                claimed.discard(id(ev))  # its other phase still holds it
            elif len(pool) < self._POOL_MAX:
                pool.append(ev)
        return pool.pop() if pool else self._new()

    def start(self, now_ns: int) -> Any:
        if self._capturing():
            return None
        key = self._stream_key(-1)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._lookup_stream()
        return self._start_on(stream, key[1], now_ns)

    def _start_portable(self, now_ns: int) -> Any:
        if self._capturing():
            return None
        stream = self._current_stream()
        return self._start_on(stream, stream.device_index, now_ns)

    def _start_on(self, stream: Any, device: int, now_ns: int) -> Any:
        last = self._last_end
        self._last_end = None
        anchor = self._anchors.get(device)
        # The idle check comes first: it is the launch-bound case, where the host is the
        # bottleneck and one driver query fewer shows (a query cost 1.3-1.6 µs on one H200 host,
        # as much as an event record); on GPU-bound loops the host has time to spare. Without
        # ``idle_queries`` only a due anchor asks.
        if (self.idle_queries or anchor is None or now_ns - anchor[1] >= self._ANCHOR_EVERY_NS
                or anchor[0] is self._bad_anchor) and self._stream_query(stream):
            # Idle stream: the phase's first launch starts on the GPU as soon as it is issued, so
            # the host clock at entry is its start; only the end needs an event.
            if anchor is not None and now_ns - anchor[1] < self._ANCHOR_EVERY_NS and self.host_starts \
                    and anchor[0] is not self._bad_anchor:
                return (None, anchor, stream, now_ns)
            # Due for a fresh anchor, and an idle stream is exactly when one can be taken: this
            # phase's start event is it.
            ev = self._new()
            self._record(ev, stream)
            anchor = self._anchors[device] = (ev, now_ns)
            return (ev, anchor, stream)
        # ``is`` matches the cached stream objects of the fast path; the portable path builds a
        # new Stream per call, which only ``==`` recognises.
        if last is not None and (last[1] is stream or last[1] == stream) and self.share_boundaries \
                and not self._query(last[0]):
            self._claimed.add(id(last[0]))
            return (last[0], anchor, stream, None, last)  # ``last``: see interval
        pool = self._pool
        ev = pool.pop() if pool else self._pop()
        self._record(ev, stream)
        if anchor is None:
            # First phase on this device and the stream busy: anchor on it anyway (span positions
            # are off by the queued work until the next idle-stream anchor; durations are exact).
            anchor = self._anchors[device] = (ev, now_ns)
        return (ev, anchor, stream)

    def stop(self, token: Any, now_ns: int) -> Any:
        if token is None:
            return None
        pool = self._pool
        ev = pool.pop() if pool else self._pop()
        stream = token[2]
        self._record(ev, stream)
        # The end token doubles as the shared-boundary candidate for the next start.
        end = self._last_end = (ev, stream, now_ns)
        return end

    # -- drain side -------------------------------------------------------------------------
    def _prepare_thread(self, stream: Any) -> None:
        """Once per resolving thread. The probe's own threads (drain, shutdown) never capture, so
        they switch to thread-local capture mode for good (and to the events' device first: a
        runtime call on a thread with no device set would open a context on GPU 0). Any other
        thread (a test or benchmark calling ``drain()``) is switched only around each query."""
        state = self._prepared
        state.exchange = None
        state.elapsed = None
        state.done = True
        if not self.relax_capture_mode:
            return
        try:
            cudart = _cudart()
            if cudart is None:
                return
            exchange = _exchange_capture_mode(cudart)
            if threading.current_thread().name.startswith("sgl-probe"):
                import ctypes
                import torch

                torch.cuda.set_device(stream.device_index)
                exchange(ctypes.byref(ctypes.c_int(_CAPTURE_MODE_THREAD_LOCAL)))
                # The runtime's calls now go to the events' own device.
                if self.runtime_elapsed:
                    state.elapsed = self.checked_elapsed(cudart)
            else:
                state.exchange = exchange
        except Exception:
            pass

    def _done(self, end: Any) -> bool:
        """Whether the end token's event has completed (see :meth:`_prepare_thread`)."""
        state = self._prepared
        if not getattr(state, "done", False):
            self._prepare_thread(end[1])
        exchange = state.exchange
        if exchange is None:
            return self._query(end[0])
        import ctypes

        mode = ctypes.c_int(_CAPTURE_MODE_THREAD_LOCAL)
        exchange(ctypes.byref(mode))
        try:
            return self._query(end[0])
        finally:
            exchange(ctypes.byref(mode))

    def ready(self, start: Any, end: Any) -> bool:
        return self._done(end)

    def ready_prefix(self, ends: list) -> int:
        """How many of ``ends`` (end tokens in record order) have completed, in few driver calls:
        events of one stream complete in the order they were recorded, so the completed ones are
        a prefix. The newest is asked first (a drain pass a second after the last one usually finds
        everything done: one query for the whole pass instead of one per step), a binary search
        finds the boundary otherwise. Ends on more than one stream are asked one by one."""
        n = len(ends)
        if not n:
            return 0
        stream = ends[0][1]
        done = self._done
        if not all(e[1] is stream or e[1] == stream for e in ends):
            return next((i for i, e in enumerate(ends) if not done(e)), n)
        if done(ends[-1]):
            return n
        lo, hi = 0, n - 1  # ends[hi] has not completed; the answer is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if done(ends[mid]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    #: How far before its own record call an end event may map before its anchor is distrusted.
    _ANCHOR_TOLERANCE_NS = 20_000

    #: Links of a chain of shared boundaries mapped from the previous phase's end before the
    #: start is mapped through the anchor again (bounds the rounding a chain can accumulate).
    _CHAIN_MAX = 256

    #: Intervals the runtime's elapsed time answers next to torch's before it is used alone.
    _ELAPSED_CHECKS = 16

    def checked_elapsed(self, cudart: Any) -> Any:
        """This thread's elapsed time through the runtime (:func:`runtime_elapsed`), checked: for
        the first :attr:`_ELAPSED_CHECKS` intervals torch's ``Event.elapsed_time`` answers too and
        its answer is used; once they all agreed, the runtime's alone. At the first disagreement or
        refusal this thread goes back to torch's for good, with one log line."""
        torch_elapsed = self._elapsed
        state = self._prepared

        def give_up(a: Any, b: Any, why: str, ref: Optional[float] = None) -> float:
            state.elapsed = None
            self.elapsed_source = "torch"
            log.info("sgl-probe: cudaEventElapsedTime through the CUDA runtime %s; the drain asks torch from now on",
                     why)
            return torch_elapsed(a, b) if ref is None else ref

        fast = runtime_elapsed(cudart, lambda a, b, error: give_up(a, b, f"failed (error {error})"),
                               keep_gil=self.elapsed_keeps_gil)

        def checking(a: Any, b: Any) -> float:
            try:
                ms = fast(a, b)
            except Exception as exc:  # e.g. a torch whose events expose no handle
                return give_up(a, b, f"raised {exc!r}")
            if state.elapsed is None:  # refused: torch answered
                return ms
            ref = torch_elapsed(a, b)  # raises as it always did where the interval cannot be read
            if ms != ref:
                return give_up(a, b, f"read {ms!r} ms where torch reads {ref!r} ms", ref)
            self._elapsed_checks -= 1
            if self._elapsed_checks <= 0:
                state.elapsed = fast
                self.elapsed_source = "cuda_runtime_gil" if self.elapsed_keeps_gil else "cuda_runtime"
            return ref

        return checking

    def interval(self, start: Any, end: Any) -> Tuple[int, int]:
        """Drain side, phases in record order. A start that is the previous phase's end (a shared
        boundary) takes that end's mapped time, so such a phase costs one ``elapsed_time``
        instead of two; durations always come from the phase's own two events."""
        ev, (anchor_ev, anchor_host), _ = start[:3]
        end_ev, _, end_host = end
        elapsed = getattr(self._prepared, "elapsed", None) or self._elapsed
        offset = self._offset
        if ev is None:  # host-clock start; the end maps through the anchor
            t0 = start[3] + offset
            t1 = anchor_host + offset + round(elapsed(anchor_ev, end_ev) * 1e6)
            self._chain = (end, t1, 0)
            # The GPU cannot pass an event before the host recorded it. Mapping earlier than that
            # means the anchor's own record ran late (e.g. behind a profiler's start-up work):
            # clamp, and have the hot thread take a new anchor.
            if t1 < end_host + offset - self._ANCHOR_TOLERANCE_NS:
                self._bad_anchor = anchor_ev
            return t0, max(t1, end_host + offset, t0)
        # The end token itself, not its event, identifies the boundary: an event comes back from
        # the pool for later phases, a token is never reused.
        chain_end, chain_t, links = self._chain
        if len(start) > 4 and start[4] is chain_end and links < self._CHAIN_MAX:
            t0 = chain_t
            links += 1
        else:
            t0 = anchor_host + offset
            if anchor_ev is not ev:
                t0 += round(elapsed(anchor_ev, ev) * 1e6)
            links = 0
        t1 = t0 + round(elapsed(ev, end_ev) * 1e6)
        self._chain = (end, t1, links)
        return t0, t1

    def wall(self, host_ns: int) -> int:
        return host_ns + self._offset

    def start_kind(self, start: Any) -> Optional[str]:
        """``host_clock`` when the stream was idle at the call (the interval then includes the
        launch latency of the phase's first kernel), ``gpu_event`` when an event queued behind
        earlier GPU work marked the start (a fresh one or the previous phase's shared end)."""
        if start is None:
            return None
        return HOST_CLOCK if start[0] is None else GPU_EVENT

    def release(self, start: Any, end: Any) -> None:
        """Drain side (or a dropped step on the hot side): hand the events back for reuse."""
        returned = self._returned
        if start is not None and start[0] is not None and start[0] is not start[1][0]:
            returned.append(start[0])
        if end is not None:
            returned.append(end[0])


def make_timer(choice: str, log) -> Any:
    """``auto`` picks CUDA only where this process has already put work on a CUDA device."""
    if choice == "cpu":
        return CpuTimer()
    try:
        import torch

        usable = torch.cuda.is_available() and (choice == "cuda" or torch.cuda.is_initialized())
    except Exception:
        usable = False
    if usable:
        return CudaTimer(torch)
    if choice == "cuda":
        log.warning("sgl-probe: SGL_PROBE_TIMER=cuda but CUDA is not available here; using the cpu timer")
    return CpuTimer()
