"""Build what travels to the GPU machine for the real-SGLang benchmarks: ``python3
benchmarks/gpu_sglang/build.py`` (on any Linux machine with PyPI; the first build takes a few
minutes, later builds only refresh the sgl-probe wheel).

Writes ``.carry/gpu_sglang/`` at the repository root (git-ignored):

- ``whl/``: the cp312 wheels of ``wheels.txt`` (what SGLang imports that the GPU image lacks);
- ``sglang-0.5.23.tar.xz``: SGLang's own cp312 wheel, unpacked without its tests and four optional
  Rust extensions the server does not load (they alone would exceed the size limit), re-packed;
- ``probe/``: the sgl-probe wheel built from this checkout (installed there as a user would);
- ``models/``: a tiny real-weight Llama (4 layers, hidden 256) and its EAGLE-3 copy draft, and the
  32B-class configs (random ``--load-format dummy`` weights) with the tiny model's tokenizer;
- ``jitcache.tgz`` when a previous run brought SGLang's JIT kernel cache back (saves minutes).

``--no-draft`` keeps the tiny model's EAGLE-3 draft (~6 MiB) beside the folder instead of in it
(``.carry/gpu_sglang_drafts/``), for calls whose suites decode without it (``overhead*``,
``seed``); a later build without the flag puts it back.

The benchmark stand-ins (``standins/``) travel with the checkout itself. ``run.sh`` there installs
all of it under /tmp and runs ``device.py``. Everything that travels must stay under 64 MiB.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SGLANG_VERSION = "0.5.23"
PY_TAG = "3.12"
# pip matches manylinux tags exactly: list every one the wheels above are published for.
PLATFORMS = ["manylinux_2_%d_x86_64" % n for n in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64"]
# Parts of SGLang's wheel the benchmarks never import (server-side Rust extensions for other
# entry points, and its test suite).
STRIP = ("sglang/test/", "sglang/srt/rust_extensions/_bench", "sglang/srt/rust_extensions/_grpc",
         "sglang/srt/rust_extensions/_multimodal", "sglang/srt/rust_extensions/_server")
LIMIT_BYTES = 64 * 2**20
TINY = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "intermediate": 512, "vocab": 2048, "seed": 1}


def read_wheel_list(path: Path = HERE / "wheels.txt") -> list[str]:
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if "==" not in line:
                raise ValueError(f"{path.name}: {line!r} is not pinned (name==version)")
            reqs.append(line)
    names = [r.split("==")[0].lower().replace("_", "-") for r in reqs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"{path.name}: more than one version of {sorted(dup)}")
    return reqs


def wheel_name_matches(req: str, filename: str) -> bool:
    """Whether ``filename`` is a wheel of ``name==version`` (wheel names normalise - to _)."""
    name, version = req.split("==")
    norm = name.lower().replace("-", "_").replace(".", "_")
    parts = filename.split("-")
    return (filename.endswith(".whl") and len(parts) >= 3
            and parts[0].lower().replace(".", "_") == norm and parts[1] == version)


def missing_wheels(reqs: list[str], folder: Path) -> list[str]:
    have = [p.name for p in folder.glob("*.whl")] if folder.is_dir() else []
    return [r for r in reqs if not any(wheel_name_matches(r, f) for f in have)]


def pip_download(reqs: list[str], dest: Path) -> None:
    if not reqs:
        return
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", PY_TAG, "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + reqs, check=True)


def strip_member(name: str) -> bool:
    return "__pycache__" in name or any(name.startswith(p) for p in STRIP)


def build_sglang_tar(dest: Path) -> None:
    if dest.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        pip_download([f"sglang=={SGLANG_VERSION}"], Path(tmp))
        whl = next(Path(tmp).glob("sglang-*.whl"))
        with zipfile.ZipFile(whl) as zf, tarfile.open(dest.with_suffix(".tmp"), "w:xz") as tf:
            for info in zf.infolist():
                if info.is_dir() or strip_member(info.filename):
                    continue
                data = zf.read(info)
                ti = tarfile.TarInfo(info.filename)
                ti.size = len(data)
                ti.mode = 0o755 if info.filename.endswith(".so") else 0o644
                import io
                tf.addfile(ti, io.BytesIO(data))
    dest.with_suffix(".tmp").rename(dest)


def build_probe_wheel(dest: Path, ref: str | None = None, section_times: bool = False) -> Path:
    """The wheel of this checkout, or of git ``ref`` (to measure two probe builds side by side);
    ``section_times``: its C hot path with the section timers the pause shim reads (benchmark-only)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = REPO
        if ref:
            src = Path(tmp) / "src"
            src.mkdir()
            archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        env = dict(os.environ)
        if section_times:
            env["CC"] = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc") + " -DSGL_PROBE_SECTION_TIMES"
        subprocess.run([gpu_python(), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(src)],
                       check=True, env=env)
    return next(dest.glob("sgl_probe-*.whl"))


#: The GPU image's Python: the probe's C hot path is compiled for it.
GPU_PYTHON = "3.12"


def gpu_python() -> str:
    """An interpreter of the GPU image's Python version (``python3.12`` on PATH, or pyenv's), so the
    wheel carries the C hot path built for it; this interpreter (a pure-Python wheel) otherwise."""
    if "%d.%d" % sys.version_info[:2] == GPU_PYTHON:
        return sys.executable
    found = shutil.which(f"python{GPU_PYTHON}")
    pyenv = sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"), "versions").glob(
        f"{GPU_PYTHON}.*/bin/python{GPU_PYTHON}"))
    for candidate in ([found] if found else []) + [str(p) for p in pyenv]:
        if subprocess.run([candidate, "-c", "import pip"], capture_output=True).returncode == 0:
            return candidate
    print(f"build.py: no Python {GPU_PYTHON} here: the sgl-probe wheel is pure Python (no C hot path)",
          file=sys.stderr)
    return sys.executable


def build_models(dest: Path) -> None:
    """The tiny target, its EAGLE-3 copy draft, and the 32B-class configs (weights: dummy)."""
    sys.path.insert(0, str(REPO))
    from tests.harness.venv import ensure_venv, venv_python

    py = str(venv_python(ensure_venv(SGLANG_VERSION)))
    env = {**os.environ, "SGL_PROBE": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    tiny, draft = dest / "tiny-llama4-h256", dest / "tiny-llama4-h256-eagle3"
    spec = json.dumps(TINY, sort_keys=True)
    marker = tiny / ".built"
    if not (marker.exists() and marker.read_text() == spec and (draft / ".built").exists()):
        shutil.rmtree(tiny, ignore_errors=True)
        shutil.rmtree(draft, ignore_errors=True)
        args = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
        subprocess.run([py, str(REPO / "tests/harness/make_tiny_model.py"), str(tiny), *args], check=True, env=env)
        subprocess.run([py, str(REPO / "tests/harness/make_eagle_draft.py"), str(tiny), str(draft)],
                       check=True, env=env)
        marker.write_text(spec)
        (draft / ".built").write_text(spec)
    for name in ("seed32b", "seed32b-eagle3"):
        out = dest / name
        out.mkdir(parents=True, exist_ok=True)
        for f in (HERE / "models" / name).iterdir():
            shutil.copy2(f, out / f.name)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(tiny / f, out / f)


#: The one large model only the speculative suites (``correct``, ``full``) read.
DRAFT = "tiny-llama4-h256-eagle3"


def place_draft(carry: Path, travels: bool) -> None:
    """Moves the tiny draft into ``carry/models`` (``travels``) or beside ``carry`` (not)."""
    inside, aside = carry / "models" / DRAFT, carry.parent / f"{carry.name}_drafts" / DRAFT
    src, dst = (aside, inside) if travels else (inside, aside)
    if src.is_dir() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dst))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def travelling_bytes(carry: Path) -> int:
    """What one device call sends: the carried folder plus the checkout's tracked files."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = sum((REPO / f).stat().st_size for f in out.decode().split("\0") if f and (REPO / f).is_file())
    return tree_bytes(carry) + tracked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".carry" / "gpu_sglang")
    ap.add_argument("--probe-only", action="store_true", help="only rebuild the sgl-probe wheel")
    ap.add_argument("--ref", help="also carry the wheel of this git ref (probe_ref/), measured beside it")
    ap.add_argument("--section-times", action="store_true",
                    help="the wheels with the C hot path's section timers (the pause shim's self time splits them)")
    ap.add_argument("--no-draft", action="store_true",
                    help="leave the tiny EAGLE-3 draft out of what travels (suites without speculative decoding)")
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.probe_only:
        place_draft(out, travels=True)  # a full build checks the draft where it builds it
        reqs = read_wheel_list()
        (out / "whl").mkdir(exist_ok=True)
        pip_download(missing_wheels(reqs, out / "whl"), out / "whl")
        still = missing_wheels(reqs, out / "whl")
        if still:
            raise SystemExit(f"pip did not fetch {still}")
        build_sglang_tar(out / f"sglang-{SGLANG_VERSION}.tar.xz")
        build_models(out / "models")
    wheel = build_probe_wheel(out / "probe", section_times=args.section_times)
    if args.ref:
        build_probe_wheel(out / "probe_ref", args.ref, section_times=args.section_times)
    else:
        shutil.rmtree(out / "probe_ref", ignore_errors=True)
    place_draft(out, travels=not args.no_draft)
    size = travelling_bytes(out)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:12]
    print(json.dumps({"carry": str(out), "probe_wheel": wheel.name, "probe_sha256": digest,
                      "travelling_mib": round(size / 2**20, 1), "limit_mib": LIMIT_BYTES // 2**20}))
    if size > LIMIT_BYTES:
        print(f"too large: {size / 2**20:.1f} MiB travel per call (limit 64 MiB)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
