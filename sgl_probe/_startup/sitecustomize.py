"""sgl-probe startup for PYTHONPATH use (containers, system Pythons, ``sgl-probe run``).

Python imports only one module named ``sitecustomize``; putting this directory first on
PYTHONPATH shadows any other one (Debian/Ubuntu ship /usr/lib/python3.X/sitecustomize.py).
So after arming the probe we find the next ``sitecustomize`` on sys.path and run it too.
"""

import os
import sys


def _arm_probe() -> None:
    try:
        import sgl_probe._arm as arm_mod
    except ImportError:
        # Running from a source checkout: <repo>/sitecustomize/ sits beside <repo>/sgl_probe/.
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.dirname(here)
        if not os.path.isdir(os.path.join(root, "sgl_probe")):
            return
        sys.path.append(root)
        try:
            import sgl_probe._arm as arm_mod
        except ImportError:
            return
    arm_mod.arm()


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
