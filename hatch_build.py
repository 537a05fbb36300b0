"""Compiles the optional C hot path (``sgl_probe/_hot.c``) into the wheel.

Where no C compiler or Python headers are found, the wheel stays pure Python and the probe runs
its Python hot path (the same work, slower on a launch-bound server: see README). A wheel with the
extension is tagged for the interpreter that built it. ``SGL_PROBE_BUILD_EXT=0`` skips it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # imported for compile_command alone (benchmarks/export_cpu.py --compare)
    BuildHookInterface = object  # type: ignore[misc,assignment]

SOURCE = Path("sgl_probe") / "_hot.c"


def compile_command(src: Path, out: Path) -> list[str]:
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    cmd = cc + ["-shared", "-fPIC", "-O2", "-I", sysconfig.get_paths()["include"], str(src), "-o", str(out)]
    if sys.platform == "darwin":
        cmd[len(cc):len(cc)] = ["-undefined", "dynamic_lookup"]
    else:
        cmd.append("-lm")
    return cmd


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or os.environ.get("SGL_PROBE_BUILD_EXT", "1") == "0":
            return
        if sys.platform == "win32" or sys.implementation.name != "cpython":
            return
        root = Path(self.root)
        name = "_hot" + sysconfig.get_config_var("EXT_SUFFIX")
        if version == "editable":
            out = root / "sgl_probe" / name  # the editable install maps the source package
        else:
            out = Path(tempfile.mkdtemp(prefix="sgl_probe_ext_")) / name
        try:
            subprocess.run(compile_command(root / SOURCE, out), check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            self.app.display_warning(f"sgl-probe: C hot path not built, the Python one will run ({detail})")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][str(out)] = f"sgl_probe/{name}"
