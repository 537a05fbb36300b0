"""Build and cache the CPU-only SGLang venvs the end-to-end tests run against.

Stdlib only: this module runs under the test runner's Python, not in the venvs.

Recipe: torch 2.13.0 pinned through a constraints file (its CPU build where an
index offers it, see :func:`choose_torch`), sglang ``--no-deps`` (its declared
deps are the CUDA stack), the small dependency set that is actually imported
when serving a Llama on CPU, and two test stand-in packages
(``stubs/sgl_kernel``, ``stubs/torchvision``) for compiled packages that have no
CPU build on PyPI. sglang itself is never patched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = Path(os.environ.get("SGL_PROBE_HARNESS_DIR", REPO_ROOT / ".harness"))
STUBS_DIR = Path(__file__).resolve().parent / "stubs"
STUB_PACKAGES = ("sgl_kernel", "torchvision")
# The Python the venvs are built with (torch 2.13 has wheels for 3.10-3.13). Kept
# separate from sys.executable so a test runner on another Python still works.
BASE_PYTHON = os.environ.get("SGL_PROBE_HARNESS_PYTHON", "python3")

# Written last by a successful build; holds the spec fingerprint so a changed
# recipe rebuilds instead of silently reusing an old venv.
COMPLETE_MARKER = ".harness-complete"
STUBS_MARKER = ".harness-stubs"

# Without a pin pip resolves torch through sglang's/compressed-tensors' deps to
# the newest CUDA build. The CPU build (~200 MB) is preferred; PyPI has only the
# default build of the same version (~900 MB plus CUDA libraries it never loads
# here), which runs on the CPU just as well.
TORCH_VERSION = "2.13.0"
TORCH_PIN = f"torch=={TORCH_VERSION}+cpu"
TORCH_PYPI_PIN = f"torch=={TORCH_VERSION}"
#: PyTorch's own index of CPU builds, tried when the configured indexes lack the +cpu wheel.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

_COMMON_DEPS: tuple[str, ...] = (
    "triton==3.7.1",  # imported unconditionally by sglang/srt/utils/common.py
    "safetensors", "numpy", "fastapi", "uvicorn>=0.51", "uvloop", "pyzmq", "orjson",
    "psutil", "requests", "aiohttp", "pydantic", "setproctitle", "msgspec", "pybase64",
    "python-multipart", "prometheus-client", "packaging", "tqdm", "einops", "xxhash",
    "interegular", "partial_json_parser", "regex", "pillow", "ipython", "dill",
    "sentencepiece==0.2.1", "gguf", "jsonschema", "soundfile", "openai-harmony", "loguru",
)

# Per-version pins from the research notes; 0.5.9 needs transformers 4.x.
VERSIONS: dict[str, dict[str, str]] = {
    "0.5.23": {
        "sglang": "0.5.23", "transformers": "5.19.0", "tokenizers": "0.23.2",
        "xgrammar": "0.2.7", "openai": "2.8.0", "apache-tvm-ffi": "0.1.11",
        "compressed-tensors": "0.18.0",
    },
    "0.5.9": {
        # apache-tvm-ffi 0.1.8 is a yanked release; pip warns but installs it
        "sglang": "0.5.9", "transformers": "4.57.1", "tokenizers": "0.22.2",
        "xgrammar": "0.1.27", "openai": "2.6.1", "apache-tvm-ffi": "0.1.8",
        "compressed-tensors": "0.18.0",
    },
}


def _log(msg: str) -> None:
    print(f"[harness {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def site_packages(venv: Path) -> Path:
    # glob rather than sysconfig: the venv's Python need not be the one running this
    found = sorted(Path(venv).glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one lib/python3.*/site-packages in {venv}, found {found}")
    return found[0]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (two pytest processes may build at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for lock {path} (another process is building)")
            t0 = time.monotonic()
            fcntl.flock(fh, fcntl.LOCK_EX)
            _log(f"got lock {path} after {time.monotonic() - t0:.0f}s")
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def choose_torch(try_install: Callable[[list[str]], bool]) -> tuple[str, list[str]]:
    """Install torch and return ``(pin, pip args used)``: the first of

    1. ``torch==2.13.0+cpu`` from the indexes pip is configured with (``PIP_FIND_LINKS``,
       ``PIP_EXTRA_INDEX_URL``, pip.conf);
    2. the same from PyTorch's CPU index (short timeout, no retries: it may be unreachable);
    3. ``torch==2.13.0`` from PyPI.

    ``try_install(args)`` runs ``pip install <args>`` and says whether it succeeded."""
    attempts = [
        [TORCH_PIN],
        ["--extra-index-url", TORCH_CPU_INDEX, "--timeout", "15", "--retries", "0", TORCH_PIN],
        [TORCH_PYPI_PIN],
    ]
    for args in attempts:
        if try_install(args):
            return args[-1], args
    raise RuntimeError(f"torch {TORCH_VERSION} could not be installed from any index (tried "
                       + "; ".join(" ".join(a) for a in attempts) + ")")


def _pip_steps(version: str) -> list[list[str]]:
    """The installs after torch (the constraints file keeps the torch chosen)."""
    pins = VERSIONS[version]
    return [
        ["--no-deps", f"sglang=={pins['sglang']}"],
        [
            f"transformers=={pins['transformers']}", f"tokenizers=={pins['tokenizers']}",
            f"xgrammar=={pins['xgrammar']}", f"openai=={pins['openai']}",
            f"apache-tvm-ffi=={pins['apache-tvm-ffi']}", *_COMMON_DEPS,
        ],
        # its deps would drag in CUDA torch again
        ["--no-deps", f"compressed-tensors=={pins['compressed-tensors']}"],
    ]


def _spec_fingerprint(version: str) -> str:
    # "torch==2.13.0" first, as the recipe had it before the choice moved to choose_torch: the
    # fingerprint of existing venvs stays valid (whichever torch they got).
    spec = {"python": BASE_PYTHON, "pin": TORCH_PIN, "steps": [[TORCH_PYPI_PIN], *_pip_steps(version)]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _run_logged(cmd: list[str], log_file: Path, what: str, check: bool = True) -> bool:
    t0 = time.monotonic()
    with open(log_file, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0 and check:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{what} failed (rc={rc}); full log: {log_file}\n{tail}")
    _log(f"  {what}: {time.monotonic() - t0:.0f}s" + ("" if rc == 0 else f" (failed, rc={rc})"))
    return rc == 0


def _sync_stubs(venv: Path) -> None:
    """(Re)copy the stand-in packages when their source changed; cheap, no rebuild."""
    digest = _tree_digest(STUBS_DIR)
    marker = venv / STUBS_MARKER
    if marker.exists() and marker.read_text().strip() == digest:
        return
    sp = site_packages(venv)
    for name in STUB_PACKAGES:
        shutil.rmtree(sp / name, ignore_errors=True)
        shutil.copytree(STUBS_DIR / name, sp / name, ignore=shutil.ignore_patterns("__pycache__"))
    marker.write_text(digest + "\n")
    _log(f"  stubs {', '.join(STUB_PACKAGES)} copied into {sp}")


def ensure_venv(version: str) -> Path:
    """Return ``HARNESS_DIR/venv-<version>``, building it on first use (~3 min)."""
    if version not in VERSIONS:
        raise ValueError(f"unknown sglang version {version!r}; known: {sorted(VERSIONS)}")
    venv = HARNESS_DIR / f"venv-{version}"
    fingerprint = _spec_fingerprint(version)
    with file_lock(HARNESS_DIR / f"venv-{version}.lock"):
        marker = venv / COMPLETE_MARKER
        if not (marker.exists() and marker.read_text().strip() == fingerprint):
            _build(version, venv, fingerprint)
        _sync_stubs(venv)
    return venv


def _build(version: str, venv: Path, fingerprint: str) -> None:
    if venv.exists():
        # no/old marker: an interrupted or outdated build; pip cannot be trusted
        # to repair it, so start clean
        _log(f"removing incomplete or outdated {venv}")
        shutil.rmtree(venv)
    log_file = HARNESS_DIR / f"venv-{version}.build.log"
    log_file.write_text("")
    _log(f"building {venv} for sglang {version} (log: {log_file})")
    t0 = time.monotonic()
    tag = venv.name  # builds of several versions run side by side: their lines say which
    _run_logged([BASE_PYTHON, "-m", "venv", str(venv)], log_file, f"{tag}: {BASE_PYTHON} -m venv")
    # `python -m pip` rather than bin/pip: no shebang, so a moved HARNESS_DIR still works
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check"]
    pin, _ = choose_torch(lambda args: _run_logged(pip + args, log_file, f"{tag}: pip install {args[-1]}"
                                                   + (" (PyTorch CPU index)" if TORCH_CPU_INDEX in args else ""),
                                                   check=False))
    _log(f"  {tag}: torch: {pin}")
    constraints = venv / "harness-constraints.txt"
    constraints.write_text(pin + "\n")
    pip += ["-c", str(constraints)]
    for step in _pip_steps(version):
        _run_logged(pip + step, log_file, f"{tag}: pip install {' '.join(step[:2])}{' ...' if len(step) > 2 else ''}")
    _sync_stubs(venv)
    (venv / COMPLETE_MARKER).write_text(fingerprint + "\n")
    _log(f"built {venv} in {time.monotonic() - t0:.0f}s")
