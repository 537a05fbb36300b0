"""Benchmark-only, never installed by the sgl-probe wheel: SIGUSR2 pauses or resumes the probe's
recording in the process that receives it.

Why: a launch-bound server's throughput differs by up to +-20 % from one launch to the next
(BENCHMARKS.md), far more than the 1 % the overhead target is about, so probe-on and probe-off
*launches* cannot resolve it. With this folder on the server's ``PYTHONPATH``, a benchmark
alternates short windows of the same scheduler process with the probe recording and paused
(``SIGUSR2`` flips it; only send it to the scheduler processes), and pairs adjacent windows.

Paused = the probe's step hooks switched off, as after an internal error: every wrapped call
passes straight to SGLang (one attribute check), nothing is recorded, the drain thread and the
exporter process idle. So the pair measures recording, timing and export; the wrapping itself
(~0.3 us a call) is what probe-off launches still have to show.

After each flip the process writes ``recording`` or ``paused`` to
``$SGL_BENCH_PAUSE_DIR/<pid>`` (when set), so the benchmark can wait until the flip took effect.
The signal is handled on the main thread between two bytecodes, which in SGLang's scheduler is
between or inside steps: a step that was open when recording was paused still finishes and is
exported; one that starts while paused is not recorded.

Before the state, each flip writes ``<pid>.gc``: the process's garbage collections so far, per
generation, with the seconds they took (a ``gc.callbacks`` hook, ~1 µs per collection, the same
in both states). Records that live until the next drain survive young collections and are
promoted, which can make SGLang's full collections of its large heap more frequent: the
difference between two flips says how much of a recording window went there. The same file
carries what the probe's CUDA timer reads GPU times with (``elapsed_source``; None before the
first step or with the CPU timer), so a benchmark can see which read ran, what its phase ends
record through (``hot_calls``: ``cuda_runtime`` or ``torch``) and read the current stream from
(``stream_calls``: ``torch_c``, ``torch_raw`` or ``torch``), how many anchor events the drain
thread has made (``anchor_events``: it reuses them, so a steady server's count stays flat), and
where the process imported ``sgl_probe`` from (``probe_file``), so it can see which probe ran.

``SGL_BENCH_KEEP_GIL=1`` / ``=0``: at its first flip the shim switches the CUDA timer's
``elapsed_keeps_gil`` on (the runtime's elapsed-time read without releasing the GIL, the release's
default since h100-5) or off (the read releasing it, as releases before did) and makes the drain
thread set up its read again, so a server measures that read from its first window.

``SGL_BENCH_START_EVENTS=1``: once the CUDA timer exists, the shim switches its ``record_starts``
on, so every phase records a start event as well as its end: two events per phase, to measure
what the release's one event per phase saves.

``SGL_BENCH_GPU_RUN=N``: once the CUDA timer exists, the shim has it time runs of N consecutive
steps when it samples them (``CudaTimer.set_gpu_run``; the release: 4; 1 times each sampled step
alone, as the release before), to measure what the runs save.

``SGL_BENCH_SELF_TIME=1``: at its first flip the shim times the probe's per-step wrappers from
inside the process. Each wrapper the probe put on a class gets a timing layer above it and one
around the SGLang function it calls (the closure cell that holds it), and every flip writes the
running totals (``self_ns``: ns inside the wrappers, ns inside SGLang's functions, calls, steps;
``self_by_target``: the first three per wrapped function, by the table's target name).
Outside minus inside is the probe's own time on the scheduler thread, caches as they are in the
real loop; recording minus paused is what recording adds. The layers cost the same in both
states. This is the hot path, not what the probe's other threads take (their CPU is measured
apart) nor what its code does to SGLang's caches afterwards. The same switch times each of the CUDA
timer's driver-facing calls (capture check, stream look-up, stream and event queries, event
records, event creation) where the scheduler thread makes them (``self_timer_calls``: name ->
[ns, calls]), which splits the probe's own time into its driver calls and its Python. Where the
C hot path was built with its section timers (``SGL_PROBE_SECTION_TIMES``), the file carries
them too (``self_sections``: section -> [ns, calls]), which splits the C wrappers' time. And the
drain thread's stretches between two GIL hand-overs (``self_drain``: name -> [ns, stretches]):
each runs from a pass's start or the drain's yield (its short sleep) to its next yield or the
pass's end; ``hold`` their wall time, ``hold_cpu`` the drain thread's CPU in them, and
``hold_over_<N>us`` the wall time of those longer than N µs. A scheduler thread that wants the GIL
back during a stretch waits for the rest of it (the GIL hand-overs inside a stretch, the
elapsed-time reads and the link's sends, count into its wall time). ``thread_cpu``: the drain
thread's whole CPU time (its clock, read at each flip), stretches or not, so what it spends
outside them (waking, taking the GIL back) is told from the process's other threads.

``SGL_BENCH_DRAIN_YIELD_US=N`` / ``SGL_BENCH_DRAIN_CHUNK=K``: at its first flip the shim sets the
drain's stretch budget (``sgl_probe.export.YIELD_AFTER_NS``, N µs) and the steps it takes between
two checks of it (``CHUNK``), to measure other stretches against the release's 500 µs / 64.

``SGL_BENCH_POOL_MAX=N``: at the first flip that finds the CUDA timer, its event pool keeps up to
N events and is filled to N at once, each event recorded once on the current stream, so no phase
end makes one later (that flip makes and records them all on the scheduler thread; it opens the
first pair, which is never judged). For a server whose drain passes seconds apart (``overhead_cross``'s
``selfnodrain`` kind): the steps pending until the first pass would otherwise make theirs (the
release keeps as many as ``SGL_PROBE_MAX_PENDING`` once they come back, and sizes its anchor stock
by ``SGL_PROBE_DRAIN_S``).

``SGL_BENCH_PMU=1``: at its first flip the shim opens the CPU's hardware counters for the thread
that handles the signal, SGLang's scheduler thread (``perf_event_open``, user space only: cycles,
instructions, L1 data and last-level cache read misses, branch misses, and the kernel's task clock
in ns beside them), and every flip writes their
running counts (``self_pmu``: name -> [count, flips]). Recording minus paused per step then says
whether the scheduler thread runs more instructions while the probe records (its own and SGLang's)
or the same ones slower (caches): what the probe's own time leaves unexplained. A counter the host
does not expose is left out (virtual machines often expose none).
"""

import ctypes
import gc
import json
import os
import signal
import struct
import sys
import threading
import time

_GC = {"count": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
_GC_START = [0.0]
#: Nanoseconds inside the probe's per-step wrappers, inside the functions they wrap; calls; steps
#: (calls of the step wrapper).
_SELF = [0, 0, 0, 0]
#: The same per target: name -> [ns inside the wrapper, ns inside the function it wraps, calls].
_BY = {}
#: The CUDA timer's driver-facing calls made on the scheduler thread: name -> [ns, calls]. Their
#: time is part of the wrappers' own time above.
_CALLS = {}
#: The drain thread's stretches between two GIL hand-overs: name -> [ns, stretches].
_DRAIN = {}
_HOLD_OVER_US = (100, 500, 1000, 2000)
#: The CudaTimer attributes (set per instance in its __init__) that reach the CUDA driver.
_TIMER_CALLS = ("_capturing", "_stream_key", "_stream_query", "_record", "_query", "_new")


def _on_gc(phase, info):
    if phase == "start":
        _GC_START[0] = time.perf_counter()
    else:
        g = info.get("generation", 0)
        _GC["count"][g] += 1
        _GC["seconds"][g] += time.perf_counter() - _GC_START[0]


gc.callbacks.append(_on_gc)


def _flip(signum, frame):
    try:
        try:
            from sgl_probe.activate import get_probe
        except ImportError:  # a server without the probe on its path (an A/A control)
            get_probe = lambda: None  # noqa: E731

        probe = get_probe()
        source = hot_calls = stream_calls = anchor_events = None
        probe_file = getattr(sys.modules.get("sgl_probe"), "__file__", None)
        if probe is None:  # SGL_PROBE=0 (an A/A control) or SGLang not imported in this process
            state = "no-probe"
        else:
            steps = [h for h in probe.instrumentor.hooks if h.target.role == "step"]
            on = not all(h.enabled for h in steps)
            for h in steps:
                h.enabled = on
            state = "recording" if on else "paused"
            timer = getattr(getattr(probe, "recorder", None), "timer", None)
            _keep_gil(timer)
            _start_events(timer)
            _gpu_run(timer)
            _pool_sized(timer)
            _time_wrappers(probe)
            _time_timer_calls(timer)
            _time_drain(probe)
            _drain_stretch()
            _drain_thread_cpu()
            source = getattr(timer, "elapsed_source", None)
            hot_calls = getattr(timer, "hot_calls", None)
            stream_calls = getattr(timer, "stream_calls", None)
            anchor_events = getattr(timer, "anchor_events_made", None)
        _pmu_read()  # also without a probe: an A/A control's counters
        folder = os.environ.get("SGL_BENCH_PAUSE_DIR")
        if folder:
            with open(os.path.join(folder, "%d.gc" % os.getpid()), "w") as fh:
                json.dump(dict(_GC, t=time.time(), elapsed_source=source, hot_calls=hot_calls,
                               stream_calls=stream_calls, anchor_events=anchor_events, probe_file=probe_file,
                               self_ns=list(_SELF) if _SELF_ON else None,
                               self_by_target={k: list(v) for k, v in _BY.items()} if _SELF_ON else None,
                               self_timer_calls={k: list(v) for k, v in _CALLS.items()} if _SELF_ON else None,
                               self_sections=_sections() if _SELF_ON else None,
                               self_drain={k: list(v) for k, v in _DRAIN.items()} if _DRAIN_ON else None,
                               self_pmu={k: list(v[1:]) for k, v in _PMU.items()} or None), fh)
            with open(os.path.join(folder, str(os.getpid())), "w") as fh:
                fh.write(state)
    except Exception as exc:  # a benchmark aid must never take the server down
        sys.stderr.write("probe_pause: %r\n" % (exc,))


def _sections():
    """The C wrappers' section times where the extension was built with them (build.py
    ``--section-times``): {section: [ns, calls]}; None otherwise."""
    times = getattr(sys.modules.get("sgl_probe._hot"), "section_times", None)
    return {k: list(v) for k, v in times().items()} if times is not None else None


def _keep_gil(timer):
    want = {"1": True, "0": False}.get(os.environ.get("SGL_BENCH_KEEP_GIL", ""))
    if want is None or timer is None or getattr(timer, "elapsed_keeps_gil", want) is want:
        return
    timer.elapsed_keeps_gil = want
    # Each drain thread sets its read up once, in this thread-local: a fresh one makes it do so
    # again with the switch on (meanwhile it reads with torch's, as an unprepared thread does).
    timer._prepared = threading.local()


def _gpu_run(timer):
    raw = os.environ.get("SGL_BENCH_GPU_RUN")
    if not raw or timer is None or not hasattr(timer, "set_gpu_run"):
        return
    n = int(raw)
    if getattr(timer, "_GPU_RUN", None) != n:
        timer.set_gpu_run(n)


def _start_events(timer):
    if os.environ.get("SGL_BENCH_START_EVENTS") != "1" or getattr(timer, "start_events", True):
        return
    timer.record_starts()


_POOL_SIZED = []


def _pool_sized(timer):
    n = os.environ.get("SGL_BENCH_POOL_MAX")
    anchors = getattr(timer, "_anchors", None)
    if not n or _POOL_SIZED or timer is None or not anchors or getattr(timer, "_pool", None) is None:
        return
    _POOL_SIZED.append(True)
    timer._POOL_MAX = int(n)
    stream = timer._current_stream(next(iter(anchors)))
    pool = timer._pool
    for _ in range(int(n) - len(pool)):
        ev = timer._new()
        timer._record(ev, stream)
        pool.append(ev)


def _drain_stretch():
    export = sys.modules.get("sgl_probe.export")
    if export is None:
        return
    us, chunk = os.environ.get("SGL_BENCH_DRAIN_YIELD_US"), os.environ.get("SGL_BENCH_DRAIN_CHUNK")
    if us:
        export.YIELD_AFTER_NS = int(float(us) * 1000)
    if chunk:
        export.CHUNK = int(chunk)


def _drain_thread_cpu():
    """The drain thread's CPU so far into ``self_drain["thread_cpu"]`` as [ns, flips]: the flips
    count up, so :func:`control.own_time` takes its difference between two flips."""
    if not _DRAIN_ON:
        return
    for t in threading.enumerate():
        if t.name == "sgl-probe-drain" and t.ident is not None:
            try:
                ns = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):
                return
            acc = _DRAIN.setdefault("thread_cpu", [0, 0])
            acc[0] = ns
            acc[1] += 1
            return


_SELF_ON = []


def _time_wrappers(probe):
    if os.environ.get("SGL_BENCH_SELF_TIME") != "1" or _SELF_ON:
        return
    _SELF_ON.append(True)
    for hook in probe.instrumentor.hooks:
        try:
            owner, attr = hook.owner, hook.attr
            fn = vars(owner).get(attr) if isinstance(owner, type) else None
            cells = getattr(fn, "__closure__", None) or ()
            cell = next((c for c in cells if c.cell_contents is hook.original), None)
            mine = _BY.setdefault(hook.target.name, [0, 0, 0])
            if cell is not None:  # the Python hot path: the original sits in a closure cell
                cell.cell_contents = _inside(hook.original, mine)
            elif getattr(fn, "sgl_probe_original", None) is hook.original:  # the C hot path's wrappers
                fn.sgl_probe_original = _inside(hook.original, mine)
            else:  # not one of the per-step replacements (wrapt wrappers keep no cell)
                _BY.pop(hook.target.name, None)
                continue
            outside = _outside(fn, hook.target.role == "step", mine)
            outside._self_sgl_probe_hook = hook  # uninstrument still puts the original back
            setattr(owner, attr, outside)
        except Exception as exc:  # that wrapper stays untimed; the flip itself must still answer
            sys.stderr.write("probe_pause: not timing %s: %r\n" % (getattr(hook.target, "name", "?"), exc))


def _time_timer_calls(timer):
    """Once a CUDA timer exists (it is made at the first step): time its driver-facing calls on
    this thread, the scheduler's (signal handlers run on the main thread); the drain thread's
    calls pass through untimed."""
    if os.environ.get("SGL_BENCH_SELF_TIME") != "1" or timer is None or getattr(timer, "_sgl_bench_timed", False):
        return
    timer._sgl_bench_timed = True
    hot = threading.get_ident()
    for name in _TIMER_CALLS:
        fn = vars(timer).get(name) if hasattr(timer, "__dict__") else None
        if callable(fn):
            setattr(timer, name, _timed_call(fn, _CALLS.setdefault(name, [0, 0]), hot))


_DRAIN_ON = []


def _time_drain(probe):
    """Time the drain's stretches (``self_drain``, see the module doc): the pipeline's ``drain``
    wrapped, and the export module's ``time`` read through a proxy whose ``sleep`` (the drain's
    yield) ends one stretch and starts the next."""
    if os.environ.get("SGL_BENCH_SELF_TIME") != "1" or _DRAIN_ON:
        return
    pipe = getattr(probe, "pipeline", None)
    export = sys.modules.get("sgl_probe.export")
    if pipe is None or export is None:
        return
    _DRAIN_ON.append(True)
    marks = threading.local()  # flush and shutdown drain from other threads

    def begin():
        marks.t = (time.perf_counter_ns(), time.thread_time_ns())

    def end():
        t0, c0 = getattr(marks, "t", (None, None))
        if t0 is None:
            return
        wall = time.perf_counter_ns() - t0
        cpu = time.thread_time_ns() - c0
        for name, ns in (("hold", wall), ("hold_cpu", cpu),
                         *(("hold_over_%dus" % n, wall) for n in _HOLD_OVER_US if wall > n * 1000)):
            acc = _DRAIN.setdefault(name, [0, 0])
            acc[0] += ns
            acc[1] += 1

    class _Time:
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds):
            end()
            time.sleep(seconds)
            begin()

    drain = pipe.drain

    def timed(final=False):
        begin()
        try:
            return drain(final)
        finally:
            end()
            marks.t = (None, None)

    export.time = _Time()
    pipe.drain = timed


def _timed_call(fn, acc, hot, clock=time.perf_counter_ns, ident=threading.get_ident):
    def timed(*args):
        if ident() != hot:
            return fn(*args)
        t0 = clock()
        try:
            return fn(*args)
        finally:
            acc[0] += clock() - t0
            acc[1] += 1

    return timed


def _outside(fn, step, mine, clock=time.perf_counter_ns, acc=_SELF):
    def outside(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            d = clock() - t0
            acc[0] += d
            acc[2] += 1
            acc[3] += step
            mine[0] += d
            mine[2] += 1

    return outside


def _inside(orig, mine, clock=time.perf_counter_ns, acc=_SELF):
    def inside(*args, **kwargs):
        t0 = clock()
        try:
            return orig(*args, **kwargs)
        finally:
            d = clock() - t0
            acc[1] += d
            mine[1] += d

    return inside


#: The scheduler thread's hardware counters: name -> [fd, count, flips].
_PMU = {}
_PMU_OPENED = []
# (name, perf type, config): PERF_TYPE_HARDWARE (0) cycles, instructions, branch misses;
# PERF_TYPE_HW_CACHE (3) L1D / LL read misses (cache | op read << 8 | result miss << 16); and the
# kernel's own clock of the thread (PERF_TYPE_SOFTWARE (1) task clock, ns), which every Linux has.
_PMU_EVENTS = (("cycles", 0, 0), ("instructions", 0, 1), ("branch_misses", 0, 5),
               ("l1d_read_misses", 3, 0 | (0 << 8) | (1 << 16)), ("llc_read_misses", 3, 2 | (0 << 8) | (1 << 16)),
               ("task_clock_ns", 1, 1))
_PERF_EVENT_OPEN = 298  # x86-64


def _pmu_read():
    if os.environ.get("SGL_BENCH_PMU") != "1":
        return
    if not _PMU_OPENED:
        _PMU_OPENED.append(True)
        libc = ctypes.CDLL(None, use_errno=True)
        for name, kind, config in _PMU_EVENTS:
            attr = bytearray(128)  # struct perf_event_attr, zeroed: counting, enabled, this thread
            struct.pack_into("IIQQQQQ", attr, 0, kind, 128, config, 0, 0, 0, (1 << 5) | (1 << 6))
            fd = libc.syscall(_PERF_EVENT_OPEN, (ctypes.c_char * 128).from_buffer(attr), 0, -1, -1, 0)
            if fd >= 0:
                _PMU[name] = [fd, 0, 0]
            else:
                sys.stderr.write("probe_pause: no %s counter (%s)\n" % (name, os.strerror(ctypes.get_errno())))
    for acc in _PMU.values():
        try:
            acc[1] = struct.unpack("Q", os.read(acc[0], 8))[0]
            acc[2] += 1
        except OSError:
            pass


signal.signal(signal.SIGUSR2, _flip)
