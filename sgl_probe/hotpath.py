"""Which implementation runs the hot path: the C extension ``sgl_probe._hot`` where it was built
(``pip install`` compiles it when a C compiler is there), else the Python one in
:mod:`sgl_probe.recorder` and :mod:`sgl_probe.timing`.

The two do the same work (the tests run both and compare their records field by field); the C one
exists because on a launch-bound GPU server the interpreter's share of every wrapped call is most
of what the probe costs the scheduler (BENCHMARKS.md). ``SGL_PROBE_HOTPATH=python`` picks the
Python one (e.g. to rule the extension out); ``c`` asks for the extension and says so in one log
line where it is missing.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Optional

log = logging.getLogger("sgl_probe")

CHOICES = ("auto", "c", "python")


def load(choice: str = "auto") -> Optional[ModuleType]:
    """The C module for ``choice``, or None for the Python hot path."""
    if choice == "python":
        return None
    try:
        from sgl_probe import _hot  # type: ignore[attr-defined]
    except ImportError as exc:
        if choice == "c":
            log.warning("sgl-probe: SGL_PROBE_HOTPATH=c but the C hot path is not built here (%s); "
                        "using the Python one", exc)
        return None
    return _hot


def name(module: Optional[ModuleType]) -> str:
    """What ran: ``c`` or ``python`` (for the summary and the benchmarks)."""
    return "python" if module is None else "c"
