"""Every SGLang name the probe touches, in one table.

SGLang moves its internals every few releases (see the research notes on hook points by
version), so a new release should be a data change here, not a hunt through the code. Each row
says what the call is for (``role``), which span phases it can produce, where it lives, how to
read facts from the call (``reader``, a function name in :mod:`sgl_probe.readers`), where a
phase that ran without a graph finds SGLang's graph runner (``runner``, in
:mod:`sgl_probe.no_graph`), and the version range in which it is *expected* to exist. Resolution itself goes by presence, not by
version number (dev builds such as the Kimi-K2.5 "0.5.8" images mix features): every row is
tried, and the range only decides whether a missing target is worth a warning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sgl_probe.contract import PHASES  # noqa: F401  (re-exported: the table's phases)

#: Roles: ``step`` opens a scheduler iteration, ``phase`` times a call, ``graph`` marks the open
#: phase as having replayed a CUDA/CPU graph, ``accept`` carries SGLang's accept length,
#: ``graph_launch`` notes when the open phase launched its first CUDA graph (torch's own replay),
#: ``nccl_init`` snapshots the env before the first communicator, ``identity`` learns the
#: process's ranks and server args, ``launch`` marks a new server launch in the parent process.
ROLES = ("step", "phase", "graph", "graph_launch", "accept", "nccl_init", "identity", "launch")


@dataclass(frozen=True)
class Target:
    role: str
    phases: tuple[str, ...]
    module: str
    qualname: str
    reader: str
    since: str | None = None  # first version expected to have it
    until: str | None = None  # first version expected NOT to have it
    mode: str | None = None  # forward-mode name to report when SGLang mutates it inside the call
    runner: str | None = None  # where a phase's no-graph reason is read (``no_graph.BY_RUNNER``)

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"

    def expected_in(self, version: str | None) -> bool:
        if version is None:
            return True
        v = parse_version(version)
        if self.since is not None and v < parse_version(self.since):
            return False
        if self.until is not None and v >= parse_version(self.until):
            return False
        return True


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release only: "0.5.8.post1" -> (0, 5, 8), "0.5.23rc1" -> (0, 5, 23)."""
    parts = []
    for piece in text.split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    return tuple(parts)


_S = "sglang.srt."
_EW1 = _S + "speculative.eagle_worker"
_EW2 = _S + "speculative.eagle_worker_v2"
_DRAFT_CG = _S + "speculative.eagle_draft_cuda_graph_runner"
_DRAFT_EXT_CG = _S + "speculative.eagle_draft_extend_cuda_graph_runner"

TARGETS: tuple[Target, ...] = (
    # One scheduler iteration; every rank of a TP group runs the same sequence of these.
    # 0.5.23 may replace run_batch on the *instance* (forward-pass metrics), so it is wrapped on
    # the class at import time, before any Scheduler exists.
    Target("step", ("step",), _S + "managers.scheduler", "Scheduler.run_batch", "step"),
    Target("identity", ("identity",), _S + "managers.scheduler", "Scheduler.__init__", "identity"),
    # The launching process, just before SGLang rewrites env and spawns its workers: a fresh run
    # id per server (a notebook may launch several) and the user's env, for the workers' diff.
    Target("launch", ("launch",), _S + "entrypoints.engine", "_launch_subprocesses", "launch",
           until="0.5.10"),
    Target("launch", ("launch",), _S + "entrypoints.engine", "Engine._launch_subprocesses", "launch",
           since="0.5.10"),
    # Target-model forward. The mode decides the phase: DECODE -> decode, EXTEND/MIXED -> extend,
    # TARGET_VERIFY (or is_verify=True) -> verify when no spec-specific verify row caught it first.
    Target("phase", ("decode", "extend"), _S + "managers.tp_worker",
           "TpModelWorker.forward_batch_generation", "forward", runner="worker"),
    # EAGLE v1 (gone in 0.5.13). EAGLEWorker subclasses TpModelWorker but overrides
    # forward_batch_generation, so the row above does not time the whole spec step.
    Target("phase", ("draft",), _EW1, "EAGLEWorker.draft", "spec_call", until="0.5.13", runner="draft"),
    Target("phase", ("verify",), _EW1, "EAGLEWorker.verify", "verify_v1", until="0.5.13",
           mode="TARGET_VERIFY", runner="spec_target"),
    # Draft-extend after a prefill runs in the prefill's own mode (EXTEND/MIXED: no table mode);
    # after a verify SGLang switches the batch to DRAFT_EXTEND(_V2) inside the call.
    Target("phase", ("draft_extend",), _EW1, "EAGLEWorker.forward_draft_extend", "spec_call",
           until="0.5.13", runner="draft_extend"),
    Target("phase", ("draft_extend",), _EW1, "EAGLEWorker.forward_draft_extend_after_decode",
           "draft_extend_v1_decode", until="0.5.13", mode="DRAFT_EXTEND", runner="draft_extend"),
    # EAGLE v2 (opt-in from 0.5.5, default from 0.5.11, the only one from 0.5.13).
    Target("phase", ("draft",), _EW2, "EagleDraftWorker.draft", "spec_call", since="0.5.5",
           runner="draft"),
    Target("phase", ("verify",), _EW2, "EAGLEWorkerV2.verify", "verify_v2", since="0.5.5",
           mode="TARGET_VERIFY", runner="spec_target"),
    Target("phase", ("draft_extend",), _EW2, "EagleDraftWorker._draft_extend_for_prefill",
           "spec_call", since="0.5.5", runner="draft_extend"),
    Target("phase", ("draft_extend",), _EW2, "EagleDraftWorker._draft_extend_for_decode",
           "spec_call", since="0.5.5", mode="DRAFT_EXTEND_V2", runner="draft_extend"),
    # Graph replays: a call here means the open phase ran a captured graph.
    Target("graph", ("graph",), _S + "model_executor.cuda_graph_runner", "CudaGraphRunner.replay",
           "graph", until="0.5.14"),
    Target("graph", ("graph",), _S + "model_executor.piecewise_cuda_graph_runner",
           "PiecewiseCudaGraphRunner.replay", "graph", since="0.5.5", until="0.5.14"),
    Target("graph", ("graph",), _S + "model_executor.runner.decode_cuda_graph_runner",
           "DecodeCudaGraphRunner.execute", "graph", since="0.5.14"),
    Target("graph", ("graph",), _S + "model_executor.runner.prefill_cuda_graph_runner",
           "PrefillCudaGraphRunner.execute", "graph", since="0.5.14"),
    Target("graph", ("graph",), _S + "model_executor.cpu_graph_runner", "CPUGraphRunner.replay",
           "graph", until="0.5.14"),
    Target("graph", ("graph",), _S + "model_executor.cpu_graph_runner", "CPUGraphRunner.execute",
           "graph", since="0.5.14"),
    Target("graph", ("graph",), _DRAFT_CG, "EAGLEDraftCudaGraphRunner.replay", "graph", until="0.5.14"),
    Target("graph", ("graph",), _DRAFT_CG, "EAGLEDraftCudaGraphRunner.execute", "graph", since="0.5.14"),
    Target("graph", ("graph",), _DRAFT_EXT_CG, "EAGLEDraftExtendCudaGraphRunner.replay", "graph",
           until="0.5.14"),
    Target("graph", ("graph",), _DRAFT_EXT_CG, "EAGLEDraftExtendCudaGraphRunner.execute", "graph",
           since="0.5.14"),
    # The launch itself, below SGLang's runners (whose entry comes before their host-side input
    # preparation): every captured graph SGLang replays is a torch CUDAGraph.
    Target("graph_launch", ("graph_launch",), "torch.cuda.graphs", "CUDAGraph.replay", "graph"),
    # SGLang's own accept-length sink, called after the accept counts reached the CPU (no sync).
    Target("accept", ("accept",), _S + "managers.scheduler_metrics_mixin",
           "SchedulerMetricsMixin.update_spec_metrics", "accept", since="0.5.5", until="0.5.13"),
    Target("accept", ("accept",), _S + "managers.scheduler_components.metrics_reporter",
           "SchedulerMetricsReporter.update_spec_metrics", "accept", since="0.5.13"),
    # Communicator creation: NCCL reads its variables at the first one in a process.
    Target("nccl_init", ("nccl_init",), "torch.distributed", "init_process_group", "nccl_init"),
    Target("nccl_init", ("nccl_init",), _S + "distributed.parallel_state", "GroupCoordinator.__init__",
           "nccl_init"),
    Target("nccl_init", ("nccl_init",), _S + "distributed.device_communicators.pynccl",
           "PyNcclCommunicator.__init__", "nccl_init"),
)


def by_module(targets: tuple[Target, ...] = TARGETS) -> dict[str, list[Target]]:
    out: dict[str, list[Target]] = {}
    for t in targets:
        out.setdefault(t.module, []).append(t)
    return out
