"""Testing API for sgl-probe (not used at runtime): assert that SGLang's workers got their env.

Public names (imported lazily, so the pytest plugin costs nothing until it is used):

- ``Collector`` (what the ``sgl_probe_collector`` fixture yields): OTLP receiver + launch env +
  ``wait_for_env_snapshots`` / ``env_snapshots`` / ``phase_spans`` / ``wait_for_phase_spans`` /
  ``nccl_confirmations`` / ``wait_for_nccl_confirmations`` / ``describe``.
- ``assert_env_propagated(snapshots, {"NCCL_PROTO": "LL"}, ranks=range(2), at="nccl_init")``,
  ``env_propagation_problems``, ``EnvPropagationError``, ``EnvProblem``.
- ``EnvSnapshot``, ``EnvSnapshots``, ``env_snapshots``, ``phase_spans``, ``nccl_confirmations``
  (the same queries on any list of received spans), ``ServerExited``.
- ``OTLPReceiver``, ``ReceivedSpan``, ``ReceivedMetric`` (:mod:`sgl_probe.testing.receiver`).
- ``free_port()``: a port for the server a test launches.

The pytest plugin itself is :mod:`sgl_probe.testing.plugin` (entry point ``pytest11: sgl_probe``).
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Collector": "collector",
    "ServerExited": "collector",
    "EnvSnapshot": "snapshots",
    "EnvSnapshots": "snapshots",
    "UNKNOWN": "snapshots",
    "env_snapshots": "queries",
    "phase_spans": "queries",
    "nccl_confirmations": "queries",
    "assert_env_propagated": "assertions",
    "env_propagation_problems": "assertions",
    "EnvPropagationError": "assertions",
    "EnvProblem": "assertions",
    "OTLPReceiver": "receiver",
    "ReceivedMetric": "receiver",
    "ReceivedSpan": "receiver",
    "free_port": "ports",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sgl_probe.testing' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"sgl_probe.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
