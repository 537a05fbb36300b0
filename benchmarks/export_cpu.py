"""CPU the probe's export costs inside the server process: exporting in-process (spans built and
OTLP-encoded on the drain and BatchSpanProcessor threads of the server process) vs the exporter
process (the server process only resolves steps and sends them over a socket), in one run.

Each measured run is a fresh process driving the real probe (wrapped calls -> recorder -> drain ->
export) over a scheduler-shaped loop whose phase blocks like a GPU wait (``time.sleep``, the GIL
released), exporting every step over OTLP/gRPC to a real receiver on localhost in this process.
``in_process_cpu_us_per_step`` is that process's CPU time (all threads) over the measured steps,
including the loop's own cost (``off``: the same loop with no probe; ``no_export``: the probe with
nothing configured, summary line only); the exporter process's CPU is
``out_of_process_cpu_us_per_step``. Runs alternate between the designs; medians are printed with
the ratio, and each run's CPU per thread. ``sleep_overshoot_us`` is how late the loop's blocking
call returned (p50 / p99 / p99.9 / max): a thread of the same process holding the GIL makes the
scheduler thread wait for it (so does a busy CPU: the exporter process competes for the machine's
cores). ``drain_stretch_us`` is the probe's part of that alone: how long the drain thread ran
between two GIL hand-overs (p50 / p99 / max of the stretches).

    python3 benchmarks/export_cpu.py [--steps 3000] [--repeats 3] [--step-ms 1.0] [--trace-dir]
                                     [--busy-us 0] [--json FILE]

``--busy-us N``: each step also runs N µs of Python before its GPU wait, holding the GIL, as a
launch-bound scheduler thread does; ``loop_ratio_vs_off`` is then the loop's slowdown with the
probe, and ``scheduler_wait_us_per_step`` the loop thread's time off a CPU beyond its GPU wait
(on the real server that wait is the probe threads' GIL holds: run h200-10).

``--breakdown`` adds where the CPU goes per step, stage by stage (thread CPU time, same steps).

``--env NAME=VALUE`` (repeatable) sets a variable in every measured process: the benchmark runs
them without the ``OTEL_*`` and ``SGL_PROBE_*`` variables of its own environment, so that a
setting left in a shell does not change the result unnoticed.

``--compare REV`` measures this tree's probe against the probe of git revision ``REV`` (checked out
into a temporary directory, run by that revision's own copy of this script; ``--compare python``:
this tree with its Python hot path, ``SGL_PROBE_HOTPATH=python``), in one run: the
designs ``off``, ``no_export`` and ``out_of_process`` of both, in an order rotated every repeat.
It prints each one's probe share (its in-process CPU minus the ``off`` run of the same repeat,
median and bootstrap 95 % interval over repeats) and the per-repeat ratio new / base; with
``--breakdown``, both revisions' stages.

    python3 benchmarks/export_cpu.py --compare HEAD~3 --steps 3000 --repeats 7 --breakdown
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

DESIGNS = ("off", "no_export", "in_process", "out_of_process")
MODULE = "export_cpu_workload"


# -- the measured process -----------------------------------------------------------------------

def _workload(step_s: float, busy_s: float = 0.0):
    """The scheduler-shaped module (:mod:`sched_shape`) whose forward blocks like a GPU wait.
    ``busy_s``: Python work per step before the GPU wait, holding the GIL (a launch-bound
    scheduler thread, which wants the GIL nearly all the time)."""
    from sched_shape import install
    from tests.workload import Batch, ForwardMode

    sleep = time.sleep
    perf = time.perf_counter
    late: list = []

    def forward() -> None:
        if busy_s:
            until = perf() + busy_s
            while perf() < until:
                pass
        t0 = perf()
        sleep(step_s)  # the GPU wait: the GIL is released, as in SGLang's synchronize
        late.append(perf() - t0 - step_s)

    batch = Batch(ForwardMode.DECODE, 8)
    batch.seq_lens = _SeqLens((8,))  # what the readers see of SGLang's tensor: its shape
    return install(MODULE, forward), batch, late


class _SeqLens:
    """SGLang's ``seq_lens`` tensor as the probe reads it (``shape`` only, never the data)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape


def _table():
    from sched_shape import table

    return table(MODULE)


def _proc_cpu_s(pid: int, path: str = "") -> float:
    """utime + stime of a process (or, with ``path``, a thread), from /proc (0 when it is gone)."""
    try:
        with open(path or f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def _thread_cpu_s(t: threading.Thread) -> Optional[float]:
    """A Python thread's CPU seconds from its own clock (ns resolution; /proc counts in ticks of
    10 ms, more than a drain thread's work in a run); None where the platform has no such clock."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (AttributeError, OSError, TypeError):
        return None


def _threads_cpu_s() -> dict:
    """CPU seconds per thread of this process, keyed by Python thread name ("native" for the
    threads Python does not know, e.g. gRPC's)."""
    threads = {t.native_id: t for t in threading.enumerate()}
    out: dict = {}
    for tid in os.listdir("/proc/self/task"):
        t = threads.get(int(tid))
        cpu = _thread_cpu_s(t) if t is not None else None
        if cpu is None:
            cpu = _proc_cpu_s(int(tid), "/proc/self/task/%s/stat" % tid)
        name = t.name if t is not None else "native"
        name = "sgl-probe-drain" if name.startswith("sgl-probe-drain") else name
        if name.startswith("OtelBatch") or "BatchProcessor" in name:
            name = "batch-span-processor"
        out[name] = out.get(name, 0.0) + cpu
    return out


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Stretches:
    """Wall time of each stretch the drain thread runs between two GIL hand-overs (the probe's
    ``time.sleep`` in :mod:`sgl_probe.export`), from a pass's start to its first and from its
    last to the pass's end: what a scheduler thread back from its GPU wait may have to wait for,
    read without the machine's own wake-up noise that ``sleep_overshoot_us`` carries."""

    def __init__(self, pipe) -> None:
        from sgl_probe import export

        self.got: list = []
        self._mark = 0.0
        self._sleep = time.sleep
        export.time = self  # the module's other uses of ``time`` pass through (__getattr__)
        drain = pipe.drain

        def timed(final: bool = False):
            self._mark = time.perf_counter()
            try:
                return drain(final)
            finally:
                self.got.append(time.perf_counter() - self._mark)

        pipe.drain = timed

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, s: float) -> None:
        self.got.append(time.perf_counter() - self._mark)
        self._sleep(s)
        self._mark = time.perf_counter()

    def summary(self) -> dict:
        got = sorted(self.got)
        if not got:
            return {"n": 0}
        return {"n": len(got), "p50": got[len(got) // 2] * 1e6, "p99": got[int(len(got) * 0.99)] * 1e6,
                "max": got[-1] * 1e6}


def worker(design: str, steps: int, step_ms: float, busy_us: float = 0.0) -> dict:
    Scheduler, batch, late = _workload(step_ms / 1000.0, busy_us / 1e6)
    probe = None
    if design != "off":
        from sgl_probe import config
        from sgl_probe.activate import Probe
        from sgl_probe.export import Pipeline

        probe = Probe(config.load(), targets=_table())
        probe.instrumentor.instrument()
        if design == "in_process":  # the server-process export, as it was before the exporter process
            probe.pipeline = Pipeline(probe.recorder, probe.cfg, probe.run_id, probe.ident, probe.version,
                                      in_process=True)
            probe.pipeline.start()
    sched = Scheduler(None, tp_rank=0)
    for _ in range(200):  # warm-up: first connection, exporter process started and importing
        sched.run_batch(batch)
    if probe is not None:
        probe.pipeline.flush(60.0)
    for t in threading.enumerate():  # one-off startup work (the run fingerprint) is not per step
        if t.name == "sgl-probe-fingerprint":
            t.join(60.0)
    exporter_pid = getattr(getattr(probe.pipeline.sink, "proc", None), "pid", None) if probe else None
    stretches = _Stretches(probe.pipeline) if probe is not None else None
    del late[:]
    th0 = _threads_cpu_s()
    c0, x0, t0 = _self_cpu_s(), _proc_cpu_s(exporter_pid) if exporter_pid else 0.0, time.perf_counter()
    m0 = time.thread_time()
    for _ in range(steps):
        sched.run_batch(batch)
    loop_s, main_cpu_s = time.perf_counter() - t0, time.thread_time() - m0
    if probe is not None:
        probe.pipeline.flush(120.0)  # what the measured steps cost, up to their export
    c1, x1, t1 = _self_cpu_s(), _proc_cpu_s(exporter_pid) if exporter_pid else 0.0, time.perf_counter()
    th1 = _threads_cpu_s()
    out = {"design": design, "steps": steps, "wall_s": t1 - t0,
           "hotpath": probe.recorder.hotpath if probe is not None else None,
           "in_process_cpu_us_per_step": (c1 - c0) / steps * 1e6,
           "out_of_process_cpu_us_per_step": (x1 - x0) / steps * 1e6,
           # The loop alone, before the final flush: with --busy-us, what the scheduler thread
           # loses to the probe's threads (its GIL waits) shows as wall it did not spend on a CPU.
           "loop_us_per_step": loop_s / steps * 1e6, "main_thread_cpu_us_per_step": main_cpu_s / steps * 1e6}
    out["threads_cpu_us_per_step"] = {name: (cpu - th0.get(name, 0.0)) / steps * 1e6 for name, cpu in th1.items()}
    late.sort()
    out["sleep_overshoot_us"] = {"p50": late[len(late) // 2] * 1e6, "p99": late[int(len(late) * 0.99)] * 1e6,
                                 "p999": late[int(len(late) * 0.999)] * 1e6, "max": late[-1] * 1e6}
    if probe is not None:
        pipe = probe.pipeline
        sink = pipe.sink
        out["sent"] = 0 if sink is None else sink.sent if design == "out_of_process" else sink.spans.exported
        out["dropped"] = pipe.export_dropped + probe.recorder.dropped_steps
        out["run_id"] = probe.run_id
        out["drain_stretch_us"] = stretches.summary()
        pipe.shutdown(30.0)
    return out


# -- stage by stage -----------------------------------------------------------------------------

def breakdown(steps: int) -> dict:
    """Thread CPU per step of each stage, over the same recorded steps (no export threads)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from gpu_common import drain_stage_ns
    from sgl_probe import config, otlp_json, spans as spans_mod
    from sgl_probe.activate import Probe
    from sgl_probe.resolved import from_row
    from sgl_probe.sinks import make_resource

    os.environ.update({"SGL_PROBE_DRAIN_S": "100000", "SGL_PROBE_MAX_PENDING": str(steps + 10),
                       "SGL_PROBE_SUMMARY_S": "30"})
    Scheduler, batch, _ = _workload(0.0)
    tt = time.thread_time
    sched = Scheduler(None, tp_rank=0)
    t0 = tt()
    for _ in range(steps):
        sched.run_batch(batch)
    bare = tt() - t0
    probe = Probe(config.load(), targets=_table())
    probe.instrumentor.instrument()
    sched = Scheduler(None, tp_rank=0)
    probe.recorder.steps.clear()
    t0 = tt()
    for _ in range(steps):
        sched.run_batch(batch)
    wrapped = tt() - t0
    rec, pipe = probe.recorder, probe.pipeline
    out = {"hot_path": (wrapped - bare)}
    stage, rows, _ = drain_stage_ns(pipe, rec)  # what the drain thread does per step, in its chunks
    out.update(resolve=stage["resolve"] / 1e9, summary_and_observers=stage["summary"] / 1e9,
               pickle_for_the_link=stage["pickle"] / 1e9)
    res = make_resource({"tp_rank": 0}, "bench", None)
    resolved = [from_row(row) for row in rows]  # what the exporter process does first
    t0 = tt()
    built = [s for step in resolved for s in spans_mod.build_step_spans(step, "bench", {"tp_rank": 0}, {}, res)]
    out["build_spans"] = tt() - t0
    t0 = tt()
    for i in range(0, len(built), 512):
        encode_spans(built[i:i + 512]).SerializeToString()
    out["otlp_protobuf_encode"] = tt() - t0
    t0 = tt()
    for i in range(0, len(built), 512):  # as the trace dir's writer does, its own encoding included
        otlp_json.message_to_json(encode_spans(built[i:i + 512]))
    out["trace_dir_json"] = tt() - t0
    result = {k: v / steps * 1e6 for k, v in out.items()}
    result["scheduler_wait_during_one_drain"] = _gil_hold(probe, sched, batch, steps)
    return result


def _gil_hold(probe, sched, batch, steps: int) -> dict:
    """A scheduler-like thread sleeps 1 ms at a time while the drain thread resolves ``steps``
    finished steps at once: how late it wakes (the drain holding the GIL), with the drain handing
    the GIL over after ``YIELD_AFTER_NS`` of work and without."""
    from sgl_probe import export

    out = {}
    keep = export.YIELD_AFTER_NS
    for label, after in (("yield_after_%d_us" % (keep // 1000), keep), ("no_yield", 10 ** 15)):
        export.YIELD_AFTER_NS = after
        for _ in range(steps):
            sched.run_batch(batch)
        late: list = []
        done = threading.Event()

        def drain() -> None:
            time.sleep(0.01)
            probe.pipeline.drain()
            done.set()

        t = threading.Thread(target=drain)
        t.start()
        while not done.is_set():
            t0 = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - t0 - 0.001)
        t.join()
        late.sort()
        out[label] = {"wakeups": len(late), "p50_us": late[len(late) // 2] * 1e6, "max_us": late[-1] * 1e6}
    export.YIELD_AFTER_NS = keep
    return out


# -- the driver ---------------------------------------------------------------------------------

def _run_worker(design: str, args, receiver, trace_dir, script: str = __file__, extra_env=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGL_PROBE"))}
    env.update(extra_env or {})
    # What the measurement itself depends on: an --env naming one of these is refused, not overwritten.
    own = dict(receiver.env("grpc")) if design != "no_export" else {}  # no_export: summary line only
    own.update({"SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_TIMER": "cpu",
                "SGL_PROBE_RUN_ID": "export-cpu-%s-%d" % (design, time.time_ns()),
                "PYTHONPATH": str(Path(script).resolve().parents[1])})
    if trace_dir and design != "no_export":
        own["SGL_PROBE_TRACE_DIR"] = trace_dir
    clash = sorted(set(args.env) & set(own))
    if clash:
        raise SystemExit("export_cpu.py: --env %s: the benchmark sets %s itself" % (", ".join(clash),
                                                                                  "it" if len(clash) == 1 else "them"))
    env.update(args.env)
    env.update(own)
    cmd = [sys.executable, script, "--worker", design, "--steps", str(args.steps), "--step-ms", str(args.step_ms)]
    if args.busy_us:  # only this tree knows it: --compare with --busy-us needs a base that does too
        cmd += ["--busy-us", str(args.busy_us)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError("%s run failed:\n%s" % (design, done.stderr[-3000:]))
    res = json.loads(done.stdout.strip().splitlines()[-1])
    if design not in ("off", "no_export"):
        run_id = res.pop("run_id")
        want = res["sent"] - res["dropped"]
        deadline = time.monotonic() + 30
        got = 0
        while time.monotonic() < deadline:
            got = sum(1 for s in receiver.spans() if s.resource.get("sgl_probe.run_id") == run_id)
            if got >= want:
                time.sleep(0.3)  # nothing more should arrive; count again
                got = sum(1 for s in receiver.spans() if s.resource.get("sgl_probe.run_id") == run_id)
                break
            time.sleep(0.2)
        res["spans_received"] = got
    return res


def _breakdown(script: str, steps: int, extra_env=None) -> dict:
    """``breakdown`` as the tree of ``script`` defines it, in a fresh process."""
    root, bench = Path(script).resolve().parents[1], Path(script).resolve().parent
    done = subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = [%r, %r]; import export_cpu, json; "
                           "print(json.dumps(export_cpu.breakdown(%d)))" % (str(root), str(bench), steps)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SGL_PROBE_TIMER": "cpu", "PYTHONPATH": str(root), **(extra_env or {})})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _checkout(rev: str, into: str) -> str:
    """This script as of ``rev``, with the probe of that revision beside it."""
    from gpu_common import checkout

    return str(checkout(rev, into) / "benchmarks" / "export_cpu.py")


def compare(args) -> dict:
    """This tree's probe vs revision ``args.compare``'s, designs interleaved (see the module doc)."""
    from gpu_common import median_ci, rotation
    from sgl_probe.testing.receiver import OTLPReceiver

    variants = ("off", "no_export", "out_of_process", "no_export@base", "out_of_process@base")
    runs: dict = {v: [] for v in variants}
    with OTLPReceiver() as receiver, tempfile.TemporaryDirectory() as tmp:
        # "python": this tree, its Python hot path (SGL_PROBE_HOTPATH=python) as the base.
        base_script = __file__ if args.compare == "python" else _checkout(args.compare, tmp)
        base_env = {"SGL_PROBE_HOTPATH": "python"} if args.compare == "python" else None
        trace_dir = tempfile.mkdtemp(dir=tmp) if args.trace_dir else None
        for r in range(args.repeats):
            for v in rotation(variants, r):
                design, _, base = v.partition("@")
                runs[v].append(_run_worker(design, args, receiver, trace_dir, base_script if base else __file__,
                                           base_env if base else None))
                receiver.clear()
        breakdown = {"new": _breakdown(__file__, args.steps),
                     "base": _breakdown(base_script, args.steps, base_env)} \
            if args.breakdown else None

    def cpu(v: str) -> list:
        return [run["in_process_cpu_us_per_step"] for run in runs[v]]

    def share(v: str) -> list:
        return [a - b for a, b in zip(cpu(v), cpu("off"))]

    def outside(v: str) -> list:
        return [run["out_of_process_cpu_us_per_step"] for run in runs[v]]

    result: dict = {
        "base": args.compare, "steps": args.steps, "repeats": args.repeats, "step_ms": args.step_ms, "env": args.env,
        "exports": "otlp-grpc" + (" + trace dir" if args.trace_dir else ""),
        "hotpath": {v: runs[v][0].get("hotpath") for v in variants if v != "off"},
        "loop_without_probe_cpu_us_per_step": median_ci(cpu("off")),
        "in_process_cpu_us_per_step": {v: median_ci(cpu(v)) for v in variants if v != "off"},
        "probe_cpu_us_per_step": {v: median_ci(share(v)) for v in variants if v != "off"},
        "probe_cpu_ratio_new_vs_base": {
            d: median_ci([a / b for a, b in zip(share(d), share(d + "@base"))]) for d in ("no_export", "out_of_process")},
        # The exporter process's CPU (read in clock ticks: ~3 µs per step over 3,000 steps).
        "out_of_process_cpu_us_per_step": {v: median_ci(outside(v)) for v in ("out_of_process", "out_of_process@base")},
        "out_of_process_cpu_ratio_new_vs_base": median_ci(
            [a / b for a, b in zip(outside("out_of_process"), outside("out_of_process@base")) if b]),
        # The drain thread's GIL holds show in the tail: a p99 over 3000 steps is the 30th latest
        # wake-up, so p99.9 and max are where the holds of a drain pass (every second) land.
        "sleep_overshoot_us": {v: {q: median_ci([run["sleep_overshoot_us"][q] for run in runs[v]])
                                   for q in ("p50", "p99", "p999", "max") if q in runs[v][0]["sleep_overshoot_us"]}
                               for v in variants},
        "drain_stretch_us": {v: {q: median_ci([run["drain_stretch_us"][q] for run in runs[v]]) for q in ("p50", "p99", "max")}
                             for v in variants if v != "off" and "drain_stretch_us" in runs[v][0]},
        "spans_sent_received_dropped": {v: [sum(run[k] for run in runs[v]) for k in ("sent", "spans_received", "dropped")]
                                        for v in ("out_of_process", "out_of_process@base")},
        "threads_cpu_us_per_step": {v: {name: statistics.median(run["threads_cpu_us_per_step"].get(name, 0.0)
                                                                for run in runs[v])
                                        for name in runs[v][0]["threads_cpu_us_per_step"]} for v in variants},
        "runs": runs,
    }
    if breakdown is not None:
        result["breakdown_cpu_us_per_step"] = breakdown
    return result


def _setting(raw: str) -> tuple:
    name, sep, value = raw.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected NAME=VALUE, got %r" % raw)
    return name, value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=1.0, help="the blocking wait inside each step")
    ap.add_argument("--trace-dir", action="store_true", help="also write the trace dir (both designs)")
    ap.add_argument("--busy-us", type=float, default=0.0,
                    help="Python work per step holding the GIL (a launch-bound scheduler thread)")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--compare", metavar="REV", help="also run the probe of git revision REV, interleaved")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", type=_setting,
                    help="a setting for every measured process (repeatable): the benchmark drops the OTEL_* "
                         "and SGL_PROBE_* variables around it, e.g. --env SGL_PROBE_DRAIN_S=5")
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=DESIGNS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.env = dict(args.env)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.step_ms, args.busy_us)))
        return 0
    from gpu_common import print_result

    if args.compare:
        print_result(compare(args), args.json)
        return 0
    from sgl_probe.testing.receiver import OTLPReceiver

    runs: dict = {d: [] for d in DESIGNS}
    with OTLPReceiver() as receiver, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = DESIGNS if r % 2 == 0 else DESIGNS[::-1]
            for design in order:
                runs[design].append(_run_worker(design, args, receiver, tmp if args.trace_dir else None))
                receiver.clear()

    def med(design: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[design])

    new, old = "out_of_process", "in_process"
    result = {
        "steps": args.steps * args.repeats,
        "repeats": args.repeats,
        "env": args.env,
        "step_ms": args.step_ms,
        "exports": "otlp-grpc" + (" + trace dir" if args.trace_dir else ""),
        "in_process_cpu_us_per_step": med(new, "in_process_cpu_us_per_step"),
        "out_of_process_cpu_us_per_step": med(new, "out_of_process_cpu_us_per_step"),
        "spans_sent": sum(run["sent"] for run in runs[new]),
        "spans_received": sum(run["spans_received"] for run in runs[new]),
        "dropped": sum(run["dropped"] for run in runs[new]),
        "loop_without_probe_cpu_us_per_step": med("off", "in_process_cpu_us_per_step"),
        "probe_without_export_cpu_us_per_step": med("no_export", "in_process_cpu_us_per_step"),
        "before": {
            "in_process_cpu_us_per_step": med(old, "in_process_cpu_us_per_step"),
            "spans_sent": sum(run["sent"] for run in runs[old]),
            "spans_received": sum(run["spans_received"] for run in runs[old]),
            "dropped": sum(run["dropped"] for run in runs[old]),
        },
        "in_process_cpu_ratio_new_vs_before": med(new, "in_process_cpu_us_per_step")
        / med(old, "in_process_cpu_us_per_step"),
        "probe_cpu_us_per_step": {d: med(d, "in_process_cpu_us_per_step") - med("off", "in_process_cpu_us_per_step")
                                  for d in (old, new)},
        "sleep_overshoot_us_p99": {d: statistics.median(run["sleep_overshoot_us"]["p99"] for run in runs[d])
                                   for d in DESIGNS},
        "sleep_overshoot_us_max": {d: statistics.median(run["sleep_overshoot_us"]["max"] for run in runs[d])
                                   for d in DESIGNS},
        "busy_us": args.busy_us,
        # The scheduler-shaped loop's own speed, each design over the ``off`` run of the same
        # repeat (median over repeats), and the time its thread spent neither on a CPU nor in
        # its GPU wait per step: waiting for the GIL (and for a CPU, on a busy machine).
        "loop_ratio_vs_off": {d: statistics.median(a["loop_us_per_step"] / b["loop_us_per_step"]
                                                   for a, b in zip(runs[d], runs["off"])) for d in DESIGNS},
        "scheduler_wait_us_per_step": {d: statistics.median(run["loop_us_per_step"] - run["main_thread_cpu_us_per_step"]
                                                            - args.step_ms * 1000 for run in runs[d])
                                       for d in DESIGNS},
        "runs": runs,
    }
    if args.breakdown:
        result["breakdown_cpu_us_per_step"] = _breakdown(__file__, args.steps)
    print_result(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
