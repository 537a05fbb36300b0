"""Apply and remove the target table: wrapt post-import hooks find the modules; once-per-process
roles get wrapt wrappers, per-step roles plain replacement functions from the recorder.

Every wrapper obeys the same rule: the probe's own work sits in ``try`` blocks that, on any
error, log one line and switch that hook off. SGLang's call itself runs exactly once, with its
own arguments, and its exceptions propagate unchanged.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import types
from typing import Any, Callable, NamedTuple, Optional

import wrapt

from sgl_probe.targets import TARGETS, Target, by_module

log = logging.getLogger("sgl_probe")


class Hook:
    """One applied target: where it lives, what was there before, and whether it is still on."""

    # Slots: the C wrappers read ``enabled`` on every wrapped call straight from its slot.
    __slots__ = ("target", "enabled", "owner", "attr", "original")

    def __init__(self, target: Target) -> None:
        self.target = target
        self.enabled = True
        self.owner: Any = None
        self.attr: Optional[str] = None
        self.original: Any = None

    def fail(self, exc: BaseException) -> None:
        if self.enabled:
            self.enabled = False
            log.error("sgl-probe: hook %s disabled after an internal error: %r (SGLang is unaffected)",
                      self.target.name, exc)


def resolve(module: Any, qualname: str) -> tuple[Any, Optional[str]]:
    """(owner, attribute) when ``qualname`` is defined directly on its owner, else (None, None).

    Inherited attributes do not count: wrapping them on a subclass would time the base twice."""
    owner = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, None
    attr = parts[-1]
    if attr not in vars(owner):
        return None, None
    return owner, attr


def _before_wrapper(action: Callable[[Hook, Any, tuple, dict], None], hook: Hook) -> Callable:
    """A wrapt wrapper that runs ``action`` before the call (identity, NCCL snapshot, launch)."""

    def wrapper(wrapped, instance, args, kwargs):
        if hook.enabled:
            try:
                action(hook, wrapped, args, kwargs)
            except Exception as exc:
                hook.fail(exc)
        return wrapped(*args, **kwargs)

    return wrapper


class Handler(NamedTuple):
    """How one role is applied. ``hot``: called on every scheduler step, so the original is
    replaced by a plain function that takes ``self`` first (see :mod:`sgl_probe.recorder` for why
    not wrapt there); ``build(probe, hook, original)`` returns it. Otherwise ``build`` returns a
    wrapt wrapper, applied with ``wrapt.wrap_function_wrapper``."""

    hot: bool
    build: Callable[[Any, Hook, Callable], Callable]


#: Every role of the target table (``targets.ROLES``) and what applies it.
HANDLERS: dict[str, Handler] = {
    "step": Handler(True, lambda probe, hook, orig: probe.recorder.step_method(hook, orig)),
    "phase": Handler(True, lambda probe, hook, orig: probe.recorder.phase_method(hook, orig)),
    "graph": Handler(True, lambda probe, hook, orig: probe.recorder.graph_method(hook, orig)),
    "graph_launch": Handler(True, lambda probe, hook, orig: probe.recorder.launch_method(hook, orig)),
    "accept": Handler(True, lambda probe, hook, orig: probe.recorder.accept_method(hook, orig)),
    "identity": Handler(False, lambda probe, hook, orig: _before_wrapper(probe.on_identity, hook)),
    "nccl_init": Handler(False, lambda probe, hook, orig: _before_wrapper(probe.on_nccl_init, hook)),
    "launch": Handler(False, lambda probe, hook, orig: _before_wrapper(probe.on_launch, hook)),
}


def _plain_method(owner: Any, attr: str) -> bool:
    """The per-step replacements take ``self`` first: only a plain function in a class is one
    (not a staticmethod, classmethod, or someone else's wrapper object)."""
    if not isinstance(owner, type):
        return False
    current = vars(owner)[attr]
    # Ours already (the C hot path's wrappers are not Python functions): it replaced a plain one.
    return type(current) is types.FunctionType or getattr(current, "_self_sgl_probe_hook", None) is not None


class Instrumentor:
    """Applies the table lazily (post-import hooks) and removes it again.

    ``uninstrument()`` undoes exactly what ``instrument()`` did: every original is put back, and
    the post-import hooks still waiting for a module are disarmed (wrapt cannot unregister them:
    each ``instrument()`` arms a fresh generation, and a hook of an older one does nothing), so a
    target module imported afterwards stays unwrapped and a later ``instrument()`` applies the
    table again."""

    def __init__(self, probe, targets: tuple[Target, ...] = TARGETS, version: Optional[str] = None) -> None:
        self.probe = probe
        self.targets = targets
        self.version = version
        self.hooks: list[Hook] = []
        self._armed: Optional[object] = None  # the current generation; None: not instrumented

    def instrument(self) -> None:
        if self._armed is not None:
            return
        generation = self._armed = object()
        for module_name, targets in by_module(self.targets).items():
            wrapt.register_post_import_hook(self._make_on_import(targets, generation), module_name)

    def _make_on_import(self, targets: list[Target], generation: object) -> Callable:
        def on_import(module: Any) -> None:
            if self._armed is not generation:
                return  # uninstrumented since (or instrumented anew, with hooks of its own)
            missing = []
            for t in targets:
                try:
                    if not self.apply(t, module) and t.expected_in(self.version):
                        missing.append(t.qualname)
                except Exception as exc:
                    log.error("sgl-probe: could not wrap %s: %r", t.name, exc)
            if missing:
                log.warning("sgl-probe: SGLang %s: %s has no %s; those phases will not be recorded",
                            self.version or "?", module.__name__, ", ".join(missing))

        return on_import

    def apply(self, target: Target, module: Any) -> bool:
        owner, attr = resolve(module, target.qualname)
        if owner is None:
            return False
        current = vars(owner)[attr]
        if getattr(current, "_self_sgl_probe_hook", None) is not None:
            return True  # already ours (second activation path, e.g. SGLang's plugin loader)
        handler = HANDLERS[target.role]
        hook = Hook(target)
        if handler.hot:
            if not _plain_method(owner, attr):
                log.warning("sgl-probe: %s is a %s, not a plain method; not wrapped", target.name,
                            type(current).__name__)
                return False
            wrapped = handler.build(self.probe, hook, current)
            functools.update_wrapper(wrapped, current)
            setattr(owner, attr, wrapped)
        else:
            wrapt.wrap_function_wrapper(owner, attr, handler.build(self.probe, hook, current))
            wrapped = vars(owner)[attr]
        wrapped._self_sgl_probe_hook = hook
        hook.owner, hook.attr, hook.original = owner, attr, current
        self.hooks.append(hook)
        return True

    def uninstrument(self) -> None:
        """Put every original back and disarm the pending import hooks. A wrapper someone else
        stacked on top of ours cannot be unwound: ours stays inside it, switched off."""
        self._armed = None
        for hook in reversed(self.hooks):
            current = vars(hook.owner).get(hook.attr)
            if getattr(current, "_self_sgl_probe_hook", None) is hook:
                setattr(hook.owner, hook.attr, hook.original)
            hook.enabled = False
        self.hooks.clear()


def _import_for_doctor(name: str, seen: dict[str, Any]) -> Any:
    """The module, or the exception that names why it cannot be imported. A package whose
    ``__init__`` failed (a missing dependency of SGLang) leaves its submodules behind, and every
    later import under it fails with a follow-on ``KeyError``; those get the package's own error."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        failed = seen.get(".".join(parts[:i]))
        if isinstance(failed, Exception):
            return failed
    try:
        return importlib.import_module(name)
    except Exception as exc:
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules:
                seen[parent] = exc
                break
        return exc


def check_targets(targets: tuple[Target, ...] = TARGETS, version: Optional[str] = None) -> list[dict]:
    """For ``sgl-probe doctor``: import each module and report every expected target (plus any
    unexpected one that exists)."""
    rows = []
    modules: dict[str, Any] = {}
    for t in targets:
        if t.module not in modules:
            modules[t.module] = _import_for_doctor(t.module, modules)
        mod = modules[t.module]
        owner, attr = (None, None) if isinstance(mod, Exception) else resolve(mod, t.qualname)
        resolved = owner is not None
        unfit = resolved and HANDLERS[t.role].hot and not _plain_method(owner, attr)
        expected = t.expected_in(version)
        if not expected and not resolved:
            continue
        for phase in t.phases:
            row = {"phase": phase, "role": t.role, "target": t.name, "resolved": resolved and not unfit,
                   "expected": expected}
            if isinstance(mod, Exception):
                row["error"] = f"{type(mod).__name__}: {mod}"
            elif unfit:
                row["error"] = f"not a plain method: {type(vars(owner)[attr]).__name__}"
            rows.append(row)
    return rows
