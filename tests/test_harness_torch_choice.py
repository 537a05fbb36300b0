"""Which torch the SGLang harness venvs get (tests/harness/venv.py: choose_torch).

The choice is tested with a recording stand-in for ``pip install`` (a real install is ~1 GB); the
real installs run whenever the harness builds its venvs."""

from __future__ import annotations

import pytest

from tests.harness.venv import TORCH_CPU_INDEX, choose_torch


def pip_offering(*available: tuple[str, bool]):
    """A ``pip install`` that succeeds for (pin, needs the PyTorch CPU index) pairs in ``available``."""
    calls: list[list[str]] = []

    def try_install(args: list[str]) -> bool:
        calls.append(args)
        via_cpu_index = TORCH_CPU_INDEX in args
        return any(args[-1] == pin and via_cpu_index == index for pin, index in available)

    return try_install, calls


def test_cpu_build_from_the_configured_indexes_first():
    try_install, calls = pip_offering(("torch==2.13.0+cpu", False), ("torch==2.13.0", False))
    assert choose_torch(try_install) == ("torch==2.13.0+cpu", ["torch==2.13.0+cpu"])
    assert len(calls) == 1


def test_cpu_build_from_the_pytorch_cpu_index_when_the_configured_ones_lack_it():
    try_install, calls = pip_offering(("torch==2.13.0+cpu", True), ("torch==2.13.0", False))
    pin, args = choose_torch(try_install)
    assert pin == "torch==2.13.0+cpu" and len(calls) == 2
    # An unreachable index must fail fast, not after pip's default retries.
    assert args[:2] == ["--extra-index-url", TORCH_CPU_INDEX] and "--retries" in args and "--timeout" in args


def test_pypi_torch_of_the_same_version_when_no_index_has_the_cpu_build():
    try_install, calls = pip_offering(("torch==2.13.0", False))
    assert choose_torch(try_install) == ("torch==2.13.0", ["torch==2.13.0"])
    assert [c[-1] for c in calls] == ["torch==2.13.0+cpu", "torch==2.13.0+cpu", "torch==2.13.0"]


def test_no_torch_anywhere_names_every_attempt():
    try_install, _ = pip_offering()
    with pytest.raises(RuntimeError, match=r"torch 2\.13\.0 could not be installed.*download\.pytorch\.org.*torch==2\.13\.0\)"):
        choose_torch(try_install)
