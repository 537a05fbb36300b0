"""GPU BENCHMARK STAND-IN for the compiled ``sgl_kernel`` package (sglang-kernel) -- not the real
thing, never installed by the sgl-probe wheel.

The GPU benchmark machine has no network and takes at most 64 MiB per call; the real wheel is
several hundred MB. The few ahead-of-time ops a Llama forward (and EAGLE-3) calls through
``sgl_kernel`` on an H200 are written here in plain torch: no host syncs, no host allocations,
CUDA-graph capturable. Every other name is a placeholder that raises when called
(``SGL_KERNEL_STANDIN missing ...`` on stderr). SGLang's own JIT kernels (``sglang.kernels``,
built with tvm-ffi + nvcc on the machine) are the real ones. Because these ops are plain torch,
absolute phase times are not those of a production install; the probe's measurements are compared
with SGLang's own and the profiler's view of the same kernels, never with a production install.
"""
from __future__ import annotations

import os
import sys
import types
from typing import Callable, Optional

import torch

from _sgl_bench_anything import install, module_getattr

__version__ = "0.0.0+benchmark.standin"
__getattr__ = module_getattr("SGL_KERNEL", "sgl_kernel", strict=True)
install("sgl_kernel", "SGL_KERNEL", strict=True)

_seen: set = set()


def _used(name: str) -> None:
    # One line per op and process, so a run's log lists which stand-ins actually ran.
    if name not in _seen:
        _seen.add(name)
        print(f"SGL_KERNEL_STANDIN used {name} (pid {os.getpid()})", file=sys.stderr, flush=True)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * (w.float() + 1.0 if gemma else w.float())).to(x.dtype)


def _into(y: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is None:
        return y
    out.copy_(y)
    return out


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    _used("rmsnorm")
    return _into(_rms(input, weight, eps, False), out)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    _used("gemma_rmsnorm")
    return _into(_rms(input, weight, eps, True), out)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    """In place, as the real op: ``residual += input; input = rmsnorm(residual)``."""
    _used("fused_add_rmsnorm")
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, False))


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None) -> None:
    _used("gemma_fused_add_rmsnorm")
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, True))


def _gated(act: Callable, input: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    d = input.shape[-1] // 2
    return _into(act(input[..., :d]) * input[..., d:], out)


def silu_and_mul(input, out=None, enable_pdl=None):
    _used("silu_and_mul")
    return _gated(torch.nn.functional.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    _used("gelu_and_mul")
    return _gated(torch.nn.functional.gelu, input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    _used("gelu_tanh_and_mul")
    return _gated(lambda t: torch.nn.functional.gelu(t, approximate="tanh"), input, out)


def weak_ref_tensor(tensor):
    """The real op returns a non-owning alias; the tensor itself only lives a little longer."""
    _used("weak_ref_tensor")
    return tensor


# ``sgl_kernel.utils`` is a real submodule in the package; SGLang asks it about PDL support.
utils = types.ModuleType("sgl_kernel.utils")
utils.__getattr__ = module_getattr("SGL_KERNEL", "sgl_kernel.utils", strict=True)  # type: ignore[attr-defined]
utils.is_arch_support_pdl = lambda: (  # type: ignore[attr-defined]
    torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)
sys.modules["sgl_kernel.utils"] = utils
