"""A scheduler-shaped module for the CPU-machine benchmarks, wrapped by the real probe through a
target table of its own (the mechanism the GPU benchmarks use too). Not a stand-in for SGLang:
the end-to-end tests run the real server; this is a loop whose cost the benchmark controls."""

from __future__ import annotations

import sys
import types
from typing import Callable

#: The table's roles that a benchmark can choose from (``identity`` is always there).
ROLES = ("step", "phase", "graph")


def install(name: str, forward: Callable[[], None]) -> type:
    """Module ``name`` with ``GraphRunner``, ``Worker`` and ``Scheduler``: ``Scheduler.run_batch``
    calls ``Worker.forward_batch_generation``, which runs ``forward()``, replays a graph and
    returns SGLang's result shape. Returns ``Scheduler``."""
    from tests.workload import Result

    mod = types.ModuleType(name)

    class GraphRunner:
        def replay(self):
            return None

    class Worker:
        def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False):
            forward()
            GraphRunner().replay()
            return Result(True)

    class Scheduler:
        def __init__(self, server_args=None, tp_rank: int = 0, pp_rank: int = 0, dp_rank=None) -> None:
            self.worker = Worker()

        def run_batch(self, batch):
            return self.worker.forward_batch_generation(batch)

    for cls in (GraphRunner, Worker, Scheduler):
        cls.__module__ = name
        setattr(mod, cls.__name__, cls)
    sys.modules[name] = mod
    return Scheduler


def table(name: str, roles: tuple = ROLES) -> tuple:
    """The probe's target table over module ``name``, only ``roles`` of it (and the identity)."""
    from sgl_probe.targets import Target

    every = (
        Target("step", ("step",), name, "Scheduler.run_batch", "step"),
        Target("identity", ("identity",), name, "Scheduler.__init__", "identity"),
        Target("phase", ("decode", "extend"), name, "Worker.forward_batch_generation", "forward"),
        Target("graph", ("graph",), name, "GraphRunner.replay", "graph"),
    )
    return tuple(t for t in every if t.role in roles or t.role == "identity")
