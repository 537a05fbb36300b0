"""The span contract's names as the testing API reads them.

Spelled out literally instead of imported from :mod:`sgl_probe.contract`: the testing API reads
spans the way a user's Jaeger query or dashboard would, so a renamed attribute in the probe must
fail the tests rather than follow silently. ``tests/test_testing_plugin.py`` checks every value
here against the contract.
"""

from __future__ import annotations

PHASES = ("decode", "extend", "draft", "verify", "draft_extend")
PHASE_SPAN_PREFIX = "sglang."
STEP_SPAN = "sglang.step"
SNAPSHOT_SPAN = "sgl_probe.env_snapshot"
#: ``nccl_confirm``: the extra snapshot sent with ``SGL_PROBE_NCCL_CONFIRM=1`` once NCCL has logged
#: what it read (it carries the ``nccl.confirmed.<VAR>`` attributes).
SNAPSHOT_POINTS = ("process_start", "nccl_init", "nccl_confirm")

SNAPSHOT_POINT = "sgl_probe.snapshot_point"
SNAPSHOT_TRIGGER = "sgl_probe.snapshot_trigger"
DIST_BACKEND = "sgl_probe.dist_backend"
ENV_PREFIX = "env."
LAUNCHER_ENV_PREFIX = "launcher_env."
ENV_DIFFERS = "sgl_probe.env.differs_from_launcher"
ENV_WITHHELD = "sgl_probe.env.withheld"
CONFIRMED_PREFIX = "nccl.confirmed."
CUDA_GRAPH = "sglang.cuda_graph"
TP_RANK = "sglang.tp_rank"
DP_RANK = "sglang.dp_rank"
PP_RANK = "sglang.pp_rank"
RUN_ID = "sgl_probe.run_id"

RUN_ID_VAR = "SGL_PROBE_RUN_ID"
LAUNCHER_ENV_VAR = "SGL_PROBE_LAUNCHER_ENV"
#: Prefixes the probe snapshots without being asked (``SGL_PROBE_ENV_ALLOW`` adds more).
DEFAULT_ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "SGLANG_", "OMP_", "PYTORCH_")

#: name here -> name in sgl_probe.contract, for the equality test.
CONTRACT_NAMES = {
    "PHASES": "PHASES", "PHASE_SPAN_PREFIX": "SPAN_PREFIX", "STEP_SPAN": "STEP_SPAN",
    "SNAPSHOT_SPAN": "ENV_SPAN", "SNAPSHOT_POINTS": "SNAPSHOT_POINTS", "SNAPSHOT_POINT": "SNAPSHOT_POINT",
    "ENV_PREFIX": "ENV_ATTR_PREFIX", "LAUNCHER_ENV_PREFIX": "LAUNCHER_ENV_PREFIX", "ENV_DIFFERS": "ENV_DIFFERS",
    "ENV_WITHHELD": "ENV_WITHHELD", "CONFIRMED_PREFIX": "NCCL_CONFIRMED_PREFIX", "CUDA_GRAPH": "CUDA_GRAPH",
    "RUN_ID": "RUN_ID", "RUN_ID_VAR": "ENV_RUN_ID", "DEFAULT_ENV_PREFIXES": "DEFAULT_ENV_ALLOW",
    "SNAPSHOT_TRIGGER": "SNAPSHOT_TRIGGER", "DIST_BACKEND": "DIST_BACKEND",
}
