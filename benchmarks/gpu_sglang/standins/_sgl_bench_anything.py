"""GPU BENCHMARK STAND-IN helper (not installed by the sgl-probe wheel; copied next to SGLang on the
benchmark machine only): a module whose every attribute, submodule, call, subscript, base class and
arithmetic resolves to another placeholder, so that ``import X`` and module-level DSL code succeed,
while any real use at run time fails loudly with ``<LABEL>_STANDIN missing ...``.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


def _fail(label: str, name: str) -> None:
    print(f"{label}_STANDIN missing {name} called", file=sys.stderr, flush=True)
    raise NotImplementedError(f"{label.lower()} benchmark stand-in: {name} is not available here")


class Anything:
    """``strict``: every call raises (a missing kernel op); otherwise only decorated functions do
    (a DSL whose decorators and constructors run at import time)."""

    __slots__ = ("_label", "_name", "_strict")

    def __init__(self, label: str, name: str, strict: bool = False) -> None:
        object.__setattr__(self, "_label", label)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_strict", strict)

    def __getattr__(self, name: str) -> "Anything":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Anything(self._label, f"{self._name}.{name}", self._strict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._strict:
            _fail(self._label, self._name)
        # Used as a decorator: keep classes (DSL structs) and block functions (kernels).
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            fn = args[0]
            if isinstance(fn, type):
                return fn
            label, name = self._label, f"{self._name}({fn.__qualname__})"

            @functools.wraps(fn)
            def blocked(*a: Any, **k: Any) -> Any:
                _fail(label, name)

            return blocked
        return Anything(self._label, f"{self._name}(...)")

    def __getitem__(self, key: Any) -> "Anything":
        return Anything(self._label, f"{self._name}[...]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __hash__(self) -> int:
        return hash(self._name)

    def __repr__(self) -> str:
        return f"<{self._label.lower()} stand-in {self._name}>"

    def _op(self, *a: Any) -> "Anything":
        return Anything(self._label, f"{self._name}<op>")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _op
    __floordiv__ = __rfloordiv__ = __mod__ = __or__ = __ror__ = __and__ = __rand__ = __neg__ = _op
    __lshift__ = __rshift__ = __pow__ = _op


def module_getattr(label: str, modname: str, strict: bool = False):
    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Anything(label, f"{modname}.{name}", strict)
    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import <root>.anything.below`` yields a placeholder package."""

    def __init__(self, root: str, label: str, strict: bool) -> None:
        self.root, self.label, self.strict = root, label, strict

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = module_getattr(self.label, spec.name, self.strict)  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module) -> None:
        pass


def install(root: str, label: str, strict: bool = False) -> None:
    """Make ``root``'s submodules importable placeholders (once per process)."""
    if not any(isinstance(f, _SubmoduleFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.append(_SubmoduleFinder(root, label, strict))
