"""gpu_bench section percall: the probe's added CPU time per wrapped step, and what the drain
thread and the exporter cost per step off the hot path."""

from __future__ import annotations

import statistics
import time

import gpu_common as gc
from gpu_bench_env import Env


def off_hot_path_costs(env: Env, p_hot, sched_hot, batch, rcv_env: dict, n: int = 1000) -> dict:
    """CPU time the drain thread (span building) and the exporter (OTLP/gRPC encode + send to the
    receiver) spend per step: the part of the probe that competes with the scheduler for the GIL."""
    out: dict = {"steps": n}
    env.sync()
    p_hot.pipeline.drain()
    for _ in range(n):
        sched_hot.run_batch(batch)
    env.sync()
    t0, c0 = time.perf_counter(), time.process_time()
    done = p_hot.pipeline.drain()
    out["drain_us_per_step"] = (time.perf_counter() - t0) / max(done, 1) * 1e6
    out["drain_cpu_us_per_step"] = (time.process_time() - c0) / max(done, 1) * 1e6
    cls = gc.make_variant("pc_exp", None, None)
    p_exp = gc.make_probe("pc_exp", {**rcv_env, **gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "1000000", "SGL_PROBE_SUMMARY_S": "0",
                                     "OTEL_BSP_MAX_QUEUE_SIZE": str(4 * n), "OTEL_BSP_SCHEDULE_DELAY": "600000"})
    s = cls(None, tp_rank=0)
    for _ in range(n):
        s.run_batch(batch)
    env.sync()
    p_exp.pipeline.flush()  # warm-up export (first gRPC connection)
    for _ in range(n):
        s.run_batch(batch)
    env.sync()
    t0, c0 = time.perf_counter(), time.process_time()
    done = p_exp.pipeline.drain()
    t1, c1 = time.perf_counter(), time.process_time()
    p_exp.pipeline.sink.flush(60.0)
    t2, c2 = time.perf_counter(), time.process_time()
    k = 1e6 / max(done, 1)
    out["drain_with_bsp_us_per_step"] = (t1 - t0) * k
    out["otlp_export_wall_us_per_step"] = (t2 - t1) * k  # includes waiting for the receiver
    out["otlp_export_cpu_us_per_step"] = (c2 - c1) * k  # this process's CPU (all threads)
    out["drain_and_export_cpu_us_per_step"] = (c2 - c0) * k
    out["spans_per_step"] = 2
    p_exp.instrumentor.uninstrument()
    p_exp.pipeline.shutdown()
    return out


def section_percall(env: Env, reps: int, calls: int, rcv_env: dict) -> dict:
    """Added CPU time per wrapped decode step (step + phase + graph hook) vs two bare records."""
    t = env.torch
    res: dict = {"calls_per_rep": calls, "reps": reps}
    bare_cls = gc.make_variant("pc_bare", None, None)
    cuda_cls = gc.make_variant("pc_cuda", None, None)
    cpu_cls = gc.make_variant("pc_cpu", None, None)
    p_cuda = gc.make_probe("pc_cuda", {**gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "1000000", "SGL_PROBE_SUMMARY_S": "0",
                                       "SGL_PROBE_TIMER": "cuda" if env.cuda else "cpu",
                                       "SGL_PROBE_MAX_PENDING": "100000000"})
    p_cpu = gc.make_probe("pc_cpu", {"SGL_PROBE_DRAIN_S": "1000000", "SGL_PROBE_SUMMARY_S": "0",
                                     "SGL_PROBE_TIMER": "cpu", "SGL_PROBE_MAX_PENDING": "100000000"})
    scheds = {"bare_call": bare_cls(), "probe": cuda_cls(), "probe_cpu_timer": cpu_cls()}
    batch = gc.Batch(gc.ForwardMode.DECODE, 1)

    def loop_sched(s):
        def run():
            f = s.run_batch
            t0 = time.perf_counter()
            for _ in range(calls):
                f(batch)
            return time.perf_counter() - t0
        return run

    fns = {k: loop_sched(s) for k, s in scheds.items()}
    if env.cuda:
        from sgl_probe.timing import CudaTimer

        Event = t.cuda.Event
        pool = [Event(enable_timing=True) for _ in range(64)]
        ref = CudaTimer(t)  # its stream cache and C record method, without the probe around them
        rec_c, cache, key_of, lookup = ref._record, ref._streams, ref._stream_key, ref._lookup_stream
        fast = ref.fast_stream
        current = t.cuda.current_stream

        def two_bare():
            p = pool
            t0 = time.perf_counter()
            for _ in range(calls):
                s = p.pop()
                e = p.pop()
                s.record()
                e.record()
                p.append(s)
                p.append(e)
            return time.perf_counter() - t0

        def two_fast():
            p = pool
            t0 = time.perf_counter()
            for _ in range(calls):
                st = (cache.get(key_of(-1)) or lookup()) if fast else current()
                s = p.pop()
                e = p.pop()
                rec_c(s, st)
                rec_c(e, st)
                p.append(s)
                p.append(e)
            return time.perf_counter() - t0

        squery, equery = ref._stream_query, ref._query
        done_ev = Event(enable_timing=True)
        done_ev.record()

        def stream_query():
            st = cache.get(key_of(-1)) or lookup()
            t0 = time.perf_counter()
            for _ in range(calls):
                squery(st)
            return time.perf_counter() - t0

        def event_query():
            t0 = time.perf_counter()
            for _ in range(calls):
                equery(done_ev)
            return time.perf_counter() - t0

        fns["two_bare_records"] = two_bare
        fns["two_records_cached_stream"] = two_fast
        fns["stream_query"] = stream_query  # what the timer's idle check costs, C methods
        fns["event_query"] = event_query
    names = list(fns)
    times: dict = {k: [] for k in names}
    for rep in range(reps + 1):
        for k in gc.rotation(names, rep):
            dt = fns[k]()
            if rep:
                times[k].append(dt / calls * 1e6)
            env.sync()
            p_cuda.pipeline.drain()  # untimed: resolves and recycles the events of this rep
            p_cpu.pipeline.drain()
    res["timer_fast_stream"] = bool(getattr(p_cuda.recorder.timer, "fast_stream", False))
    res["us_per_call_median"] = {k: statistics.median(v) for k, v in times.items()}
    res["us_per_call_all"] = times
    if "two_bare_records" in times:
        added = [p - b for p, b in zip(times["probe"], times["bare_call"])]
        ratios = [a / r for a, r in zip(added, times["two_bare_records"])]
        med, lo, hi = gc.bootstrap_median_ci(ratios)
        res["probe_added_vs_two_bare_records"] = {"median_ratio": med, "ci95": [lo, hi], "target": 1.2}
        ratios2 = [a / r for a, r in zip(added, times["two_records_cached_stream"])]
        med, lo, hi = gc.bootstrap_median_ci(ratios2)
        res["probe_added_vs_two_cached_stream_records"] = {"median_ratio": med, "ci95": [lo, hi]}
        py = [p - b for p, b in zip(times["probe_cpu_timer"], times["bare_call"])]
        res["python_part_us_median"] = statistics.median(py)
    res["probe_added_us_median"] = statistics.median(p - b for p, b in zip(times["probe"], times["bare_call"]))
    res["off_hot_path"] = off_hot_path_costs(env, p_cuda, scheds["probe"], batch, rcv_env)
    for p in (p_cuda, p_cpu):
        p.instrumentor.uninstrument()
        p.pipeline.shutdown()
    return res
