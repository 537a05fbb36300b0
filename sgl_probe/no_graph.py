"""Why a phase ran without a CUDA graph, from SGLang's own state (``contract.NO_GRAPH_REASONS``).

Asked only for a phase whose graph flag came out false, on the scheduler thread right after the
wrapped call returned (SGLang may swap its graph runners at run time, e.g. adaptive speculative
decoding in 0.5.14+, so later would be too late). It only reads attributes of the object the call
ran on: no call into SGLang, no device access. Anything unexpected gives ``unknown``, never an
error.

Where SGLang decides, in every supported version (``ModelRunner._forward_raw``, the EAGLE
workers' ``draft`` / ``verify`` / ``forward_draft_extend_after_decode`` /
``_draft_extend_for_decode``): a graph runs when a runner exists (none is built with
``--disable-cuda-graph``; 0.5.14+ may put an ``EagerRunner`` in its place), the forward mode is
the one it captured (``capture_forward_mode``: DECODE, or TARGET_VERIFY for the target model under
speculative decoding; DRAFT_EXTEND(_V2) for the draft-extend runner; prefill-shaped modes only
through a separate prefill / piecewise runner), and the runner's ``can_run`` / ``can_run_graph``
accepts the batch: a batch size up to ``max_bs`` (the largest captured), plus conditions this
module does not second-guess (data-parallel sync, padding disabled, encoder lengths, two-batch
overlap...), reported as ``runner_refused``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sgl_probe.contract import NO_GRAPH_REASONS
from sgl_probe.readers import EXTEND_MODES

GRAPHS_DISABLED, BATCH_TOO_LARGE, MODE_NOT_CAPTURED, RUNNER_REFUSED, UNKNOWN = NO_GRAPH_REASONS

_MISSING = object()
#: A model runner's decode / verify graph runner: 0.5.14+, 0.5.x, older.
_DECODE_RUNNER = ("decode_cuda_graph_runner", "graph_runner", "cuda_graph_runner")
#: A model runner's prefill-shaped graph runner: 0.5.14+, 0.5.5-0.5.13 (piecewise, opt-in).
_PREFILL_RUNNER = ("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner")


def _first(obj: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(obj, name, _MISSING)
        if value is not _MISSING:
            return value
    return _MISSING


def _live(runner: Any) -> bool:
    """A graph runner that can replay something (not absent, not 0.5.14+'s eager stand-in)."""
    return runner is not None and type(runner).__name__ != "EagerRunner"


def _flag_disabled(model_runner: Any) -> bool:
    try:
        return getattr(model_runner.server_args, "disable_cuda_graph", None) is True
    except Exception:  # 0.5.23 seals some server-args reads; the runner tells the rest
        return False


def _captured_mode(runner: Any) -> Optional[str]:
    # The draft-extend runner of 0.5.5-0.5.13 keeps its mode in ``forward_mode``.
    mode = getattr(runner, "capture_forward_mode", None) or getattr(runner, "forward_mode", None)
    name = getattr(mode, "name", None)
    return name if isinstance(name, str) else None


def _max_bs(runner: Any) -> Optional[int]:
    max_bs = getattr(runner, "max_bs", None)
    if isinstance(max_bs, int):
        return max_bs
    sizes = getattr(runner, "capture_bs", None)
    if isinstance(sizes, (list, tuple)) and sizes and all(isinstance(x, int) for x in sizes):
        return max(sizes)
    return None


#: id(runner) -> (runner, (live, captured mode, max bs)). What a runner captured is fixed when it is
#: built, and runners live as long as the server (a swapped-in one gets its own entry), so these
#: are read once per runner: an Enum's ``.name`` alone costs more than the rest of a reason.
_RUNNERS: dict[int, tuple[Any, tuple[bool, Optional[str], Optional[int]]]] = {}


def _runner_facts(runner: Any) -> tuple[bool, Optional[str], Optional[int]]:
    hit = _RUNNERS.get(id(runner))
    if hit is not None and hit[0] is runner:
        return hit[1]
    live = _live(runner)
    facts = (live, _captured_mode(runner), _max_bs(runner)) if live else (False, None, None)
    if len(_RUNNERS) < 64:
        _RUNNERS[id(runner)] = (runner, facts)
    return facts


def decide(mode: Optional[str], batch_size: Optional[int], disabled: bool, runner: Any,
           prefill_runner: Any = _MISSING, check_mode: bool = True) -> str:
    """The reason, from what was read off SGLang's objects. ``runner``: the graph runner that
    serves this phase (``_MISSING`` when the layout was not understood); ``prefill_runner``: the
    one that could serve a prefill-shaped mode; ``check_mode`` False where the runner is only ever
    used for this phase (the draft's multi-step decode), whatever mode the batch shows."""
    if disabled:
        return GRAPHS_DISABLED
    if runner is _MISSING:
        live, captured, max_bs = False, None, None
    else:
        live, captured, max_bs = _runner_facts(runner)
    if check_mode and mode in EXTEND_MODES and not (live and captured == mode):
        if prefill_runner is not _MISSING and _runner_facts(prefill_runner)[0]:
            return RUNNER_REFUSED
        if live:
            return MODE_NOT_CAPTURED
        return UNKNOWN if runner is _MISSING else GRAPHS_DISABLED
    if runner is _MISSING:
        return UNKNOWN
    if not live:
        return GRAPHS_DISABLED
    if check_mode and captured is not None and mode is not None and mode != captured:
        return MODE_NOT_CAPTURED
    if max_bs is not None and isinstance(batch_size, int) and batch_size > max_bs:
        return BATCH_TOO_LARGE
    return RUNNER_REFUSED


# -- where each phase target finds its runner --------------------------------------------------
# Each takes the object the wrapped call ran on (``self``) and the phase's mode and batch size.

def _on_model_runner(mr: Any, mode: Optional[str], bs: Optional[int]) -> str:
    prefill = _first(mr, _PREFILL_RUNNER) if mode in EXTEND_MODES else _MISSING
    return decide(mode, bs, _flag_disabled(mr), _first(mr, _DECODE_RUNNER), prefill)


def worker(obj: Any, mode: Optional[str], bs: Optional[int]) -> str:
    """``TpModelWorker``: its own model runner (the target model's)."""
    return _on_model_runner(obj.model_runner, mode, bs)


def spec_target(obj: Any, mode: Optional[str], bs: Optional[int]) -> str:
    """An EAGLE worker's verify: the target worker's model runner (v1 attribute, v2 property)."""
    return _on_model_runner(obj.target_worker.model_runner, mode, bs)


def draft(obj: Any, mode: Optional[str], bs: Optional[int]) -> str:
    """The EAGLE draft's multi-step decode: the worker's ``cuda_graph_runner`` (v1 and v2)."""
    return decide(mode, bs, _flag_disabled(obj.target_worker.model_runner),
                  getattr(obj, "cuda_graph_runner", _MISSING), check_mode=False)


def draft_extend(obj: Any, mode: Optional[str], bs: Optional[int]) -> str:
    """The EAGLE draft-extend: ``cuda_graph_runner_for_draft_extend`` after a verify; after a
    prefill (EXTEND/MIXED) only the draft model runner's prefill runner could serve it."""
    draft_mr = getattr(obj, "draft_runner", None) or getattr(obj, "model_runner", None)
    return decide(mode, bs, _flag_disabled(obj.target_worker.model_runner),
                  getattr(obj, "cuda_graph_runner_for_draft_extend", _MISSING),
                  _first(draft_mr, _PREFILL_RUNNER) if draft_mr is not None else _MISSING)


Locate = Callable[[Any, Optional[str], Optional[int]], str]
#: ``Target.runner`` -> how that call's graph decision is explained.
BY_RUNNER: dict[str, Locate] = {
    "worker": worker,
    "spec_target": spec_target,
    "draft": draft,
    "draft_extend": draft_extend,
}


def reason_for(runner_kind: Optional[str]) -> Locate:
    """The hot path's function for a phase target: never raises, ``unknown`` when it cannot tell."""
    locate = BY_RUNNER.get(runner_kind) if runner_kind is not None else None
    if locate is None:
        return lambda obj, mode, bs: UNKNOWN

    def reason(obj: Any, mode: Optional[str], bs: Optional[int]) -> str:
        try:
            return locate(obj, mode, bs)
        except Exception:
            return UNKNOWN

    return reason
