"""Who this scheduler process is: ranks and speculative-decoding settings.

Read once, in ``Scheduler.__init__`` before the original runs (NCCL init happens inside it).
Up to 0.5.12 the ranks are constructor arguments; 0.5.23 publishes them in
``sglang.srt.runtime_context`` before building the Scheduler, which then takes none.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

_RANKS = ("tp_rank", "pp_rank", "dp_rank", "attn_tp_rank", "attn_dp_rank", "moe_ep_rank")


def _bind(wrapped: Callable, args: tuple, kwargs: dict) -> dict:
    try:
        return dict(inspect.signature(wrapped).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return dict(kwargs)


def read_identity(wrapped: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = _bind(wrapped, args, kwargs)
    ident: dict[str, Any] = {}
    for key in _RANKS:
        val = bound.get(key)
        if isinstance(val, int):
            ident[key] = val
    ctx_mod = sys.modules.get("sglang.srt.runtime_context")
    if ctx_mod is not None and "tp_rank" not in ident:
        try:
            par = ctx_mod.get_parallel()
        except Exception:
            par = None
        for key in _RANKS:
            try:
                val = getattr(par, key)
            except Exception:  # unpublished names raise, by design
                continue
            if isinstance(val, int):
                ident[key] = val
    if "dp_rank" not in ident and "tp_rank" in ident:
        ident["dp_rank"] = 0  # SGLang passes None without data parallelism
    gpu = bound.get("gpu_id")
    if isinstance(gpu, int):
        ident["gpu_id"] = gpu
    return ident


def read_spec(args: tuple, kwargs: dict) -> dict[str, Any]:
    server_args = kwargs.get("server_args", args[0] if args else None)
    algo = getattr(server_args, "speculative_algorithm", None)
    if not algo or str(algo).upper() == "NONE":
        return {}
    spec = {"algorithm": str(getattr(algo, "name", algo))}
    for key, attr in (("num_steps", "speculative_num_steps"), ("topk", "speculative_eagle_topk"),
                      ("num_draft_tokens", "speculative_num_draft_tokens")):
        val = getattr(server_args, attr, None)
        if isinstance(val, int):
            spec[key] = val
    return spec
