"""``sgl_probe._arm`` is the startup module ``_sgl_probe_arm`` under its package name.

The startup code is one top-level module (``startup/_sgl_probe_arm.py``, installed at the top of
site-packages beside ``sgl_probe.pth``) because the .pth runs in every interpreter of the venv:
loading one module instead of a package plus a submodule measurably shortens every start. This
alias keeps a single copy of its state (armed or not, the start environment) for code that uses
the package name.
"""

import os
import sys

try:
    import _sgl_probe_arm as _impl
except ImportError:  # a source checkout used through PYTHONPATH, without installing the wheel
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "startup",
                         "_sgl_probe_arm.py")
    _spec = importlib.util.spec_from_file_location("_sgl_probe_arm", _path)
    _impl = importlib.util.module_from_spec(_spec)
    sys.modules["_sgl_probe_arm"] = _impl
    _spec.loader.exec_module(_impl)

sys.modules[__name__] = _impl
