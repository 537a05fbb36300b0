"""TEST STAND-IN for the compiled ``torchvision`` package -- not the real thing.

Copied into the harness venvs by ``tests/harness/venv.py``; never installed
anywhere else.

Why it exists: the PyPI torchvision wheels for torch 2.13 are CUDA builds; with
the CPU torch wheel ``import torchvision`` raises ``RuntimeError: operator
torchvision::nms does not exist``. sglang imports torchvision at startup
(``sglang/srt/configs/__init__.py`` -> ... -> ``multimodal/internvl_utils.py``)
but only multimodal preprocessing uses it, so text-only serving needs nothing
but importable names.

Deliberately shipped WITHOUT a dist-info directory: transformers'
``is_torchvision_available()`` checks package metadata, so it reports False
and transformers never tries to use this stub.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable

__version__ = "0.0.0+harness.stub"


class _Meta(type):
    # class-level attribute access (e.g. InterpolationMode.BICUBIC) at import time
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls


class _Dummy(metaclass=_Meta):
    """Any torchvision class/function: constructible, subclassable, not callable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchvision test stub: not available in this CPU-only venv")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy()

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


def _module_getattr(modname: str) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Dummy

    return __getattr__


__getattr__ = _module_getattr("torchvision")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import torchvision.transforms.v2.functional`` (or any submodule) work."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith("torchvision."):
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
