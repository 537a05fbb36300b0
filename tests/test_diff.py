"""``sgl-probe diff A B`` and ``report --baseline``'s fingerprint section, on trace files written by
the probe's own span builder and exporter (env snapshots and fingerprints of known content)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from sgl_probe import envsnap, fingerprint
from sgl_probe.cli import main
from sgl_probe.contract import DEFAULT_ENV_ALLOW, FINGERPRINT_SPAN
from sgl_probe.report.diff import parse_args

PATCHED = "sglang/srt/managers/scheduler.py"
BASE_ENV = {"NCCL_SOCKET_IFNAME": "eth0", "CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}
ARGS = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp", "2", "--port", "30000",
        "--api-key", "s3cret"]
FP = {"sglang": {"version": "0.5.23", "path": "/v/site-packages/sglang", "install": "wheel", "checked": 5771,
                 "hashed": 0, "patched": [], "missing": [], "orphaned_bytecode": [], "stale_bytecode": []},
      "python": "3.11.7", "torch": "2.9.1+cu128", "cuda": "12.8", "nccl": "2.27.5", "driver": "570.86.15",
      "gpu_models": ["NVIDIA H200", "NVIDIA H200"], "gpu_count": 2}


def write_run(trace_dir: Path, env: dict, fp: dict | None = None, argv: list | None = None,
              rank_env: dict | None = None, ranks: int = 2, run_id: str | None = None) -> Path:
    """One run as a server writes it: per rank, an nccl_init env snapshot and a fingerprint."""
    from sgl_probe.sinks import JsonLinesExporter, make_resource
    from sgl_probe.spans import build_env_span

    trace_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or "run-" + trace_dir.name
    launcher = dict(env)
    envsnap.record_launcher_env(DEFAULT_ENV_ALLOW, launcher)
    for rank in range(ranks):
        ident = {"tp_rank": rank, "dp_rank": 0, "pp_rank": 0}
        res = make_resource(ident, run_id, "0.5.23")
        worker_env = {**launcher, **(rank_env or {}).get(rank, {})}
        spans = [build_env_span(envsnap.snapshot_attributes("nccl_init", DEFAULT_ENV_ALLOW, worker_env),
                                1_790_000_000_000_000_000, run_id, ident, res)]
        if fp is not None:
            full = copy.deepcopy(fp)
            full["server_args"] = argv or ARGS
            full["launcher_env"] = envsnap.launcher_env(launcher)
            spans.append(build_env_span(fingerprint.to_attributes(full), 1_790_000_000_000_000_001, run_id,
                                        ident, res, FINGERPRINT_SPAN))
        JsonLinesExporter(str(trace_dir / f"sgl-probe-{rank}.jsonl")).export(spans)
    return trace_dir


def diff(capsys, a: Path, b: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["diff", str(a), str(b), *extra])
    return rc, capsys.readouterr().out


def diff_json(capsys, a: Path, b: Path) -> tuple[int, dict]:
    rc, out = diff(capsys, a, b, "--json")
    return rc, json.loads(out)


def test_identical_runs_show_no_difference(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    b = write_run(tmp_path / "b", BASE_ENV, FP)  # another run id, written separately
    rc, d = diff_json(capsys, a, b)
    assert rc == 0 and d["same"] is True and d["differs"] == [] and d["fingerprints"] == {"a": 2, "b": 2}
    rc, out = diff(capsys, a, b)
    assert rc == 0 and "no difference" in out


def test_nccl_variables_and_a_patched_file_are_named_exactly(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    patched = copy.deepcopy(FP)
    patched["sglang"]["patched"] = [PATCHED]
    b = write_run(tmp_path / "b", {**BASE_ENV, "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, patched)
    rc, d = diff_json(capsys, a, b)
    assert rc == 1
    want = {"NCCL_ALGO": {"a": None, "b": "Ring"}, "NCCL_PROTO": {"a": None, "b": "LL"}}
    assert d["env"] == {"tp0": want, "tp1": want}
    assert d["launcher_env"] == want
    assert d["files"] == {"patched SGLang files": {"only_a": [], "only_b": [PATCHED]}}
    assert d["differs"] == ["env", "launcher_env", "files"] and d["unexpected"] == d["differs"]
    assert d["server_args"] == {} and d["versions"] == {} and d["gpu"] == {}
    rc, out = diff(capsys, a, b)
    lines = out.splitlines()
    assert lines[0].endswith("differs in env, launcher_env, files")
    assert "  env tp0: NCCL_ALGO (unset) -> Ring; NCCL_PROTO (unset) -> LL" in lines
    assert f"  patched SGLang files only in {b}: {PATCHED}" in lines


def test_sglangs_per_launch_id_is_not_a_difference(tmp_path, capsys):
    a = write_run(tmp_path / "a", {**BASE_ENV, "SGLANG_RUN_ID": "sglang-run-1"}, FP)
    b = write_run(tmp_path / "b", {**BASE_ENV, "SGLANG_RUN_ID": "sglang-run-2"}, FP)
    assert diff_json(capsys, a, b)[1]["same"] is True


def test_env_differs_on_one_rank_only(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    b = write_run(tmp_path / "b", BASE_ENV, FP, rank_env={1: {"NCCL_IB_HCA": "mlx5_1"}})
    rc, d = diff_json(capsys, a, b)
    assert rc == 1 and d["env"] == {"tp1": {"NCCL_IB_HCA": {"a": None, "b": "mlx5_1"}}}
    assert d["launcher_env"] == {}  # the launcher was the same: a worker's env changed


def test_versions_gpus_and_arguments(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    other = copy.deepcopy(FP)
    other.update(torch="2.9.0+cu128", gpu_models=["NVIDIA H100 80GB HBM3"] * 2, driver="565.57.01")
    argv = ARGS[:-2] + ["--api-key", "other", "--port", "30001", "--disable-cuda-graph"]
    b = write_run(tmp_path / "b", BASE_ENV, other, argv=argv)
    rc, d = diff_json(capsys, a, b)
    assert rc == 1
    assert d["versions"] == {"torch": {"a": "2.9.1+cu128", "b": "2.9.0+cu128"},
                             "driver": {"a": "570.86.15", "b": "565.57.01"}}
    assert d["gpu"] == {"gpu models": {"a": ["NVIDIA H200"] * 2, "b": ["NVIDIA H100 80GB HBM3"] * 2}}
    # The API keys differ, but both are redacted: no difference, and no secret in the output.
    assert d["server_args"] == {"--port": {"a": "30000", "b": "30001"},
                                "--disable-cuda-graph": {"a": None, "b": "(set)"}}
    assert "s3cret" not in json.dumps(d) and "other" not in json.dumps(d["server_args"])


def test_a_run_with_another_build_of_the_probe_says_so(tmp_path, capsys):
    """Both report sgl-probe 0.1.0; one imported a checkout with a modified file: the version alone
    would hide that the two runs measured with different probe code."""
    wheel = {**FP, "sgl_probe": {"version": "0.1.0", "path": "/v/site-packages/sgl_probe", "install": "wheel",
                                 "patched": []}}
    checkout = {**FP, "sgl_probe": {"version": "0.1.0", "path": "/src/sgl-probe/sgl_probe", "install": "git",
                                    "git_commit": "abc123", "git_modified": ["sgl_probe/timing.py"]}}
    a = write_run(tmp_path / "a", BASE_ENV, wheel)
    b = write_run(tmp_path / "b", BASE_ENV, checkout)
    rc, d = diff_json(capsys, a, b)
    assert rc == 1 and "versions" in d["unexpected"]
    assert d["versions"] == {"sgl-probe install": {"a": "wheel", "b": "git"},
                             "sgl-probe git commit": {"a": None, "b": "abc123"}}
    assert d["files"] == {"modified files in the sgl-probe checkout": {"only_a": [], "only_b": ["sgl_probe/timing.py"]}}
    rc, d = diff_json(capsys, a, write_run(tmp_path / "c", BASE_ENV, wheel))
    assert d["same"]


def test_a_baseline_on_another_port_is_shown_but_not_doubted(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    argv = [x if x != "30000" else "30001" for x in ARGS] + ["--host", "0.0.0.0", "--speculative-algorithm", "EAGLE3"]
    b = write_run(tmp_path / "b", BASE_ENV, FP, argv=argv)
    rc, d = diff_json(capsys, a, b)
    assert rc == 1 and d["differs"] == ["server_args"] and d["unexpected"] == []
    assert set(d["server_args"]) == {"--port", "--host", "--speculative-algorithm"}
    _, out = diff(capsys, a, b)
    assert "server arg --port: 30000 -> 30001  (where it listens)" in out
    assert "server arg --host: (unset) -> 0.0.0.0  (where it listens)" in out
    # any other flag still makes the baseline suspect
    c = write_run(tmp_path / "c", BASE_ENV, FP, argv=argv + ["--disable-cuda-graph"])
    assert diff_json(capsys, a, c)[1]["unexpected"] == ["server_args"]


def test_a_flag_only_on_one_side_is_a_difference():
    assert parse_args(["-m", "x", "--a", "1", "--b=2", "--flag", "--multi", "x", "y"]) == {
        "(command)": "-m x", "--a": "1", "--b": "2", "--flag": "(set)", "--multi": "x y"}


def test_missing_fingerprint_is_said_not_hidden(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, None)
    b = write_run(tmp_path / "b", BASE_ENV, FP)
    rc, out = diff(capsys, a, b)
    assert rc == 0 and "has no sgl_probe.fingerprint spans" in out


def test_input_without_probe_spans_is_an_error(tmp_path, capsys):
    a = write_run(tmp_path / "a", BASE_ENV, FP)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["diff", str(a), str(empty)]) == 2
    assert "no sgl_probe.env_snapshot or sgl_probe.fingerprint spans" in capsys.readouterr().err


def test_report_baseline_puts_the_difference_first_and_marks_the_verdict(tmp_path, capsys):
    from tests.test_report_verdict import write_trace

    spec, base = tmp_path / "spec", tmp_path / "base"
    spec.mkdir()
    base.mkdir()
    cycle = [("draft", "DECODE", 4.0, True, None), ("verify", "TARGET_VERIFY", 29.0, False, 2.0),
             ("draft_extend", "DRAFT_EXTEND", 2.0, True, None)]
    write_trace(str(spec / "steps.jsonl"), [cycle] * 20)
    write_trace(str(base / "steps.jsonl"), [[("decode", "DECODE", 12.1, True, None)]] * 20)
    spec_args = ARGS + ["--speculative-algorithm", "EAGLE3"]
    write_run(spec, BASE_ENV, FP, argv=spec_args, ranks=1, run_id="seed-run")
    write_run(base, BASE_ENV, FP, ranks=1, run_id="seed-run")
    # Only the speculative settings differ: expected, the verdict stands unmarked.
    capsys.readouterr()
    assert main(["report", str(spec), "--baseline", str(base), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline_diff"]["differs"] == ["server_args"] and doc["baseline_diff"]["unexpected"] == []
    assert "baseline_fingerprint_differs" not in doc["speculative"]["verdict"]
    # The baseline ran with leftover NCCL settings on a patched SGLang: said first, and by the verdict.
    patched = copy.deepcopy(FP)
    patched["sglang"]["patched"] = [PATCHED]
    for f in base.glob("sgl-probe-*.jsonl"):
        f.unlink()
    write_run(base, {**BASE_ENV, "NCCL_PROTO": "LL"}, patched, ranks=1, run_id="seed-run")
    capsys.readouterr()
    assert main(["report", str(spec), "--baseline", str(base)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("Run fingerprint: baseline vs this run: differs in env, launcher_env, files")
    verdict = next(line for line in out.splitlines() if line.startswith("  => "))
    assert "measured against a baseline whose fingerprint differs in env, launcher_env, files" in verdict
    assert out.index("Run fingerprint") < out.index("  => ")


def test_report_without_baseline_has_no_fingerprint_section(tmp_path, capsys):
    run = write_run(tmp_path / "a", BASE_ENV, FP)
    from tests.test_report_verdict import write_trace

    write_trace(str(run / "steps.jsonl"), [[("decode", "DECODE", 1.0, True, None)]] * 3)
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    assert "Run fingerprint" not in capsys.readouterr().out
