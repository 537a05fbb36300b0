"""Read facts from a wrapped SGLang call: forward mode, batch size, token count, graph flag.

These run on the scheduler's hot path, so they only touch Python attributes and tensor shapes
(``len(seq_lens)`` reads the shape, never the data: no device sync). Each reader copes with the
argument spellings of every supported version; the table in :mod:`sgl_probe.targets` names
which reader serves which target.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Callable, NamedTuple, Optional

#: Modes that mean "prefill" for span purposes. TARGET_VERIFY is deliberately absent even though
#: SGLang's own ``is_extend()`` is true for it: filing graph-less verifies as extend is exactly
#: the misreading this tool exists to prevent.
EXTEND_MODES = frozenset({"EXTEND", "MIXED", "PREBUILT", "SPLIT_PREFILL", "DLLM_EXTEND"})


class Facts(NamedTuple):
    """What a reader learns on entry; ``phase`` None means "do not record this call"."""

    phase: Optional[str]
    mode: Optional[str]
    batch_size: Optional[int]
    num_tokens: Optional[int]


# Readers build their result with this: tuple.__new__ runs in C, where ``Facts(...)`` would run
# a Python-level __new__ on every wrapped call.
_facts = functools.partial(tuple.__new__, Facts)


_MODE_NAMES: dict[int, tuple[Any, Optional[str]]] = {}


def mode_name(batch: Any) -> Optional[str]:
    fm = getattr(batch, "forward_mode", None)
    if fm is None:
        return None
    # ForwardMode members are singletons; ``.name`` on an Enum goes through two Python-level
    # descriptor calls, a dict hit on id() through none. The member is kept so its id stays valid.
    hit = _MODE_NAMES.get(id(fm))
    if hit is not None:
        return hit[1]
    name = getattr(fm, "name", None)
    if isinstance(fm, enum.Enum) and len(_MODE_NAMES) < 256:
        _MODE_NAMES[id(fm)] = (fm, name)
    return name


def batch_size(batch: Any) -> Optional[int]:
    seq_lens = getattr(batch, "seq_lens", None)
    if seq_lens is not None:
        shape = getattr(seq_lens, "shape", None)  # a tensor: Tensor.__len__ is Python code
        if shape:
            return shape[0]
        try:
            return len(seq_lens)
        except TypeError:
            pass
    bs = getattr(batch, "batch_size", None)
    if callable(bs):
        bs = bs()
    return bs if isinstance(bs, int) else None


def extend_tokens(batch: Any) -> Optional[int]:
    n = getattr(batch, "extend_num_tokens", None)
    if isinstance(n, int):
        return n
    lens = getattr(batch, "extend_seq_lens_cpu", None) or getattr(batch, "extend_lens", None)
    if isinstance(lens, (list, tuple)):
        return int(sum(lens))
    return None


def _first_batch(args: tuple, kwargs: dict) -> Any:
    if args:
        return args[0]
    for key in ("batch", "model_worker_batch", "schedule_batch"):
        if key in kwargs:
            return kwargs[key]
    return None


def _phase_for_mode(mode: Optional[str]) -> Optional[str]:
    if mode == "DECODE":
        return "decode"
    if mode in EXTEND_MODES:
        return "extend"
    if mode == "TARGET_VERIFY":
        return "verify"
    if mode is not None and mode.startswith("DRAFT_EXTEND"):
        return "draft_extend"
    return None  # IDLE and anything unknown: not a timed phase


def _tokens_for(phase: Optional[str], batch: Any, bs: Optional[int], spec: dict) -> Optional[int]:
    """Tokens the phase runs through a model (target or draft), from shapes and server args.

    extend, and the draft-extend after a prefill: the prompt tokens. verify and the draft-extend
    after a verify (EAGLE v2 re-runs the whole verified window): ``bs * num_draft_tokens``.
    draft: the multi-step draft decode runs ``num_steps - 1`` forwards of ``bs * topk`` tokens
    (the first step's candidates come from the previous draft-extend). decode: ``bs``.
    """
    if phase == "extend" or (phase == "draft_extend" and mode_name(batch) in EXTEND_MODES):
        return extend_tokens(batch)
    if bs is None:
        return None
    if phase in ("verify", "draft_extend"):
        return bs * int(spec.get("num_draft_tokens") or 1)
    if phase == "draft":
        return bs * int(spec.get("topk") or 1) * max(int(spec.get("num_steps") or 1) - 1, 0)
    return bs


#: ``_phase_for_mode``, remembered per mode name (a few dozen exist).
_PHASE_OF: dict[Optional[str], Optional[str]] = {}
_UNKNOWN = object()


# ``step`` and ``forward`` run on every scheduler step: mode_name, batch_size, _phase_for_mode and
# _tokens_for are inlined there for what SGLang passes (a ForwardMode member already seen, a
# tensor of sequence lengths, a decode batch); anything else takes the functions themselves.


def step(target, args: tuple, kwargs: dict, spec: dict) -> Facts:
    batch = args[0] if args else _first_batch(args, kwargs)
    hit = _MODE_NAMES.get(id(getattr(batch, "forward_mode", None)))
    mode = hit[1] if hit is not None else mode_name(batch)
    shape = getattr(getattr(batch, "seq_lens", None), "shape", None)
    bs = shape[0] if shape else batch_size(batch)
    tokens = extend_tokens(batch) if mode in EXTEND_MODES else bs
    return _facts(("step", mode, bs, tokens))


def forward(target, args: tuple, kwargs: dict, spec: dict) -> Facts:
    """``TpModelWorker.forward_batch_generation(batch, forward_batch=None, pp_proxy_tensors=None,
    is_verify=False, ...)``; batch is None when a spec worker hands over a ForwardBatch."""
    batch = args[0] if args else _first_batch(args, kwargs)
    if batch is None:
        batch = kwargs.get("forward_batch", args[1] if len(args) > 1 else None)
    hit = _MODE_NAMES.get(id(getattr(batch, "forward_mode", None)))
    mode = hit[1] if hit is not None else mode_name(batch)
    if kwargs.get("is_verify", args[3] if len(args) > 3 else False) is True:
        phase, mode = "verify", "TARGET_VERIFY"
    else:
        phase = _PHASE_OF.get(mode, _UNKNOWN)
        if phase is _UNKNOWN:
            phase = _phase_for_mode(mode)
            if len(_PHASE_OF) < 256:
                _PHASE_OF[mode] = phase
    shape = getattr(getattr(batch, "seq_lens", None), "shape", None)
    bs = shape[0] if shape else batch_size(batch)
    return _facts((phase, mode, bs, bs if phase == "decode" else _tokens_for(phase, batch, bs, spec)))


def spec_call(target, args: tuple, kwargs: dict, spec: dict) -> Facts:
    """EAGLE draft / draft-extend / verify methods: ``(self, batch, ...)``. SGLang mutates the
    batch's forward mode inside these calls, so the table's mode (the one the call runs its
    forward in) wins over what is seen now; rows without one (the draft-extend after a prefill,
    which runs in the prefill's own EXTEND/MIXED mode) report the batch's mode. An IDLE batch
    (a data-parallel rank with no requests) is not a timed phase, as in :func:`forward`."""
    batch = _first_batch(args, kwargs)
    seen = mode_name(batch)
    if seen == "IDLE":
        return _facts((None, seen, 0, 0))
    phase = target.phases[0]
    bs = batch_size(batch)
    return _facts((phase, target.mode or seen, bs, _tokens_for(phase, batch, bs, spec)))


def draft_extend_after_decode_v1(target, args: tuple, kwargs: dict, spec: dict) -> Facts:
    """EAGLE v1 ``forward_draft_extend_after_decode(batch)``: unlike v2 it re-runs only the
    accepted tokens (``accept_length + 1`` per unfinished request, already on the host in
    ``batch.spec_info.accept_length_cpu``)."""
    facts = spec_call(target, args, kwargs, spec)
    if facts.phase is None:
        return facts
    accepted = getattr(getattr(_first_batch(args, kwargs), "spec_info", None), "accept_length_cpu", None)
    if isinstance(accepted, (list, tuple)) and all(isinstance(x, int) for x in accepted):
        facts = facts._replace(batch_size=len(accepted), num_tokens=sum(accepted) + len(accepted))
    return facts


def result_graph_attr(result: Any) -> Optional[bool]:
    """GenerationBatchResult.can_run_cuda_graph (0.5.5+), ModelRunnerOutput.can_run_graph."""
    for name in ("can_run_cuda_graph", "can_run_graph"):
        val = getattr(result, name, None)
        if isinstance(val, bool):
            return val
    return None


def result_graph_v1_verify(result: Any) -> Optional[bool]:
    """EAGLEWorker.verify returns (logits, verify_output, model_worker_batch, can_run_cuda_graph)."""
    if isinstance(result, tuple) and len(result) >= 4 and isinstance(result[3], bool):
        return result[3]
    return result_graph_attr(result)


def accept_length(args: tuple, kwargs: dict) -> Optional[tuple[int, float]]:
    """SGLang's accept length for one verify step, bonus token included: (bs, length).

    0.5.5-0.5.14: ``update_spec_metrics(bs, num_accepted_drafts)`` -> (n + bs) / bs.
    0.5.23: ``update_spec_metrics(bs, num_correct_drafts, num_accept_tokens, ...)`` -> tokens / bs.
    """
    bs = args[0] if args else kwargs.get("bs")
    if not isinstance(bs, int) or bs <= 0:
        return None
    accept_tokens = kwargs.get("num_accept_tokens", args[2] if len(args) > 2 else None)
    if isinstance(accept_tokens, int):
        return bs, accept_tokens / bs
    drafts = args[1] if len(args) > 1 else kwargs.get("num_accepted_tokens", kwargs.get("num_correct_drafts"))
    if isinstance(drafts, int):
        return bs, (drafts + bs) / bs
    return None


#: Readers whose common case the C hot path reads itself (``sgl_probe._hot``: the step and decode
#: shapes ``step`` and ``forward`` inline above), falling back to them for anything else.
_C_READERS = {"step": 1, "forward": 2}


def c_reader(target) -> tuple[int, dict, dict]:
    """For the C wrappers: which of their readers serves ``target`` (0: none), and the two
    look-up tables the Python readers fill (the C one only reads them)."""
    return _C_READERS.get(target.reader, 0), _MODE_NAMES, _PHASE_OF


EnterReader = Callable[[Any, tuple, dict, dict], Facts]
ENTER: dict[str, EnterReader] = {
    "step": step,
    "forward": forward,
    "spec_call": spec_call,
    "verify_v1": spec_call,
    "verify_v2": spec_call,
    "draft_extend_v1_decode": draft_extend_after_decode_v1,
}
LEAVE: dict[str, Callable[[Any], Optional[bool]]] = {
    "forward": result_graph_attr,
    "verify_v1": result_graph_v1_verify,
    "verify_v2": result_graph_attr,
}
