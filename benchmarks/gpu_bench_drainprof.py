"""gpu_bench section drainprof: where the drain thread's CPU per step goes with real CUDA events.

Two measurements of the same probe (CUDA timer, exporter process, OTLP to the receiver):

- ``live``: a launch-bound loop (a small CUDA graph per step, ``spin_us`` of host work before it)
  with the probe's own drain thread running at its default interval, as in a server; that thread's CPU time
  (its own clock) per step, and the loop's thread CPU per step; as scheduled, then with both
  threads on one CPU, then on two far-apart CPUs, then as scheduled again; as scheduled also with
  torch's ``Event.elapsed_time`` for the GPU times instead of the runtime's (``runtime_elapsed``),
  and with the runtime's read made without releasing the GIL (``keeps_gil``).
- ``stages``: one pass over recorded steps, on a thread named like the probe's (the drain
  thread's CUDA capture mode), each stage timed by thread CPU: completion check and resolving
  (``take_ready``), the summary, the link's pickling, the send; then the whole ``drain()`` over
  fresh steps under cProfile, its top functions by own time.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import threading
import time
from pathlib import Path

import gpu_common as gc
from gpu_bench_env import Env


def _thread_cpu_ns(thread: threading.Thread) -> int:
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def _pin(tid: int, cpu: int) -> None:
    os.sched_setaffinity(tid, {cpu})


def _decode_loop(env: Env, tag: str, probe_env: dict):
    """(probe, scheduler, batch): a small CUDA graph per decode step, the probe over it."""
    g, _, _ = env.make_graph(1024, 8, 1)
    cls = gc.make_variant(tag, None, g)
    probe = gc.make_probe(tag, probe_env)
    return probe, cls(None, tp_rank=0), gc.Batch(gc.ForwardMode.DECODE, 16)


def _live(env: Env, rcv_env: dict, seconds: float, host_us: float, pin: str = "",
          runtime_elapsed: bool = True, keeps_gil: bool = False) -> dict:
    """``pin``: "" (as scheduled), ``same`` (the loop's thread and the drain thread on one CPU:
    the GIL runs one of them at a time anyway, and the records stay in that CPU's caches) or
    ``apart`` (the first and the last CPU of this process, on a large host likely far apart).
    ``runtime_elapsed`` False: the drain reads GPU times with torch's ``Event.elapsed_time``;
    ``keeps_gil``: the runtime's read without releasing the GIL."""
    probe, s, batch = _decode_loop(env, "dp_live", {**rcv_env, "SGL_PROBE_SUMMARY_S": "30"})
    timer = probe.recorder.ensure_timer()
    timer.runtime_elapsed, timer.elapsed_keeps_gil = runtime_elapsed, keeps_gil  # before the drain's first pass
    for _ in range(200):
        s.run_batch(batch)
    env.sync()
    probe.pipeline.flush()
    drainer = probe.pipeline._thread
    cpus = sorted(os.sched_getaffinity(0))
    if pin:
        _pin(threading.get_native_id(), cpus[0])
        _pin(drainer.native_id, cpus[0] if pin == "same" else cpus[-1])
    d0, m0, t0 = _thread_cpu_ns(drainer), time.thread_time_ns(), time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        gc.spin_us(host_us)
        s.run_batch(batch)
        n += 1
    env.sync()
    time.sleep(1.5)  # the last pass
    d1, m1 = _thread_cpu_ns(drainer), time.thread_time_ns()
    if pin:
        os.sched_setaffinity(threading.get_native_id(), cpus)
    out = {"steps": n, "host_us": host_us, "pin": pin or None, "runtime_elapsed": runtime_elapsed, "keeps_gil": keeps_gil,
           "elapsed_source": getattr(probe.recorder.timer, "elapsed_source", None),
           "drain_thread_cpu_us_per_step": (d1 - d0) / n / 1e3,
           "loop_thread_cpu_us_per_step": (m1 - m0) / n / 1e3, "dropped": probe.pipeline.dropped_by()}
    probe.instrumentor.uninstrument()
    probe.pipeline.shutdown()
    return out


def _stages(env: Env, rcv_env: dict, steps: int) -> dict:
    probe, s, batch = _decode_loop(env, "dp_stages", {**rcv_env, "SGL_PROBE_SUMMARY_S": "30", "SGL_PROBE_DRAIN_S": "1000000",
                                                      "SGL_PROBE_MAX_PENDING": str(4 * steps)})
    pipe, rec = probe.pipeline, probe.recorder
    out: dict = {"steps": steps}

    def record() -> None:
        for _ in range(steps):
            s.run_batch(batch)
        env.sync()

    def work() -> None:
        record()
        pipe.drain()  # warm-up: the exporter process starts, the first message goes
        record()
        stage, _, msgs = gc.drain_stage_ns(pipe, rec)
        out.update({f"{k}_us": v / steps / 1e3 for k, v in stage.items()})
        tt = time.thread_time_ns
        t = tt()
        for data, spans in msgs:
            pipe.sink._send(data, spans)
        out["send_us"] = (tt() - t) / steps / 1e3
        record()
        t = tt()
        pipe.drain()
        out["drain_us"] = (tt() - t) / steps / 1e3
        record()
        prof = cProfile.Profile()
        prof.enable()
        pipe.drain()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
        # File names relative to the checkout: the result is read on other machines.
        root = str(Path(__file__).resolve().parents[1]) + "/"
        out["profile"] = buf.getvalue()[-6000:].replace(root, "")

    th = threading.Thread(target=work, name="sgl-probe-drainprof")
    th.start()
    th.join()
    probe.instrumentor.uninstrument()
    pipe.shutdown()
    return out


def section_drainprof(env: Env, rcv: gc.ReceiverProcess, steps: int = 3000) -> dict:
    return {"stages": _stages(env, rcv.env(), steps),
            "live": [_live(env, rcv.env(), 6.0, 2000.0, pin, rt, gil)
                     for pin, rt, gil in (("", True, False), ("", False, False), ("", True, True), ("same", True, False),
                                          ("apart", True, False), ("", True, False), ("", False, False), ("", True, True))]}
