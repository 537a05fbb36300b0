"""Build sgl-probe's wheel once per test session and install it the way a user would."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.venv import HARNESS_DIR, file_lock

ROOT = Path(__file__).resolve().parents[2]


_built: dict[str, Path] = {}


def build_wheel(out_dir: Path | None = None) -> Path:
    """``pip wheel`` of the checkout, once per test session (the code under test does not change
    within one; ~8 s a build, a dozen modules ask): each call gets its own copy in ``out_dir``."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="sgl-probe-wheel-"))
    out.mkdir(parents=True, exist_ok=True)
    built = _built.get("wheel")
    if built is None or not built.exists():
        where = Path(tempfile.mkdtemp(prefix="sgl-probe-wheel-"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(where), str(ROOT)],
                       check=True, stdout=subprocess.DEVNULL)
        wheels = sorted(where.glob("sgl_probe-*.whl"))
        assert wheels, f"no wheel in {where}"
        built = _built["wheel"] = wheels[-1]
    copy = out / built.name
    shutil.copyfile(built, copy)
    return copy


def pip_install(venv: Path, *args: str, constraints: Path | None = None) -> None:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if constraints is not None:
        cmd += ["-c", str(constraints)]
    subprocess.run(cmd + list(args), check=True)


# venv -> the digest of the wheel this session installed there (~5 s of pip a module otherwise).
_installed: dict[Path, str] = {}


def install_wheel(venv: Path, wheel: Path) -> None:
    """Into an SGLang harness venv: reinstall sgl-probe only, keep the venv's torch pin. Once per
    session and wheel: the modules that ask again get the same build (build_wheel)."""
    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    key = Path(venv).resolve()
    pins = venv / "harness-constraints.txt"  # holds the CPU torch pin (see venv.py)
    with file_lock(venv.parent / (venv.name + ".lock")):  # test sessions may share the venv
        if _installed.get(key) == digest:
            return
        pip_install(venv, "--force-reinstall", "--no-deps", str(wheel))
        pip_install(venv, str(wheel), constraints=pins if pins.exists() else None)
        _installed[key] = digest


def fresh_venv(path: Path, wheel: Path | None) -> Path:
    """A bare venv, with only the wheel (and its dependencies) when one is given."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    if wheel is not None:
        pip_install(path, str(wheel))
    return path


def site_packages_of(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


__all__ = ["build_wheel", "install_wheel", "fresh_venv", "site_packages_of", "HARNESS_DIR", "ROOT"]
