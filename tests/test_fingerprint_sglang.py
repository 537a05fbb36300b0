"""The run fingerprint and ``sgl-probe diff`` on real CPU SGLang 0.5.23 servers, probe from its wheel.

One SGLang file is patched in the real harness venv (a comment appended, so the code that runs is
unchanged for anyone else using the venv meanwhile) and restored in a ``finally`` block, under a
lock, with a backup on disk that the next run restores if this one was killed. Two launches:
A plain, B with ``NCCL_PROTO=LL NCCL_ALGO=Ring`` in the launcher's env and the patched file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from sgl_probe.cli import main
from tests.harness.model import ensure_tiny_model
from tests.harness.server import SGLangServer, free_port
from tests.harness.venv import HARNESS_DIR, ensure_venv, file_lock, site_packages
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

VERSION = "0.5.23"
PATCHED = "sglang/srt/managers/scheduler.py"  # as RECORD names it
NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
# Allow-listed names without a secret word: the secret is only in the value.
PLANTED = {"SGLANG_DEMO_MODEL_URL": "https://bob:hunter2@models.example/llama",
           "CUDA_DEMO_TAG": "hf_PLANTEDSECRET0003"}


@contextlib.contextmanager
def patched_file(venv: Path, rel: str) -> Iterator[Path]:
    """Append a comment to one installed SGLang file; restore bytes and times afterwards."""
    path = site_packages(venv) / rel
    backup = _backup_dir(venv)
    with file_lock(_lock_path(venv)):
        _restore(backup)  # a run killed mid-patch left its backup
        backup.mkdir(parents=True, exist_ok=True)
        st = path.stat()
        (backup / "meta.json").write_text(json.dumps({"path": str(path), "atime_ns": st.st_atime_ns,
                                                      "mtime_ns": st.st_mtime_ns}))
        shutil.copyfile(path, backup / "original")
        try:
            with open(path, "ab") as fh:
                fh.write(b"\n# a local patch (sgl-probe fingerprint test; restored afterwards)\n")
            yield path
        finally:
            _restore(backup)


def _backup_dir(venv: Path) -> Path:
    return HARNESS_DIR / f"{venv.name}.patch-backup"


def _lock_path(venv: Path) -> Path:
    return HARNESS_DIR / f"{venv.name}.patch.lock"


def _restore(backup: Path) -> None:
    meta = backup / "meta.json"
    if not meta.exists():
        return
    info = json.loads(meta.read_text())
    shutil.copyfile(backup / "original", info["path"])
    os.utime(info["path"], ns=(info["atime_ns"], info["mtime_ns"]))
    shutil.rmtree(backup)


def doctor(venv: Path) -> dict:
    out = subprocess.run([str(venv / "bin" / "sgl-probe"), "doctor", "--json"], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **PLANTED})
    assert out.returncode in (0, 1), out.stderr[-2000:]
    return json.loads(out.stdout)


def trace_spans(trace_dir: Path, name: str) -> list[dict]:
    spans = []
    for f in sorted(trace_dir.glob("*.jsonl")) if trace_dir.exists() else ():
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    spans += [s for s in ss["spans"] if s["name"] == name]
    return spans


def attrs_of(span: dict) -> dict:
    out = {}
    for a in span["attributes"]:
        v = a["value"]
        if "arrayValue" in v:
            out[a["key"]] = [next(iter(x.values())) for x in v["arrayValue"].get("values", [])]
        elif "intValue" in v:  # a string in OTLP/JSON
            out[a["key"]] = int(v["intValue"])
        else:
            out[a["key"]] = next(iter(v.values()), None)
    return out


def launch(venv: Path, model: Path, trace_dir: Path, port: int, extra_env: dict, log: Path) -> None:
    env = {"SGL_PROBE": "1", "SGL_PROBE_TRACE_DIR": str(trace_dir), "OTEL_BSP_SCHEDULE_DELAY": "200",
           "SGL_PROBE_RUN_ID": None, "SGL_PROBE_LAUNCHER_ENV": None, "NCCL_PROTO": None, "NCCL_ALGO": None,
           **PLANTED, **extra_env}
    with SGLangServer(venv, model, tp=1, port=port, env=env, log_path=log) as server:
        server.generate("hello world", 4)
        deadline = time.monotonic() + 90
        while not trace_spans(trace_dir, "sgl_probe.fingerprint") and time.monotonic() < deadline:
            time.sleep(0.5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fingerprint")
    venv = ensure_venv(VERSION)
    install_wheel(venv, build_wheel(tmp / "wheel"))
    model = ensure_tiny_model(venv)
    port = free_port()  # both launches on one port: the command lines differ in nothing else
    out = {"venv": venv, "a": tmp / "a", "b": tmp / "b"}
    with file_lock(_lock_path(venv)):
        # A run killed mid-patch left the file patched: the clean side must not see it.
        _restore(_backup_dir(venv))
    out["doctor_clean"] = doctor(venv)
    launch(venv, model, out["a"], port, {}, tmp / "a.log")
    with patched_file(venv, PATCHED):
        out["doctor_patched"] = doctor(venv)
        launch(venv, model, out["b"], port, NCCL, tmp / "b.log")
    return out


def sgl_probe(capsys, *args: str) -> tuple[int, str]:
    """The checkout's CLI: reading traces needs no SGLang (and the shared venv's copy of the probe
    may have been reinstalled by another test session meanwhile)."""
    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_doctor_names_the_patched_file_and_only_while_patched(runs):
    for key, want in (("doctor_clean", []), ("doctor_patched", [PATCHED])):
        sg = runs[key]["fingerprint"]["sglang"]
        assert sg["install"] == "wheel" and sg["version"] == VERSION, key
        assert sg["patched"] == want and sg["missing"] == [], key
        assert sg["checked"] > 1000
    # Only the file whose inode changed after install was read: the check is one stat per file.
    assert runs["doctor_patched"]["fingerprint"]["sglang"]["hashed"] < 10
    env = runs["doctor_clean"]["fingerprint"]["launcher_env"]
    assert env["SGLANG_DEMO_MODEL_URL"] == "https://bob:<redacted>@models.example/llama"
    assert env["CUDA_DEMO_TAG"] == "<redacted>"


def test_each_scheduler_exports_one_fingerprint(runs):
    for side, want in (("a", []), ("b", [PATCHED])):
        spans = trace_spans(runs[side], "sgl_probe.fingerprint")
        assert len(spans) == 1, side  # tp 1: one scheduler process
        a = attrs_of(spans[0])
        assert a["fingerprint.sglang.patched_files"] == want, side
        assert a["fingerprint.sglang.version"] == VERSION and a["fingerprint.sglang.install"] == "wheel"
        assert a["fingerprint.torch.version"].startswith("2.") and a["fingerprint.gpu.count"] == 0
        args = a["fingerprint.server_args"]
        assert "--model-path" in args and "--attention-backend" in args, args  # the launcher's argv
        assert a["sglang.tp_rank"] == 0
        names = a["fingerprint.launcher_env_names"]
        assert [n for n in names if n.startswith("NCCL_")] == (["NCCL_ALGO", "NCCL_PROTO"] if side == "b" else [])


def test_no_planted_secret_leaves_the_process(runs):
    for side in ("a", "b"):
        blob = "".join(f.read_text() for f in runs[side].glob("*.jsonl"))
        assert "https://bob:<redacted>@models.example/llama" in blob
        for secret in ("hunter2", "PLANTEDSECRET0003"):
            assert secret not in blob, side


def test_diff_names_exactly_the_variables_and_the_file(runs, capsys):
    rc, out = sgl_probe(capsys, "diff", str(runs["a"]), str(runs["b"]), "--json")
    assert rc == 1, out
    d = json.loads(out)
    want = {"NCCL_ALGO": {"a": None, "b": "Ring"}, "NCCL_PROTO": {"a": None, "b": "LL"}}
    assert d["env"] == {"tp0": want}
    assert d["launcher_env"] == want
    assert d["files"] == {"patched SGLang files": {"only_a": [], "only_b": [PATCHED]}}
    assert d["differs"] == ["env", "launcher_env", "files"], d
    rc, out = sgl_probe(capsys, "diff", str(runs["a"]), str(runs["b"]))
    assert rc == 1 and f"patched SGLang files only in {runs['b']}: {PATCHED}" in out
    assert "env tp0: NCCL_ALGO (unset) -> Ring; NCCL_PROTO (unset) -> LL" in out


def test_same_run_shows_no_difference(runs, capsys):
    rc, out = sgl_probe(capsys, "diff", str(runs["a"]), str(runs["a"]))
    assert rc == 0 and "no difference" in out, out


def test_doctor_and_the_server_record_the_same_code_and_versions(runs):
    """Two independent collections of one install (the doctor CLI, a scheduler process) agree."""
    for doc, side in (("doctor_clean", "a"), ("doctor_patched", "b")):
        fp = runs[doc]["fingerprint"]
        a = attrs_of(trace_spans(runs[side], "sgl_probe.fingerprint")[0])
        sg = fp["sglang"]
        assert (a["fingerprint.sglang.version"], a["fingerprint.sglang.path"], a["fingerprint.sglang.install"]) == \
            (sg["version"], sg["path"], sg["install"])
        assert a["fingerprint.sglang.patched_files"] == sg["patched"]
        assert a["fingerprint.sglang.missing_files"] == sg["missing"]
        assert a["fingerprint.python.version"] == fp["python"] and a["fingerprint.torch.version"] == fp["torch"]
        assert a["fingerprint.gpu.count"] == fp["gpu_count"]
