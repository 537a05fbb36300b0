"""Shared pieces of the GPU benchmarks: an SGLang-shaped workload, probe set-up through a target
table of the benchmark's own (the mechanism the probe uses for SGLang), an OTLP receiver in a
child process, and the paired-ratio statistics.

Nothing here imports torch at module level, so the pure-Python parts are testable on any machine.
"""

from __future__ import annotations

import enum
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WORKLOAD_MODULE = __name__  # the target table points at classes defined in this module


# -- results ------------------------------------------------------------------------------------

def print_result(result: dict, json_path: Optional[str] = None) -> None:
    """A benchmark's result as one JSON object on stdout, and in ``json_path`` when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if json_path:
        with open(json_path, "w") as fh:
            fh.write(text + "\n")


# -- statistics ---------------------------------------------------------------------------------

def bootstrap_median_ci(values: Sequence[float], n_boot: int = 2000, seed: int = 0,
                        level: float = 0.95) -> tuple[float, float, float]:
    """Median and percentile-bootstrap interval of the median."""
    vals = list(values)
    if not vals:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(n_boot))
    lo = meds[int((1 - level) / 2 * n_boot)]
    hi = meds[min(n_boot - 1, int((1 + level) / 2 * n_boot))]
    return statistics.median(vals), lo, hi


def median_ci(values: Sequence[float]) -> dict:
    """:func:`bootstrap_median_ci` as the benchmarks print it: ``{"median", "ci95": [lo, hi]}``."""
    med, lo, hi = bootstrap_median_ci(values)
    return {"median": med, "ci95": [lo, hi]}


def revision_roots(compare: Optional[str], into: str) -> dict[str, str]:
    """The probes a ``--compare`` benchmark runs: ``new`` (this tree) and, given a revision,
    ``base`` (:func:`checkout` of it into ``into``)."""
    roots = {"new": str(Path(__file__).resolve().parents[1])}
    if compare:
        roots["base"] = str(checkout(compare, into))
    return roots


def worker_json(cmd: list[str], timeout: float = 1800) -> dict:
    """Run a benchmark's worker process; its result is the last line it prints, as JSON (a
    failed worker raises)."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def checkout(rev: str, into: str) -> Path:
    """git revision ``rev`` of this repository extracted into ``into``, its C hot path compiled in
    place where it has one (the compiler command ``pip install`` runs), so that a benchmark's
    ``--compare REV`` runs that revision's probe as a user would have it. Returns ``into``."""
    import sysconfig

    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    src = Path(into) / "sgl_probe" / "_hot.c"
    if src.is_file():
        sys.path.insert(0, str(root))
        from hatch_build import compile_command

        out = src.with_name("_hot" + sysconfig.get_config_var("EXT_SUFFIX"))
        done = subprocess.run(compile_command(src, out), capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{rev}'s C hot path did not build; it runs its Python one\n{done.stderr[-2000:]}", file=sys.stderr)
    return Path(into)


def rotation(variants: Sequence[str], i: int) -> list[str]:
    """Order of the blocks in round ``i``: rotated each round, reversed every other round, so no
    variant keeps a fixed position next to another."""
    k = i % len(variants)
    order = list(variants[k:]) + list(variants[:k])
    return order[::-1] if (i // len(variants)) % 2 else order


def paired_ratios(times: dict[str, list[float]], base: str) -> dict[str, list[float]]:
    return {v: [t / b for t, b in zip(ts, times[base])] for v, ts in times.items() if v != base}


def summarize_ratios(times: dict[str, list[float]], base: str) -> dict[str, dict]:
    out = {}
    for v, ratios in paired_ratios(times, base).items():
        med, lo, hi = bootstrap_median_ci(ratios)
        out[v] = {"median_ratio": med, "ci95": [lo, hi], "n_pairs": len(ratios)}
    return out


# -- the workload: SGLang-shaped classes, one set per variant ------------------------------------

class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    IDLE = 4


class Batch:
    """What the probe's readers look at: forward_mode, seq_lens (length = batch size)."""

    def __init__(self, mode: ForwardMode, bs: int, extend_tokens: int = 0) -> None:
        self.forward_mode = mode
        self.seq_lens = [1] * bs
        self.extend_num_tokens = extend_tokens


class Result:
    """No ``can_run_cuda_graph`` on purpose: the graph flag must come from the graph-runner hook."""

    __slots__ = ()


RESULT = Result()


def make_variant(tag: str, eager: Optional[Callable[[], Any]], graph: Any) -> type:
    """Define ``Scheduler_<tag>``, ``Worker_<tag>``, ``GraphRunner_<tag>``, ``Metrics_<tag>`` in
    this module (so a target table can name them) and return the scheduler class.

    DECODE batches replay ``graph`` through the graph runner; other modes run ``eager()``. A
    TARGET_VERIFY step reports an accept count to the metrics sink afterwards, as SGLang does."""
    mod = sys.modules[WORKLOAD_MODULE]

    class GraphRunner:
        def replay(self) -> None:
            if graph is not None:
                graph.replay()

    class Worker:
        def __init__(self) -> None:
            self.runner = GraphRunner()

        def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None,
                                     is_verify=False):
            if batch.forward_mode is ForwardMode.DECODE:
                self.runner.replay()
            elif eager is not None:
                eager()
            return RESULT

    class Metrics:
        def update_spec_metrics(self, bs: int, num_accepted_drafts: int) -> None:
            self.last = (bs, num_accepted_drafts)

    class Scheduler:
        def __init__(self, server_args=None, tp_rank: int = 0, pp_rank: int = 0, dp_rank=None,
                     gpu_id: int = 0) -> None:
            self.worker = Worker()
            self.metrics = Metrics()

        def run_batch(self, batch):
            res = self.worker.forward_batch_generation(batch)
            if batch.forward_mode is ForwardMode.TARGET_VERIFY:
                self.metrics.update_spec_metrics(len(batch.seq_lens), len(batch.seq_lens))
            return res

    for cls, base in ((GraphRunner, "GraphRunner"), (Worker, "Worker"), (Metrics, "Metrics"),
                      (Scheduler, "Scheduler")):
        name = f"{base}_{tag}"
        cls.__name__ = cls.__qualname__ = name
        cls.__module__ = WORKLOAD_MODULE
        setattr(mod, name, cls)
    return Scheduler


def bench_table(tag: str) -> tuple:
    """The probe's table for one variant: the same roles and readers as SGLang's rows."""
    from sgl_probe.targets import Target

    m = WORKLOAD_MODULE
    return (
        Target("step", ("step",), m, f"Scheduler_{tag}.run_batch", "step"),
        Target("identity", ("identity",), m, f"Scheduler_{tag}.__init__", "identity"),
        Target("phase", ("decode", "extend"), m, f"Worker_{tag}.forward_batch_generation", "forward"),
        Target("graph", ("graph",), m, f"GraphRunner_{tag}.replay", "graph"),
        Target("accept", ("accept",), m, f"Metrics_{tag}.update_spec_metrics", "accept"),
    )


_PROBE_ENV_KEYS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
                   "SGL_PROBE_DRAIN_S", "SGL_PROBE_SUMMARY_S", "SGL_PROBE_TIMER", "SGL_PROBE_MAX_PENDING",
                   "SGL_PROBE_TRACE_DIR", "OTEL_BSP_SCHEDULE_DELAY")


@contextmanager
def env_override(values: dict) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in set(values) | set(_PROBE_ENV_KEYS)}
    for k in _PROBE_ENV_KEYS:
        os.environ.pop(k, None)
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: For what measures or checks the CUDA timer step by step (accuracy, per-call cost, capture
#: safety, host syncs): every step timed on the GPU. The loops run the release's default, which
#: times about one step per 40 ms on the GPU (``SGL_PROBE_GPU_EVERY_MS``; 10 ms in runs 51-54).
EVERY_STEP = {"SGL_PROBE_GPU_EVERY_MS": "0"}


def make_probe(tag: str, env: dict, targets: Optional[tuple] = None):
    """A real ``Probe`` (config, recorder, wrappers, pipeline) over the variant's classes."""
    from sgl_probe import config
    from sgl_probe.activate import Probe

    with env_override(env):
        probe = Probe(config.load(), targets=targets or bench_table(tag))
        probe.instrumentor.instrument()
        probe.ensure_pipeline()
    return probe


def drain_stage_ns(pipeline, recorder) -> tuple[dict, list, list]:
    """Thread CPU ns of each stage of the drain over the recorder's finished steps, in the drain's
    own chunks: resolving them into rows (``resolve``), the summary and any other step observers
    (``summary``), encoding the rows for the exporter's link as the exporter process's sink does
    (``pickle``: packed by the C extension where it packs, else pickled). Returns the times, the rows and
    the link's messages ``(data, spans)``."""
    from sgl_probe import export, wire
    from sgl_probe.drain import take_ready

    tt = time.thread_time_ns
    out: dict = {}
    rows: list = []
    t = tt()
    while take_ready(recorder.steps, recorder.timer, time.perf_counter_ns(), False, export.CHUNK, rows):
        pass
    out["resolve"] = tt() - t
    t = tt()
    for i in range(0, len(rows), export.CHUNK):
        pipeline.observe_rows(rows[i:i + export.CHUNK])
    out["summary"] = tt() - t
    t = tt()
    sink = getattr(pipeline, "sink", None)  # none configured: as the exporter process's sink would
    pack = sink.pack if hasattr(sink, "pack") else getattr(getattr(recorder, "c", None), "pack_steps", None)
    msgs = wire.encode_steps(rows, [False] * len(rows), pack)
    out["pickle"] = tt() - t
    return out, rows, msgs


# -- receiver in a child process ----------------------------------------------------------------

class ReceiverProcess:
    def __init__(self, path: str) -> None:
        self.path = path
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "gpu_receiver.py"), path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            raise RuntimeError("receiver did not start: %r" % self.endpoint)

    def env(self) -> dict:
        return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true"}

    def spans(self) -> list[dict]:
        out = []
        try:
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line:
                        out.append(json.loads(line))
        except FileNotFoundError:
            pass
        return out

    def spans_when(self, enough, timeout_s: float = 30.0) -> list[dict]:
        """The spans received, once ``enough(spans)`` holds or ``timeout_s`` passed: the exporter
        processes export on their own schedule, after the probe's flush returned."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if enough(spans) or time.monotonic() >= deadline:
                return spans
            time.sleep(0.2)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()


def spin_us(us: float) -> None:
    """CPU 'scheduler' work between steps (holds the GIL, like SGLang's Python scheduler)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "wrapt", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc",
                 "grpcio", "protobuf"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:
            out[name] = None
    try:
        from sgl_probe import __version__, hotpath

        out["sgl-probe"] = __version__
        out["sgl-probe hot path"] = hotpath.name(hotpath.load())
    except Exception:
        pass
    try:
        # What ran, whatever the machine copy's git HEAD says: a digest of the package's sources.
        import hashlib

        digest = hashlib.sha256()
        for path in sorted(Path(ROOT, "sgl_probe").rglob("*")):
            if path.suffix in (".py", ".c"):
                digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
        out["sgl_probe_sources_sha256"] = digest.hexdigest()[:16]
    except Exception:
        out["sgl_probe_sources_sha256"] = None
    try:
        out["git_commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=5).stdout.strip() or None
    except Exception:
        out["git_commit"] = None
    return out
