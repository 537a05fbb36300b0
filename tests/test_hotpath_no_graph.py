""""Why was there no graph?": every reason, on objects laid out as SGLang 0.5.9 and 0.5.23 lay
theirs out (attribute names from their sources; ``tests/harness/check_probe_readers.py`` checks
the same on SGLang's own classes), and through the recorder's real phase wrapper."""

from __future__ import annotations

import enum
import logging
from types import SimpleNamespace as NS

import pytest

from sgl_probe import no_graph, targets
from sgl_probe.contract import NO_GRAPH_REASONS
from sgl_probe.instrument import Hook
from sgl_probe.recorder import Recorder


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    DRAFT_EXTEND = 4
    DRAFT_EXTEND_V2 = 5
    DLLM_EXTEND = 6


class EagerRunner:  # 0.5.14+: stands in the decode / prefill runner's place when graphs are off
    pass


def graph_runner(mode: str = "DECODE", max_bs: int | None = 8, capture_bs=None, old_field: bool = False):
    r = NS(capture_bs=capture_bs if capture_bs is not None else [1, 2, 4, 8])
    if max_bs is not None:
        r.max_bs = max_bs
    if old_field:  # 0.5.9's draft-extend runner keeps its mode here
        r.forward_mode = ForwardMode[mode]
    else:
        r.capture_forward_mode = ForwardMode[mode]
    return r


def model_runner_0_5_9(runner=None, piecewise=None, disabled=False):
    return NS(server_args=NS(disable_cuda_graph=disabled), graph_runner=runner,
              piecewise_cuda_graph_runner=piecewise)


def model_runner_0_5_23(runner=None, prefill=None, disabled=False):
    return NS(server_args=NS(disable_cuda_graph=disabled), decode_cuda_graph_runner=runner,
              prefill_cuda_graph_runner=prefill if prefill is not None else EagerRunner())


def why(kind: str, obj, mode: str, bs: int = 2) -> str:
    got = no_graph.reason_for(kind)(obj, mode, bs)
    assert got in NO_GRAPH_REASONS
    return got


LAYOUTS = {"0.5.9": model_runner_0_5_9, "0.5.23": model_runner_0_5_23}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_graphs_disabled(layout):
    make = LAYOUTS[layout]
    # --disable-cuda-graph: no runner was built, and the flag says so.
    worker = NS(model_runner=make(None, disabled=True))
    assert why("worker", worker, "DECODE") == "graphs_disabled"
    assert why("worker", worker, "EXTEND") == "graphs_disabled"
    # The flag alone (a runner left over) or the runner alone (never built, e.g. the CPU engine).
    assert why("worker", NS(model_runner=make(graph_runner(), disabled=True)), "DECODE") == "graphs_disabled"
    assert why("worker", NS(model_runner=make(None)), "DECODE") == "graphs_disabled"
    assert why("worker", NS(model_runner=make(EagerRunner())), "DECODE") == "graphs_disabled"
    spec = NS(target_worker=NS(model_runner=make(None)), cuda_graph_runner=None,
              cuda_graph_runner_for_draft_extend=None, model_runner=make(None))
    for kind, mode in (("spec_target", "TARGET_VERIFY"), ("draft", "DECODE"), ("draft_extend", "DRAFT_EXTEND")):
        assert why(kind, spec, mode) == "graphs_disabled", kind


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_too_large(layout):
    worker = NS(model_runner=LAYOUTS[layout](graph_runner("DECODE", max_bs=8)))
    assert why("worker", worker, "DECODE", bs=9) == "batch_too_large"
    assert why("worker", worker, "DECODE", bs=8) == "runner_refused"  # at the largest size: SGLang's other checks
    verify = NS(target_worker=NS(model_runner=LAYOUTS[layout](graph_runner("TARGET_VERIFY", max_bs=16))))
    assert why("spec_target", verify, "TARGET_VERIFY", bs=17) == "batch_too_large"
    # No max_bs attribute: the largest captured size.
    worker = NS(model_runner=LAYOUTS[layout](graph_runner("DECODE", max_bs=None, capture_bs=[1, 2, 3])))
    assert why("worker", worker, "DECODE", bs=4) == "batch_too_large"
    drafts = NS(target_worker=verify.target_worker, cuda_graph_runner=graph_runner("DECODE", max_bs=4),
                cuda_graph_runner_for_draft_extend=graph_runner("DRAFT_EXTEND_V2", max_bs=4))
    assert why("draft", drafts, "DECODE", bs=5) == "batch_too_large"
    assert why("draft_extend", drafts, "DRAFT_EXTEND_V2", bs=5) == "batch_too_large"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mode_not_captured(layout):
    make = LAYOUTS[layout]
    # A prefill with only a decode graph: prefill-shaped modes are not captured.
    worker = NS(model_runner=make(graph_runner("DECODE")))
    assert why("worker", worker, "EXTEND", bs=1) == "mode_not_captured"
    assert why("worker", worker, "MIXED", bs=1) == "mode_not_captured"
    # Under speculative decoding the target captures TARGET_VERIFY only.
    verify_only = NS(model_runner=make(graph_runner("TARGET_VERIFY")))
    assert why("worker", verify_only, "DECODE") == "mode_not_captured"
    # The draft-extend after a prefill runs in the prefill's mode; its runner captured DRAFT_EXTEND.
    ext = NS(target_worker=NS(model_runner=make(graph_runner("TARGET_VERIFY"))),
             cuda_graph_runner_for_draft_extend=graph_runner("DRAFT_EXTEND", old_field=True),
             model_runner=make(None))
    assert why("draft_extend", ext, "EXTEND", bs=1) == "mode_not_captured"
    assert why("draft_extend", ext, "DRAFT_EXTEND", bs=1) == "runner_refused"
    # A mode the decode runner did capture (a diffusion LLM's DLLM_EXTEND) is not "not captured".
    dllm = NS(model_runner=make(graph_runner("DLLM_EXTEND", max_bs=4)))
    assert why("worker", dllm, "DLLM_EXTEND", bs=5) == "batch_too_large"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_runner_refused(layout):
    make = LAYOUTS[layout]
    worker = NS(model_runner=make(graph_runner("DECODE", max_bs=8)))
    assert why("worker", worker, "DECODE", bs=3) == "runner_refused"
    # A prefill graph runner exists and declined this prefill.
    prefill = graph_runner("EXTEND")
    worker = NS(model_runner=make(graph_runner("DECODE"), prefill))
    assert why("worker", worker, "EXTEND", bs=1) == "runner_refused"
    # The draft's runner serves only the draft decode: the batch's mode is not held against it.
    drafts = NS(target_worker=NS(model_runner=make(graph_runner("TARGET_VERIFY"))),
                cuda_graph_runner=graph_runner("DECODE", max_bs=8))
    assert why("draft", drafts, "TARGET_VERIFY", bs=2) == "runner_refused"


def test_unknown_when_the_layout_is_not_understood():
    assert why("worker", None, "DECODE") == "unknown"
    assert why("worker", NS(model_runner=NS(server_args=NS())), "DECODE") == "unknown"
    assert why("worker", NS(model_runner=NS()), "EXTEND") == "unknown"
    assert why("spec_target", NS(), "TARGET_VERIFY") == "unknown"
    assert why("draft", NS(target_worker=NS(model_runner=NS())), "DECODE") == "unknown"

    class Sealed:  # a server-args object whose reads raise: the runner still tells
        @property
        def server_args(self):
            raise RuntimeError("sealed")

        decode_cuda_graph_runner = None

    assert why("worker", NS(model_runner=Sealed()), "DECODE") == "graphs_disabled"
    assert no_graph.reason_for(None)(NS(), "DECODE", 1) == "unknown"


def test_every_phase_target_says_where_its_runner_is():
    for t in targets.TARGETS:
        if t.role == "phase":
            assert t.runner in no_graph.BY_RUNNER, t.name


# -- through the recorder's phase wrapper (the hot path) ------------------------------------------

class CountingWorker:
    """A worker whose model runner counts how often the probe looked at it."""

    def __init__(self, runner) -> None:
        self.looks = 0
        self._mr = model_runner_0_5_23(runner)

    @property
    def model_runner(self):
        self.looks += 1
        return self._mr


def run_phase(rec: Recorder, target, obj, batch, result, mark=None):
    step_t = next(t for t in targets.TARGETS if t.role == "step")

    def body(self, *args, **kwargs):
        if mark is not None:
            mark()
        if isinstance(result, BaseException):
            raise result
        return result

    phase = rec.phase_method(Hook(target), body)
    step = rec.step_method(Hook(step_t), lambda sched, b: phase(obj, b))
    try:
        step(None, batch)
    except RuntimeError:
        pass
    return rec.steps.pop().phases[0]


def batch(mode: str, bs: int):
    return NS(forward_mode=ForwardMode[mode], seq_lens=[0] * bs, extend_num_tokens=3)


def test_recorder_asks_only_for_graph_less_phases():
    rec = Recorder("cpu", 100, logging.getLogger("x"))
    forward = next(t for t in targets.TARGETS if t.reader == "forward")
    worker = CountingWorker(graph_runner("DECODE", max_bs=4))
    ph = run_phase(rec, forward, worker, batch("DECODE", 2), NS(can_run_cuda_graph=True))
    assert ph.graph is True and ph.no_graph_reason is None and worker.looks == 0
    ph = run_phase(rec, forward, worker, batch("DECODE", 6), NS(can_run_cuda_graph=False))
    assert ph.no_graph_reason == "batch_too_large" and worker.looks == 1
    ph = run_phase(rec, forward, worker, batch("EXTEND", 1), NS(can_run_cuda_graph=False))
    assert ph.no_graph_reason == "mode_not_captured"
    # An exception from SGLang's call: no flag, no reason, the error is recorded.
    looks = worker.looks
    ph = run_phase(rec, forward, worker, batch("DECODE", 2), RuntimeError("boom"))
    assert ph.error is not None and ph.no_graph_reason is None and worker.looks == looks
    # No flag in the result: the graph-replay hook decides (the draft's case).
    draft_t = next(t for t in targets.TARGETS if t.runner == "draft")
    drafts = NS(target_worker=worker, cuda_graph_runner=graph_runner("DECODE", max_bs=4))
    ph = run_phase(rec, draft_t, drafts, batch("DECODE", 2), None,
                   mark=lambda: setattr(rec.tls.phase, "graph_hook", True))
    assert ph.graph_hook and ph.no_graph_reason is None
    ph = run_phase(rec, draft_t, drafts, batch("DECODE", 2), None)
    assert ph.no_graph_reason == "runner_refused"
    # A flag-less result on a flag-reading target, and a replay seen: a graph ran.
    ph = run_phase(rec, forward, worker, batch("DECODE", 2), NS(),
                   mark=lambda: setattr(rec.tls.phase, "graph_hook", True))
    assert ph.graph is None and ph.no_graph_reason is None
    # A layout the probe does not understand: unknown.
    ph = run_phase(rec, forward, object(), batch("DECODE", 2), NS(can_run_cuda_graph=False))
    assert ph.no_graph_reason == "unknown"
