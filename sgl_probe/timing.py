"""Interval timers behind one interface: CUDA events on the GPU, perf_counter_ns on the CPU.

Hot side (the scheduler thread): ``start(now_ns) -> token`` and ``stop(token, now_ns) -> token | None``
(None: nothing was recorded, a graph was being captured).
Drain side (the export thread): ``ready``, ``interval_kind``, ``wall``, ``release``.

The CUDA timer never synchronizes: end events come from a pool, are recorded on the current
stream when the call returns, and are later asked ``query()`` by the drain thread; only completed
ones are read, on the probe's own threads with the CUDA runtime's ``cudaEventElapsedTime`` (one
call, the GIL kept; :func:`runtime_elapsed`), elsewhere with torch's ``elapsed_time``. Nothing
is recorded on a stream that is being captured into a CUDA graph (SGLang captures at startup), so
capture stays valid.

What one timed call costs on the hot path: at the start, the host clock (and every 100 ms an
anchor, below); at the end, one capture check, one look-up of the current stream (torch's C entry point for
its raw handle where it has a checked one, else a C call of torch's Python module, then a dict hit:
``torch.cuda.current_stream()`` would build a new Python ``Stream`` object every time, which costs
more than the driver's record itself) and one event record, made through the C method
with that stream. Where the phase started on the GPU is worked out by the drain thread
(see ``CudaTimer``).

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
import functools
import logging
import math
import os
import re
import sys
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
    calling ``ready`` / ``interval_kind`` / ``release`` for every phase."""

    kind = "cpu"
    host_clock = True

    #: With the C hot path: ``drain.take_ready``'s checks in C, ``(steps, n, wait_from) -> n``
    #: (``sgl_probe._hot.ready_steps``); None: take_ready's Python loop.
    ready_steps: Any = None

    def __init__(self, fast: Any = None) -> None:
        self._offset = self.offset = time.time_ns() - perf_counter_ns()
        self._fast = fast
        if fast is not None:  # the same two identities in C (sgl_probe.hotpath)
            self.start, self.stop = fast.cpu_start, fast.cpu_stop  # type: ignore[method-assign]
            self.ready_steps = functools.partial(fast.ready_steps, None)  # always ready: no timers to ask

    def take_rows(self, steps: Any, n: int, out: list, error_text: Any, on_drop: Any, *packed: Any) -> int:
        """With the C hot path: ``drain.take_ready``'s loop in C (see ``CudaTimer.take_rows``)."""
        if self._fast is None:
            return 0
        return self._fast.take_host(steps, n, out, self._offset, error_text, on_drop, *packed)

    def start(self, now_ns: int, step: Any = None) -> Any:
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

    def interval_kind(self, start: Any, end: Any) -> Tuple[int, int, None]:
        """As :meth:`interval`; host-clock intervals have no GPU start to tell apart."""
        return start + self._offset, end + self._offset, None


def _loaded_library(name: str) -> Any:
    """A shared library this process already loaded whose file name contains ``name`` (a
    ``ctypes.CDLL`` of that file), or None."""
    import ctypes

    path = None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if name in line:
                    path = line.split()[-1]
                    break
    except OSError:
        return None
    return None if path is None else ctypes.CDLL(path)


def _cudart() -> Any:
    """The CUDA runtime torch already loaded (a ``ctypes.CDLL``), or None."""
    return _loaded_library("libcudart.so")


# torch's C shim for the current stream took (ret_stream, device_index) in its first releases and
# (device_index, ret_stream) since: the C half calls the latter, where the header torch ships says so.
_STREAM_ENTRY = "aoti_torch_get_current_cuda_stream"
_STREAM_DECL = re.compile(_STREAM_ENTRY + r"\(\s*int32_t\s+\w+\s*,\s*void\s*\*\s*\*\s*\w+\s*\)")
_STREAM_HEADER = ("include", "torch", "csrc", "inductor", "aoti_torch", "c", "shim.h")


def _torch_stream_entry(torch_mod: Any, raw_stream: Any) -> Optional[int]:
    """The address of torch's ``aoti_torch_get_current_cuda_stream`` in the libtorch_cuda it
    loaded, for the C hot path's stream look-up: only where the header torch ships declares it
    ``(int32_t device_index, void** ret_stream)`` and one call answers as ``raw_stream(-1)`` (torch's
    Python call) does; else None (the C half makes that Python call)."""
    import ctypes

    header = os.path.join(os.path.dirname(getattr(torch_mod, "__file__", None) or ""), *_STREAM_HEADER)
    try:
        with open(header, encoding="utf-8", errors="replace") as fh:
            if not _STREAM_DECL.search(fh.read()):
                return None
    except OSError:
        return None
    lib = _loaded_library("libtorch_cuda.so")
    fn = getattr(lib, _STREAM_ENTRY, None) if lib is not None else None
    if fn is None:
        return None
    fn.restype = ctypes.c_int32
    fn.argtypes = (ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))
    out = ctypes.c_void_p()
    try:
        if fn(-1, ctypes.byref(out)) != 0 or (out.value or 0) != raw_stream(-1):
            return None
    except Exception:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def _runtime_entry_points(on_fail: Any) -> Optional[tuple]:
    """For the C hot path's phase end and anchor: the addresses of the runtime's
    ``cudaEventRecord``, ``cudaStreamIsCapturing``, ``cudaGetLastError`` and ``cudaStreamQuery`` in
    the libcudart torch loaded, and what to call when one fails; None where they cannot be found."""
    import ctypes

    cudart = _cudart()
    if cudart is None:
        return None
    try:
        names = ("cudaEventRecord", "cudaStreamIsCapturing", "cudaGetLastError", "cudaStreamQuery")
        return tuple(ctypes.cast(getattr(cudart, n), ctypes.c_void_p).value for n in names) + (on_fail,)
    except AttributeError:
        return None


def _unreferenced(objs: list) -> list:
    """The objects of ``objs`` that nothing else refers to (CPython's reference counts, against a
    sentinel's read the same way): for the anchor events, which are free to record again once no
    end token maps through them."""
    objs.append(object())  # no other name for it: its count is a free object's
    try:
        counts = [sys.getrefcount(ob) for ob in objs]
    finally:
        objs.pop()
    base = counts[-1]
    return [ob for ob, n in zip(objs, counts) if n <= base]


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
    # Where the C drain (CudaTimer.take_rows) calls the same function itself.
    elapsed.address = ctypes.cast(library, ctypes.c_void_p).value  # type: ignore[attr-defined]
    return elapsed


class _Kept:
    """A CudaTimer attribute that its C half (``sgl_probe._hot.CudaFast``) reads or writes on every
    phase, kept in that object's struct (a look-up in the instance dict costs a few cache-cold
    lines on the scheduler thread). Reading and writing it looks as for a plain attribute."""

    def __set_name__(self, owner: Any, name: str) -> None:
        self.field = name.lstrip("_")

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(obj._c, self.field)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj._c, self.field, value)


class CudaTimer:
    """One event per phase: the end. Token of ``start``: ``(host_ns, previous_end)``, plus the start
    event with :meth:`record_starts`, or ``None`` there when the stream was seen busy; token of
    ``stop``: ``(event, stream, host_ns, anchor)``, where ``anchor`` is ``(event, perf_counter_ns)``.

    Where a phase starts on the GPU is decided on the drain thread, from what the hot path already
    has: the later of the call's entry (host clock) and the previous phase's end on the same stream.
    If the GPU was still busy with the previous phase when this one was called, nothing of this
    phase can run before that end, which is then its start (``gpu_event``); if the GPU had caught
    up, the phase's first launch runs as soon as it is issued, and the entry is its start
    (``host_clock``: the interval includes that launch's latency). Ends map to the host clock
    through the anchor, so that comparison is as good as the anchor (a few µs: the anchor's own
    launch latency; an idle-stream anchor is refreshed every 100 ms). While no idle stream renews a
    due anchor, each start asks the stream instead, and a busy one means the previous end.

    Why not a start event, or a driver query deciding between one and the host clock (the previous
    release): in the real launch-bound server each driver call cost 2-7 µs of the scheduler
    thread, and the stream query cost more than the records it saved (BENCHMARKS.md, h200-16). Here
    a phase's start makes no driver call at all, its end one record (plus the capture check and
    the stream look-up), and the drain thread none beyond what it already made.

    Limits, in exchange: work that SGLang queued on the stream between two phases and that was
    still running at the next phase's entry counts into that phase (the previous release excluded it
    with a fresh start event), and when the GPU's lead over the host at a phase's entry is within
    the anchor's error the start is off by at most that error.

    Events come back from the drain thread through ``_returned``; only the hot thread moves them
    into the pool.

    Steps, sampled (``every_ns``, ``SGL_PROBE_GPU_EVERY_MS``): with k the largest power of two
    such that k steps last at most ``every_ns`` (by the steps' running period), the GPU times runs
    of :attr:`_GPU_RUN` consecutive steps, one run every ``_GPU_RUN`` * k steps: a step is timed
    where its index modulo ``_GPU_RUN`` * k is below ``_GPU_RUN`` (``start``'s ``step``: the index,
    given at the step's first phase, which decides for the whole step). One step in k, as one run
    in k, but a run's steps after its first start from the step before's end event: a run of m
    steps records m + 1 events for one-phase steps where m lone steps record 2m (on a ~1.8 ms
    launch-bound step, k = 4: 0.32 records a step against 0.51, and ~1 µs a step less of the
    scheduler thread; BENCHMARKS.md, h100-26). By index, not by clock, so that every rank of a
    server times the same steps (its step indexes are the same; ranks whose k differ by a factor
    of two still share every step the larger k times), as the report's per-step comparisons of
    ranks need. The other steps' tokens are the host clock (ints, as the CPU timer's), resolved
    as host times under the timer kind ``host``.
    The one record a phase costs on the scheduler thread, and what SGLang's code loses beside it,
    is then paid on one step in k, not on every step of a launch-bound server (on real SGLang
    ~0.5-0.75 % of a ~1.6 ms step; BENCHMARKS.md, h100-23), while a server whose steps are longer
    than half of ``every_ns`` still has every step timed. A timed step that follows an untimed one
    has no previous end in the chain, so its first phase records a start event of its own."""

    #: Consecutive steps timed together when sampling (class doc); a power of two.
    _GPU_RUN = 4

    kind = "cuda"
    host_clock = False
    #: Its end tokens may be host clock values (ints): steps left untimed (see the class doc).
    untimed_steps = True
    # Host and GPU clocks drift apart by up to ~10 ppm on the H200 hosts measured (gpu_clock.py):
    # 100 ms between anchors keeps that under 1 µs, for one extra event per 100 ms.
    _ANCHOR_EVERY_NS = 100_000_000
    # A due anchor whose stream was busy is asked for again this much later, not at every start:
    # where the GPU runs ahead of the host (a GPU-bound model) nearly every start can find the
    # stream busy, and each ask costs the scheduler thread a stream look-up and a driver query.
    # The anchor is at most this much older for it (20 ppm of 10 ms is 0.2 µs of drift); the
    # starts in between are marked as seen busy.
    _ANCHOR_RETRY_NS = 10_000_000
    #: Ended events the pool keeps at least (more where the queue to the drain holds more steps:
    #: the events of the steps pending between two drain passes come back at once).
    _POOL_MAX = 4096
    #: Anchor events kept ready per device (replenish) for each second between two drain passes:
    #: ten are taken a second at most, and the drain thread tops them up once a pass.
    _FRESH_STOCK = 16
    _STREAMS_MAX = 256

    def __init__(self, torch_mod: Any, fast: Any = None, hold_s: float = 1.0, max_pending: int = 0,
                 every_ns: int = 0) -> None:
        """``hold_s``: seconds between two drain passes (``SGL_PROBE_DRAIN_S``) and ``max_pending``:
        steps the queue to the drain holds (``SGL_PROBE_MAX_PENDING``), which size the event pool
        and the anchor stock so a step never makes an event while the drain passes in time.
        ``every_ns``: the steps' sampling (class doc; 0: every step on the GPU)."""
        self._every_ns = max(0, int(every_ns))
        self._last_step = 0  # the host clock at the last step's first phase
        self._period = 0  # the steps' running period (ns), at most every_ns
        self._stride = 1  # one step in this many is timed (the last step's k)
        self._step_host = False  # the current step keeps host times
        # Instance values, read by the Python methods (the C half asks them through _pop and
        # replenish): a drain passing every 30 s needs ~300 anchors between two top-ups, not 16.
        self._POOL_MAX = max(CudaTimer._POOL_MAX, max_pending)
        self._FRESH_STOCK = min(1024, max(CudaTimer._FRESH_STOCK, math.ceil(CudaTimer._FRESH_STOCK * hold_s)))
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
        # The C hot path's runtime calls name the stream by its raw handle; this returns it in one
        # call (sgl_probe._hot's current_stream_runtime), checked below against the full look-up.
        self._raw_stream = getattr(C, "_cuda_getCurrentRawStream", None)
        self._streams: dict = {}
        self._pool: list = []
        self._returned: collections.deque = collections.deque()  # appended by the drain thread
        self._last_end: Optional[tuple] = None  # the latest stop()'s token
        self._bad_anchor: Any = None  # an anchor event the drain thread caught mapping wrong
        self._chain: tuple = (None, 0)  # drain side: the last end token mapped, and where it mapped
        self._offset = time.time_ns() - perf_counter_ns()
        self._anchors: dict = {}  # device index -> (event, perf_counter_ns), one per device
        # A start at or after this host time tries to take a fresh anchor (0: as soon as the stream
        # is idle; the drain thread sets it so when it distrusts an anchor).
        self._anchor_due = 0
        # The last ask found the stream busy (until _anchor_due, when it is asked again).
        self._anchor_busy = False
        # device index -> events made and recorded once on the drain thread, for the C hot path's
        # anchors (replenish); None once replenishing failed.
        self._fresh: Optional[dict] = {}
        self._made: dict = {}  # device index -> the events replenish made (stocked, anchors, free)
        self.anchor_events_made = 0  # by replenish, in all (benchmarks read it: reuse keeps it flat)
        self._prepared = threading.local()
        self.start_events = False  # benchmarks switch it on (record_starts) to measure what it saves
        self.relax_capture_mode = True  # benchmarks switch it off to show the hazard it avoids
        self.runtime_elapsed = True  # benchmarks switch it off to measure what it saves
        # runtime_elapsed's keep_gil. The reads hold the GIL: releasing it for a few µs of driver
        # calls let the scheduler thread take it, and the drain waited for it back and resumed on
        # cold caches once per chunk (on a tiny real server, 64-step chunks read this way took the
        # drain thread's CPU per step from ~3.0 to ~2.3 µs, BENCHMARKS.md h100-5). Benchmarks
        # switch it off to measure the release.
        self.elapsed_keeps_gil = True
        self._elapsed_checks = self._ELAPSED_CHECKS
        # What the drain thread reads intervals with: "torch", or "cuda_runtime_gil" once its checks
        # passed ("cuda_runtime" without elapsed_keeps_gil; for benchmarks and tests to see which
        # ran).
        self.elapsed_source = "torch"
        self.fast_stream = raw_ok = False
        if self._stream_key is not None:
            try:
                official = self._current_stream()  # first: it runs torch's lazy CUDA init
                self.fast_stream = self._lookup_stream()[0] == official
            except Exception:
                self.fast_stream = False
            try:
                raw_ok = self.fast_stream and self._raw_stream is not None \
                    and self._raw_stream(-1) == official.cuda_stream
            except Exception:
                raw_ok = False
        if not raw_ok:
            self._raw_stream = None
        if not self.fast_stream:
            self._stream_now = self._portable_stream  # type: ignore[method-assign]
            self.stop = self._stop_portable  # type: ignore[method-assign]
        elif fast is not None:
            # start / stop in C (sgl_probe.hotpath), over this object's own state: the drain thread
            # and the Python methods here see and change the same values and containers. Those the
            # C half uses on every phase move into it (taken out of the instance dict), and this
            # object's class becomes one whose attributes of those names read and write them there
            # (_CudaTimerKept); a timer without a C half keeps plain attributes, which its Python
            # methods read faster.
            runtime = _runtime_entry_points(self._runtime_failed) if self.hot_runtime_calls else None
            entry = None if runtime is None or self._raw_stream is None \
                else _torch_stream_entry(torch_mod, self._raw_stream)
            if entry is not None:
                runtime += (entry,)
            self._c = fast.CudaFast(self, vars(self), runtime)
            self.__class__ = _CudaTimerKept
            self.start, self.stop = self._c.start, self._c.stop  # type: ignore[method-assign]
            self.ready_steps = functools.partial(fast.ready_steps, self.ready_prefix)

    #: With the C hot path, the phase end's capture check and event record call the CUDA runtime
    #: directly, keeping the GIL (``sgl_probe._hot.CudaFast``); benchmarks switch it off (on the
    #: class, before the timer is made) to measure what that saves.
    hot_runtime_calls = True
    _c: Any = None
    #: As CpuTimer.ready_steps (completion asked through ready_prefix).
    ready_steps: Any = None

    @property
    def hot_calls(self) -> str:
        """What the phase end's capture check and record go through: ``cuda_runtime`` or ``torch``."""
        return "cuda_runtime" if self._c is not None and self._c.runtime else "torch"

    @property
    def stream_calls(self) -> str:
        """Where the C half's phase end reads the current stream from: ``torch_c`` (torch's C entry
        point), ``torch_raw`` (torch's Python call for the raw handle) or ``torch`` (the full look-up)."""
        if self._c is None or not self._c.runtime:
            return "torch"
        return "torch_c" if self._c.stream_c else "torch_raw" if self._raw_stream is not None else "torch"

    @staticmethod
    def _runtime_failed(what: str) -> None:
        log.warning("sgl-probe: %s through the CUDA runtime failed; the hot path uses torch's calls from now on",
                    what)

    # -- hot side ---------------------------------------------------------------------------
    def _lookup_stream(self) -> Tuple[Any, int]:
        key = self._stream_key(-1)  # (stream id, device index, device type) of the current stream
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= self._STREAMS_MAX:
                self._streams.clear()
            stream = self._Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            self._streams[key] = stream
        return stream, key[1]

    # ``torch.cuda.current_stream()`` builds a new Python ``Stream`` every call, which cost more than
    # the driver's record itself: the fast path keeps one per stream, keyed by torch's C look-up.
    _stream_now = _lookup_stream

    def _portable_stream(self) -> Tuple[Any, int]:
        stream = self._current_stream()
        return stream, stream.device_index

    def _pop(self) -> Any:
        pool = self._pool
        if pool:
            return pool.pop()
        returned = self._returned
        while returned:
            ev = returned.popleft()
            if len(pool) < self._POOL_MAX:
                pool.append(ev)
        return pool.pop() if pool else self._new()

    def start(self, now_ns: int, step: Any = None) -> Any:
        lead = False
        if self._every_ns and step is not None:
            host = not self._timed_step(now_ns, step)
            lead = not host and self._step_host
            self._step_host = host
        if self._step_host:
            return now_ns
        if now_ns >= self._anchor_due:
            self._refresh_anchor(now_ns)
        if self._anchor_busy:
            # The stream was busy and the anchor is due: the drain must not decide by an anchor
            # that may have drifted (a GPU-bound server can go minutes without an idle stream).
            # What the query saw decides instead: the GPU is behind, so the previous end starts.
            token = (now_ns, self._last_end, None)
        else:
            token = (now_ns, self._last_end)
        return self._with_start_event(token) if lead else token

    def _timed_step(self, now_ns: int, index: Any) -> bool:
        """Whether the step of this index is timed on the GPU (class doc), at its first phase."""
        last, every = self._last_step, self._every_ns
        self._last_step = now_ns
        if last:
            dt = min(max(now_ns - last, 0), every)
            self._period = dt if self._period == 0 else self._period + (dt - self._period) // 8
        k, p = 1, self._period
        if p > 0:
            while (k << 1) * p <= every:
                k <<= 1
        self._stride = k
        return k == 1 or type(index) is not int or index & (k * self._GPU_RUN - 1) < self._GPU_RUN

    def set_gpu_run(self, steps: int) -> None:
        """Benchmark switch: time runs of this many consecutive steps (a power of two; 1: each
        timed step alone, as the release before), to measure what the runs save."""
        if steps < 1 or steps & (steps - 1):
            raise ValueError("gpu_run must be a power of two")
        self._GPU_RUN = steps
        if self._c is not None:
            self._c.gpu_run = steps

    @property
    def gpu_stride(self) -> int:
        """One step in this many is timed on the GPU now (1: every step; class doc)."""
        return self._c.stride if self._c is not None else self._stride

    def _with_start_event(self, token: tuple) -> tuple:
        """The token with a start event recorded now (a timed step after an untimed one: see the
        class doc), or as it was while a graph is being captured. The C half calls it where its
        runtime calls are off."""
        if self._capturing():
            return token
        ev = self._pop()
        self._record(ev, self._stream_now()[0])
        return (token[0], token[1], ev)

    def _refresh_anchor(self, now_ns: int) -> None:
        """An anchor is an event recorded on an idle stream, so the GPU reaches it one launch
        latency after the host clock taken with it (a stream of its own would not do: with few
        hardware queues, e.g. ``CUDA_DEVICE_MAX_CONNECTIONS=1``, its record waits behind the busy
        stream's work). Its outcome is in ``_anchor_busy`` and ``_anchor_due``: a fresh anchor is
        due again in :attr:`_ANCHOR_EVERY_NS`; a busy stream is marked and asked again
        :attr:`_ANCHOR_RETRY_NS` later; while a graph is being captured (a record would break the
        capture) nothing changes but the mark, and the next start asks again."""
        if self._capturing():
            self._anchor_busy = False
            return
        stream, device = self._stream_now()
        if not self._stream_query(stream):
            self._anchor_busy = True
            self._anchor_due = now_ns + self._ANCHOR_RETRY_NS
            return
        ev = self._new()
        self._record(ev, stream)
        self._anchors[device] = (ev, now_ns)
        self._anchor_due = now_ns + self._ANCHOR_EVERY_NS
        self._anchor_busy = False

    def record_starts(self) -> None:
        """Benchmark switch: every phase also records a start event (two events per phase, the
        design this one replaced), to measure what one event per phase saves."""
        self.start_events = True
        self.start = self._start_recorded  # type: ignore[method-assign]

    def _start_recorded(self, now_ns: int, step: Any = None) -> Any:
        token = CudaTimer.start(self, now_ns, step)
        if token.__class__ is int or (len(token) > 2 and token[2] is not None):  # untimed, or it has one
            return token
        if self._capturing():
            return token[:2]
        ev = self._pop()
        self._record(ev, self._stream_now()[0])
        return (now_ns, token[1], ev)

    def stop(self, token: Any, now_ns: int) -> Any:
        if token.__class__ is int:  # an untimed step (class doc)
            return now_ns
        if self._capturing():
            return None
        # The stream look-up inline: this runs on every phase, and each Python call costs more
        # than its work on a scheduler thread whose caches SGLang keeps cold.
        key = self._stream_key(-1)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._lookup_stream()[0]
        pool = self._pool
        ev = pool.pop() if pool else self._pop()
        self._record(ev, stream)
        anchor = self._anchors.get(key[1])
        if anchor is None:
            return self._first_anchor(ev, stream, key[1], now_ns)
        end = self._last_end = (ev, stream, now_ns, anchor)
        return end

    def _stop_portable(self, token: Any, now_ns: int) -> Any:
        if token.__class__ is int:  # an untimed step (class doc)
            return now_ns
        if self._capturing():
            return None
        stream = self._current_stream()
        ev = self._pop()
        self._record(ev, stream)
        anchor = self._anchors.get(stream.device_index)
        if anchor is None:
            return self._first_anchor(ev, stream, stream.device_index, now_ns)
        end = self._last_end = (ev, stream, now_ns, anchor)
        return end

    def _first_anchor(self, ev: Any, stream: Any, device: int, now_ns: int) -> Any:
        """The first phase on this device and no idle stream yet: its end event is the anchor
        (span positions are off by the work queued ahead of it until an idle-stream anchor
        replaces it at a later start)."""
        anchor = self._anchors[device] = (ev, now_ns)
        self._anchor_due = 0
        end = self._last_end = (ev, stream, now_ns, anchor)
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
                state.relaxed = True  # another thread's capture no longer forbids this one's records
                # The runtime's calls now go to the events' own device.
                if self.runtime_elapsed:
                    state.elapsed = self.checked_elapsed(cudart)
            else:
                state.exchange = exchange
        except Exception:
            pass

    def replenish(self) -> None:
        """Drain side, once a pass: the events the C hot path's anchor refresh takes
        (``_fresh``), so that the scheduler thread's refresh records an existing event with the GIL
        held (torch creates an event at its first record, and releases the GIL around every record:
        20-30 µs of the scheduler's time a refresh, h100-3, h100-4). An event made here goes back
        into the stock once nothing refers to it any more (no longer the anchor, and no end token
        that maps through it is left: :func:`_unreferenced`); only what that does not cover is made,
        and recorded once on this thread's current stream. Only with the C half's runtime calls,
        and only on a probe thread whose capture mode is thread-local (:meth:`_prepare_thread`):
        another thread's graph capture then does not forbid the record. A failure stops it, with one
        log line; the refresh then records through torch as before."""
        c, fresh, state = self._c, self._fresh, self._prepared
        if c is None or fresh is None or not c.runtime or not getattr(state, "relaxed", False):
            return
        try:
            for device in list(self._anchors):
                stock = fresh.setdefault(device, [])
                made = self._made.setdefault(device, [])
                need = self._FRESH_STOCK - len(stock)
                if need > 0 and made:
                    free = _unreferenced(made)
                    stock.extend(free[:need])
                    if len(free) > need:  # more than the stock takes (after a backlog): let those go
                        spare = {id(ev) for ev in free[need:]}
                        made[:] = [ev for ev in made if id(ev) not in spare]
                    need -= min(need, len(free))
                if need > 0:
                    stream = self._current_stream(device)
                    for _ in range(need):
                        ev = self._new()
                        self._record(ev, stream)
                        stock.append(ev)
                        made.append(ev)
                        self.anchor_events_made += 1
        except Exception as exc:
            self._fresh = None
            log.warning("sgl-probe: making anchor events on the drain thread failed (%r); anchors are "
                        "recorded through torch from now on", exc)

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
        return end.__class__ is int or self._done(end)

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

    def interval_kind(self, start: Any, end: Any) -> Tuple[int, int, str]:
        """Drain side, phases in record order: ``(t0, t1, start kind)`` in wall-clock ns (see the
        class doc). The end maps through its anchor; the start is the entry, or the previous
        phase's mapped end on the same stream where that is later. With the C hot path, the same
        arithmetic in C (``sgl_probe._hot.CudaFast.interval``, what the C drain runs)."""
        if end.__class__ is int:  # an untimed step's phase: its host times (class doc)
            return start + self._offset, end + self._offset, None
        if self._c is not None:
            return self._c.interval(start, end, *self._c_reader())
        elapsed = getattr(self._prepared, "elapsed", None) or self._elapsed
        end_ev, stream, end_host, (anchor_ev, anchor_host) = end
        offset = self._offset
        t1 = anchor_host + offset
        if anchor_ev is not end_ev:
            t1 += round(elapsed(anchor_ev, end_ev) * 1e6)
        # The GPU cannot pass an event before the host recorded it. Mapping earlier than that
        # means the anchor's own record ran late (e.g. behind a profiler's start-up work): clamp,
        # and have the hot thread take a new anchor.
        floor = end_host + offset
        if t1 < floor:
            if t1 < floor - self._ANCHOR_TOLERANCE_NS and self._bad_anchor is not anchor_ev:
                self._bad_anchor = anchor_ev
                self._anchor_due = 0
            t1 = floor
        t0 = start[0] + offset
        kind = HOST_CLOCK
        if len(start) > 2 and start[2] is not None:  # record_starts: the phase's own start event
            t0 = anchor_host + offset + round(elapsed(anchor_ev, start[2]) * 1e6)
            kind = GPU_EVENT
        else:
            chain_end, chain_t = self._chain
            last = start[1]
            # The end token itself, not its event, identifies the previous phase: an event comes
            # back from the pool for later phases, a token is never reused. A start whose stream
            # was seen busy (third item None) came with a due anchor, which may have drifted: its
            # previous end counts unless it mapped earlier than the entry by more than the drift
            # could explain (20 ppm of the anchor's age, twice the worst measured, plus the
            # anchor tolerance), e.g. when other work kept the stream busy after a long idle gap.
            if last is not None and last is chain_end and (last[1] is stream or last[1] == stream) and (
                    chain_t > t0 or (len(start) > 2 and chain_t > t0 - (start[0] - anchor_host) // 50_000
                                     - self._ANCHOR_TOLERANCE_NS)):
                t0 = chain_t
                kind = GPU_EVENT
        if t1 < t0:
            t1 = t0
        self._chain = (end, t1)
        return t0, t1, kind

    def interval(self, start: Any, end: Any) -> Tuple[int, int]:
        return self.interval_kind(start, end)[:2]

    def take_rows(self, steps: Any, n: int, out: list, error_text: Any, on_drop: Any, *packed: Any) -> int:
        """With the C hot path: ``drain.take_ready``'s loop over the first ``n`` of ``steps`` (pop,
        resolve into ``out`` with :meth:`interval_kind`'s arithmetic, release), in C, the elapsed
        times read by the runtime's ``cudaEventElapsedTime`` itself once this thread's checks
        passed (:meth:`checked_elapsed`). Returns how many it took: it stops at a step the Python
        wrappers made, and takes none on a thread not prepared yet (the Python loop does both).
        ``packed``: ``(PackedSteps, summary state or None)``, the drain's packed pass (see
        ``drain.take_ready``)."""
        if self._c is None or not getattr(self._prepared, "done", False):
            return 0
        return self._c.take(steps, n, out, *self._c_reader(), error_text, on_drop, *packed)

    def _c_reader(self) -> tuple:
        """What the C drain reads GPU times with on this thread: the reader (as
        :meth:`interval_kind` picks it), the runtime function's address once the checks passed (0
        before), whether it keeps the GIL, and the start kinds."""
        elapsed = getattr(self._prepared, "elapsed", None)
        return (elapsed or self._elapsed, getattr(elapsed, "address", 0), self.elapsed_keeps_gil, START_VALUES)

    def wall(self, host_ns: int) -> int:
        return host_ns + self._offset

    def release(self, start: Any, end: Any) -> None:
        """Drain side (or a dropped step on the hot side): hand the events back for reuse; an end
        event that is its own anchor stays out of the pool (anchors stay alive)."""
        returned = self._returned
        if start.__class__ is tuple and len(start) > 2 and start[2] is not None:
            returned.append(start[2])
        if end.__class__ is tuple and end[0] is not end[3][0]:
            returned.append(end[0])


def make_timer(choice: str, log, fast: Any = None, hold_s: float = 1.0, max_pending: int = 0,
               every_ns: int = 0) -> Any:
    """``auto`` picks CUDA only where this process has already put work on a CUDA device. ``fast``:
    the C hot path (:mod:`sgl_probe.hotpath`), for the CUDA timer's start / stop; ``hold_s`` and
    ``max_pending`` size its pool and anchor stock, ``every_ns`` samples its steps (:class:`CudaTimer`)."""
    if choice == "cpu":
        return CpuTimer(fast)
    try:
        import torch

        usable = torch.cuda.is_available() and (choice == "cuda" or torch.cuda.is_initialized())
    except Exception:
        usable = False
    if usable:
        return CudaTimer(torch, fast, hold_s, max_pending, every_ns)
    if choice == "cuda":
        log.warning("sgl-probe: SGL_PROBE_TIMER=cuda but CUDA is not available here; using the cpu timer")
    return CpuTimer(fast)


class _CudaTimerKept(CudaTimer):
    """A CudaTimer with its C half (``sgl_probe._hot.CudaFast``): the attributes that the C half
    reads or writes on every phase live in it (see :class:`_Kept`)."""

    _anchor_due = _Kept()
    _anchor_busy = _Kept()
    _last_end = _Kept()
    _chain = _Kept()
    _pool = _Kept()
    _anchors = _Kept()
    _raw_stream = _Kept()
