"""Every name shared by the probe, the report and the testing API: span names, attribute keys,
phases, snapshot points, settings, the env allow-list and the secret-name pattern.

The span contract is what users' Jaeger queries, dashboards and tests rely on, so it is spelled
once, here. This module imports nothing from the package: the runtime core, ``report/`` and
``testing/`` all import it, never each other through it. (``testing/`` keeps literal copies of a
few names as an independent oracle; a test checks that they are equal.)
"""

from __future__ import annotations

#: Phases that become ``sglang.<phase>`` spans, in display order.
PHASES = ("decode", "extend", "draft", "verify", "draft_extend")
#: Phases that only run under speculative decoding.
SPEC_PHASES = ("draft", "verify", "draft_extend")

#: Ranks of a scheduler process, as ``sglang.<rank>`` attributes (resource and spans).
RANKS = ("tp_rank", "dp_rank", "pp_rank")

# --- span names -----------------------------------------------------------------------------
SPAN_PREFIX = "sglang."
STEP_SPAN = "sglang.step"
ENV_SPAN = "sgl_probe.env_snapshot"
#: One per process: which SGLang code, libraries, GPUs, arguments and launch env it ran with.
FINGERPRINT_SPAN = "sgl_probe.fingerprint"


def phase_span(phase: str) -> str:
    return SPAN_PREFIX + phase


# --- phase / step attributes ----------------------------------------------------------------
DURATION_MS = "sgl_probe.duration_ms"
#: What the phases' intervals were timed with: ``cuda`` (CUDA events: GPU time), ``cpu`` (the host
#: clock in a process with no CUDA work, where the call is the compute) or ``host`` (the host clock
#: on a step the CUDA timer left untimed, ``SGL_PROBE_GPU_EVERY_MS``: the intervals are the host
#: calls, launches included, not GPU time, and stay out of every GPU-time statistic).
TIMER = "sgl_probe.timer"
TIMER_VALUES = TIMER_CUDA, TIMER_CPU, TIMER_HOST = ("cuda", "cpu", "host")
HOST_MS = "sgl_probe.host_ms"
TARGET = "sgl_probe.target"
#: How the phase's start was taken: ``gpu_event`` (the previous phase's end event on the same stream,
#: still pending at the call) or ``host_clock`` (the GPU had caught up at the call, so the interval
#: includes the launch latency).
START = "sgl_probe.start"
START_VALUES = ("gpu_event", "host_clock")
#: On a phase that launched a CUDA graph: from the graph's launch (the host clock at
#: ``torch.cuda.CUDAGraph.replay``, or the phase's GPU start if the GPU was still busy then) to the
#: phase's end. The span's interval also holds the host's preparation before the launch (input
#: copies, attention metadata), time in which a launch-bound GPU sits idle.
GRAPH_MS = "sgl_probe.graph_ms"
PHASE = "sglang.phase"
STEP_INDEX = "sglang.step_index"
CUDA_GRAPH = "sglang.cuda_graph"
#: Why no graph ran, from SGLang's own state (only on phases with ``sglang.cuda_graph`` false).
NO_GRAPH_REASON = "sglang.no_graph_reason"
NO_GRAPH_REASONS = (
    "graphs_disabled",     # --disable-cuda-graph (or the runner was never built)
    "batch_too_large",     # batch size above the largest captured size
    "mode_not_captured",   # this forward mode has no captured graph (e.g. extend, eager verify)
    "runner_refused",      # the graph runner's can_run() said no for another reason
    "unknown",
)
#: On a ``sglang.step`` span the trace sampler would have dropped: why it was kept anyway.
KEPT = "sgl_probe.kept"
#: ... because the step took longer than the running p99 of its forward mode (tail-based keep).
KEPT_SLOW = "slow"
FORWARD_MODE = "sglang.forward_mode"
BATCH_SIZE = "sglang.batch_size"
NUM_TOKENS = "sglang.num_tokens"
ACCEPT_LENGTH = "sglang.spec.accept_length"
SPEC_PREFIX = "sglang.spec."
SPEC_SETTINGS = ("algorithm", "num_steps", "topk", "num_draft_tokens")

# --- env snapshot attributes ----------------------------------------------------------------
SNAPSHOT_POINT = "sgl_probe.snapshot_point"
SNAPSHOT_POINTS = ("process_start", "nccl_init", "nccl_confirm")
SNAPSHOT_TRIGGER = "sgl_probe.snapshot_trigger"  # nccl_init: the target whose call took it
DIST_BACKEND = "sgl_probe.dist_backend"  # nccl_init: torch.distributed's backend, when passed
ENV_ATTR_PREFIX = "env."
LAUNCHER_ENV_PREFIX = "launcher_env."
ENV_NAMES = "sgl_probe.env.names"
ENV_WITHHELD = "sgl_probe.env.withheld"
ENV_DIFFERS = "sgl_probe.env.differs_from_launcher"
NCCL_CONFIRMED_PREFIX = "nccl.confirmed."

# --- fingerprint attributes (sgl_probe.fingerprint span) -------------------------------------
FP_PREFIX = "fingerprint."
FP_SGLANG_VERSION = "fingerprint.sglang.version"
FP_SGLANG_PATH = "fingerprint.sglang.path"
#: ``wheel`` (checked against its RECORD), ``git`` (a checkout), ``unknown`` or ``absent``.
FP_SGLANG_INSTALL = "fingerprint.sglang.install"
#: SGLang files whose content differs from the wheel's RECORD hashes (paths as in RECORD).
FP_PATCHED = "fingerprint.sglang.patched_files"
FP_MISSING = "fingerprint.sglang.missing_files"
FP_RECORD_CHECKED = "fingerprint.sglang.record_files_checked"
FP_RECORD_HASHED = "fingerprint.sglang.record_files_hashed"
FP_GIT_COMMIT = "fingerprint.sglang.git_commit"
FP_GIT_MODIFIED = "fingerprint.sglang.git_modified"
FP_ORPHANED_BYTECODE = "fingerprint.sglang.orphaned_bytecode"
FP_STALE_BYTECODE = "fingerprint.sglang.stale_bytecode"
FP_ERRORS = "fingerprint.errors"
#: Which sgl-probe code ran (its version alone names no build): ``sglang_code``'s keys for the
#: probe's own package -> attribute key.
FP_PROBE = {
    "version": "fingerprint.sgl_probe.version",
    "path": "fingerprint.sgl_probe.path",
    "install": "fingerprint.sgl_probe.install",
    "patched": "fingerprint.sgl_probe.patched_files",
    "git_commit": "fingerprint.sgl_probe.git_commit",
    "git_modified": "fingerprint.sgl_probe.git_modified",
}
#: Runtime versions: fingerprint dict key -> attribute key.
FP_RUNTIME = {
    "python": "fingerprint.python.version",
    "torch": "fingerprint.torch.version",
    "cuda": "fingerprint.cuda.version",
    "hip": "fingerprint.hip.version",
    "nccl": "fingerprint.nccl.version",
    "driver": "fingerprint.driver.version",
    "gpu_count": "fingerprint.gpu.count",
    "gpu_models": "fingerprint.gpu.models",
}
#: The command line, secrets redacted.
FP_SERVER_ARGS = "fingerprint.server_args"
#: The allow-listed launcher env (redacted): one attribute per variable, and the names.
FP_LAUNCHER_ENV_PREFIX = "fingerprint.launcher_env."
FP_LAUNCHER_ENV_NAMES = "fingerprint.launcher_env_names"
FP_COLLECT_MS = "fingerprint.collect_ms"

# --- resource attributes --------------------------------------------------------------------
RUN_ID = "sgl_probe.run_id"
PROBE_VERSION = "sgl_probe.version"
SGLANG_VERSION = "sglang.version"
DEFAULT_SERVICE_NAME = "sglang"

# --- settings -------------------------------------------------------------------------------
ENV_ENABLE = "SGL_PROBE"
ENV_TRACE_DIR = "SGL_PROBE_TRACE_DIR"
ENV_SUMMARY_S = "SGL_PROBE_SUMMARY_S"
ENV_ALLOW = "SGL_PROBE_ENV_ALLOW"
ENV_TIMER = "SGL_PROBE_TIMER"
ENV_GPU_EVERY_MS = "SGL_PROBE_GPU_EVERY_MS"
ENV_RUN_ID = "SGL_PROBE_RUN_ID"
ENV_MAX_PENDING = "SGL_PROBE_MAX_PENDING"
ENV_DRAIN_S = "SGL_PROBE_DRAIN_S"
ENV_IDLE_FLUSH_S = "SGL_PROBE_IDLE_FLUSH_S"
ENV_NCCL_CONFIRM = "SGL_PROBE_NCCL_CONFIRM"

#: Prefixes whose variables are snapshotted; ``SGL_PROBE_ENV_ALLOW`` adds names or ``PREFIX*``.
DEFAULT_ENV_ALLOW = ("NCCL_", "CUDA_", "TORCH_", "SGLANG_", "OMP_", "PYTORCH_")
#: A name matching this is never captured with its value, whatever the allow-list says.
SECRET_NAME_PATTERN = r"TOKEN|KEY|SECRET|PASSW|PASSWD|PWD|CREDENTIAL|AUTH|COOKIE"

# --- metrics (Prometheus through SGLang's /metrics, and OTLP) --------------------------------
#: Family names, shared by both exporters; Prometheus exposes counters with ``_total`` and
#: histograms as ``_bucket`` / ``_count`` / ``_sum``.
METRIC_PHASE_SECONDS = "sgl_probe_phase_seconds"            # histogram, every phase of every timed step
METRIC_STEPS = "sgl_probe_steps"                            # counter (sgl_probe_steps_total)
METRIC_ACCEPT_LENGTH = "sgl_probe_spec_accept_length"       # histogram, verify phases
METRIC_DROPPED = "sgl_probe_dropped"                        # counter (sgl_probe_dropped_total)
METRIC_SPEC_SPEEDUP = "sgl_probe_spec_speedup"              # gauge: live verdict vs decode
METRIC_SPEC_BREAK_EVEN = "sgl_probe_spec_break_even_accept_length"  # gauge: break-even tau
METRIC_COUNTERS = (METRIC_STEPS, METRIC_DROPPED)
METRIC_HISTOGRAMS = (METRIC_PHASE_SECONDS, METRIC_ACCEPT_LENGTH)
METRIC_GAUGES = (METRIC_SPEC_SPEEDUP, METRIC_SPEC_BREAK_EVEN)
#: Labels of the phase histogram; the other metrics carry ``RANK_LABELS`` (steps also
#: ``forward_mode``, drops ``cause``).
RANK_LABELS = RANKS
PHASE_LABELS = ("phase", "forward_mode", "cuda_graph") + RANK_LABELS
#: Why what ``METRIC_DROPPED`` counts was lost, as the summary line's breakdown names it:
#: ``pending`` (steps: the drain was behind), ``link`` (spans: the exporter process), ``otlp`` and
#: ``trace_dir`` (spans: that output).
DROP_CAUSE_LABEL = "cause"
#: 0.1 ms to 10 s, neighbours at most 1.5x apart: a 0.2 ms decode and a 5 s stall both resolve.
PHASE_SECONDS_BUCKETS = tuple(round(m * 10.0 ** e, 6) for e in range(-4, 1)
                              for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8)) + (10.0,)
#: Accept length tau: 1 (nothing accepted) up to a few dozen draft tokens.
ACCEPT_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0,
                         12.0, 16.0, 24.0, 32.0)
ENV_METRICS = "SGL_PROBE_METRICS"
METRICS_VALUES = ("auto", "off")
