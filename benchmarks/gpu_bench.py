"""Prove the probe's timing on one GPU: overhead, per-call cost, accuracy, graph flag, no host sync.

    python3 benchmarks/gpu_bench.py [--smoke] [--out DIR]

Drives the probe's real code (target table -> wrapt wrappers -> recorder -> CUDA-event timer ->
drain thread -> span builder -> BatchSpanProcessor -> OTLP/gRPC exporter) around a torch workload
shaped like SGLang's scheduler: ``Scheduler_<tag>.run_batch`` (step) calls
``Worker_<tag>.forward_batch_generation`` (phase), which either replays a CUDA graph through
``GraphRunner_<tag>.replay`` (graph role) or runs an eager, launch-bound layer stack; verify steps
report an accept count to ``Metrics_<tag>.update_spec_metrics`` (accept role). Spans go to a real
OTLP receiver in a child process on localhost while the loops run.

Sections (each writes into $OUT/gpu_bench.json; the table is printed last):
  percall   probe's added CPU time per wrapped step vs two bare pooled Event.record() calls
  loops     paired fine-grained interleaving: untimed / probe (full export) / probe hot path only /
            naive synchronize() timer, per loop shape; median paired ratio + bootstrap 95 % CI
  accuracy  probe phase time vs torch profiler kernel sum and kernel envelope, same steps
  graphflag sglang.cuda_graph on every exported span vs what each step actually ran
  syncdebug probe-on loop under torch.cuda.set_sync_debug_mode("error"), plus a positive control
  capture   graph-capture safety, each case in its own process (gpu_capture_check.py)
Without CUDA (--smoke or no GPU) it runs tiny CPU versions of what it can and says what it skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import gpu_common as gc

RESULTS: dict = {}


def log(msg: str) -> None:
    print("[gpu_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Env:
    def __init__(self, smoke: bool) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available() and not smoke
        self.smoke = smoke or not self.cuda
        self.dev = torch.device("cuda:0" if self.cuda else "cpu")
        self._weights: dict = {}

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def weights(self, H: int, L: int):
        key = (H, L)
        if key not in self._weights:
            t = self.torch
            g = t.Generator(device=self.dev).manual_seed(H * 1000 + L)
            dt = t.bfloat16 if self.cuda else t.float32
            self._weights[key] = [t.randn(H, H, device=self.dev, dtype=dt, generator=g) * 0.01 for _ in range(L)]
        return self._weights[key]

    def make_eager(self, H: int, L: int, passes: int, bs: int):
        t = self.torch
        Ws = self.weights(H, L)
        x = t.randn(bs, H, device=self.dev, dtype=Ws[0].dtype)
        silu = t.nn.functional.silu

        def step():
            y = x
            for _ in range(passes):
                for W in Ws:
                    y = silu(y @ W)
                    y = y * 0.5 + 0.1
            return y
        return step

    def make_graph(self, H: int, L: int, passes: int):
        """(graph, eager reference fn, static output) -- captured before any probe exists, as
        SGLang captures at startup."""
        t = self.torch
        step = self.make_eager(H, L, passes, bs=1)
        if not self.cuda:  # --smoke: a "CPU graph runner" (SGLang has one too) replays eagerly
            return _CpuReplay(step), step, None
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(3):
                step()
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            out = step()
        t.cuda.synchronize()
        return g, step, out

    def step_ms(self, fn, n: int = 10) -> float:
        for _ in range(3):
            fn()
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n * 1e3
        t = self.torch
        t.cuda.synchronize()
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        t.cuda.synchronize()
        return a.elapsed_time(b) / n


def events_only_wrapper(env: Env):
    """Two timing events around the call on the cached current stream, through the C method, from
    a ring of events (never queried): what the events themselves cost, without the probe."""
    import wrapt  # noqa: F401
    from sgl_probe.timing import CudaTimer

    t = env.torch
    ref = CudaTimer(t)
    rec, cache, key_of, lookup = ref._record, ref._streams, ref._stream_key, ref._lookup_stream
    ring = [t.cuda.Event(enable_timing=True) for _ in range(256)]
    pos = [0]

    def w(wrapped, instance, args, kwargs):
        st = cache.get(key_of(-1)) or lookup()
        i = pos[0]
        pos[0] = (i + 2) % 256
        rec(ring[i], st)
        r = wrapped(*args, **kwargs)
        rec(ring[i + 1], st)
        return r
    return w


def _wrapt_passthrough(cls, name: str) -> None:
    import wrapt

    wrapt.wrap_function_wrapper(cls, name, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))


def _plain_passthrough(cls, name: str) -> None:
    orig = vars(cls)[name]

    def patched(self, *args, **kwargs):
        return orig(self, *args, **kwargs)
    setattr(cls, name, patched)


class _CpuReplay:
    def __init__(self, fn) -> None:
        self.replay = fn


def sync_timer_wrapper(env: Env, sink: list):
    """The naive design: synchronize() + perf_counter around the call."""
    import wrapt

    def w(wrapped, instance, args, kwargs):
        env.sync()
        t0 = time.perf_counter()
        r = wrapped(*args, **kwargs)
        env.sync()
        sink.append((time.perf_counter() - t0) * 1e3)
        return r
    return w


# -- per-call cost --------------------------------------------------------------------------------

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
    p_exp = gc.make_probe("pc_exp", {**rcv_env, "SGL_PROBE_DRAIN_S": "1000000", "SGL_PROBE_SUMMARY_S": "0",
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
    p_cuda = gc.make_probe("pc_cuda", {"SGL_PROBE_DRAIN_S": "1000000", "SGL_PROBE_SUMMARY_S": "0",
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


# -- loops ----------------------------------------------------------------------------------------

SHAPES = {
    # name: (H, L, passes, graph?, mode, bs)
    "graph_2ms": (8192, 48, 1, True),
    "eager_2ms": (8192, 48, 1, False),
    "eager_launchbound_2ms": (1024, 64, 1, False),
    "graph_12ms": (8192, 48, 6, True),
    "eager_launchbound_29ms": (1024, 64, 12, False),
}
SMOKE_SHAPES = {"graph_smoke": (64, 8, 1, True), "eager_smoke": (64, 8, 1, False)}


class Shape:
    def __init__(self, env: Env, name: str, spec, rcv: gc.ReceiverProcess) -> None:
        H, L, passes, graph = spec
        self.name = name
        self.graph = graph
        self.env = env
        if graph:
            g, self.reference, self.static_out = env.make_graph(H, L, passes)
            eager, self.cuda_graph = None, g
            self.batch = gc.Batch(gc.ForwardMode.DECODE, 1)
            self.ms = env.step_ms(g.replay)
        else:
            eager, self.cuda_graph = env.make_eager(H, L, passes, bs=3), None
            self.batch = gc.Batch(gc.ForwardMode.TARGET_VERIFY, 3)
            self.ms = env.step_ms(eager)
        self._eager = eager
        tag = lambda v: f"{name}_{v}"  # noqa: E731
        self.tags = {v: tag(v) for v in ("untimed", "probe", "probe_hot", "sync", "probe_cpu_timer",
                                         "events_only", "probe_hot_2ev", "wrapt_passthrough",
                                         "plain_passthrough")}
        self.sched = {v: gc.make_variant(t, eager, self.cuda_graph) for v, t in self.tags.items()}
        self.probe = gc.make_probe(self.tags["probe"], {**rcv.env(), "SGL_PROBE_TIMER": "auto"})
        self.probe_hot = gc.make_probe(self.tags["probe_hot"], {"SGL_PROBE_DRAIN_S": "1000000",
                                                                "SGL_PROBE_SUMMARY_S": "0"})
        # Diagnostics: the hot path with a start event on every phase (host-clock starts off), the
        # probe's Python alone (cpu timer), and two bare event records alone.
        self.probe_2ev = gc.make_probe(self.tags["probe_hot_2ev"], {"SGL_PROBE_DRAIN_S": "1000000",
                                                                    "SGL_PROBE_SUMMARY_S": "0"})
        self.probe_cpu = gc.make_probe(self.tags["probe_cpu_timer"], {"SGL_PROBE_DRAIN_S": "1000000",
                                                                      "SGL_PROBE_SUMMARY_S": "0",
                                                                      "SGL_PROBE_TIMER": "cpu"})
        import wrapt

        self.sync_ms: list = []
        wrapt.wrap_function_wrapper(getattr(gc, "Worker_" + self.tags["sync"]), "forward_batch_generation",
                                    sync_timer_wrapper(env, self.sync_ms))
        if env.cuda:
            wrapt.wrap_function_wrapper(getattr(gc, "Worker_" + self.tags["events_only"]),
                                        "forward_batch_generation", events_only_wrapper(env))
        # Diagnostics: what the wrapping alone costs on this loop (step, phase, graph and accept
        # methods, the probe's four hot roles), through wrapt and through plain functions.
        for variant, wrap in (("wrapt_passthrough", _wrapt_passthrough), ("plain_passthrough", _plain_passthrough)):
            for cls_name, meth in (("Scheduler_", "run_batch"), ("Worker_", "forward_batch_generation"),
                                   ("GraphRunner_", "replay"), ("Metrics_", "update_spec_metrics")):
                wrap(getattr(gc, cls_name + self.tags[variant]), meth)
        # Schedulers are built after instrumenting, so the identity hook sees them, as in SGLang.
        self.s = {v: cls(None, tp_rank=0) for v, cls in self.sched.items()}
        self.steps_run = {v: 0 for v in self.s}
        self.settle_cpu: list = []  # process CPU seconds the full probe still spent after each block

    def block(self, variant: str, n: int, cpu_us: float) -> float:
        env = self.env
        f = self.s[variant].run_batch
        b = self.batch
        if variant == "probe_hot_2ev" and self.probe_2ev.recorder.timer is not None:
            self.probe_2ev.recorder.timer.host_starts = False  # the timer is made at the first step
        env.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            f(b)
            gc.spin_us(cpu_us)
        env.sync()
        dt = time.perf_counter() - t0
        self.steps_run[variant] += n
        if variant == "probe_hot":
            self.probe_hot.pipeline.drain()  # outside the timed region: hot path only
        elif variant == "probe_cpu_timer":
            self.probe_cpu.pipeline.drain()
        elif variant == "probe_hot_2ev":
            self.probe_2ev.pipeline.drain()
        elif variant == "probe":
            # Finish this block's export work now, so none of it lands in another variant's block,
            # and charge the process CPU it took (drain + span building + OTLP encoding; the wait
            # for the receiver is not CPU) to this block: the conservative reading, as if every
            # microsecond of it had been taken from the scheduler thread.
            c0 = time.process_time()
            self.probe.pipeline.flush()
            self.settle_cpu.append(time.process_time() - c0)
        return dt

    def close(self) -> None:
        for p in (self.probe, self.probe_hot, self.probe_cpu, self.probe_2ev):
            p.pipeline.flush()
            p.instrumentor.uninstrument()
            p.pipeline.shutdown()


ALL_VARIANTS = ("untimed", "probe", "probe_hot", "sync")


def section_loops(env: Env, rcv: gc.ReceiverProcess, shapes: dict, budget_s: float, cpu_us: float,
                  variants=ALL_VARIANTS, max_rounds: int = 150) -> dict:
    out = {}
    variants = list(variants)
    for name, spec in shapes.items():
        t_start = time.perf_counter()
        sh = Shape(env, name, spec, rcv)
        # ~2 ms steps: 20-step blocks; longer steps: fewer steps per block, fewer rounds.
        n = max(2, min(20, int(round(40.0 / max(sh.ms, 0.01)))))
        per_round_s = len(variants) * n * (sh.ms + cpu_us / 1e3) / 1e3 * 1.1
        rounds = int(max(20, min(max_rounds, budget_s / max(per_round_s, 1e-6))))
        if env.smoke:
            rounds, n = 12, 5
        for v in variants:  # warm-up, also creates the probe's first events and anchor
            sh.block(v, n, cpu_us)
        times = {v: [] for v in variants}
        for i in range(rounds):
            for v in gc.rotation(variants, i):
                times[v].append(sh.block(v, n, cpu_us))
        if "probe" in times:  # settle_cpu[0] belongs to the warm-up block
            times["probe_charged"] = [w + c for w, c in zip(times["probe"], sh.settle_cpu[1:])]
        summary = gc.summarize_ratios(times, "untimed")
        out[name] = {
            "step_ms_events": sh.ms, "block_steps": n, "rounds": rounds, "cpu_us_per_step": cpu_us,
            "ratios_vs_untimed": summary,
            "untimed_block_s": {"median": statistics.median(times["untimed"]),
                                "min": min(times["untimed"]), "max": max(times["untimed"])},
            "sync_timer_step_ms_median": statistics.median(sh.sync_ms) if sh.sync_ms else None,
            "probe_settle_cpu_us_per_step_median": statistics.median(sh.settle_cpu[1:]) / n * 1e6
            if len(sh.settle_cpu) > 1 else None,
            "steps_run": dict(sh.steps_run), "wall_s": None,
        }
        sh.close()
        out[name]["wall_s"] = time.perf_counter() - t_start
        out[name]["probe_tag"] = sh.tags["probe"]
        log("%-24s step %.3f ms  %s  (%d rounds x %d steps)" % (name, sh.ms, "  ".join(
            "%s %.4f [%.4f, %.4f]" % (v, x["median_ratio"], *x["ci95"]) for v, x in summary.items()), rounds, n))
        RESULTS.setdefault("_shapes", {})[name] = sh
    return out


# -- accuracy --------------------------------------------------------------------------------------

def _kernel_events(trace_path: str) -> list[tuple[float, float]]:
    with open(trace_path, encoding="utf-8") as fh:
        data = json.load(fh)
    evs = []
    for e in data.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            evs.append((float(e["ts"]), float(e["dur"])))
    evs.sort()
    return evs


def section_accuracy(env: Env, rcv: gc.ReceiverProcess, names: list, cpu_us: float) -> dict:
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name in names:
        sh = RESULTS["_shapes"][name]
        # Re-instrument a fresh probe: the loop's probe was shut down after its section.
        tag = sh.tags["probe"] + "_acc"
        cls = gc.make_variant(tag, sh._eager, sh.cuda_graph)
        probe = gc.make_probe(tag, rcv.env())
        s = cls(None, tp_rank=0)
        S = 20 if sh.ms < 5 else 8
        for _ in range(3):
            s.run_batch(sh.batch)
        env.sync()
        first = probe.recorder.step_count + 1
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(S):
                s.run_batch(sh.batch)
                gc.spin_us(cpu_us)
            env.sync()
        last = probe.recorder.step_count
        probe.pipeline.flush()
        trace = os.path.join(tempfile.gettempdir(), "acc_%s.json" % name)
        prof.export_chrome_trace(trace)
        kev = _kernel_events(trace)
        spans = [x for x in rcv.spans() if x["name"] != "sglang.step" and x["attributes"].get("sgl_probe.target", "").endswith(
            "Worker_%s.forward_batch_generation" % tag) and first <= x["attributes"]["sglang.step_index"] <= last]
        spans.sort(key=lambda x: x["attributes"]["sglang.step_index"])
        probe_ms = [x["attributes"]["sgl_probe.duration_ms"] for x in spans]
        res = {"steps": S, "spans": len(spans), "kernels": len(kev)}
        if probe_ms and kev:
            ksum_total = sum(d for _, d in kev) / 1e3
            res["probe_ms_mean"] = sum(probe_ms) / len(probe_ms)
            res["kernel_sum_ms_mean"] = ksum_total / S
            res["probe_over_kernel_sum"] = res["probe_ms_mean"] / res["kernel_sum_ms_mean"]
            if len(kev) % S == 0 and len(probe_ms) == S:
                k = len(kev) // S
                env_ms, ks_ms = [], []
                for i in range(S):
                    chunk = kev[i * k:(i + 1) * k]
                    ks_ms.append(sum(d for _, d in chunk) / 1e3)
                    env_ms.append((chunk[-1][0] + chunk[-1][1] - chunk[0][0]) / 1e3)
                res["kernels_per_step"] = k
                res["per_step_probe_over_kernel_sum"] = [p / q for p, q in zip(probe_ms, ks_ms)]
                res["per_step_probe_over_envelope"] = [p / q for p, q in zip(probe_ms, env_ms)]
                res["probe_over_envelope_median"] = statistics.median(res["per_step_probe_over_envelope"])
                res["probe_over_kernel_sum_median"] = statistics.median(res["per_step_probe_over_kernel_sum"])
                res["envelope_ms_mean"] = sum(env_ms) / S
        out[name] = res
        probe.instrumentor.uninstrument()
        probe.pipeline.shutdown()
        log("accuracy %-24s %s" % (name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()
                                         if not isinstance(v, list)}))
    return out


# -- graph flag and export completeness --------------------------------------------------------------

def section_graphflag(rcv: gc.ReceiverProcess, loops: dict) -> dict:
    spans = rcv.spans()
    out = {}
    for name, info in loops.items():
        tag = info["probe_tag"]
        phases = [x for x in spans if x["name"] != "sglang.step" and
                  x["attributes"].get("sgl_probe.target", "").endswith("Worker_%s.forward_batch_generation" % tag)]
        graph_true = sum(1 for x in phases if x["attributes"].get("sglang.cuda_graph") is True)
        expect_graph = name.startswith("graph")
        out[name] = {
            "phase_spans": len(phases), "steps_run_with_probe": info["steps_run"]["probe"],
            "phase_names": sorted({x["name"] for x in phases}),
            "cuda_graph_true": graph_true, "cuda_graph_false": len(phases) - graph_true,
            "flag_correct_on_every_span": (graph_true == len(phases)) if expect_graph else (graph_true == 0),
            "all_steps_exported": len(phases) == info["steps_run"]["probe"],
        }
    return out


# -- no host sync -------------------------------------------------------------------------------------

class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record) -> None:
        self.records.append(record.getMessage())


class _SyncSpy:
    """Counts every Python-visible host-sync entry point, from any thread, while installed."""

    def __init__(self, t) -> None:
        import threading

        self.t, self.calls, self._saved, self._lock = t, [], [], threading.Lock()
        targets = [(t.cuda, "synchronize"), (t._C, "_cuda_synchronize"), (t.cuda.Event, "synchronize"),
                   (t.cuda.Event, "wait"), (t.cuda.Stream, "synchronize"), (t.cuda.Stream, "wait_event"),
                   (t.cuda.Stream, "wait_stream")]
        for owner, name in targets:
            orig = getattr(owner, name, None)
            if orig is None:
                continue
            self._saved.append((owner, name, orig))
            setattr(owner, name, self._spy(name, orig))

    def _spy(self, name, orig):
        import threading

        def spy(*a, **k):
            with self._lock:
                self.calls.append((name, threading.current_thread().name))
            return orig(*a, **k)
        return spy

    def remove(self) -> None:
        for owner, name, orig in self._saved:
            setattr(owner, name, orig)


def section_syncdebug(env: Env, rcv: gc.ReceiverProcess, cpu_us: float, steps: int) -> dict:
    """No host sync, three ways: (1) torch's sync debug mode set to "error" for a probed loop (its
    drain thread resolving and exporting meanwhile), with a positive control proving the detector
    is live; (2) spies on every Python-level synchronize/wait entry point, from any thread;
    (3) the host runs ahead: a probed step queues ~1 s of GPU work and returns at once, more
    probed steps follow, and the drain thread keeps polling (query() == False) while the GPU is
    still busy, so nothing in the probe, on any thread, waited for the GPU."""
    t = env.torch
    sh = RESULTS["_shapes"]["eager_launchbound_2ms"]
    tag = "syncdbg"
    cls = gc.make_variant(tag, sh._eager, None)
    probe = gc.make_probe(tag, {**rcv.env(), "SGL_PROBE_DRAIN_S": "0.05"})
    handler = _Collect()
    logging.getLogger("sgl_probe").addHandler(handler)
    s = cls(None, tp_rank=0)
    batch = gc.Batch(gc.ForwardMode.TARGET_VERIFY, 3)
    for _ in range(5):
        s.run_batch(batch)
    env.sync()
    probe.pipeline.flush()
    first = probe.recorder.step_count + 1
    res: dict = {"steps": steps}
    # (1) + (2)
    spy = _SyncSpy(t)
    error = None
    t.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            s.run_batch(batch)
            gc.spin_us(cpu_us)
        time.sleep(0.5)  # the drain thread resolves (query/elapsed_time) inside the error window
    except Exception as exc:
        error = repr(exc)
    finally:
        t.cuda.set_sync_debug_mode(0)
        spy.remove()
    res["probe_loop_error"] = error
    res["sync_calls_seen_by_spies"] = spy.calls[:20]
    # Positive controls: the detector is live (a D2H copy is caught); whether it also sees
    # torch.cuda.synchronize() is recorded, not assumed (it is a prototype feature).
    x = t.ones(4, device="cuda")
    for name, fn in (("item", lambda: x.sum().item()), ("cuda_synchronize", t.cuda.synchronize)):
        t.cuda.set_sync_debug_mode("error")
        try:
            fn()
            res["detector_caught_" + name] = False
        except Exception as exc:
            res["detector_caught_" + name] = True
            res["detector_message_" + name] = str(exc)[:160]
        finally:
            t.cuda.set_sync_debug_mode(0)
    env.sync()
    probe.pipeline.flush()
    last = probe.recorder.step_count
    got = [x for x in rcv.spans() if x["name"] == "sglang.verify" and
           x["attributes"].get("sgl_probe.target", "").endswith("Worker_%s.forward_batch_generation" % tag)
           and first <= x["attributes"]["sglang.step_index"] <= last]
    res["verify_spans_exported"] = len(got)
    res["probe_log_lines_during_run"] = handler.records[:20]
    logging.getLogger("sgl_probe").removeHandler(handler)
    # (3) the host runs ahead of a busy GPU with the probe on
    # Few, long kernels: ~1 s of GPU work in well under the launch queue's depth, so the host
    # is never held back by a full queue (that is backpressure, not a sync).
    a = t.randn(16384, 16384, device="cuda", dtype=t.bfloat16)
    bm = t.randn(16384, 16384, device="cuda", dtype=t.bfloat16)
    per = env.step_ms(lambda: a @ bm, n=5)
    reps = max(1, int(1000.0 / max(per, 1e-3)))

    def long_work():
        for _ in range(reps):
            a @ bm

    cls_long = gc.make_variant(tag + "_long", long_work, None)
    p_long = gc.make_probe(tag + "_long", {"SGL_PROBE_DRAIN_S": "0.02", "SGL_PROBE_SUMMARY_S": "0"})
    s_long = cls_long(None, tp_rank=0)
    s_long.run_batch(gc.Batch(gc.ForwardMode.EXTEND, 1, extend_tokens=1))  # timer + warm-up
    env.sync()
    time.sleep(0.1)
    timer = p_long.recorder.timer
    polls = []
    real_ready = timer.ready

    def counting_ready(start, end):
        r = real_ready(start, end)
        polls.append((time.perf_counter(), r))
        return r

    timer.ready = counting_ready
    marker = t.cuda.Event()
    h0 = time.perf_counter()
    s_long.run_batch(gc.Batch(gc.ForwardMode.EXTEND, 1, extend_tokens=1))  # queues ~1 s of GPU work
    h1 = time.perf_counter()
    for _ in range(10):
        s_long.run_batch(gc.Batch(gc.ForwardMode.DECODE, 1))  # probed steps behind it (no GPU work)
    marker.record()
    time.sleep(0.3)
    h2 = time.perf_counter()
    busy_after = not marker.query()
    polls_busy = [r for (ts, r) in polls if h1 <= ts <= h2]
    env.sync()
    timer.ready = real_ready
    res["host_ahead"] = {
        "gpu_work_ms_queued": per * reps, "probed_call_host_ms": (h1 - h0) * 1e3,
        "gpu_still_busy_after_s": round(h2 - h0, 3), "gpu_was_still_busy": busy_after,
        "drain_polls_while_busy": len(polls_busy), "drain_poll_results_while_busy": sorted({str(r) for r in polls_busy}),
    }
    p_long.instrumentor.uninstrument()
    p_long.pipeline.shutdown()
    ha = res["host_ahead"]
    # The host finished the probed steps (and slept) while the GPU was still busy: nothing on the
    # main thread waited for it; the drain thread kept returning from query() == False meanwhile.
    res["no_host_sync"] = (error is None and len(got) == steps and not handler.records and not spy.calls
                           and res["detector_caught_item"] is True and ha["gpu_was_still_busy"]
                           and ha["drain_polls_while_busy"] >= 3 and ha["drain_poll_results_while_busy"] == ["False"])
    probe.instrumentor.uninstrument()
    probe.pipeline.shutdown()
    log("syncdebug %s" % {k: v for k, v in res.items() if k != "probe_log_lines_during_run"})
    return res


# -- capture safety (child processes) -------------------------------------------------------------------

def section_capture(timeout_s: float) -> dict:
    out = {}
    script = os.path.join(gc.HERE, "gpu_capture_check.py")
    for case in ("phase_in_capture", "timing_event_in_capture_control", "drain_during_capture",
                 "drain_during_capture_unrelaxed_control"):
        try:
            p = subprocess.run([sys.executable, script, case], capture_output=True, text=True, timeout=timeout_s)
            line = [x for x in p.stdout.splitlines() if x.startswith("{")]
            out[case] = json.loads(line[-1]) if line else {"rc": p.returncode, "stderr_tail": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            out[case] = {"error": "timeout"}
        log("capture %s: %s" % (case, out[case]))
    return out


# -- main ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script's logic")
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.gettempdir())
    ap.add_argument("--loop-budget-s", type=float, default=28.0, help="target seconds per loop shape")
    ap.add_argument("--only", default="", help="comma-separated sections to run")
    ap.add_argument("--shapes", default="", help="comma-separated loop shapes (default: all)")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS), help="loop variants; untimed is the base")
    ap.add_argument("--max-rounds", type=int, default=150)
    args = ap.parse_args()
    env = Env(args.smoke)
    t = env.torch
    RESULTS["meta"] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "versions": gc.versions(), "cuda": env.cuda, "smoke": env.smoke,
        "device": t.cuda.get_device_name(0) if env.cuda else "cpu",
        "cuda_runtime": getattr(t.version, "cuda", None),
        "nccl": ".".join(map(str, t.cuda.nccl.version())) if env.cuda else None,
        "cpu_count": os.cpu_count(),
    }
    log("meta %s" % RESULTS["meta"])
    only = set(filter(None, args.only.split(",")))
    want = lambda s: not only or s in only  # noqa: E731
    path = os.path.join(args.out, "gpu_bench.json")
    spans_path = os.path.join(tempfile.gettempdir(), "gpu_bench_spans_%d.jsonl" % os.getpid())
    rcv = gc.ReceiverProcess(spans_path)
    cpu_us = 300.0

    def save() -> None:
        with open(path, "w") as fh:
            json.dump({k: v for k, v in RESULTS.items() if not k.startswith("_")}, fh, indent=1, default=str)

    def run(name, fn, *a):
        t0 = time.perf_counter()
        try:
            RESULTS[name] = fn(*a)
        except Exception:
            RESULTS[name] = {"error": traceback.format_exc()[-3000:]}
            log("%s FAILED:\n%s" % (name, RESULTS[name]["error"]))
        RESULTS.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 1)
        save()

    try:
        if want("percall"):
            run("percall", section_percall, env, 5 if env.smoke else 31, 200 if env.smoke else 2000, rcv.env())
            pc = RESULTS["percall"]
            log("percall %s" % {k: v for k, v in pc.items() if k != "us_per_call_all"})
        shapes = SMOKE_SHAPES if env.smoke else SHAPES
        if args.shapes:
            shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
        if want("loops"):
            run("loops", section_loops, env, rcv, shapes, args.loop_budget_s, cpu_us,
                args.variants.split(","), args.max_rounds)
        if want("graphflag") and isinstance(RESULTS.get("loops"), dict) and "error" not in RESULTS["loops"]:
            run("graphflag", section_graphflag, rcv, RESULTS["loops"])
            log("graphflag %s" % RESULTS["graphflag"])
        if env.cuda and want("accuracy") and RESULTS.get("_shapes"):
            run("accuracy", section_accuracy, env, rcv, list(RESULTS["_shapes"]), cpu_us)
        if env.cuda and want("syncdebug") and RESULTS.get("_shapes"):
            run("syncdebug", section_syncdebug, env, rcv, cpu_us, 300)
        if env.cuda and want("capture"):
            run("capture", section_capture, 180)
        if not env.cuda:
            RESULTS["skipped"] = ["accuracy", "syncdebug", "capture", "graph shapes: no CUDA"]
    finally:
        rcv.close()
        save()
    print_table(RESULTS)


def print_table(r: dict) -> None:
    print("\n=== gpu_bench summary ===")
    pc = r.get("percall", {})
    if "probe_added_vs_two_bare_records" in pc:
        x = pc["probe_added_vs_two_bare_records"]
        m = pc["us_per_call_median"]
        print("per call: probe adds %.2f us; two bare records %.2f us; ratio %.3f [%.3f, %.3f] (target <= 1.2)" % (
            pc["probe_added_us_median"], m["two_bare_records"], x["median_ratio"], *x["ci95"]))
    oh = pc.get("off_hot_path") or {}
    if oh:
        print("off the hot path, per step: drain %.1f us CPU, drain+OTLP export %.1f us CPU" % (
            oh.get("drain_cpu_us_per_step", float("nan")), oh.get("drain_and_export_cpu_us_per_step", float("nan"))))
    for name, x in (r.get("loops") or {}).items():
        if not isinstance(x, dict) or "ratios_vs_untimed" not in x:
            continue
        rv = x["ratios_vs_untimed"]
        target = 1.005 if name.startswith("graph") else 1.01
        labels = {"probe_hot": "hot path", "probe": "full export in-block", "probe_charged": "all CPU charged",
                  "sync": "synchronize() timer"}
        # Only the probe as deployed is judged against the target; the rest are diagnostics.
        judged = ("probe", "probe_hot", "probe_charged")
        print("%-24s %6.2f ms  %s" % (name, x["step_ms_events"], " | ".join(
            "%s %.4f [%.4f, %.4f]%s" % (labels.get(k, k), v["median_ratio"], *v["ci95"],
                                        "" if k not in judged else (" met" if v["ci95"][1] <= target else " MISSED"))
            for k, v in rv.items())))
    for name, x in (r.get("accuracy") or {}).items():
        if isinstance(x, dict) and "probe_over_kernel_sum" in x:
            print("accuracy %-24s per-step median: probe/kernel-sum %s, probe/envelope %s; means: probe %.3f ms, "
                  "kernel sum %.3f ms" % (
                      name, "%.4f" % x["probe_over_kernel_sum_median"] if "probe_over_kernel_sum_median" in x else "-",
                      "%.4f" % x["probe_over_envelope_median"] if "probe_over_envelope_median" in x else "-",
                      x["probe_ms_mean"], x["kernel_sum_ms_mean"]))


if __name__ == "__main__":
    main()
