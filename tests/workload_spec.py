"""A scheduler-shaped workload with speculative-decoding steps (draft / verify / draft-extend plus
SGLang's accept-length sink), for driving the probe's real machinery (wrappers, recorder, span
builder, trace-file exporter) through a target table of the tests' own. It is *not* a stand-in for
SGLang in end-to-end tests; it is how the report tests get real probe traces with known shape.

``run_rank`` is the body of one "TP rank": in a process of its own (spawned by
``make_trace_dir``), it activates a real :class:`sgl_probe.activate.Probe` with
``SGL_PROBE_TRACE_DIR`` set and runs a fixed sequence of steps, so every rank writes its own
``sgl-probe-<pid>.jsonl`` with step trace ids shared across ranks, exactly like a server.
"""

from __future__ import annotations

import enum
import multiprocessing
import os
import time
from dataclasses import dataclass, field

from sgl_probe.targets import Target

M = __name__


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND = 4
    IDLE = 5


class Batch:
    def __init__(self, mode: ForwardMode, bs: int, extend_tokens: int = 0, accept: float = 0.0,
                 spec: bool = True) -> None:
        self.forward_mode = mode
        self.seq_lens = [1] * bs
        self.extend_num_tokens = extend_tokens
        self.accept = accept  # accept length this step's verify reports (bonus token included)
        self.spec = spec  # False: a plain decode step (spec disabled for it)


class Result:
    def __init__(self, graph: bool) -> None:
        self.can_run_cuda_graph = graph


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def init_process_group(backend: str = "nccl") -> None:
    """Stands for torch.distributed's: the probe snapshots the env just before it."""


class GraphRunner:
    def replay(self):
        return None


@dataclass
class Timing:
    """Seconds each call spins, and which calls replay a graph."""
    extend: float = 0.002
    decode: float = 0.0005
    draft: float = 0.0005
    verify: float = 0.008
    draft_extend: float = 0.0003
    verify_graph: bool = False
    decode_graph: bool = True
    draft_graph: bool = True


class TargetWorker:
    def __init__(self, timing: Timing) -> None:
        self.t = timing

    def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False):
        if is_verify:
            spin(self.t.verify)
            if self.t.verify_graph:
                GraphRunner().replay()
            return Result(self.t.verify_graph)
        if batch.forward_mode == ForwardMode.DECODE:
            spin(self.t.decode)
            if self.t.decode_graph:
                GraphRunner().replay()
            return Result(self.t.decode_graph)
        spin(self.t.extend)
        return Result(False)


class DraftWorker:
    def __init__(self, timing: Timing) -> None:
        self.t = timing

    def draft(self, batch):
        spin(self.t.draft)
        if self.t.draft_graph:
            GraphRunner().replay()

    def forward_draft_extend(self, batch):
        spin(self.t.draft_extend)


class SpecWorker:
    """EAGLE-worker-shaped: verify runs the target forward nested (one verify span, no decode)."""

    def __init__(self, target: TargetWorker, draft: DraftWorker) -> None:
        self.target = target
        self.draft_worker = draft

    def verify(self, batch):
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        return self.target.forward_batch_generation(batch, is_verify=True)


class MetricsReporter:
    def update_spec_metrics(self, bs: int, num_accepted_drafts: int) -> None:
        return None


class ServerArgs:
    def __init__(self, spec: bool) -> None:
        self.speculative_algorithm = "EAGLE3" if spec else None
        self.speculative_num_steps = 3
        self.speculative_eagle_topk = 1
        self.speculative_num_draft_tokens = 4


class Scheduler:
    def __init__(self, server_args, tp_rank: int = 0, pp_rank: int = 0, dp_rank=None,
                 timing: Timing | None = None) -> None:
        init_process_group("nccl")
        self.timing = timing or Timing()
        self.server_args = server_args
        self.target = TargetWorker(self.timing)
        self.draft = DraftWorker(self.timing)
        self.spec = SpecWorker(self.target, self.draft)
        self.metrics = MetricsReporter()

    def run_batch(self, batch):
        spec_on = bool(self.server_args.speculative_algorithm)
        if batch.forward_mode == ForwardMode.EXTEND:
            out = self.target.forward_batch_generation(batch)
            if spec_on:
                self.draft.forward_draft_extend(batch)
            return out
        if batch.forward_mode == ForwardMode.DECODE and spec_on and batch.spec:
            bs = len(batch.seq_lens)
            self.draft.draft(batch)
            out = self.spec.verify(batch)
            self.metrics.update_spec_metrics(bs, round((batch.accept - 1) * bs))
            self.draft.forward_draft_extend(batch)
            return out
        if batch.forward_mode == ForwardMode.DECODE:
            return self.target.forward_batch_generation(batch)
        return None  # IDLE


TABLE = (
    Target("step", ("step",), M, "Scheduler.run_batch", "step"),
    Target("identity", ("identity",), M, "Scheduler.__init__", "identity"),
    Target("nccl_init", ("nccl_init",), M, "init_process_group", "nccl_init"),
    Target("phase", ("decode", "extend"), M, "TargetWorker.forward_batch_generation", "forward"),
    Target("phase", ("draft",), M, "DraftWorker.draft", "spec_call"),
    Target("phase", ("verify",), M, "SpecWorker.verify", "verify_v2", mode="TARGET_VERIFY"),
    Target("phase", ("draft_extend",), M, "DraftWorker.forward_draft_extend", "spec_call",
           mode="DRAFT_EXTEND"),
    Target("graph", ("graph",), M, "GraphRunner.replay", "graph"),
    Target("accept", ("accept",), M, "MetricsReporter.update_spec_metrics", "accept"),
)


@dataclass
class Plan:
    """What one run does, per rank. Accept lengths alternate around ``tau``."""
    spec: bool = True
    prefills: int = 2
    spec_steps: int = 30
    plain_decode_steps: int = 0  # decode steps without spec (spec disabled for them)
    batch_sizes: tuple = (1, 2, 4)
    tau: float = 3.0
    timing: Timing = field(default_factory=Timing)
    slow_rank: int | None = None  # this rank's verify (or decode) takes slow_extra_s longer
    slow_extra_s: float = 0.004


def steps_of(plan: Plan) -> list[Batch]:
    out = [Batch(ForwardMode.EXTEND, 1, extend_tokens=16) for _ in range(plan.prefills)]
    for i in range(plan.spec_steps if plan.spec else 0):
        bs = plan.batch_sizes[i % len(plan.batch_sizes)]
        # Accept lengths SGLang can report ((drafts + bs) / bs): bs 1 alternates tau -/+ 1, bs 4
        # tau -/+ 0.5, others give tau exactly; the mean over every run of 2 x len(batch_sizes)
        # steps is tau.
        swing = {1: 1.0, 4: 0.5}.get(bs, 0.0)
        delta = swing if (i // len(plan.batch_sizes)) % 2 else -swing
        out.append(Batch(ForwardMode.DECODE, bs, accept=plan.tau + delta))
    for i in range(plan.plain_decode_steps if plan.spec else plan.spec_steps):
        out.append(Batch(ForwardMode.DECODE, plan.batch_sizes[i % len(plan.batch_sizes)], spec=False))
    out.append(Batch(ForwardMode.IDLE, 0))
    return out


def run_rank(trace_dir: str, tp_rank: int, run_id: str, plan: Plan, summary_s: str = "0") -> None:
    """One rank's process: real probe, real exporters, this workload."""
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME"):
        os.environ.pop(key, None)
    os.environ.update({"SGL_PROBE_TRACE_DIR": trace_dir, "SGL_PROBE_RUN_ID": run_id,
                       "SGL_PROBE_SUMMARY_S": summary_s, "SGL_PROBE_DRAIN_S": "0.05",
                       "SGL_PROBE_TIMER": "cpu", "OTEL_BSP_SCHEDULE_DELAY": "50", "NCCL_PROTO": "LL",
                       "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "32",  # several lines per file
                       "NCCL_IB_HCA": f"mlx5_{tp_rank}"})
    from sgl_probe import config
    from sgl_probe.activate import Probe

    probe = Probe(config.load(), targets=TABLE)
    probe.instrumentor.instrument()
    timing = Timing(**vars(plan.timing))
    if plan.slow_rank == tp_rank:
        if plan.spec:
            timing.verify += plan.slow_extra_s
        else:
            timing.decode += plan.slow_extra_s
    sched = Scheduler(ServerArgs(plan.spec), tp_rank=tp_rank, pp_rank=0, dp_rank=None, timing=timing)
    for batch in steps_of(plan):
        sched.run_batch(batch)
    probe.pipeline.flush()
    probe.pipeline.shutdown()
    probe.instrumentor.uninstrument()


def make_trace_dir(trace_dir: str, plan: Plan, ranks: int = 2, run_id: str | None = None) -> str:
    """Run ``ranks`` rank processes (spawned, like SGLang's schedulers) into ``trace_dir``.

    One after the other: on a 2-core CI machine, ranks spinning side by side would mostly measure
    each other. Step trace ids are still shared (same run id, same step indices)."""
    import uuid

    run_id = run_id or "test-" + uuid.uuid4().hex[:12]
    ctx = multiprocessing.get_context("spawn")
    for r in range(ranks):
        p = ctx.Process(target=run_rank, args=(trace_dir, r, run_id, plan))
        p.start()
        p.join(120)
        if p.exitcode != 0:
            raise RuntimeError(f"rank {r} process exited with {p.exitcode}")
    return run_id


_CACHE: dict[str, str] = {}


def cached_trace_dir(tmp_path_factory, name: str, plan: Plan, ranks: int = 2) -> str:
    """One trace dir per name per test session, shared by every report test module."""
    if name not in _CACHE:
        path = str(tmp_path_factory.mktemp("traces-" + name))
        make_trace_dir(path, plan, ranks)
        _CACHE[name] = path
    return _CACHE[name]


#: The trace dirs the report tests share: a 2-rank EAGLE-shaped run (verify without a graph, rank 1
#: the verify straggler, a few plain graph-decode steps), and a 2-rank run without spec decoding.
SPEC_PLAN = Plan(slow_rank=1, plain_decode_steps=6)
BASELINE_PLAN = Plan(spec=False)
