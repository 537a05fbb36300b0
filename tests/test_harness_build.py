"""``python -m tests.harness build``: the SGLang venvs are built side by side, the tiny model after
all of them, and a failed build fails the command (tests/harness/__main__.py); the session's wheel
goes into each venv once (tests/harness/wheel.py).

The builds are recording stand-ins (a real one installs ~2 GB); the real builds run at the start of
every test session (tests/run.sh)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import tests.harness.__main__ as harness_main


@pytest.fixture
def recorded(monkeypatch):
    events: list[tuple[str, str, float]] = []
    lock = threading.Lock()
    fail = set()

    def ensure_venv(version: str) -> Path:
        with lock:
            events.append(("start", version, time.monotonic()))
        time.sleep(0.3)
        if version in fail:
            raise RuntimeError(f"pip failed for {version}")
        with lock:
            events.append(("end", version, time.monotonic()))
        return Path(f"/nowhere/venv-{version}")

    def ensure_tiny_model(venv: Path) -> Path:
        events.append(("model", venv.name, time.monotonic()))
        return Path("/nowhere/model")

    monkeypatch.setattr(harness_main, "ensure_venv", ensure_venv)
    monkeypatch.setattr(harness_main, "ensure_tiny_model", ensure_tiny_model)
    return events, fail


def test_venvs_build_side_by_side_and_the_model_after_them(recorded):
    events, _ = recorded
    assert harness_main.main(["build", "0.5.9", "0.5.23"]) == 0
    starts = {v: t for kind, v, t in events if kind == "start"}
    ends = {v: t for kind, v, t in events if kind == "end"}
    assert set(starts) == set(ends) == {"0.5.9", "0.5.23"}
    # Each build started before the other one ended.
    assert max(starts.values()) < min(ends.values())
    model = [(v, t) for kind, v, t in events if kind == "model"]
    assert model and model[0][0] == f"venv-{harness_main.MODEL_BUILDER_VERSION}"
    assert model[0][1] >= max(ends.values())


def test_a_failed_build_fails_the_command_before_the_model(recorded):
    events, fail = recorded
    fail.add("0.5.9")
    with pytest.raises(RuntimeError, match="pip failed for 0.5.9"):
        harness_main.main(["build", "0.5.9", "0.5.23"])
    assert not [e for e in events if e[0] == "model"]


def test_a_wheel_is_installed_into_a_venv_once_per_session(monkeypatch, tmp_path):
    """install_wheel skips a venv that already has this session's wheel (each module asks), and
    installs again for another wheel or another venv."""
    from tests.harness import wheel as harness_wheel

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(harness_wheel, "pip_install",
                        lambda venv, *args, constraints=None: calls.append((venv.name, args[-1])))
    monkeypatch.setattr(harness_wheel, "_installed", {})
    a, b = tmp_path / "venv-a", tmp_path / "venv-b"
    a.mkdir(), b.mkdir()
    w1, w2 = tmp_path / "one.whl", tmp_path / "two.whl"
    w1.write_bytes(b"first build")
    w2.write_bytes(b"second build")
    for venv, w in ((a, w1), (a, w1), (b, w1), (a, w2), (a, w2)):
        harness_wheel.install_wheel(venv, w)
    assert [(v, Path(w).name) for v, w in calls] == [("venv-a", "one.whl")] * 2 + [("venv-b", "one.whl")] * 2 \
        + [("venv-a", "two.whl")] * 2
