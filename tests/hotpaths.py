"""Runs a test module under both hot paths: the C extension (``sgl_probe._hot``) and the Python one.

``from tests.hotpaths import both_hotpaths`` in a module makes every test there run twice, as
``[c]`` and ``[python]``; ``recorder_hotpath`` tells which one a test got. Where the extension is
not built, ``[c]`` is skipped with the reason, or fails when SGL_PROBE_TEST_REQUIRE_EXT=1 (what
tests/run.sh sets wherever a C compiler is found, so that CI cannot pass with it missing).
"""

from __future__ import annotations

import os

import pytest

from sgl_probe import hotpath


def c_module():
    """The built extension; skips (or fails, see above) where it is missing."""
    module = hotpath.load("c")
    if module is None:
        if os.environ.get("SGL_PROBE_TEST_REQUIRE_EXT") == "1":
            pytest.fail("the C hot path (sgl_probe._hot) is not built, and SGL_PROBE_TEST_REQUIRE_EXT=1")
        pytest.skip("the C hot path (sgl_probe._hot) is not built here")
    return module


@pytest.fixture(params=["c", "python"], autouse=False)
def recorder_hotpath(request, monkeypatch):
    """Every Recorder made during the test gets this hot path (its ``hot`` argument is ignored)."""
    module = c_module() if request.param == "c" else None
    monkeypatch.setattr(hotpath, "load", lambda choice="auto": module)
    return request.param


@pytest.fixture(autouse=True)
def both_hotpaths(recorder_hotpath):
    return recorder_hotpath
