"""The benchmark-only pause switch (benchmarks/probe_pause/): SIGUSR2 flips the probe's step
hooks, the state is reported, and the controller finds SGLang's scheduler processes by title."""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from sgl_probe import activate
from sgl_probe.instrument import Hook
from sgl_probe.targets import Target

PAUSE = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_pause"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"probe_pause_{name}", PAUSE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture()
def shim(monkeypatch, tmp_path):
    before = signal.getsignal(signal.SIGUSR2)
    mod = _load("sitecustomize")
    monkeypatch.setenv("SGL_BENCH_PAUSE_DIR", str(tmp_path))
    yield mod
    signal.signal(signal.SIGUSR2, before)
    gc.callbacks.remove(mod._on_gc)


def test_flip_toggles_only_the_step_hooks_and_reports_the_state(shim, monkeypatch, tmp_path):
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    phase = Hook(Target("phase", ("decode",), "m", "W.forward", "forward"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step, phase])))
    assert signal.getsignal(signal.SIGUSR2) is shim._flip
    state = tmp_path / str(os.getpid())
    shim._flip(signal.SIGUSR2, None)
    assert step.enabled is False and phase.enabled is True and state.read_text() == "paused"
    shim._flip(signal.SIGUSR2, None)
    assert step.enabled is True and state.read_text() == "recording"


def test_each_flip_reports_the_garbage_collections_so_far(shim, monkeypatch, tmp_path):
    control = _load("control")
    monkeypatch.setattr(activate, "_PROBE", None)
    assert control.gc_stats(tmp_path, os.getpid()) is None
    shim._flip(signal.SIGUSR2, None)
    first = control.gc_stats(tmp_path, os.getpid())
    gc.collect()
    gc.collect(0)
    shim._flip(signal.SIGUSR2, None)
    second = control.gc_stats(tmp_path, os.getpid())
    assert second["count"][2] >= first["count"][2] + 1 and second["count"][0] >= first["count"][0] + 1
    assert sum(second["seconds"]) > sum(first["seconds"]) and second["t"] >= first["t"]
    assert second["elapsed_source"] is None  # no probe here
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]),
                                               recorder=NS(timer=NS(elapsed_source="cuda_runtime",
                                                                    anchor_events_made=7))))
    shim._flip(signal.SIGUSR2, None)
    got = control.gc_stats(tmp_path, os.getpid())
    assert got["elapsed_source"] == "cuda_runtime" and got["anchor_events"] == 7
    assert got["probe_file"] == sys.modules["sgl_probe"].__file__  # which probe this process runs


def test_flip_without_a_probe_reports_it_and_never_raises(shim, monkeypatch, tmp_path):
    monkeypatch.setattr(activate, "_PROBE", None)
    shim._flip(signal.SIGUSR2, None)
    assert (tmp_path / str(os.getpid())).read_text() == "no-probe"
    monkeypatch.setattr(activate, "_PROBE", NS())  # no instrumentor: logged, not raised
    shim._flip(signal.SIGUSR2, None)


def test_flip_where_the_probe_cannot_be_imported_reports_no_probe(shim, monkeypatch, tmp_path):
    """An A/A control server has no sgl_probe on its path at all: it must still answer the flip,
    or the controller waits for it in vain."""
    monkeypatch.setitem(sys.modules, "sgl_probe.activate", None)  # import raises ImportError
    shim._flip(signal.SIGUSR2, None)
    assert (tmp_path / str(os.getpid())).read_text() == "no-probe"


def test_controller_finds_schedulers_by_title_and_waits_for_their_state(tmp_path):
    control = _load("control")
    # bash's exec -a sets argv[0], as SGLang's setproctitle does for its scheduler
    procs = [subprocess.Popen(["bash", "-c", f"exec -a {title} sleep 30"], start_new_session=i == 0)
             for i, title in enumerate(["sglang::scheduler_TP0", "sglang::detokenizer"])]
    try:
        pgid = procs[0].pid
        end = time.monotonic() + 5
        while time.monotonic() < end and not control.scheduler_pids(pgid):
            time.sleep(0.02)
        assert control.scheduler_pids(pgid) == [pgid]  # the other one is neither in the group nor titled so
        (tmp_path / str(pgid)).write_text("paused")
        control.set_recording([pgid], False, tmp_path, timeout=1)  # already paused: nothing sent
        assert procs[0].poll() is None
        with pytest.raises(TimeoutError):  # a process that never answers is named, not waited on forever
            control.set_recording([pgid], True, tmp_path, timeout=0.3)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_group_cpu_is_summed_by_role_within_the_group_only():
    control = _load("control")
    assert control.role_of(b"sglang::scheduler_TP0", b"sglang::scheduler_TP0\0") == "scheduler"
    assert control.role_of(b"/usr/bin/python3", b"/usr/bin/python3\0-m\0sgl_probe.exporter_main\0"
                                                b"7\0123\0") == "exporter"
    assert control.role_of(b"sglang::detokenizer", b"sglang::detokenizer\0") == "other"
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    # The group's leader burns 0.6 s as "the exporter"; a process outside the group burns too.
    leader = subprocess.Popen(["python3", "-c", burn, "sgl_probe.exporter_main"], start_new_session=True)
    outside = subprocess.Popen(["python3", "-c", burn], start_new_session=True)
    try:
        end = time.monotonic() + 20
        got = control.group_cpu_s(leader.pid)
        while time.monotonic() < end and got["exporter"] < 0.55:
            time.sleep(0.1)
            got = control.group_cpu_s(leader.pid)
        assert 0.55 <= got["exporter"] < 1.5 and got["scheduler"] == 0.0 and got["other"] == 0.0
    finally:
        for p in (leader, outside):
            p.kill()
            p.wait()


def test_thread_use_tells_a_sleeping_main_thread_from_a_busy_other_thread():
    control = _load("control")
    # The main thread sleeps in short naps (voluntary switches) while another thread burns CPU.
    code = ("import threading, time\n"
            "def burn():\n"
            "    while True: sum(range(1000))\n"
            "threading.Thread(target=burn, daemon=True).start()\n"
            "while True: time.sleep(0.001)\n")
    proc = subprocess.Popen(["python3", "-c", code])
    try:
        time.sleep(0.5)
        a, t0 = control.thread_times(proc.pid), time.monotonic()
        time.sleep(1.0)
        b, t1 = control.thread_times(proc.pid), time.monotonic()
        assert proc.pid in a and len(b) >= 2
        got = control.thread_use(a, b, proc.pid, t1 - t0)
        # Under the GIL the napping main thread gets little CPU; the burner most of what the
        # process gets (on a loaded machine that may be well under a core: compared, not fixed).
        assert got["main_cpu"] < 0.5 and got["main_asleep"] > 0.2
        assert got["main_vcsw_per_s"] > 50
        assert got["busiest_other_cpu"] > max(0.1, 2 * got["main_cpu"])
        assert got["others_cpu"] >= got["busiest_other_cpu"]
    finally:
        proc.kill()
        proc.wait()
    assert control.thread_times(proc.pid) == {}  # gone: nothing, no error


def test_scheduler_core_takes_a_whole_physical_core_and_leaves_the_rest(tmp_path):
    control = _load("control")
    assert control.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    # Siblings (0, 8), (1, 9), ... as on a 2-way SMT host; CPUs outside the set are not taken.
    for cpu in range(16):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        d.joinpath("thread_siblings_list").write_text(f"{cpu % 8},{cpu % 8 + 8}\n")
    assert control.scheduler_core(set(range(16)), tmp_path) == {0, 8}
    assert control.scheduler_core({0, 1, 2, 9}, tmp_path) == {1, 9}  # 0's sibling 8 is not ours
    assert control.siblings(3, tmp_path / "nowhere") == {3}
    assert control.scheduler_core({4, 5, 6}, tmp_path / "nowhere") == {4, 5}  # no SMT: two CPUs


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pin_scheduler_moves_every_thread_of_the_group_by_role():
    control = _load("control")
    cpus = set(sorted(os.sched_getaffinity(0))[:3])
    threads = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\ntime.sleep(30)"
    # The interpreter itself (a launcher shim would drop the title exec -a gives it).
    sched = subprocess.Popen(["bash", "-c", f"exec -a sglang::scheduler_TP0 {sys.executable} -c '{threads}'"],
                             start_new_session=True)
    try:
        end = time.monotonic() + 10
        while time.monotonic() < end and len(os.listdir(f"/proc/{sched.pid}/task")) < 2:
            time.sleep(0.05)
        got = control.pin_scheduler(sched.pid, cpus)
        assert got["threads"]["scheduler"] == 2
        core = set(got["scheduler_cpus"])
        for tid in os.listdir(f"/proc/{sched.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == core
        assert core <= cpus and (set(got["other_cpus"]) == (cpus - core or cpus))
    finally:
        sched.kill()
        sched.wait()


def test_keep_gil_switch_is_applied_once_and_the_drain_sets_up_again(shim, monkeypatch, tmp_path):
    """SGL_BENCH_KEEP_GIL=1 (overhead_cross's ``gil`` kind): the first flip turns the timer's
    GIL-keeping read on and replaces its per-thread setup; without the variable nothing changes."""
    import threading

    prepared = threading.local()
    timer = NS(elapsed_keeps_gil=False, _prepared=prepared, elapsed_source="cuda_runtime")
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    assert timer.elapsed_keeps_gil is False and timer._prepared is prepared
    monkeypatch.setenv("SGL_BENCH_KEEP_GIL", "1")
    shim._flip(signal.SIGUSR2, None)
    assert timer.elapsed_keeps_gil is True and timer._prepared is not prepared
    again = timer._prepared
    shim._flip(signal.SIGUSR2, None)
    assert timer._prepared is again  # once only
    monkeypatch.setenv("SGL_BENCH_KEEP_GIL", "0")  # the read releasing it, as releases before h100-5 did
    shim._flip(signal.SIGUSR2, None)
    assert timer.elapsed_keeps_gil is False and timer._prepared is not again


def test_start_events_switch_makes_the_timer_record_starts_once_it_exists(shim, monkeypatch, tmp_path):
    """SGL_BENCH_START_EVENTS=1 (overhead_cross's ``self2ev`` kind): the flip that finds the CUDA
    timer switches its ``record_starts`` on, once; without the variable, or before the timer
    exists, nothing changes."""
    switched = []
    timer = NS(start_events=False)
    timer.record_starts = lambda: switched.append(1) or setattr(timer, "start_events", True)
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    assert switched == [] and timer.start_events is False
    monkeypatch.setenv("SGL_BENCH_START_EVENTS", "1")
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=None)))
    shim._flip(signal.SIGUSR2, None)  # no timer yet: nothing to switch, and the flip still answers
    assert (tmp_path / str(os.getpid())).exists()
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    shim._flip(signal.SIGUSR2, None)
    assert switched == [1] and timer.start_events is True


def test_gpu_run_switch_sets_a_real_timers_runs_in_c_and_python_once_it_exists(shim, monkeypatch, tmp_path):
    """SGL_BENCH_GPU_RUN=1 (overhead_cross's ``selflone`` kind): the flip that finds the CUDA timer
    has it time each sampled step alone, its C half as its Python methods; before the timer exists,
    or without the variable, the runs stay the release's."""
    from sgl_probe import hotpath
    from sgl_probe.timing import CudaTimer
    from tests.test_gpu_free_parts import _FakeTorch

    fast = hotpath.load()
    timer = CudaTimer(_FakeTorch(), fast, every_ns=10_000_000)
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    assert timer._GPU_RUN == CudaTimer._GPU_RUN == 4
    monkeypatch.setenv("SGL_BENCH_GPU_RUN", "1")
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=None)))
    shim._flip(signal.SIGUSR2, None)  # no timer yet: the flip still answers
    assert (tmp_path / str(os.getpid())).exists()
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    assert timer._GPU_RUN == 1 and CudaTimer._GPU_RUN == 4
    if fast is not None:
        assert timer._c.gpu_run == 1
        with pytest.raises(ValueError):
            timer._c.gpu_run = 3
    timer.relax_capture_mode = False
    t, timed = 10**12, []
    for index in range(48):
        token = timer.start(t, index)
        if index >= 16 and type(token) is not int:
            timed.append(index)
        timer.release(token, timer.stop(token, t + 100_000))
        t += 1_600_000
    assert timed == list(range(16, 48, 4))  # one step in four, alone


def test_self_time_times_the_cuda_timers_calls_on_the_scheduler_thread_only(shim, monkeypatch, tmp_path):
    """SGL_BENCH_SELF_TIME=1 also times the CUDA timer's driver-facing calls (instance attributes,
    as CudaTimer sets them), once, from the flip that finds the timer; calls made on another thread
    (the drain's) pass through untimed; the controller reports µs and calls per step."""
    import threading

    def slow_record(ev, stream):
        time.sleep(0.002)
        return (ev, stream)

    timer = NS(_record=slow_record, _stream_query=lambda stream: True, elapsed_keeps_gil=True)
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=None)))
    monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
    control = _load("control")
    shim._flip(signal.SIGUSR2, None)  # no timer yet (no step so far): nothing to time
    assert timer._record is slow_record
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    timed = timer._record
    assert timed is not slow_record
    g0 = control.gc_stats(tmp_path, os.getpid())
    for _ in range(5):
        assert timer._record(1, 2) == (1, 2) and timer._stream_query(3) is True
    drain = threading.Thread(target=lambda: [timer._record(1, 2) for _ in range(5)])
    drain.start()
    drain.join()
    shim._flip(signal.SIGUSR2, None)
    assert timer._record is timed  # wrapped once
    got = control.own_time(g0, control.gc_stats(tmp_path, os.getpid()), steps=5)
    assert got["timer_calls:_record"] == 1 and got["timer_calls:_stream_query"] == 1
    assert 2000 <= got["timer_call:_record"] < 20000  # the 2 ms sleep, per step; not the drain's 5 more
    assert got["timer_call:_stream_query"] < got["timer_call:_record"] / 10


def _scheduler_with_probe(monkeypatch, name: str, forward):
    """A scheduler-shaped module ``name`` (benchmarks/sched_shape.py) whose forward runs
    ``forward()``, wrapped by a real probe instrumented over it (CPU timer, nothing exported, the
    drain held back). Returns (its Scheduler class, the probe)."""
    sys.path.insert(0, str(PAUSE.parent))
    try:
        from sched_shape import install, table
    finally:
        sys.path.remove(str(PAUSE.parent))
    for key, val in {"SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_METRICS": "off",
                     "SGL_PROBE_DRAIN_S": "3600", "SGL_PROBE_MAX_PENDING": "1000000"}.items():
        monkeypatch.setenv(key, val)
    for key in ("SGL_PROBE_TRACE_DIR", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    from sgl_probe import config
    from sgl_probe.activate import Probe

    Scheduler = install(name, forward)
    probe = Probe(config.load(), targets=table(name))
    probe.instrumentor.instrument()
    return Scheduler, probe


def test_self_time_layers_time_the_probe_wrappers_and_what_they_call(shim, monkeypatch, tmp_path):
    """SGL_BENCH_SELF_TIME=1 (overhead_cross's ``self`` kind): from the first flip the real
    probe's per-step wrappers are timed from outside and around the SGLang function they call;
    outside minus inside is the probe's own time, which grows with a slower probe and not with a
    slower SGLang, and uninstrument still puts every original back."""
    from tests.workload import Batch, ForwardMode

    slow_sglang = [0.0]
    Scheduler, probe = _scheduler_with_probe(monkeypatch, "probe_pause_self_workload",
                                             lambda: time.sleep(slow_sglang[0]))
    originals = {(h.owner, h.attr): h.original for h in probe.instrumentor.hooks}
    try:
        monkeypatch.setattr(activate, "_PROBE", probe)
        monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
        control = _load("control")
        sched, batch = Scheduler(), Batch(ForwardMode.DECODE, 4)
        shim._flip(signal.SIGUSR2, None)  # paused, layers on
        shim._flip(signal.SIGUSR2, None)  # recording
        layered = [h for h in probe.instrumentor.hooks if vars(h.owner)[h.attr].__name__ == "outside"]
        assert {h.target.role for h in layered} == {"step", "phase", "graph"}  # not the wrapt ones

        def self_us(n: int) -> tuple[float, float]:
            before = shim._SELF[:]
            for _ in range(n):
                sched.run_batch(batch)
            d = [a - b for a, b in zip(shim._SELF, before)]
            assert d[3] == n  # steps counted
            return (d[0] - d[1]) / n / 1e3, d[2] / n

        base, calls = self_us(200)
        assert calls == len(layered)  # every per-step wrapper once per step
        slow_sglang[0] = 0.002  # SGLang slower: the probe's own time must not follow it
        slowed, _ = self_us(20)
        assert slowed < base + 500
        slow_sglang[0] = 0.0
        real = probe.recorder.timer.start

        def slow_start(now_ns, first=True):  # the probe slower by 1 ms a phase: its own time must show it
            time.sleep(0.001)
            return real(now_ns, first)

        probe.recorder.timer.start = slow_start
        slowed_probe, _ = self_us(20)
        assert slowed_probe > base + 900
        probe.recorder.timer.start = real
        shim._flip(signal.SIGUSR2, None)
        flip = control.gc_stats(tmp_path, os.getpid())
        assert flip["self_ns"] == shim._SELF
        # Per target: the three wrappers' own times add up to the total.
        by = flip["self_by_target"]
        assert {h.target.name for h in layered} == set(by)
        assert sum(o - i for o, i, _ in by.values()) == shim._SELF[0] - shim._SELF[1]
    finally:
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()
    assert all(vars(owner)[attr] is orig for (owner, attr), orig in originals.items())


def test_cpu_server_self_time_takes_each_segment_between_two_flips_by_its_state():
    """``cpu_server_overhead.py --in-process --self-time``: the shim's totals at each flip close a
    segment of one state (a segment may hold two load blocks: ABBA repeats a state at a pair's
    edge); a segment without totals (before the first flip) or without steps is left out."""
    spec = importlib.util.spec_from_file_location("cpu_server_overhead", PAUSE.parent / "cpu_server_overhead.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(PAUSE.parent))  # as when run as a script: its folder first
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(PAUSE.parent))

    def at(outside, inside, steps):  # all of it in one wrapper, "step"; "graph" never called
        return {"self_ns": [outside, inside, 3 * steps, steps],
                "self_by_target": {"step": [outside, inside, steps], "graph": [0, 0, 0]}}

    flips = [(True, None),                       # never flipped: no totals yet
             (False, at(0, 0, 0)),               # paused: 1,000 steps, 6 µs each
             (True, at(8e6, 2e6, 1000)),         # recording: 2,000 steps, 22 µs each
             (False, at(8e6 + 5.2e7, 2e6 + 8e6, 3000)),
             (True, at(6e7, 1e7, 3000))]         # no step in between: left out
    got = mod.self_table(flips)
    assert got["paused"]["median"] == pytest.approx(6) and got["paused"]["segments"] == 1
    assert got["recording"]["median"] == pytest.approx(22) and got["recording"]["segments"] == 1
    assert got["recording_minus_paused"] == pytest.approx(16)
    assert got["by_target"] == {"step": {"recording": pytest.approx(22), "paused": pytest.approx(6)}}


def test_the_section_build_times_the_c_wrappers_and_the_controller_reports_them(shim, monkeypatch, tmp_path):
    """``build.py --section-times``: the C hot path compiled with SGL_PROBE_SECTION_TIMES counts each
    section's ns and calls; the shim's flip carries them (``self_sections``) and the controller
    reports µs and calls per step; a normal build has no section timers."""
    import importlib.machinery
    import logging
    import sysconfig

    from hatch_build import compile_command

    from sgl_probe import hotpath
    from sgl_probe.recorder import Recorder
    from sgl_probe.timing import CpuTimer
    from tests.test_exact_recorder import FORWARD, STEP, ForwardMode

    if hotpath.load("auto") is None:
        pytest.skip("no C hot path here (no compiler)")
    assert not hasattr(hotpath.load("auto"), "section_times")
    src = Path(__file__).resolve().parents[1] / "sgl_probe" / "_hot.c"
    out = tmp_path / ("_hot" + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = compile_command(src, out)
    cmd[0:1] = [cmd[0], "-DSGL_PROBE_SECTION_TIMES"]
    subprocess.run(cmd, check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location(
        "sgl_probe._hot", out, loader=importlib.machinery.ExtensionFileLoader("sgl_probe._hot", str(out)))
    timed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timed)
    monkeypatch.setitem(sys.modules, "sgl_probe._hot", timed)
    monkeypatch.setattr(hotpath, "load", lambda choice="auto": timed)
    rec = Recorder("cpu", 1000, logging.getLogger("sgl_probe.test"), "c")
    rec.timer = CpuTimer(timed)
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b: NS(can_run_cuda_graph=True))
    step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(4,)))
    step_hook = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step_hook]), recorder=NS(timer=None)))
    monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
    control = _load("control")
    shim._flip(signal.SIGUSR2, None)
    g0 = control.gc_stats(tmp_path, os.getpid())
    for _ in range(7):
        step(None, batch)
    shim._flip(signal.SIGUSR2, None)
    got = control.own_time(g0, control.gc_stats(tmp_path, os.getpid()), steps=7)
    assert len(rec.steps) == 7
    for name in ("step_enter", "step_read", "step_exit", "phase_enter", "phase_read", "phase_start", "phase_exit"):
        assert got["sections:" + name] == 1, name
        assert 0 < got["section:" + name] < 1000, name
    assert got["section:step_read"] < got["section:step_enter"]
    assert "sections:stop_record" not in got  # the CPU timer: no CUDA stop
    # The drain's C parts, per step: the ready checks and the summary once a pass, pop and row
    # once a step (the CPU timer: no events to read ahead or release).
    from sgl_probe import drain
    from sgl_probe.summary import Summary

    g0 = control.gc_stats(tmp_path, os.getpid())
    rows: list = []
    assert drain.take_ready(rec.steps, rec.timer, 0, False, 100, rows) == 7
    Summary(30, {}, timed).add_rows(rows)
    shim._flip(signal.SIGUSR2, None)
    got = control.own_time(g0, control.gc_stats(tmp_path, os.getpid()), steps=7)
    assert got["sections:drain_pop"] == got["sections:drain_resolve"] == 1
    assert got["sections:drain_ready"] == got["sections:drain_summary"] == 1 / 7
    assert not any(k.startswith(("sections:drain_release", "sections:drain_reads", "sections:step")) for k in got)
    # The CUDA timer over a stand-in GPU: a pass's reads ahead (once each: collect, read, regain),
    # and each step's events released.
    from tests.test_hotpath_c import _drained_rows

    before = timed.section_times()
    rows, taken = _drained_rows(timed, monkeypatch, c_take=True, runtime=True, keep_gil=False)[:2]
    after = timed.section_times()
    calls = {k: after[k][1] - before[k][1] for k in after}
    assert calls["drain_collect"] == calls["drain_reads"] == calls["drain_regain"] >= 1
    assert calls["drain_release"] == calls["drain_pop"] == taken == len(rows) > 0
    # The anchor's refreshes, part of the timer's start: only at the starts where one fell due.
    assert 1 <= calls["start_anchor"] < calls["phase_start"]


def test_drain_stretch_switches_set_the_drains_budget_and_chunk(shim, monkeypatch, tmp_path):
    """SGL_BENCH_DRAIN_YIELD_US / SGL_BENCH_DRAIN_CHUNK (overhead_cross's ``selfyield`` kind): the
    first flip sets the drain's stretch budget and chunk, and the drain then takes the steps in
    chunks of that size, yielding between them."""
    from sgl_probe import export
    from tests.workload import Batch, ForwardMode

    Scheduler, probe = _scheduler_with_probe(monkeypatch, "probe_pause_yield_workload", lambda: None)
    try:
        monkeypatch.setattr(activate, "_PROBE", probe)
        monkeypatch.setattr(export, "YIELD_AFTER_NS", export.YIELD_AFTER_NS)  # put back after
        monkeypatch.setattr(export, "CHUNK", export.CHUNK)
        monkeypatch.setattr(export, "time", export.time)
        monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
        monkeypatch.setenv("SGL_BENCH_DRAIN_YIELD_US", "0")
        monkeypatch.setenv("SGL_BENCH_DRAIN_CHUNK", "4")
        control = _load("control")
        sched, batch = Scheduler(), Batch(ForwardMode.DECODE, 4)
        shim._flip(signal.SIGUSR2, None)  # paused, switches applied
        assert (export.YIELD_AFTER_NS, export.CHUNK) == (0, 4)
        shim._flip(signal.SIGUSR2, None)  # recording
        g0 = control.gc_stats(tmp_path, os.getpid())
        for _ in range(4 * 3 + 1):
            sched.run_batch(batch)
        assert probe.pipeline.drain() == 13
        shim._flip(signal.SIGUSR2, None)
        g1 = control.gc_stats(tmp_path, os.getpid())
        assert g1["self_drain"]["hold"][1] == 4  # three full chunks of 4 left steps behind: three yields
    finally:
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()


def test_self_time_times_the_drains_stretches_between_two_gil_hand_overs(shim, monkeypatch, tmp_path):
    """SGL_BENCH_SELF_TIME=1 also times each stretch the drain thread runs between two yields (its
    short sleeps) or a pass's ends, wall and CPU, and the controller reports them per step."""
    from sgl_probe import export
    from tests.workload import Batch, ForwardMode

    Scheduler, probe = _scheduler_with_probe(monkeypatch, "probe_pause_drain_workload", lambda: None)
    try:
        monkeypatch.setattr(activate, "_PROBE", probe)
        monkeypatch.setattr(export, "YIELD_AFTER_NS", 0)  # yield after every chunk that leaves steps behind
        monkeypatch.setattr(export, "time", export.time)  # the shim replaces it; put it back after
        monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
        control = _load("control")
        sched, batch = Scheduler(), Batch(ForwardMode.DECODE, 4)
        shim._flip(signal.SIGUSR2, None)  # paused, timing on
        shim._flip(signal.SIGUSR2, None)  # recording
        g0 = control.gc_stats(tmp_path, os.getpid())
        steps = 5 * export.CHUNK + 3
        for _ in range(steps):
            sched.run_batch(batch)
        assert probe.pipeline.drain() == steps
        shim._flip(signal.SIGUSR2, None)
        g1 = control.gc_stats(tmp_path, os.getpid())
        hold, hold_cpu = g1["self_drain"]["hold"], g1["self_drain"]["hold_cpu"]
        assert hold[1] == hold_cpu[1] == 6  # five yields split the pass into six stretches
        assert 0 < hold_cpu[0] <= hold[0] * 1.5 + 1e6
        for name, (ns, n) in g1["self_drain"].items():
            if name.startswith("hold_over_"):
                assert n <= hold[1] and ns <= hold[0]
        got = control.own_time(g0, g1)
        assert got["drains:hold"] == 6 / steps and got["drain:hold"] == hold[0] / steps / 1e3
    finally:
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()


def test_self_time_reads_the_drain_threads_whole_cpu_at_each_flip(shim, monkeypatch, tmp_path):
    """``self_drain["thread_cpu"]``: the drain thread's own clock at each flip (whatever it did,
    in stretches or not), so the controller reports its CPU per step between two flips."""
    import threading

    from sgl_probe import export
    from tests.workload import Batch, ForwardMode

    Scheduler, probe = _scheduler_with_probe(monkeypatch, "probe_pause_thread_cpu_workload", lambda: None)
    stop = threading.Event()
    burned = threading.Event()

    def burn():  # stands for the drain thread: CPU between the two flips, none after
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 30_000_000:
            pass
        burned.set()
        stop.wait()

    drainer = threading.Thread(target=burn, name="sgl-probe-drain", daemon=True)
    try:
        monkeypatch.setattr(activate, "_PROBE", probe)
        monkeypatch.setattr(export, "time", export.time)
        monkeypatch.setenv("SGL_BENCH_SELF_TIME", "1")
        control = _load("control")
        Scheduler().run_batch(Batch(ForwardMode.DECODE, 4))  # the pipeline, and its (idle) drain thread
        probe.pipeline._thread.name = "idle"  # the burner below stands for it
        shim._flip(signal.SIGUSR2, None)  # paused, timing on
        drainer.start()
        shim._flip(signal.SIGUSR2, None)  # recording
        g0 = control.gc_stats(tmp_path, os.getpid())
        assert burned.wait(10)
        shim._flip(signal.SIGUSR2, None)
        g1 = control.gc_stats(tmp_path, os.getpid())
        got = control.own_time(g0, g1, steps=1000)
        assert g1["self_drain"]["thread_cpu"][1] == g0["self_drain"]["thread_cpu"][1] + 1
        assert got["drain:thread_cpu"] >= 20  # µs per step: >= 20 ms over the 1,000 steps given
        assert g1["self_drain"]["thread_cpu"][0] - g0["self_drain"]["thread_cpu"][0] >= 20_000_000
    finally:
        stop.set()
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()


def test_pool_switch_fills_the_cuda_timers_pool_once(shim, monkeypatch, tmp_path):
    """SGL_BENCH_POOL_MAX=N (``selfnodrain``): the first flip that finds the CUDA timer with an
    anchor raises its pool's cap to N and fills the pool to N events, each recorded once on that
    device's current stream; later flips change nothing. Without the variable, or before the timer
    has an anchor, nothing changes."""
    made, recorded = [], []
    timer = NS(_pool=["old"], _POOL_MAX=4096, _anchors={},
               _new=lambda: made.append(object()) or made[-1],
               _record=lambda ev, stream: recorded.append((ev, stream)),
               _current_stream=lambda device: ("stream", device))
    step = Hook(Target("step", (), "m", "S.run_batch", "step"))
    monkeypatch.setattr(activate, "_PROBE", NS(instrumentor=NS(hooks=[step]), recorder=NS(timer=timer)))
    shim._flip(signal.SIGUSR2, None)
    assert timer._pool == ["old"] and timer._POOL_MAX == 4096  # not asked
    monkeypatch.setenv("SGL_BENCH_POOL_MAX", "5")
    shim._flip(signal.SIGUSR2, None)
    assert timer._pool == ["old"] and timer._POOL_MAX == 4096  # no anchor yet: no device to record on
    timer._anchors[3] = ("anchor", 0)
    shim._flip(signal.SIGUSR2, None)
    assert timer._POOL_MAX == 5
    assert timer._pool == ["old"] + made and len(made) == 4
    assert recorded == [(ev, ("stream", 3)) for ev in made]
    timer._pool.clear()
    shim._flip(signal.SIGUSR2, None)
    assert timer._pool == [] and len(made) == 4


def test_pmu_switch_counts_the_scheduler_threads_events_between_two_flips(shim, monkeypatch, tmp_path, capfd):
    """``SGL_BENCH_PMU=1``: the flipping thread's counters are opened at the first flip and read at
    each; the controller reports counts per step. The task clock exists on every Linux (the
    hardware counters only where the host exposes them: the others are left out, one line each)."""
    monkeypatch.setattr(activate, "_PROBE", None)
    monkeypatch.setenv("SGL_BENCH_PMU", "1")
    control = _load("control")
    shim._flip(signal.SIGUSR2, None)
    g0 = control.gc_stats(tmp_path, os.getpid())
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < 30_000_000:  # 30 ms of this thread's CPU between the flips
        pass
    shim._flip(signal.SIGUSR2, None)
    g1 = control.gc_stats(tmp_path, os.getpid())
    if "task_clock_ns" not in (g1["self_pmu"] or {}):  # perf events refused here (seccomp, paranoid 3)
        assert "no task_clock_ns counter" in capfd.readouterr().err
        pytest.skip("this machine refuses perf_event_open even for the task clock")
    pmu = {k: v for k, v in control.own_time({**g0, "self_ns": [0, 0, 0, 0]}, {**g1, "self_ns": [0, 0, 0, 1000]}).items()
           if k.startswith("pmu:")}
    assert 25_000 <= pmu["pmu:task_clock_ns"] <= 200_000  # ns per step over the 1,000 steps
    assert g1["self_pmu"]["task_clock_ns"][1] == g0["self_pmu"]["task_clock_ns"][1] + 1
    missing = [n for n, _, _ in shim._PMU_EVENTS if n not in g1["self_pmu"]]
    err = capfd.readouterr().err
    assert all(err.count(f"no {n} counter") == 1 for n in missing)
    if "pmu:instructions" in pmu:
        assert pmu["pmu:instructions"] > 0
