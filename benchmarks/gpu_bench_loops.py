"""gpu_bench section loops: paired, interleaved step loops (untimed / probe / probe hot path /
synchronize() timer and diagnostics) per loop shape, with the wrappers the comparisons use."""

from __future__ import annotations

import statistics
import time
from typing import Optional

import gpu_common as gc
from gpu_bench_env import RESULTS, Env, log


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
        # Diagnostics: the hot path with a start event on every phase (``record_starts``), the
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
        # Per step, the host time from one step's return to the next's: on a graph loop that is
        # the launch call (the host runs ahead of the GPU inside a block), so also the GPU's
        # step time: between the completions of consecutive steps, from one benchmark event
        # recorded after every step in every variant (the same ~2 µs each, so the paired ratios
        # are unaffected), what a client waiting for each step sees. p99 on vs off of both.
        self.step_s: dict = {v: [] for v in self.s}
        self.gpu_step_s: dict = {v: [] for v in self.s}
        self._marks: list = []
        self.settle_cpu: list = []  # process CPU seconds the full probe still spent after each block

    def block(self, variant: str, n: int, cpu_us: float) -> float:
        env = self.env
        f = self.s[variant].run_batch
        b = self.batch
        timer = self.probe_2ev.recorder.timer  # made at the first step
        if variant == "probe_hot_2ev" and timer is not None and not getattr(timer, "start_events", True):
            timer.record_starts()
        perf = time.perf_counter
        stamps = [0.0] * (n + 1)
        marks = self._step_marks(n + 1)
        env.sync()
        t0 = stamps[0] = perf()
        if marks:
            marks[0].record()
        for i in range(1, n + 1):
            f(b)
            if marks:
                marks[i].record()
            gc.spin_us(cpu_us)
            stamps[i] = perf()
        env.sync()
        dt = time.perf_counter() - t0
        self.step_s[variant].extend(stamps[i] - stamps[i - 1] for i in range(1, n + 1))
        if marks:
            self.gpu_step_s[variant].extend(marks[i - 1].elapsed_time(marks[i]) / 1e3 for i in range(1, n + 1))
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

    def _step_marks(self, k: int) -> list:
        """``k`` timing events, reused block after block (the block ends in a sync); none without CUDA."""
        if not self.env.cuda:
            return []
        while len(self._marks) < k:
            self._marks.append(self.env.torch.cuda.Event(enable_timing=True))
        return self._marks[:k]

    def close(self) -> None:
        for p in (self.probe, self.probe_hot, self.probe_cpu, self.probe_2ev):
            p.pipeline.flush()
            p.instrumentor.uninstrument()
            p.pipeline.shutdown()


ALL_VARIANTS = ("untimed", "probe", "probe_hot", "sync")


def step_quantiles(step_s: list) -> Optional[list]:
    """[p50, p99] of per-step host times, in ms (None without steps)."""
    if not step_s:
        return None
    s = sorted(step_s)
    return [s[len(s) // 2] * 1e3, s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3]


def after_first(step_s: list, n: int) -> list:
    """Per-step times of blocks of ``n`` steps, without each block's first."""
    return [t for i, t in enumerate(step_s) if i % n]


def p99_ratio(on: list, off: list) -> Optional[float]:
    a, b = step_quantiles(on), step_quantiles(off)
    return a[1] / b[1] if a and b and b[1] > 0 else None


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
            sh.step_s[v].clear()
            sh.gpu_step_s[v].clear()
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
            "step_ms_p50_p99": {v: step_quantiles(sh.step_s[v]) for v in variants},
            "p99_step_ratio_vs_untimed": {v: p99_ratio(sh.step_s[v], sh.step_s["untimed"]) for v in variants
                                          if v != "untimed"} if "untimed" in variants else None,
            "gpu_step_ms_p50_p99": {v: step_quantiles(sh.gpu_step_s[v]) for v in variants},
            "p99_gpu_step_ratio_vs_untimed": {v: p99_ratio(sh.gpu_step_s[v], sh.gpu_step_s["untimed"])
                                              for v in variants if v != "untimed"}
            if "untimed" in variants and sh.gpu_step_s["untimed"] else None,
            # Without each block's first step, which starts from an idle GPU (the block before
            # ended in a sync) and so waits for whatever host work precedes its launch.
            "p99_gpu_step_ratio_vs_untimed_after_first": {
                v: p99_ratio(after_first(sh.gpu_step_s[v], n), after_first(sh.gpu_step_s["untimed"], n))
                for v in variants if v != "untimed"}
            if "untimed" in variants and sh.gpu_step_s["untimed"] else None,
        }
        sh.close()
        out[name]["wall_s"] = time.perf_counter() - t_start
        out[name]["probe_tag"] = sh.tags["probe"]
        log("%-24s step %.3f ms  %s  (%d rounds x %d steps)" % (name, sh.ms, "  ".join(
            "%s %.4f [%.4f, %.4f]" % (v, x["median_ratio"], *x["ci95"]) for v, x in summary.items()), rounds, n))
        RESULTS.setdefault("_shapes", {})[name] = sh
    return out
