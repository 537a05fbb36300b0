"""CPU cost of the metrics path per resolved step, in-process, side by side.

Feeds the same resolved steps (a plain decode, a prefill, and a speculative step with draft,
verify and draft-extend phases) to: nothing (a no-op call: the pipeline without metrics), and
``PhaseMetrics`` with the Prometheus sink in multiprocess mode (what SGLang's
--enable-metrics turns on), the OTLP sink (exporting to a local receiver every second, on its
thread in this process), and both; sinks get snapshots once a second, as in the server. For
reference, the two designs not taken: prometheus_client ``observe()`` / ``inc()`` per phase into
the multiprocess files, and the OpenTelemetry SDK's instruments (``record()`` / ``add()``) per
phase. ``prometheus, C loop``: the Prometheus variant with the C extension's ``metrics_add`` doing
``observe_rows``'s loop (as the probe does with its C hot path; the other variants run the Python
loop), and its paired ratio over the no-op with the Python loop's. Rounds alternate between the variants; prints the median CPU microseconds per step (this
thread's CPU time, so other processes on a busy machine do not count) and the difference to the
no-op.

Every variant is fed as the drain feeds the metrics: rows (plain tuples, as the C drain makes
them) in chunks of ``sgl_probe.export.CHUNK`` (``PhaseMetrics.observe_rows``); the designs not
taken get a ResolvedStep made of each row, as they would need. ``ref: a named copy per step``
is the feed before ``observe_rows`` (each row made a ResolvedStep and observed on its own, into
the Prometheus sink); its paired ratio with ``prometheus`` is printed last.

    python3 benchmarks/metrics_overhead.py [--rounds 30] [--steps 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# prometheus_client picks multiprocess mode at import: the directory must exist first.
_MULTIPROC = tempfile.mkdtemp(prefix="sgl-probe-bench-prom-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _MULTIPROC
os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from sgl_probe import export, hotpath, metrics, metrics_otlp, metrics_prom  # noqa: E402
from sgl_probe.resolved import ResolvedPhase, ResolvedStep, from_row, to_row  # noqa: E402
from sgl_probe.testing.receiver import OTLPReceiver  # noqa: E402
from gpu_common import median_ci  # noqa: E402

RANKS = {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0}


def workload() -> list[ResolvedStep]:
    def ph(name, us, graph, mode, accept=None):
        return ResolvedPhase(name, 0, us * 1000, graph, mode, 8, 8, 0.05, "t", accept)

    decode = ResolvedStep(0, 0, 1, "DECODE", 8, 8, 0.1, "cuda", (ph("decode", 4000, True, "DECODE"),))
    extend = ResolvedStep(1, 0, 1, "EXTEND", 2, 512, 0.1, "cuda", (ph("extend", 20000, False, "EXTEND"),))
    spec = ResolvedStep(2, 0, 1, "TARGET_VERIFY", 8, 32, 0.1, "cuda", (
        ph("draft", 1500, True, "DRAFT_EXTEND"), ph("verify", 6000, False, "TARGET_VERIFY", 2.5),
        ph("draft_extend", 1200, True, "DRAFT_EXTEND")))
    # Mostly decode, as a serving scheduler is; one spec step in four.
    return [decode, decode, extend, spec] * 8


class PerStep:
    """Rows fed to something that takes one named step at a time."""

    def observe_rows(self, rows) -> None:
        for row in rows:
            self.observe_step(from_row(row))


class PerPhasePrometheus(PerStep):
    """The design not taken: prometheus_client called per phase (children bound once)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        from sgl_probe.contract import PHASE_LABELS, PHASE_SECONDS_BUCKETS, RANK_LABELS

        self.h = Histogram("bench_phase_seconds", "x", PHASE_LABELS, buckets=PHASE_SECONDS_BUCKETS, registry=None)
        self.c = Counter("bench_steps", "x", ("forward_mode",) + RANK_LABELS, registry=None)
        self.ranks = metrics.rank_labels({**RANKS, "tp_rank": 3})
        self.bound: dict = {}

    def observe_step(self, st: ResolvedStep) -> None:
        c = self.bound.get(st.mode) or self.bound.setdefault(
            st.mode, self.c.labels(forward_mode=st.mode, **self.ranks))
        c.inc()
        for ph in st.phases:
            key = (ph.phase, ph.mode, ph.graph)
            h = self.bound.get(key) or self.bound.setdefault(key, self.h.labels(
                phase=ph.phase, forward_mode=ph.mode, cuda_graph=str(ph.graph).lower(), **self.ranks))
            h.observe((ph.end_ns - ph.start_ns) / 1e9)


class PerPhaseOtelSdk(PerStep):
    """The design not taken: the OpenTelemetry SDK's instruments per phase (no export)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider

        meter = MeterProvider(shutdown_on_exit=False).get_meter("bench")
        self.h = meter.create_histogram("bench_phase_seconds", unit="s")
        self.c = meter.create_counter("bench_steps")
        self.ranks = metrics.rank_labels(RANKS)
        self.attrs: dict = {}

    def observe_step(self, st: ResolvedStep) -> None:
        a = self.attrs.get(st.mode) or self.attrs.setdefault(st.mode, {"forward_mode": st.mode, **self.ranks})
        self.c.add(1, a)
        for ph in st.phases:
            key = (ph.phase, ph.mode, ph.graph)
            a = self.attrs.get(key) or self.attrs.setdefault(key, {
                "phase": ph.phase, "forward_mode": ph.mode, "cuda_graph": str(ph.graph).lower(), **self.ranks})
            self.h.record((ph.end_ns - ph.start_ns) / 1e9, a)


class NoMetrics:
    def observe_rows(self, rows) -> None:
        pass


class NamedCopyFeed(PerStep):
    """The feed before ``observe_rows``: a ResolvedStep made of each row, observed on its own."""

    def __init__(self, m: metrics.PhaseMetrics) -> None:
        self.m = m
        self.observe_step = m.observe_step


def time_round(m, steps: list, n: int) -> float:
    k = len(steps)
    rows = [to_row(steps[i % k]) for i in range(n)]
    feed, chunk = m.observe_rows, export.CHUNK
    # This thread's CPU time: on a shared machine, wall time also counts the time others ran.
    t0 = time.thread_time_ns()
    for i in range(0, n, chunk):
        feed(rows[i:i + chunk])
    return (time.thread_time_ns() - t0) / n / 1000.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    steps = workload()
    hot = hotpath.load()  # the C extension's metrics_add (None: no compiled hot path here)
    if hot is None:
        raise SystemExit("metrics_overhead: no C extension (pip install builds it where a compiler is found)")
    with OTLPReceiver() as receiver:
        for key, value in receiver.env("grpc", signals=("metrics",)).items():
            os.environ[key] = value
        prom = metrics_prom.from_env(os.environ)
        otlp = metrics_otlp.from_env(os.environ)
        assert prom is not None and otlp is not None
        variants = {
            "no metrics": NoMetrics(),
            "prometheus": metrics.PhaseMetrics(RANKS, [prom]),
            "otlp": metrics.PhaseMetrics({**RANKS, "tp_rank": 1}, [otlp]),
            "both": metrics.PhaseMetrics({**RANKS, "tp_rank": 2}, [prom, otlp]),
            "prometheus, C loop": metrics.PhaseMetrics({**RANKS, "tp_rank": 5}, [prom], fast=hot),
            "ref: a named copy per step": NamedCopyFeed(metrics.PhaseMetrics({**RANKS, "tp_rank": 4}, [prom])),
            "ref: prometheus_client per phase": PerPhasePrometheus(),
            "ref: OTel SDK instruments per phase": PerPhaseOtelSdk(),
        }
        for m in variants.values():  # bind every label set before timing
            time_round(m, steps, len(steps))
        times: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order:
                times[name].append(time_round(variants[name], steps, args.steps))
        for m in variants.values():
            m = getattr(m, "m", m)
            if isinstance(m, metrics.PhaseMetrics):
                m.flush()
        otlp.shutdown(3)
        exported = len(receiver.metrics())
    base = statistics.median(times["no metrics"])
    phases = sum(len(s.phases) for s in steps) / len(steps)
    print(f"{args.rounds} rounds x {args.steps} steps ({phases:.2f} phases/step, 1 in 4 speculative); "
          f"OTLP points received: {exported}")
    print(f"{'variant':<36} {'CPU us/step (median)':>21} {'[min, max]':>18} {'minus no-op':>12}")
    result = {}
    for name, vals in times.items():
        med = statistics.median(vals)
        result[name] = {"median_us": med, "min_us": min(vals), "max_us": max(vals), "over_noop_us": med - base}
        print(f"{name:<36} {med:>21.2f} {f'[{min(vals):.2f}, {max(vals):.2f}]':>18} {med - base:>12.2f}")
    new, old = times["prometheus"], times["ref: a named copy per step"]
    feed = median_ci([a / b for a, b in zip(new, old)])
    print("prometheus / a named copy per step, paired: %.3f [%.3f, %.3f]" % (feed["median"], *feed["ci95"]))
    noop = times["no metrics"]
    c_loop = median_ci([(a - z) / (b - z) for a, b, z in zip(times["prometheus, C loop"], new, noop)])
    print("prometheus over the no-op, C loop / Python loop, paired: %.3f [%.3f, %.3f]" % (c_loop["median"], *c_loop["ci95"]))
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "steps": args.steps, "variants": result,
                                         "drain_feed_vs_named_copy": feed, "c_loop_vs_python_loop": c_loop}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
