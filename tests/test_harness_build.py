"""``python -m tests.harness build``: the SGLang venvs are built side by side, the tiny model after
all of them, and a failed build fails the command (tests/harness/__main__.py).

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
