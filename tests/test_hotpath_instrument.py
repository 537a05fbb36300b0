"""``Instrumentor``: the role -> handler table, and ``uninstrument()`` as the exact inverse of
``instrument()``, with real imports of modules from a temporary package on ``sys.path``."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid

import pytest

from sgl_probe import config, targets
from sgl_probe.activate import Probe
from sgl_probe.instrument import HANDLERS
from sgl_probe.targets import Target

SOURCE = textwrap.dedent('''
    class Worker:
        def forward_batch_generation(self, batch):
            return "result"


    class Scheduler:
        def __init__(self, server_args=None, tp_rank=0):
            self.worker = Worker()

        def run_batch(self, batch):
            return self.worker.forward_batch_generation(batch)
''')


class Batch:
    forward_mode = None
    seq_lens = (1, 2)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh package with two target modules, ``sched`` and ``worker``, neither imported yet."""
    name = "sglprobe_targets_" + uuid.uuid4().hex[:8]
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "sched.py").write_text(SOURCE)
    (root / "worker.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for key in ("SGL_PROBE_RUN_ID", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SGL_PROBE_SUMMARY_S", "0")
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def table(pkg: str) -> tuple[Target, ...]:
    return (
        Target("step", ("step",), pkg + ".sched", "Scheduler.run_batch", "step"),
        Target("identity", ("identity",), pkg + ".sched", "Scheduler.__init__", "identity"),
        Target("phase", ("decode", "extend"), pkg + ".worker", "Worker.forward_batch_generation", "forward"),
    )


def wrapped(cls, attr: str) -> bool:
    return getattr(vars(cls)[attr], "_self_sgl_probe_hook", None) is not None


def test_every_role_has_a_handler():
    assert set(HANDLERS) == set(targets.ROLES)
    assert {r for r, h in HANDLERS.items() if h.hot} == {"step", "phase", "graph", "graph_launch", "accept"}


def test_uninstrument_disarms_import_hooks_and_instrument_works_again(package):
    probe = Probe(config.load(), targets=table(package))
    inst = probe.instrumentor
    inst.instrument()
    inst.uninstrument()
    sched = importlib.import_module(package + ".sched")  # imported after uninstrument
    assert not wrapped(sched.Scheduler, "run_batch") and not wrapped(sched.Scheduler, "__init__")
    assert not inst.hooks
    inst.instrument()  # the module is loaded now: applied at once
    assert wrapped(sched.Scheduler, "run_batch") and wrapped(sched.Scheduler, "__init__")
    worker = importlib.import_module(package + ".worker")  # first imported while instrumented
    assert wrapped(worker.Worker, "forward_batch_generation")
    # The wrappers do their job: a step with one phase is recorded.
    count = probe.recorder.step_count
    sched.Scheduler.run_batch(type("S", (), {"worker": worker.Worker()})(), Batch())
    assert probe.recorder.step_count == count + 1
    inst.uninstrument()
    for cls, attr in ((sched.Scheduler, "run_batch"), (sched.Scheduler, "__init__"),
                      (worker.Worker, "forward_batch_generation")):
        assert not wrapped(cls, attr), attr
    assert vars(sched.Scheduler)["run_batch"].__qualname__ == "Scheduler.run_batch"


def test_uninstrument_after_some_imports_leaves_later_imports_alone(package):
    probe = Probe(config.load(), targets=table(package))
    inst = probe.instrumentor
    inst.instrument()
    sched = importlib.import_module(package + ".sched")
    ours = vars(sched.Scheduler)["run_batch"]
    assert wrapped(sched.Scheduler, "run_batch")
    inst.uninstrument()
    assert vars(sched.Scheduler)["run_batch"] is ours.__wrapped__  # the original, put back
    worker = importlib.import_module(package + ".worker")  # its hook was registered, never fired
    assert not wrapped(worker.Worker, "forward_batch_generation")
    # Instrumenting twice in a row registers and applies once.
    inst.instrument()
    inst.instrument()
    assert len(inst.hooks) == 3
    assert wrapped(worker.Worker, "forward_batch_generation")
    inst.uninstrument()
    assert not wrapped(worker.Worker, "forward_batch_generation") and not inst.hooks
