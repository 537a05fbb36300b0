"""The probe's readers fed SGLang's own objects from the installed version.

Mainly ``sglang.cuda_graph`` = true, which a CPU-only machine cannot produce for real.

Runs INSIDE an SGLang harness venv where sgl-probe is installed from its wheel; started by
``tests/test_spec_eagle.py``. On a CPU machine every real step runs without a graph (SGLang's
CPU graph runner needs the intel_amx backend on AMX hardware), so the real server can only show
``false``. This script shows the ``true`` path through the probe's real code:

1. result objects: SGLang's own ``GenerationBatchResult`` (what ``TpModelWorker.forward_batch_
   generation`` and ``EAGLEWorkerV2.verify`` return), ``ModelRunnerOutput`` and, for EAGLE v1,
   the ``(logits, verify_output, batch, can_run_cuda_graph)`` tuple of ``EAGLEWorker.verify``,
   built from the installed version with the flag true and false, go through the probe's leave
   reader of every phase target of the table that resolves here, then through ``Recorder`` and
   the span builder into span attributes (through the probe's replacement methods);
2. graph-replay hooks: with the probe activated in this process, SGLang's own graph-runner
   classes are wrapped by the probe's table; calling the wrapped ``execute``/``replay`` of each
   (on a bare instance: the method body itself cannot run without a GPU and raises, which is
   expected and ignored) inside an open draft / draft-extend / decode phase must mark that phase;
3. spec readers on SGLang's ``ForwardMode.IDLE`` (no phase) and, where the installed version has
   EAGLE v1, the token count of ``forward_draft_extend_after_decode`` from its own
   ``EagleDraftInput.accept_length_cpu``.
4. "why no graph": the attributes the reasons read exist in this version's SGLang classes, and
   the reasons come out right on SGLang's own graph-runner classes (bare instances given the
   fields their ``__init__`` sets: ``max_bs``, the captured forward mode) and ``ForwardMode``;
0. before any of that: ``uninstrument()`` right after activation, then SGLang's worker module
   imported: nothing is wrapped; ``instrument()`` again wraps every target loaded by then.

usage: python check_probe_readers.py  -> one JSON object on stdout
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import re
import sys
import types

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
os.environ["SGL_PROBE"] = "1"
os.environ["SGL_PROBE_SUMMARY_S"] = "0"
for var in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT", "SGL_PROBE_TRACE_DIR"):
    os.environ.pop(var, None)

from sgl_probe import activate as probe_activate  # noqa: E402
from sgl_probe import no_graph, readers, spans, targets  # noqa: E402
from sgl_probe.drain import resolve_step  # noqa: E402
from sgl_probe.sinks import make_resource  # noqa: E402
from sgl_probe.instrument import Hook, resolve  # noqa: E402

PROBE = probe_activate.activate()  # before any sglang import: the table wraps modules as they load


def wrapped_targets() -> tuple[list, list]:
    """(targets the probe has wrapped, targets that could be) among the loaded modules."""
    wrapped, loaded = [], []
    for t in targets.TARGETS:
        mod = sys.modules.get(t.module)
        owner, attr = resolve(mod, t.qualname) if mod is not None else (None, None)
        if owner is not None:
            loaded.append(t.name)
            if getattr(vars(owner)[attr], "_self_sgl_probe_hook", None) is not None:
                wrapped.append(t.name)
    return wrapped, loaded


PROBE.instrumentor.uninstrument()
import sglang.srt.managers.tp_worker  # noqa: E402,F401  (and, through it, most target modules)

_off, _loaded = wrapped_targets()
PROBE.instrumentor.instrument()
_again, _ = wrapped_targets()
UNINSTRUMENT = {"loaded": _loaded, "wrapped_while_off": _off, "wrapped_again": _again}

import torch  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.model_runner import ModelRunnerOutput  # noqa: E402

SPEC = {"algorithm": "EAGLE3", "num_steps": 3, "topk": 2, "num_draft_tokens": 4}
OUT: dict = {"sglang_version": PROBE.version, "leave": [], "spans": [], "graph_hooks": [], "idle": [],
             "v1_draft_extend": None, "uninstrument": UNINSTRUMENT, "no_graph": {}}


def result_objects(flag: bool) -> dict:
    return {
        "GenerationBatchResult": GenerationBatchResult(can_run_cuda_graph=flag),
        "ModelRunnerOutput": ModelRunnerOutput(logits_output=None, can_run_graph=flag),
        "EAGLEWorker.verify tuple": (None, None, None, flag),
    }


# Which objects each leave reader receives from SGLang (per the call it is attached to).
RECEIVES = {
    "forward": ("GenerationBatchResult", "ModelRunnerOutput"),
    "verify_v2": ("GenerationBatchResult",),
    "verify_v1": ("EAGLEWorker.verify tuple",),
}


def resolved_targets():
    for t in targets.TARGETS:
        try:
            mod = importlib.import_module(t.module)
        except Exception:
            continue
        if resolve(mod, t.qualname)[0] is not None:
            yield t, mod


def batch(mode: str, bs: int = 2):
    return types.SimpleNamespace(forward_mode=ForwardMode[mode], seq_lens=torch.zeros(bs, dtype=torch.int64),
                                 extend_num_tokens=7)


def step_spans(rec, phase_target, phase_batch, result, mark=None):
    """One step with one phase through the probe's own replacement methods (``Recorder.
    step_method`` / ``phase_method`` around stand-in bodies) and the span builder; returns
    {span name: attributes}. ``mark`` runs while the phase is open (graph hooks)."""
    step_t = next(t for t in targets.TARGETS if t.role == "step")

    def phase_body(obj, *args, **kwargs):
        if mark is not None:
            mark()
        return result

    phase = rec.phase_method(Hook(phase_target), phase_body)
    step = rec.step_method(Hook(step_t), lambda obj, *a, **k: phase(None, phase_batch))
    n = rec.step_count
    step(None, phase_batch)
    assert rec.step_count == n + 1 and rec.steps and rec.steps[-1].phases, phase_target.name
    st = rec.steps.pop()
    built = spans.build_step_spans(resolve_step(st, rec.timer), "graph-check", {"tp_rank": 0, "dp_rank": 0},
                                   SPEC, make_resource({}, "graph-check", PROBE.version))
    return {s.name: dict(s.attributes) for s in built}


def main() -> int:
    logging.getLogger("sgl_probe").setLevel(logging.ERROR)
    rec = PROBE.recorder
    table = list(resolved_targets())
    phase_modes = {"verify": "DECODE", "draft": "DECODE", "draft_extend": "DECODE", "decode": "DECODE",
                   "extend": "EXTEND"}
    # 1. result objects through every resolved leave reader, then into spans
    for t, _ in table:
        if t.role != "phase" or t.reader not in RECEIVES:
            continue
        leave = readers.LEAVE[t.reader]
        for flag in (True, False):
            for kind in RECEIVES[t.reader]:
                obj = result_objects(flag)[kind]
                got = leave(obj)
                OUT["leave"].append({"target": t.name, "reader": t.reader, "object": kind, "flag": flag, "read": got})
                attrs = step_spans(rec, t, batch(phase_modes[t.phases[0]]), obj)
                phase_span = next(n for n in attrs if n != "sglang.step")
                OUT["spans"].append({"target": t.name, "object": kind, "flag": flag, "span": phase_span,
                                     "phase_cuda_graph": attrs[phase_span]["sglang.cuda_graph"],
                                     "step_cuda_graph": attrs["sglang.step"]["sglang.cuda_graph"]})
    # 2. SGLang's graph-runner methods, wrapped by the probe, mark the open phase
    phase_for = {  # which phase opens the runner in SGLang
        "EAGLEDraftCudaGraphRunner": "draft",
        "EAGLEDraftExtendCudaGraphRunner": "draft_extend",
    }
    by_phase = {}
    for t, _ in table:
        if t.role == "phase":
            by_phase.setdefault(t.phases[0], t)
    for t, mod in table:
        if t.role != "graph":
            continue
        owner, attr = resolve(mod, t.qualname)
        method = getattr(owner, attr)
        wrapped_by_probe = getattr(vars(owner)[attr], "_self_sgl_probe_hook", None) is not None
        phase = phase_for.get(t.qualname.split(".")[0], "decode")
        pt = by_phase[phase]
        raised: list = []

        n_args = sum(1 for p in inspect.signature(vars(owner)[attr].__wrapped__).parameters.values()
                     if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD) - 1

        def call(method=method, owner=owner, n_args=n_args):
            try:
                method(object.__new__(owner), *([None] * n_args))
            except Exception as exc:  # the body needs a GPU-built runner; only the hook matters here
                raised.append(type(exc).__name__)

        attrs = step_spans(rec, pt, batch("DECODE"), None, mark=call)
        phase_span = next(n for n in attrs if n != "sglang.step")
        OUT["graph_hooks"].append({"target": t.name, "wrapped_by_probe": wrapped_by_probe, "phase": phase_span,
                                   "phase_cuda_graph": attrs[phase_span]["sglang.cuda_graph"],
                                   "step_cuda_graph": attrs["sglang.step"]["sglang.cuda_graph"],
                                   "body_raised": raised[0] if raised else None})
    # 3. IDLE batches are no phase; EAGLE v1 draft-extend after decode counts accepted tokens
    for t, _ in table:
        if t.role == "phase" and t.reader in readers.ENTER and t.reader != "step":
            facts = readers.ENTER[t.reader](t, (batch("IDLE", 0),), {}, SPEC)
            OUT["idle"].append({"target": t.name, "phase": facts.phase})
    v1 = next((t for t, _ in table if t.qualname == "EAGLEWorker.forward_draft_extend_after_decode"), None)
    if v1 is not None:
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        b = batch("DECODE", 4)  # four requests ran verify, one finished there
        b.spec_info = EagleDraftInput(accept_length_cpu=[1, 0, 2])
        facts = readers.ENTER[v1.reader](v1, (b,), {}, SPEC)
        OUT["v1_draft_extend"] = {"phase": facts.phase, "mode": facts.mode, "batch_size": facts.batch_size,
                                  "num_tokens": facts.num_tokens}
    OUT["no_graph"] = no_graph_report(table)
    json.dump(OUT, sys.stdout)
    return 0


# -- 4. why no graph -------------------------------------------------------------------------------

def _sources(cls) -> str:
    """The source of every SGLang module ``cls`` and its bases live in."""
    out = []
    for base in cls.__mro__:
        mod = sys.modules.get(base.__module__)
        if mod is not None and base.__module__.startswith("sglang."):
            try:
                out.append(inspect.getsource(mod))
            except (OSError, TypeError):
                pass
    return "\n".join(out)


def provides(cls, name: str) -> bool:
    """SGLang's class has ``name``: a property / class attribute, or one its code assigns."""
    return any(name in vars(base) for base in cls.__mro__) or \
        re.search(r"self\.%s\s*[:=]" % re.escape(name), _sources(cls)) is not None


def bare(cls, **fields):
    """An instance of SGLang's own class without running its (GPU-bound) __init__."""
    obj = object.__new__(cls)
    for key, value in fields.items():
        setattr(obj, key, value)
    return obj


def no_graph_report(table) -> dict:
    from sglang.srt.model_executor.model_runner import ModelRunner

    owners = {t.qualname: resolve(mod, t.qualname)[0] for t, mod in table}
    graph_classes = {t.qualname.split(".")[0]: owners[t.qualname] for t, _ in table if t.role == "graph"}
    # What the reasons read, per runner kind: (owner attribute, alternatives on the model runner).
    layout = {"ModelRunner.decode runner": any(provides(ModelRunner, n) for n in no_graph._DECODE_RUNNER),
              "ModelRunner.server_args": provides(ModelRunner, "server_args")}
    for t, _ in table:
        if t.role != "phase":
            continue
        owner = owners[t.qualname]
        needs = {"worker": ("model_runner",), "spec_target": ("target_worker",),
                 "draft": ("target_worker", "cuda_graph_runner"),
                 "draft_extend": ("target_worker", "cuda_graph_runner_for_draft_extend")}[t.runner]
        for name in needs:
            layout[f"{owner.__name__}.{name}"] = provides(owner, name)
        if t.runner == "draft_extend":
            layout[f"{owner.__name__}.draft model runner"] = provides(owner, "draft_runner") or \
                provides(owner, "model_runner")
    target_cls = graph_classes.get("DecodeCudaGraphRunner") or graph_classes["CudaGraphRunner"]
    draft_cls = graph_classes["EAGLEDraftCudaGraphRunner"]
    ext_cls = graph_classes["EAGLEDraftExtendCudaGraphRunner"]
    for cls in (target_cls, draft_cls, ext_cls):
        layout[f"{cls.__name__}.max_bs"] = provides(cls, "max_bs")
    for cls in (target_cls, ext_cls):  # the draft's runner serves one mode only: not compared
        layout[f"{cls.__name__}.captured mode"] = provides(cls, "capture_forward_mode") or \
            provides(cls, "forward_mode")

    def runner(cls, mode: str, max_bs: int = 8):
        # 0.5.5-0.5.13's draft-extend runner keeps its mode in ``forward_mode``, later ones in
        # ``capture_forward_mode``: set the one this version's class assigns.
        field = "capture_forward_mode" if provides(cls, "capture_forward_mode") else "forward_mode"
        return bare(cls, max_bs=max_bs, capture_bs=list(range(1, max_bs + 1)), **{field: ForwardMode[mode]})

    def model_runner(decode, prefill=None, disabled=False):
        return bare(ModelRunner, server_args=types.SimpleNamespace(disable_cuda_graph=disabled),
                    decode_cuda_graph_runner=decode, graph_runner=decode, prefill_cuda_graph_runner=prefill,
                    piecewise_cuda_graph_runner=prefill)

    try:
        from sglang.srt.model_executor.runner.eager_runner import EagerRunner  # 0.5.14+
        eager = bare(EagerRunner)
    except ImportError:
        eager = None
    ns = types.SimpleNamespace
    ext_mode = "DRAFT_EXTEND_V2"  # the draft-extend after a verify (v2; v1's runner captures DRAFT_EXTEND)
    mr_verify = model_runner(runner(target_cls, "TARGET_VERIFY"))
    spec = ns(target_worker=ns(model_runner=mr_verify), cuda_graph_runner=runner(draft_cls, "DECODE", 4),
              cuda_graph_runner_for_draft_extend=runner(ext_cls, ext_mode, 4), model_runner=model_runner(None))
    cases = {  # name: (runner kind, worker, mode, batch size, expected)
        "flag": ("worker", ns(model_runner=model_runner(runner(target_cls, "DECODE"), disabled=True)),
                 "DECODE", 2, "graphs_disabled"),
        "no runner": ("worker", ns(model_runner=model_runner(None)), "DECODE", 2, "graphs_disabled"),
        "eager runner": ("worker", ns(model_runner=model_runner(eager or None)), "DECODE", 2, "graphs_disabled"),
        "decode too large": ("worker", ns(model_runner=model_runner(runner(target_cls, "DECODE"))), "DECODE", 9,
                             "batch_too_large"),
        "decode refused": ("worker", ns(model_runner=model_runner(runner(target_cls, "DECODE"))), "DECODE", 8,
                           "runner_refused"),
        "extend": ("worker", ns(model_runner=model_runner(runner(target_cls, "DECODE"))), "EXTEND", 1,
                   "mode_not_captured"),
        "decode on a verify graph": ("worker", ns(model_runner=mr_verify), "DECODE", 2, "mode_not_captured"),
        "verify too large": ("spec_target", spec, "TARGET_VERIFY", 9, "batch_too_large"),
        "verify refused": ("spec_target", spec, "TARGET_VERIFY", 3, "runner_refused"),
        "draft too large": ("draft", spec, "DECODE", 5, "batch_too_large"),
        "draft_extend refused": ("draft_extend", spec, ext_mode, 4, "runner_refused"),
        "draft_extend after prefill": ("draft_extend", spec, "EXTEND", 1, "mode_not_captured"),
    }
    reasons = {}
    for name, (kind, obj, mode, bs, want) in cases.items():
        reasons[name] = {"got": no_graph.reason_for(kind)(obj, mode, bs), "want": want}
    return {"layout": layout, "reasons": reasons, "eager_runner": eager is not None}


if __name__ == "__main__":
    sys.exit(main())
