"""Build and cache the tiny random Llama the SGLang servers load.

Stdlib only (runs under the test runner's Python); the actual model writing is
done by ``make_tiny_model.py`` with a harness venv's Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .venv import HARNESS_DIR, _log, file_lock, venv_python

MAKE_TINY_MODEL = Path(__file__).resolve().parent / "make_tiny_model.py"
MODEL_MARKER = ".harness-complete"


def ensure_tiny_model(venv: Path, name: str = "tiny-llama", layers: int = 2) -> Path:
    """Return ``HARNESS_DIR/models/<name>``, building it with ``venv`` on first use.

    Build it with the 0.5.23 venv (transformers 5); the directory also loads
    under 0.5.9 (transformers 4). Whichever venv builds it first wins: a cached
    model is not rebuilt for a different venv, only for different parameters,
    so all versions see the same weights. ``harness_reference.json`` in the
    directory holds HF greedy ids for a reference prompt.
    """
    script_digest = hashlib.sha256(MAKE_TINY_MODEL.read_bytes()).hexdigest()[:16]
    spec = json.dumps({"layers": layers, "script": script_digest}, sort_keys=True)
    return build_cached(name, spec, lambda tmp: [str(venv_python(venv)), str(MAKE_TINY_MODEL), str(tmp),
                                                 "--layers", str(layers)],
                        what=f"model ({layers} layers) with {venv}")


def build_cached(name: str, spec: str, command, what: str) -> Path:
    """``HARNESS_DIR/models/<name>``, built by ``command(tmp_dir)`` unless a complete build with
    the same ``spec`` is there. Locked (test sessions share it); written to a temp dir and renamed,
    so a model dir is either complete or absent."""
    models = HARNESS_DIR / "models"
    out = models / name
    with file_lock(models / f"{name}.lock"):
        marker = out / MODEL_MARKER
        if marker.exists() and marker.read_text() == spec:
            return out
        tmp = models / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        _log(f"building {out}: {what}")
        t0 = time.monotonic()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        cmd = command(tmp)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{Path(cmd[1]).name} failed (rc={proc.returncode}):\n{proc.stdout}\n"
                               f"{proc.stderr[-4000:]}")
        (tmp / MODEL_MARKER).write_text(spec)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        _log(f"built {out} in {time.monotonic() - t0:.0f}s")
    return out


def reference(model: Path) -> dict:
    """HF transformers' greedy result recorded when the model was built."""
    return json.loads((Path(model) / "harness_reference.json").read_text())
