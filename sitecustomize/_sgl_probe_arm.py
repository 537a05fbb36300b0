"""The few lines every interpreter runs at startup (from the .pth, the PEP 829 .start file,
the PYTHONPATH ``sitecustomize`` or SGLang's plugin entry point). Installed as a top-level module
beside ``sgl_probe.pth``: the .pth runs in every interpreter of the venv, and loading one module
instead of a package plus a submodule measurably shortens every start.

Only ``sys`` and ``os`` may be imported here: this runs in every pip, every tool and every
script of the venv. It arms a meta-path trigger that costs nothing until some code imports
``sglang``; only then is the real machinery (wrapt, OpenTelemetry) loaded.

PYTEST_DONT_REWRITE: already imported when pytest starts (pytest would warn it cannot rewrite it).
"""

import os
import sys

_ARMED = False
_ACTIVATED = False
#: The environment as the interpreter started, before any later code could change it (raw; use
#: :func:`start_env`).
START_ENV = None


def start_env():
    """START_ENV decoded to ``str``, or None when the probe was not armed at startup."""
    raw = START_ENV
    if raw is None:
        return None
    decode = getattr(os, "fsdecode", str)
    return {(decode(k) if isinstance(k, bytes) else k): (decode(v) if isinstance(v, bytes) else v)
            for k, v in raw.items()}


_OFF_VALUES = ("0", "false", "no", "off")


def _disabled() -> bool:
    return os.environ.get("SGL_PROBE", "1").strip().lower() in _OFF_VALUES


class _SGLangTrigger:
    """Meta-path finder that never finds anything; it only notices the first ``sglang`` import."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sglang" or fullname.startswith("sglang."):
            disarm()
            _activate()
        return None


_TRIGGER = _SGLangTrigger()


def arm() -> None:
    """Idempotent: the .pth, the sitecustomize and the plugin entry point may all call it."""
    global _ARMED, START_ENV
    if _ARMED or _disabled():
        return
    _ARMED = True
    try:  # the raw bytes mapping: a plain dict copy, no decoding of every value at startup
        START_ENV = os.environ._data.copy()
    except AttributeError:
        START_ENV = dict(os.environ)
    if "sglang" in sys.modules:
        _activate()
    elif _TRIGGER not in sys.meta_path:
        sys.meta_path.insert(0, _TRIGGER)


def disarm() -> None:
    """Remove the trigger (``sgl-probe doctor`` imports SGLang without instrumenting it)."""
    try:
        sys.meta_path.remove(_TRIGGER)
    except ValueError:
        pass


def _activate() -> None:
    global _ACTIVATED
    if _ACTIVATED:
        return
    _ACTIVATED = True
    try:
        from sgl_probe import activate

        activate.activate()
    except Exception as exc:  # the probe must never break the program it rides in
        sys.stderr.write("sgl-probe: disabled in pid %d: activation failed: %r\n" % (os.getpid(), exc))


def sglang_plugin() -> None:
    """Entry point for SGLang's own plugin loader (``sglang.srt.plugins``, 0.5.11+).

    By the time SGLang loads plugins, the .pth has normally armed and activated already; this is
    the fallback for interpreters started without site (``python -S``) and is a no-op otherwise.
    """
    arm()
