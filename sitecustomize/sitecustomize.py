"""sgl-probe startup for PYTHONPATH use (containers, system Pythons, ``sgl-probe run``).

Python imports only one module named ``sitecustomize``; putting this directory first on
PYTHONPATH shadows any other one (Debian/Ubuntu ship /usr/lib/python3.X/sitecustomize.py).
So after arming the probe we find the next ``sitecustomize`` on sys.path and run it too.

Installed as ``_sgl_probe_startup/sitecustomize.py`` in site-packages (``_sgl_probe_arm`` is at
the top of site-packages); in a source checkout it sits beside ``_sgl_probe_arm.py``, one level
below the ``sgl_probe`` package.
"""

import os
import sys


def _arm_probe() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if os.path.isfile(os.path.join(root, "sgl_probe", "__init__.py")):
        # A source checkout without an installed wheel: the package is found only once the probe
        # activates; appended, so an installed sgl_probe still wins.
        sys.path.append(root)
    import _sgl_probe_arm

    _sgl_probe_arm.arm()


def _chain_shadowed() -> None:
    """Run the sitecustomize that this one hides, as site.py would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.realpath(os.path.dirname(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.origin is None or os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_sgl_probe_shadowed_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py also reports and continues
        sys.stderr.write("Error in shadowed sitecustomize %s: %r\n" % (spec.origin, exc))


try:
    _arm_probe()
except Exception as _exc:
    sys.stderr.write("sgl-probe: startup failed: %r\n" % (_exc,))
_chain_shadowed()
