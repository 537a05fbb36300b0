"""TEST STAND-IN for the compiled ``sgl_kernel`` package -- not the real thing.

Copied into the harness venvs by ``tests/harness/venv.py``; never installed
anywhere else.

Why it exists: with ``SGLANG_USE_CPU_ENGINE=1`` sglang imports symbols from
sgl_kernel at module import time (0.5.23:
``sglang/kernels/ops/kvcache/cache_move.py`` does
``from sgl_kernel import copy_all_layer_kv_cache_cpu``). The only sgl_kernel
builds on PyPI (``sglang-kernel``, ``sgl-kernel``) are CUDA builds that fail
to import without ``libcuda.so.1``; the CPU build is not published.

Why placeholders are enough: on a CPU without AMX sglang gates every
``torch.ops.sgl_kernel.*_cpu`` call on ``cpu_has_amx_support()``, i.e.
``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``, which is False
here, so it takes its torch-native paths. Any attribute or submodule resolves
to a placeholder that raises ``NotImplementedError`` only when called, so a
test that reaches a missing kernel fails loudly instead of silently.

The one op sglang does call on this path is ``copy_all_layer_kv_cache_cpu``
(the KV pool runs it at init); a pure-Python version is below.

EAGLE speculative decoding (0.5.23, ``--speculative-algorithm EAGLE3``) calls
more: the eight speculative ops in ``_spec_standins.py`` (draft cache
locations, tree building, greedy verification, accepted-slot compaction,
bonus tokens, req->token writes; ``rotate_input_ids_cpu`` for completeness)
and the two ``intel_amx`` attention ops in ``_attention_standins.py``
(attached to ``torch.ops.sgl_kernel``, where the backend looks them up).
They are TEST STAND-INS in plain torch, each checked against SGLang's own
Triton kernel in Triton's CPU interpreter or a re-derivation
(``tests/test_kernel_standins.py``); ``convert_weight_packed`` stays absent,
so ``cpu_has_amx_support()`` stays False and non-spec serving is unchanged.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

__version__ = "0.0.0+harness.stub"


class _Placeholder:
    """Stands for any sgl_kernel symbol; fails only when actually used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel test stub: {self._name} has no CPU implementation here"
        )

    def __getattr__(self, name: str) -> "_Placeholder":
        # dunder lookups (copy, pickle, inspect) must fail normally
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stub placeholder {self._name}>"


def _module_getattr(modname: str) -> Callable[[str], _Placeholder]:
    def __getattr__(name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{modname}.{name}")

    return __getattr__


__getattr__ = _module_getattr("sgl_kernel")


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """Pure-Python stand-in for the CPU kernel of the same name.

    ``data_ptrs``/``strides``: one raw buffer address and one row size in bytes
    per KV buffer (all layers, K and V). Copies row ``src_loc[i]`` to row
    ``tgt_loc[i]`` in every buffer.
    """
    import ctypes

    tgt = [int(t) for t in tgt_loc.tolist()]
    src = [int(s) for s in src_loc.tolist()]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        base, stride = int(base), int(stride)
        # read every source row before writing, so overlapping src/tgt sets
        # behave like the kernel's parallel copy
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


from ._attention_standins import decode_attention_cpu, extend_attention_cpu  # noqa: E402
from ._spec_standins import (  # noqa: E402
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

STANDIN_OPS = (
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu", "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu", "rotate_input_ids_cpu", "extend_attention_cpu",
    "decode_attention_cpu", "copy_all_layer_kv_cache_cpu",
)


def _install_torch_ops() -> None:
    """The intel_amx backend reads the attention ops from ``torch.ops.sgl_kernel``."""
    import torch

    ns = torch.ops.sgl_kernel
    ns.extend_attention_cpu = extend_attention_cpu
    ns.decode_attention_cpu = decode_attention_cpu


_install_torch_ops()


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import sgl_kernel.<anything>`` succeed with a placeholder module.

    Appended to sys.meta_path, so it only answers after the normal finders
    found nothing; real files in this package would still win.
    """

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())
