"""The run fingerprint's parts on real files: a wheel-style install checked against its RECORD, a
real git checkout, bytecode, versions without CUDA, and the span attributes."""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sgl_probe import contract as C, fingerprint
from sgl_probe.redact import REDACTED

PKG = "fpfakepkg"
FILES = {"__init__.py": "VERSION = '1.0'\n", "engine.py": "def run():\n    return 1\n",
         "sub/__init__.py": "", "sub/topk.py": "K = 4\n", "data/table.json": '{"a": 1}\n'}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_install(site: Path, settle_s: float = 0.0) -> Path:
    """A package installed the way pip lays out a wheel: files, then dist-info with RECORD last."""
    rows = []
    for rel, text in FILES.items():
        path = site / PKG / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rows.append(f"{PKG}/{rel},{_hash(text.encode())},{len(text.encode())}")
    dist = site / f"{PKG}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PKG}\nVersion: 1.0\n")
    rows += [f"{PKG}/__pycache__/engine.cpython-311.pyc,,", f"{dist.name}/METADATA,,", f"{dist.name}/RECORD,,"]
    time.sleep(settle_s)  # the files' inode change times fall clearly before RECORD's
    (dist / "RECORD").write_text("\n".join(rows) + "\n")
    return dist / "RECORD"


def test_record_check_unchanged_install_hashes_nothing(tmp_path):
    record = make_install(tmp_path, settle_s=0.05)
    res = fingerprint.record_check(str(record), str(tmp_path), PKG)
    assert res == {"checked": 5, "hashed": 0, "patched": [], "missing": []}
    full = fingerprint.record_check(str(record), str(tmp_path), PKG, full=True)
    assert full == {"checked": 5, "hashed": 5, "patched": [], "missing": []}


def test_record_check_finds_each_kind_of_local_change(tmp_path):
    record = make_install(tmp_path, settle_s=0.05)
    engine = tmp_path / PKG / "engine.py"
    st = engine.stat()
    # Same size, modification time put back: only the content (and the inode change time) differ.
    engine.write_text(FILES["engine.py"].replace("1", "2"))
    os.utime(engine, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert engine.stat().st_size == st.st_size and engine.stat().st_mtime_ns == st.st_mtime_ns
    (tmp_path / PKG / "sub" / "topk.py").write_text("K = 8  # tuned\n")  # another size
    (tmp_path / PKG / "data" / "table.json").unlink()
    res = fingerprint.record_check(str(record), str(tmp_path), PKG)
    assert res["patched"] == [f"{PKG}/engine.py", f"{PKG}/sub/topk.py"]
    assert res["missing"] == [f"{PKG}/data/table.json"]
    assert res["hashed"] == 1  # the size change needs no hash; untouched files are not read


def test_sglang_code_for_an_installed_wheel(tmp_path, monkeypatch):
    make_install(tmp_path, settle_s=0.05)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    (tmp_path / PKG / "engine.py").write_text("def run():\n    return 2  # local fix\n")
    code = fingerprint.sglang_code(top=PKG)
    assert code["install"] == "wheel" and code["version"] == "1.0"
    assert code["path"] == os.path.realpath(tmp_path / PKG)
    assert code["patched"] == [f"{PKG}/engine.py"] and code["missing"] == []
    assert "git_commit" not in code and not code.get("errors")


def test_sglang_code_absent():
    code = fingerprint.sglang_code(top="no_such_package_fp")
    assert code == {"version": None, "path": None, "install": "absent"}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_checkout_commit_and_modified_files(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    pkg = repo / "python" / PKG
    pkg.mkdir(parents=True)
    for rel, text in FILES.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (repo / ".gitignore").write_text("__pycache__/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    head = _git(repo, "rev-parse", "HEAD").strip()
    (pkg / "engine.py").write_text("def run():\n    return 3\n")
    (pkg / "sub" / "new_backend.py").write_text("X = 1\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "gone.cpython-311.pyc").write_bytes(b"\0" * 16)  # source deleted
    state = fingerprint.git_state(str(pkg))
    assert state["commit"] == head
    assert state["modified"] == [f"python/{PKG}/engine.py", f"python/{PKG}/sub/new_backend.py"]
    monkeypatch.syspath_prepend(str(repo / "python"))
    importlib.invalidate_caches()
    code = fingerprint.sglang_code(top=PKG)
    assert code["install"] == "git" and code["git_commit"] == head
    assert code["git_modified"] == state["modified"]
    assert code["orphaned_bytecode"] == [f"{PKG}/__pycache__/gone.cpython-311.pyc"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_package_inside_an_unrelated_repository_is_not_a_checkout(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("venv/\n")
    pkg = tmp_path / "venv" / "site-packages" / PKG
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    assert fingerprint.git_state(str(pkg)) is None


def test_bytecode_that_runs_instead_of_its_source(tmp_path, monkeypatch):
    name = "fpbytecodepkg"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 1\n")
    py_compile.compile(str(pkg / "mod.py"), cfile=importlib.util.cache_from_source(str(pkg / "mod.py")),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    (pkg / "legacy.py").write_text("X = 1\n")
    py_compile.compile(str(pkg / "legacy.py"), cfile=str(pkg / "legacy.pyc"))
    (pkg / "legacy.py").unlink()  # a sourceless module: Python imports legacy.pyc
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        (pkg / "mod.py").write_text("VALUE = 2\n")  # the source changes; the unchecked .pyc still runs
        mod = importlib.import_module(name + ".mod")
        assert mod.VALUE == 1
        res = fingerprint.bytecode_check(str(pkg), name)
        assert res["stale"] == [name + ".mod"]
        assert res["orphaned"] == [f"{name}/legacy.pyc (imported without source)"]
    finally:
        for key in [k for k in sys.modules if k.startswith(name)]:
            del sys.modules[key]


def test_runtime_versions_do_not_import_torch_or_touch_cuda():
    had = "torch" in sys.modules
    rv = fingerprint.runtime_versions()
    assert ("torch" in sys.modules) == had
    assert rv["python"] == sys.version.split()[0]
    assert rv["gpu_count"] == len(rv["gpu_models"])
    if not had:
        assert "torch" not in rv


def test_collect_and_span_attributes(tmp_path, monkeypatch):
    make_install(tmp_path, settle_s=0.05)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    (tmp_path / PKG / "sub" / "topk.py").write_text("K = 16\n")
    code = fingerprint.sglang_code(top=PKG)
    fp = fingerprint.collect(argv=["-m", "sglang.launch_server", "--api-key", "s3cret", "--port", "1"],
                             launcher_env={"NCCL_PROTO": "LL", "NCCL_X": "https://u:pw@h"})
    fp["sglang"] = code  # the fake package in place of sglang, which this test venv lacks
    attrs = fingerprint.to_attributes(fp)
    assert attrs[C.FP_PATCHED] == [f"{PKG}/sub/topk.py"]
    assert attrs[C.FP_RECORD_CHECKED] == 5 and attrs[C.FP_SGLANG_INSTALL] == "wheel"
    assert attrs[C.FP_SERVER_ARGS] == ["-m", "sglang.launch_server", "--api-key", REDACTED, "--port", "1"]
    assert attrs[C.FP_LAUNCHER_ENV_NAMES] == ["NCCL_PROTO", "NCCL_X"]
    assert attrs[C.FP_LAUNCHER_ENV_PREFIX + "NCCL_X"] == f"https://u:{REDACTED}@h"
    assert attrs[C.FP_RUNTIME["python"]] == sys.version.split()[0]
    assert all(k.startswith(C.FP_PREFIX) for k in attrs)
    assert all(isinstance(v, (str, int, float, bool, list)) for v in attrs.values())
    assert "s3cret" not in repr(attrs) and "pw@" not in repr(attrs)


def test_the_fingerprint_names_the_probe_code_that_runs(tmp_path, monkeypatch):
    """The probe's own package, found the way SGLang's is: where it was imported from, and a
    probe checked against its wheel's RECORD."""
    import sgl_probe

    fp = fingerprint.collect(argv=[])
    assert fp["sgl_probe"]["path"] == os.path.dirname(os.path.realpath(sgl_probe.__file__))
    assert fp["sgl_probe"]["install"] in ("wheel", "git")
    attrs = fingerprint.to_attributes(fp)
    assert attrs[C.FP_PROBE["path"]] == fp["sgl_probe"]["path"]
    assert any(line.startswith("sgl-probe ") for line in fingerprint.text_lines(fp))
    # A patched probe install is named like a patched SGLang (the fake package stands in for it).
    make_install(tmp_path, settle_s=0.05)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    (tmp_path / PKG / "engine.py").write_text("def run():\n    return 3\n")
    fp["sgl_probe"] = fingerprint.sglang_code(top=PKG)
    attrs = fingerprint.to_attributes(fp)
    assert attrs[C.FP_PROBE["patched"]] == [f"{PKG}/engine.py"] and attrs[C.FP_PROBE["install"]] == "wheel"
