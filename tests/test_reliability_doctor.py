"""``sgl-probe doctor`` on a broken SGLang install: one dependency missing.

The break is made without touching the harness venv: the interpreter runs without its site
directory (``-S``) on a copy of the venv's ``site-packages`` made of links, one dependency
(pyzmq, imported by SGLang's package itself) left out. Every target doctor cannot resolve must
name that dependency, not a follow-on error of the half-imported package.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.harness.venv import ensure_venv, site_packages, venv_python
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

HIDDEN = ("zmq", "pyzmq")  # the import name, and the distribution's files


def doctor_on(venv: Path, site: Path, home: Path) -> tuple[int, dict]:
    code = "import sys; from sgl_probe.cli import main; sys.exit(main(['doctor', '--json']))"
    out = subprocess.run([str(venv_python(venv)), "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(home), "HF_HUB_OFFLINE": "1"},
                         timeout=300)
    assert out.stdout.strip(), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout)


def linked_copy(src: Path, dst: Path, hide: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for item in src.iterdir():
        if not any(item.name == h or item.name.startswith(h + "-") for h in hide):
            (dst / item.name).symlink_to(item)
    return dst


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    v = ensure_venv("0.5.23")
    install_wheel(v, build_wheel(tmp_path_factory.mktemp("wheel")))
    return v


def test_doctor_names_the_missing_dependency_for_every_target(venv, tmp_path):
    site = site_packages(venv)
    assert any(p.name.startswith("pyzmq-") for p in site.iterdir()), "pyzmq is not installed as expected"
    # The same way of running, nothing hidden: every expected target resolves.
    rc, whole = doctor_on(venv, linked_copy(site, tmp_path / "whole"), tmp_path)
    assert rc == 0, [r for r in whole["targets"] if r["expected"] and not r["resolved"]]

    rc, broken = doctor_on(venv, linked_copy(site, tmp_path / "broken", HIDDEN), tmp_path)
    assert rc == 1 and broken["sglang_version"] == "0.5.23"
    missing = [r for r in broken["targets"] if r["expected"] and not r["resolved"]]
    assert len(missing) >= 10, "hiding pyzmq should break every SGLang module"
    for row in missing:
        assert row.get("error") == "ModuleNotFoundError: No module named 'zmq'", row
    assert any(r["resolved"] and r["target"].startswith("torch.") for r in broken["targets"]), \
        "a target outside SGLang still resolves"
