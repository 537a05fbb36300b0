"""The real-GPU SGLang benchmark (benchmarks/gpu_sglang) without a GPU: the builder's logic, the
benchmark stand-ins' arithmetic on CPU torch, and the judging code on SGLang-shaped inputs."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu_sglang"
sys.path.insert(0, str(GPU))

import analysis  # noqa: E402
import build  # noqa: E402


def test_wheel_list_is_pinned_unique_and_matches_wheel_names(tmp_path: Path):
    reqs = build.read_wheel_list()
    assert len(reqs) > 40 and all("==" in r for r in reqs)
    assert build.wheel_name_matches("partial-json-parser==0.2.1.1.post7",
                                    "partial_json_parser-0.2.1.1.post7-py3-none-any.whl")
    assert build.wheel_name_matches("pydantic-core==2.50.5", "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl")
    assert not build.wheel_name_matches("pydantic==2.14.4", "pydantic_core-2.14.4-cp312-none-any.whl")
    assert not build.wheel_name_matches("pydantic==2.14.4", "pydantic-2.14.3-py3-none-any.whl")
    (tmp_path / "fastapi-0.165.0-py3-none-any.whl").write_text("")
    assert build.missing_wheels(["fastapi==0.165.0", "orjson==3.13.0"], tmp_path) == ["orjson==3.13.0"]
    bad = tmp_path / "w.txt"
    bad.write_text("a==1\nA==2\n")
    with pytest.raises(ValueError, match="more than one version"):
        build.read_wheel_list(bad)
    bad.write_text("fastapi\n")
    with pytest.raises(ValueError, match="not pinned"):
        build.read_wheel_list(bad)


def test_sglang_strip_rules_keep_the_server_and_drop_tests_and_unused_extensions():
    assert build.strip_member("sglang/test/test_utils.py")
    assert build.strip_member("sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so")
    assert build.strip_member("sglang/srt/__pycache__/x.cpython-312.pyc")
    assert not build.strip_member("sglang/srt/managers/scheduler.py")
    assert not build.strip_member("sglang/srt/rust_extensions/_radix.cpython-312-x86_64-linux-gnu.so")
    assert not build.strip_member("sglang-0.5.23.dist-info/RECORD")


def test_standins_are_labelled_and_never_in_the_wheel():
    for pkg in ("sgl_kernel", "cutlass", "flash_mla"):
        assert "STAND-IN" in (GPU / "standins" / pkg / "__init__.py").read_text().split('"""')[1]
    assert "STAND-IN" in (GPU / "standins" / "_sgl_bench_anything.py").read_text().split('"""')[1]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'packages = ["sgl_probe"]' in pyproject  # the wheel ships only the probe
    assert not (ROOT / "sgl_probe" / "sgl_kernel").exists()


STANDIN_CHECK = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import sgl_kernel, cutlass, flash_mla
x = torch.randn(5, 64); w = torch.randn(64); r = torch.randn(5, 64)
ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
assert torch.allclose(sgl_kernel.rmsnorm(x, w, 1e-6), ref, atol=1e-5)
out = torch.empty_like(x); sgl_kernel.rmsnorm(x, w, 1e-6, out=out); assert torch.allclose(out, ref, atol=1e-5)
xi, ri = x.clone(), r.clone(); sgl_kernel.fused_add_rmsnorm(xi, ri, w, 1e-6)
s = x + r
assert torch.allclose(ri, s) and torch.allclose(xi, s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w, atol=1e-5)
g = torch.randn(3, 8)
assert torch.allclose(sgl_kernel.silu_and_mul(g), torch.nn.functional.silu(g[:, :4]) * g[:, 4:])
assert sgl_kernel.utils.is_arch_support_pdl() is False
for call in (lambda: sgl_kernel.top_k_renorm_prob(g), lambda: cutlass.cute.kernel(lambda: 0)()):
    try:
        call(); raise SystemExit("placeholder did not raise")
    except NotImplementedError:
        pass
from cutlass.cute.runtime import from_dlpack  # submodules import
import flash_mla.flash_mla_interface
print("STANDINS_OK")
"""


def test_standin_kernels_compute_what_sglang_expects_on_cpu_torch():
    harness = pytest.importorskip("tests.harness.venv")
    venv = harness.HARNESS_DIR / "venv-0.5.23"
    py = harness.venv_python(venv)
    if not py.exists():
        pytest.skip("the 0.5.23 harness venv is built by the SGLang server tests; not built yet")
    proc = subprocess.run([str(py), "-c", STANDIN_CHECK, str(GPU / "standins")], capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "SGL_PROBE": "0"})
    assert "STANDINS_OK" in proc.stdout, proc.stderr[-3000:]


LOG = """\
[2026-12-01 06:00:00] Prefill batch [1], #new-seq: 1, #new-token: 5, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: True, input throughput (token/s): 10.0
[2026-12-01 06:00:00] Decode batch [2], #running-req: 1, #token: 6, token usage: 0.00, accept len: 2.00, accept rate: 0.50, cuda graph: True, gen throughput (token/s): 1.0, #queue-req: 0
[2026-12-01 06:00:00] Decode batch [3], #running-req: 2, #token: 6, token usage: 0.00, accept len: 2.50, accept rate: 0.75, cuda graph: False, gen throughput (token/s): 1.0, #queue-req: 0
[2026-12-01 06:00:01] INFO something else entirely
[2026-12-01 06:00:01] Prefill batch, #new-seq: 2, #new-token: 9, #cached-token: 0, #running-req: 1, #queue-req: 0, cpu graph: False, input throughput (token/s): 3.0
"""


def _span(name, step, graph, start, end, **attrs):
    a = {"sglang.step_index": step, "sglang.cuda_graph": graph, "sgl_probe.duration_ms": (end - start) / 1e6}
    a.update(attrs)
    return {"name": name, "start": start, "end": end, "attrs": a, "pid": 7, "trace_id": None, "error": False, "file": "f"}


def test_log_lines_parse_and_graph_and_accept_agreement_count_exactly():
    lines = analysis.parse_batch_lines(LOG)
    assert [(ln["kind"], ln["iter"], ln["graph"], ln["running"], ln["accept"]) for ln in lines] == [
        ("prefill", 1, True, 0, None), ("decode", 2, True, 1, 2.0), ("decode", 3, False, 2, 2.5),
        ("prefill", None, False, 1, None)]
    spans = [_span("sglang.extend", 1, True, 0, 10), _span("sglang.verify", 2, True, 20, 30, **{
        "sglang.batch_size": 1, "sglang.spec.accept_length": 2.0}),
        _span("sglang.verify", 3, True, 40, 50, **{"sglang.batch_size": 2, "sglang.spec.accept_length": 2.4}),
        _span("sglang.extend", 4, False, 60, 70)]
    g = analysis.graph_agreement(spans, lines, spec=True)
    assert g["verify"]["agree"] == 1 and g["verify"]["first_mismatches"] == [1]
    assert g["extend"]["agree"] == 2 and g["agreement"] == pytest.approx(3 / 4)
    a = analysis.accept_agreement(spans, lines)
    assert (a["agree"], a["batch_size_agree"], a["verify_spans"]) == (1, 2, 2)
    # a missing span shows as disagreement, not as a shorter list that agrees
    assert analysis.graph_agreement(spans[:1], lines, spec=True)["agreement"] == pytest.approx(1 / 4)


def test_metric_counts_against_spans():
    text = ('sglang:cuda_graph_passes_total{mode="decode_cuda_graph",tp_rank="0"} 2.0\n'
            'sglang:cuda_graph_passes_total{mode="prefill_none",tp_rank="0"} 1.0\n'
            'sglang:spec_verify_calls_total{tp_rank="0"} 3.0\n')
    counts = analysis.metric_counts(text)
    assert counts == {"passes": {"decode_cuda_graph": 2.0, "prefill_none": 1.0}, "verify_calls": 3.0}
    spans = [_span("sglang.decode", 1, True, 0, 1), _span("sglang.decode", 2, True, 2, 3),
             _span("sglang.extend", 0, False, 0, 1), _span("sglang.verify", 3, True, 4, 5, **{"sglang.batch_size": 3})]
    assert analysis.count_agreement(spans, counts)["all_equal"]
    assert not analysis.count_agreement(spans[1:], counts)["all_equal"]


def test_profiler_ratio_finds_the_clock_offset_and_the_kernel_envelope(tmp_path: Path):
    base = 1_700_000_000_000_000_000
    spans, events = [], []
    for i in range(20):
        s0 = base + i * 2_000_000
        spans.append(_span("sglang.decode", i, True, s0, s0 + 1_000_000, **{"sgl_probe.start": "gpu_event"}))
        # kernels fill 0.95 of the phase; the profiler's clock runs 40 us behind the probe's
        for j in range(5):
            k0 = s0 + 25_000 + j * 190_000 - 40_000
            events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": (k0 - base) / 1000, "dur": 180.0})
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"baseTimeNanoseconds": base, "traceEvents": events + [{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 5}]}, fh)
    kernels = analysis.read_kernels(str(path))
    assert len(kernels) == 100
    r = analysis.profiler_ratio(spans, kernels)
    # all 5 kernels of a phase stay inside it for offsets from -75 to +165 us
    assert r["spans_matched"] == 20 and -75 <= r["clock_offset_us"] <= 165
    envelope = (4 * 190_000 + 180_000) / 1e6
    assert r["by_phase"]["decode/gpu_event"]["kernel_envelope_p50_ms"] == pytest.approx(envelope, rel=1e-6)
    assert r["ratio_of_sums"] == pytest.approx(1.0 / envelope, rel=1e-6)


def test_profiler_ratio_judges_a_graph_phase_from_its_launch_too():
    """A host-clock graph phase: 300 us of host input preparation (one 10 us copy at its start),
    then the graph's kernels. The span is judged as it is, and from its graph's launch."""
    base = 1_700_000_000_000_000_000
    spans, kernels = [], []
    for i in range(10):
        s0 = base + i * 2_000_000
        spans.append(_span("sglang.decode", i, True, s0, s0 + 1_000_000,
                           **{"sgl_probe.start": "host_clock", "sgl_probe.graph_ms": 0.7}))
        kernels.append((s0 + 5_000, s0 + 15_000))                   # the input copy
        kernels += [(s0 + 310_000 + j * 140_000, s0 + 440_000 + j * 140_000) for j in range(5)]
    r = analysis.profiler_ratio(spans, kernels)
    whole, graph = r["by_phase"]["decode/host_clock"], r["by_phase"]["decode/graph_launch"]
    assert whole["n"] == graph["n"] == 10
    assert whole["kernel_envelope_p50_ms"] == pytest.approx(0.995, rel=1e-3)  # copy .. last kernel
    assert graph["kernel_envelope_p50_ms"] == pytest.approx(0.69, rel=1e-3)   # the graph's kernels only
    assert graph["ratio_of_sums"] == pytest.approx(0.7 / 0.69, rel=1e-3)
    assert r["ratio_of_sums"] == pytest.approx(1.0 / 0.995, rel=1e-3)  # the launch rows are not in it


def test_graph_launches_pairs_each_launch_call_with_its_first_kernel(tmp_path: Path):
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 100.0 * i, "dur": 20.0 + i,
               "args": {"correlation": i}} for i in range(10)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "ts": 100.0 * i + 30 + i + j * 5, "dur": 2.0,
                "args": {"correlation": i}} for i in range(10) for j in range(3)]
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5.0, "dur": 3.0,
                   "args": {"correlation": 99}})
    events.append({"ph": "X", "cat": "kernel", "name": "eager", "ts": 6.0, "dur": 1.0, "args": {"correlation": 99}})
    path = tmp_path / "g.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = analysis.graph_launches(str(path))
    assert (r["launches"], r["with_kernels"]) == (10, 10)
    assert r["call_us"]["p50"] == pytest.approx(24.5) and r["to_first_kernel_us"]["p50"] == pytest.approx(34.5)
    assert r["to_first_kernel_us"]["p10"] == 31.0 and r["to_first_kernel_us"]["p90"] == 39.0


def test_bootstrap_ratio_and_steady_state():
    r = analysis.bootstrap_ratio([100, 101, 99, 100, 102], [90, 91, 89, 90, 92])
    assert r["median_ratio"] == pytest.approx(0.9)
    assert r["ci95"][0] <= 0.9 <= r["ci95"][1] and r["ci95"][1] < 1.0
    first_uses = [_span("sglang.decode", i, True, i * 10, i * 10 + (5000 if i < 2 else 1)) for i in range(10)]
    assert analysis.phase_p50(first_uses, "decode") == pytest.approx(1 / 1e6)


def test_seed_verdict_judges_the_probe_and_sglangs_own_against_the_same_off_launches():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sglang"))
    import device

    raw = {"seedoff_bs1_0": {"tok_s": [50.0, 50.0]}, "seedon_bs1_0": {"tok_s": [49.0, 49.0]},
           "seedoff_bs1_1": {"tok_s": [50.0]}, "seedobs_bs1_1": {"tok_s": [40.0]},
           "seedoff_bs8_0": {"tok_s": [300.0]}, "seedon_bs8_0": {"tok_s": [297.0]}}
    v = device.seed_verdict(raw)
    assert v["bs1"]["seedon_bs1"]["median_ratio"] == pytest.approx(0.98)
    assert v["bs1"]["seedobs_bs1"]["median_ratio"] == pytest.approx(0.8)
    assert v["bs1"]["tok_s_per_launch"]["seedoff_bs1"] == [50.0, 50.0]
    assert "seedobs_bs8" not in v["bs8"] and v["bs8"]["seedon_bs8"]["median_ratio"] == pytest.approx(0.99)


def test_summary_reports_the_cores_each_role_kept_busy_per_window_kind(tmp_path: Path):
    import summarize

    busy = [{"recording": True, "scheduler": 1.0, "exporter": 0.2, "other": 0.5},
            {"recording": True, "scheduler": 0.8, "exporter": 0.4, "other": 0.3},
            {"recording": False, "scheduler": 0.9, "exporter": 0.0, "other": 0.5}]
    doc = {"windows": {"ab_probe_0": {"recording": [1.0], "paused": [1.0], "cores_busy": busy},
                       "ab_aa_0": {"recording": [1.0], "paused": [1.0]}}, "verdict": {}}
    (tmp_path / "gpu_sglang_rX_overhead_ab.json").write_text(json.dumps(doc))
    got = summarize.summarize("t", [str(tmp_path)])["overhead_in_server"]["cores_busy_p50"]
    assert got == {"ab_probe_0": {"scheduler_recording": pytest.approx(0.9), "scheduler_paused": 0.9,
                                  "exporter_recording": pytest.approx(0.3), "exporter_paused": 0.0,
                                  "other_recording": pytest.approx(0.4), "other_paused": 0.5}}


def test_summary_reports_the_scheduler_threads_per_window_kind(tmp_path: Path):
    import summarize

    def window(rec: bool, asleep: float) -> dict:
        threads = {k: 0.0 for k in summarize.THREAD_KEYS}
        threads.update(main_asleep=asleep, main_cpu=1.0 - asleep)
        return {"recording": rec, "scheduler": 1.0, "exporter": 0.0, "other": 0.0, "threads": threads}

    busy = [window(True, 0.10), window(True, 0.30), window(True, 0.05), window(False, 0.02)]
    doc = {"windows": {"ab_probe_0": {"recording": [1.0], "paused": [1.0], "cores_busy": busy}}, "verdict": {}}
    (tmp_path / "gpu_sglang_rX_overhead_ab.json").write_text(json.dumps(doc))
    got = summarize.summarize("t", [str(tmp_path)])["overhead_in_server"]["scheduler_threads_p50"]["ab_probe_0"]
    assert got["main_asleep_recording"] == pytest.approx(0.10) and got["main_asleep_paused"] == pytest.approx(0.02)
    assert got["main_cpu_recording"] == pytest.approx(0.90) and set(got) == {
        f"{k}_{r}" for k in summarize.THREAD_KEYS for r in ("recording", "paused")}


def test_summary_keeps_each_overhead_ab_call_apart_by_tag_with_its_kinds_of_probe_server(tmp_path: Path):
    import summarize

    def call(kinds: dict) -> dict:
        return {"windows": {}, "verdict": {k: {"all_pairs": {"median_ratio": r}} for k, r in kinds.items()}}

    (tmp_path / "gpu_sglang_r7_overhead_ab.json").write_text(json.dumps(call({"probe": 0.97, "aa_control": 1.0})))
    (tmp_path / "gpu_sglang_r8_overhead_ab.json").write_text(json.dumps(call({"none": 0.99, "cputimer": 1.001})))
    (tmp_path / "gpu_sglang_r9_overhead_ab.json").write_text(json.dumps(call({"probe": 0.93, "ref": 0.98})))
    got = summarize.summarize("t", [str(tmp_path)])["overhead_in_server"]
    assert got["r9"]["reference_wheel_recording_over_paused"] == {"median_ratio": 0.98}
    assert got["r7"]["probe_recording_over_paused"] == {"median_ratio": 0.97}
    assert got["r7"]["aa_control"] == {"median_ratio": 1.0} and "cpu_timer_recording_over_paused" not in got["r7"]
    assert got["r8"]["no_export_recording_over_paused"] == {"median_ratio": 0.99}
    assert got["r8"]["cpu_timer_recording_over_paused"] == {"median_ratio": 1.001}
    assert got["r8"]["aa_control"] is None
    assert "first_pair_ratio" not in got["r7"]  # calls from before the first pair was kept apart
    r10 = call({"probe": 0.99})
    r10["windows"] = {"ab_probe_0": {"first_pair": {"recording": 75.0, "paused": 100.0}}, "ab_aa_0": {"first_pair": None}}
    (tmp_path / "gpu_sglang_r10_overhead_ab.json").write_text(json.dumps(r10))
    got = summarize.summarize("t", [str(tmp_path)])["overhead_in_server"]
    assert got["r10"]["first_pair_ratio"] == {"ab_probe_0": 0.75}


def test_the_draft_is_kept_beside_the_carried_folder_and_put_back(tmp_path: Path):
    """``--no-draft``: the tiny EAGLE-3 draft (what the speculative suites alone read) moves out
    of what travels and back in on a build without the flag, never built twice or lost."""
    carry = tmp_path / "gpu_sglang"
    draft = carry / "models" / build.DRAFT
    draft.mkdir(parents=True)
    (draft / "model.safetensors").write_bytes(b"x" * 1000)
    before = build.tree_bytes(carry)
    build.place_draft(carry, travels=False)
    assert not draft.exists() and build.tree_bytes(carry) == before - 1000
    assert (tmp_path / "gpu_sglang_drafts" / build.DRAFT / "model.safetensors").read_bytes() == b"x" * 1000
    build.place_draft(carry, travels=False)  # already aside: nothing moves
    build.place_draft(carry, travels=True)
    assert (draft / "model.safetensors").read_bytes() == b"x" * 1000 and build.tree_bytes(carry) == before
    assert not (tmp_path / "gpu_sglang_drafts" / build.DRAFT).exists()


def test_the_correctness_suites_refuse_without_the_draft_before_starting_anything(tmp_path: Path):
    import device

    (tmp_path / "models" / "tiny-llama4-h256").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="--no-draft"):
        device.suite_full(tmp_path, out, 1)
    assert not list(out.iterdir())  # no receiver started


def test_overhead_ab_refuses_an_unknown_kind_of_probe_server_before_starting_anything(tmp_path: Path):
    import device

    with pytest.raises(ValueError, match="not in"):
        device.suite_overhead_ab(tmp_path, tmp_path, 1, exports=("probe", "bogus"))
    assert not list(tmp_path.iterdir())  # no receiver, no server: nothing written


def test_overhead_ab_refuses_a_reference_server_without_a_reference_wheel(tmp_path: Path, monkeypatch):
    import device

    monkeypatch.setenv("GPU_BENCH_PROBE", str(tmp_path))  # this wheel is there: only the reference is missing
    monkeypatch.setenv("GPU_BENCH_PROBE_REF", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="build.py --ref"):
        device.suite_overhead_ab(tmp_path, tmp_path, 1, exports=("probe", "ref"))
    assert not list(tmp_path.iterdir())


def test_summary_keeps_the_seed_servers_profiler_ratios(tmp_path: Path):
    import summarize

    ratios = {"decode": {"gpu_event": {"ratio": 1.01}}}
    seed = {"baseline": {"p50_ms": {"decode": 19.4}, "profiler": {"by_phase": ratios}},
            "eagle_eager": {"p50_ms": {"verify": 59.8}}, "eagle_graph": {"profiler": {"error": "x"}}}
    (tmp_path / "gpu_sglang_r1_seed.json").write_text(json.dumps(seed))
    got = summarize.summarize("t", [str(tmp_path)])["seed_case"]
    assert got["decode_p50_ms"] == 19.4
    assert got["profiler_ratio"] == {"baseline": ratios, "eagle_graph": None}


def test_two_passes_over_one_server_join_into_one_set_of_pairs():
    import device

    def one(rec, paused, gaps_rec, gaps_paused, n):
        return {"recording": rec, "paused": paused, "cores_busy": [{"recording": True}] * len(rec),
                "requests": n, "request_errors": 0, "gaps_s": {"recording": gaps_rec, "paused": gaps_paused},
                "p99_step_ms": {}}

    a = one([1.0, 2.0], [1.0, 2.0], [0.001] * 49, [0.001] * 50, 5)  # 50 gaps: the p99 is the largest
    b = one([3.0], [4.0], [0.010], [0.002], 2)
    got = device.merge_windows(a, b)
    assert got["recording"] == [1.0, 2.0, 3.0] and got["paused"] == [1.0, 2.0, 4.0]
    assert got["requests"] == 7 and len(got["cores_busy"]) == 3
    assert got["p99_step_ms"]["recording"] == pytest.approx(10.0)  # the slow gap is the second pass's
    assert got["p99_step_ms"]["paused"] == pytest.approx(2.0)
    assert device.merge_windows(None, b) is b and device.merge_windows(a, {"error": "x"}) is a
    a["first_pair"] = {"recording": 0.75, "paused": 1.0}
    assert device.merge_windows(a, b)["first_pair"] == a["first_pair"]  # the first pass's, kept apart


def test_a_servers_first_pair_is_kept_apart_from_the_judged_pairs():
    """The first windows after start-up are warm-up (SGLang compiling for new shapes, h200-14):
    with ``apart`` the first two windows and their CPU entries leave the judged ones."""
    import device

    spans = [(True, 0.0, 1.0), (False, 1.0, 2.0), (False, 2.0, 3.0), (True, 3.0, 4.0)]
    cpu = [{"w": i} for i in range(4)]
    head, rest, rest_cpu = device.first_pair_apart(spans, cpu, True)
    assert head == (spans[:2], cpu[:2]) and rest == spans[2:] and rest_cpu == cpu[2:]
    assert device.first_pair_apart(spans, cpu, False) == (None, spans, cpu)
    assert device.first_pair_apart(spans[:1], cpu[:1], True) == (None, spans[:1], cpu[:1])
    # two servers measured at once: two CPU entries per window
    cpu2 = [{"w": i // 2, "server": i % 2} for i in range(8)]
    head, rest, rest_cpu = device.first_pair_apart(spans, cpu2, True, per_window=2)
    assert head == (spans[:2], cpu2[:4]) and rest_cpu == cpu2[4:]


def test_in_process_ab_judge_pairs_adjacent_windows_per_server_and_overall():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sglang"))
    import device

    windows = {"ab_probe_0": {"recording": [99.0, 98.0, 97.0], "paused": [100.0, 100.0, 100.0]},
               "ab_probe_1": {"recording": [50.0], "paused": [50.0]},
               "broken": {"error": "no sglang::scheduler process"}}
    v = device.ab_judge(windows)
    assert v["per_server"]["ab_probe_0"]["median_ratio"] == pytest.approx(0.98)
    assert v["per_server"]["ab_probe_1"]["median_ratio"] == pytest.approx(1.0)
    assert "broken" not in v["per_server"]
    assert v["all_pairs"]["pairs"] == 4 and v["all_pairs"]["median_ratio"] == pytest.approx((0.98 + 0.99) / 2)
    assert device.ab_judge({}) == {"per_server": {}}


def test_window_tokens_spreads_each_request_evenly_over_its_interval():
    sys.path.insert(0, str(GPU))
    import device

    done = [(0.0, 1.0, 100), (0.5, 1.5, 100), (2.0, 3.0, 10), (1.0, 1.0, 5)]
    assert device.window_tokens(done, 0.0, 1.0) == pytest.approx(100 + 50)
    assert device.window_tokens(done, 0.75, 1.25) == pytest.approx(25 + 50)
    assert device.window_tokens(done, 1.5, 2.0) == 0.0
    assert device.window_tokens(done, -5, 5) == pytest.approx(210)  # a zero-length request adds nothing


def test_chunk_tokens_reads_the_streamed_count_or_counts_chunks():
    sys.path.insert(0, str(GPU))
    import device

    line = b'data: {"text": " fox", "meta_info": {"id": "a1", "prompt_tokens": 9, "completion_tokens": 17, "cached_tokens": 0}}'
    assert device.chunk_tokens(line, 3) == 17
    assert device.chunk_tokens(b'data: {"text": " fox"}', 3) == 3


def test_stream_tokens_counts_only_what_arrived_in_the_window():
    sys.path.insert(0, str(GPU))
    import device

    times, totals = [float("-inf"), 0.5, 1.0, 1.5, 2.5], [0, 4, 8, 12, 20]
    assert device.stream_tokens(times, totals, 0.0, 1.0) == 8  # (0, 1]: the chunks at 0.5 and 1.0
    assert device.stream_tokens(times, totals, 1.0, 2.0) == 4
    assert device.stream_tokens(times, totals, 2.6, 9.0) == 0
    assert device.stream_tokens(times, totals, -1.0, 9.0) == 20


def simulated_windows(factor: float, settle_s: float = 1.2, window_s: float = 3.0, periods: int = 24,
                      conc: int = 16, tokens: int = 1024, step_s: float = 0.0019) -> tuple[list, list]:
    """A steady server's decode steps under alternating states (``settle_s`` + ``window_s`` each,
    as ab_cross_windows flips), recording every other one with steps ``1 / factor`` as long;
    ``conc`` workers each sending its next ``tokens``-token request when the last one returns.
    Returns each window's (recording?, rate from the requests spread, rate as streamed)."""
    import random

    sys.path.insert(0, str(GPU))
    import device

    period = settle_s + window_s
    t, clock = 0.0, [0.0]
    while t < (periods + 1) * period:  # a period past the last window: every request in it ends
        t += step_s / (factor if int(t // period) % 2 else 1.0)
        clock.append(t)
    rng = random.Random(5)
    done, stream_t, stream_n = [], [float("-inf")], [0]
    for w in range(conc):
        k = rng.randrange(tokens)  # staggered starts
        while k + tokens + 1 < len(clock):
            done.append((clock[k], clock[k + tokens], tokens))
            if w == 0:
                stream_t += clock[k + 1:k + tokens + 1]
                stream_n += range(stream_n[-1] + 1, stream_n[-1] + tokens + 1)
            k += tokens + 1  # one step between requests: the next one's prefill
    out = []
    for p in range(2, periods):
        t0 = p * period + settle_s
        t1 = t0 + window_s
        out.append((p % 2 == 1, device.window_tokens(done, t0, t1) / window_s,
                    device.stream_tokens(stream_t, stream_n, t0, t1) / window_s))
    return out


def test_streamed_rates_read_the_states_speed_where_spread_requests_blur_it():
    """1,024-token requests (~2 s) across 4.2 s states: a request running across a flip lends the
    window some of the other state's speed, so spreading each request's tokens over its interval
    reads ~0.77 of a 1 % difference (the estimator of the calls up to r133); the streamed worker's
    tokens, counted as they arrive, read the difference itself."""
    import statistics

    got = simulated_windows(0.99)
    spread = statistics.mean(r for rec, r, _ in got if rec) / statistics.mean(r for rec, r, _ in got if not rec)
    streamed = statistics.mean(s for rec, _, s in got if rec) / statistics.mean(s for rec, _, s in got if not rec)
    assert streamed == pytest.approx(0.99, abs=0.0008)
    assert 0.991 < spread < 0.994  # the blur: 0.7-0.9 of the difference
    flat = simulated_windows(1.0)  # no difference: both read none
    assert {round(r / flat[0][1], 3) for _, r, _ in flat} == {1.0}


def test_steady_load_keeps_every_worker_busy_and_times_the_streamed_gaps():
    """Against a local HTTP stand-in for SGLang's /generate (each request takes ~0.1 s, the
    streamed one sends 5 chunks 20 ms apart, two tokens each, as SGLang's server coalesces a
    stream's queued outputs into one chunk whose ``completion_tokens`` counts them all): no round
    barrier, so the rate over a window is workers x tokens / request time, the streamed worker's
    gaps are the chunk gaps, and its streamed rate counts tokens, not chunks."""
    import http.server
    import threading
    import time

    sys.path.insert(0, str(GPU))
    import device

    class Generate(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = body["sampling_params"]["max_new_tokens"]
            self.send_response(200)
            self.end_headers()
            if body.get("stream"):
                for k in range(5):
                    time.sleep(0.02)
                    self.wfile.write(b'data: {"text": "x", "meta_info": {"completion_tokens": %d}}\n\n' % (2 * k + 2))
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                time.sleep(0.1)
                self.wfile.write(json.dumps({"text": "x", "meta_info": {"completion_tokens": n}}).encode())

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    srv = object.__new__(device.Server)
    srv.port = httpd.server_address[1]
    try:
        load = device.SteadyLoad(srv, 4, 10).start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        time.sleep(1.0)
        t1 = time.perf_counter()
        load.stop()
    finally:
        httpd.shutdown()
    assert load.errors == 0
    # 3 plain workers at ~10 tokens / 0.1 s, the streamed one at 10 tokens / 0.1 s.
    assert 250 < load.rate(t0, t1) < 420
    assert 60 < load.stream_rate(t0, t1) < 120  # 10 tokens a ~0.1 s request: 5 chunks would read ~45
    gaps = load.gaps_in([(t0, t1)])
    assert gaps and 0.015 < sorted(gaps)[len(gaps) // 2] < 0.06
    assert load.gaps_in([]) == []


def test_seed_overhead_gives_sglangs_own_observability_both_orders_in_the_same_alternation():
    sys.path.insert(0, str(GPU))
    import device

    assert [device.second_server(i, True) for i in range(8)] == ["probe", "probe", "obs", "obs"] * 2
    assert {device.second_server(i, False) for i in range(8)} == {"probe"}


def test_in_process_ab_judge_gives_the_p99_step_ratio_where_the_load_streamed():
    sys.path.insert(0, str(GPU))
    import device

    w = {"ab_probe_0": {"recording": [99.0], "paused": [100.0], "p99_step_ms": {"recording": 2.2, "paused": 2.0}},
         "ab_probe_1": {"recording": [99.0], "paused": [100.0], "p99_step_ms": {"recording": None, "paused": 2.0}}}
    v = device.ab_judge(w)
    assert v["per_server"]["ab_probe_0"]["p99_step_ratio"] == pytest.approx(1.1)
    assert "p99_step_ratio" not in v["per_server"]["ab_probe_1"]


def test_smi_samples_parse_and_give_each_window_its_median_clock():
    import datetime

    text = ("2026/12/03 08:30:00.000, 1980\n2026/12/03 08:30:00.100, [N/A]\n"
            "timestamp, clocks.current.sm [MHz]\n2026/12/03 08:30:00.200, 1400\n"
            "2026/12/03 08:30:00.300, 1500\n")
    got = analysis.parse_smi(text)
    base = datetime.datetime(2026, 12, 3, 8, 30).timestamp()
    assert [round(t - base, 3) for t, _ in got] == [0.0, 0.2, 0.3] and [c for _, c in got] == [1980, 1400, 1500]
    assert analysis.window_clock(got, base + 0.1, base + 0.35) == 1450
    assert analysis.window_clock(got, base + 1, base + 2) is None


def test_clock_adjusted_ratio_takes_the_clock_out_of_the_pairs():
    """Windows whose throughput follows the GPU clock (exponent 1.2) and a true 1.5 % cost: the
    plain median of pair ratios is thrown about by the clock, the adjusted ratio finds the cost;
    a few wild pairs do not move it; pairs without a clock are left out."""
    import math
    import random

    rng = random.Random(3)
    rec, paused, rc, pc = [], [], [], []
    for _ in range(30):
        ca, cb = rng.uniform(1350, 1980), rng.uniform(1350, 1980)
        rec.append(0.985 * 8000 * (ca / 1980) ** 1.2 * math.exp(rng.gauss(0, 0.004)))
        paused.append(8000 * (cb / 1980) ** 1.2 * math.exp(rng.gauss(0, 0.004)))
        rc.append(ca)
        pc.append(cb)
    rec += [800.0, 8000.0]  # a stalled window, and a pair with no clock on one side
    paused += [4000.0, 8000.0]
    rc += [1980, None]
    pc += [1980, 1980]
    got = analysis.clock_adjusted_ratio(rec, paused, rc, pc)
    assert got["pairs"] == 31
    assert got["ratio"] == pytest.approx(0.985, abs=0.003)
    assert got["ci95"][0] < 0.985 < got["ci95"][1] and got["ci95"][1] - got["ci95"][0] < 0.01
    assert got["clock_exponent"] == pytest.approx(1.2, abs=0.05)
    assert analysis.clock_adjusted_ratio(rec[:30], paused[:30], rc[:30], pc[:30])["r2"] > 0.9
    plain = analysis.bootstrap_ratio([1.0] * len(rec), [a / b for a, b in zip(rec, paused)])
    assert plain["ci95"][1] - plain["ci95"][0] > 3 * (got["ci95"][1] - got["ci95"][0])
    assert analysis.clock_adjusted_ratio([1.0], [1.0], [1.0], [1.0])["ratio"] is None


def test_ab_judge_adds_the_clock_adjusted_ratio_where_windows_have_clocks():
    sys.path.insert(0, str(GPU))
    import device

    w = {"recording": [98.0, 99.0, 97.0, 98.5], "paused": [100.0, 100.0, 100.0, 100.0],
         "sm_clock_mhz": {"recording": [1980, 1980, 1980, 1980], "paused": [1980, 1980, 1980, 1980]}}
    v = device.ab_judge({"ab_probe_0": w, "ab_probe_1": dict(w)})
    assert v["per_server"]["ab_probe_0"]["clock_adjusted"]["ratio"] == pytest.approx(0.9825, rel=1e-4)
    assert v["all_pairs"]["clock_adjusted"]["pairs"] == 8
    merged = device.merge_windows(dict(w, cores_busy=[], requests=1, request_errors=0,
                                       gaps_s={"recording": [], "paused": []}),
                                  {"recording": [1.0], "paused": [1.0], "cores_busy": [], "requests": 1,
                                   "request_errors": 0, "gaps_s": {"recording": [], "paused": []}})
    assert merged["sm_clock_mhz"]["recording"] == [1980] * 4 + [None]


def test_gpu_clocks_without_nvidia_smi_give_no_samples_and_no_error(tmp_path: Path, monkeypatch):
    sys.path.insert(0, str(GPU))
    import device

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi on it
    clocks = device.GpuClocks(str(tmp_path / "clocks.csv")).start()
    assert clocks.proc is None and clocks.stop() == []
    fake = tmp_path / "nvidia-smi"  # a stand-in that prints two samples and waits to be stopped
    fake.write_text("#!/bin/sh\necho '2026/12/03 08:30:00.000, 1980'\necho '2026/12/03 08:30:00.100, 1410'\nexec sleep 30\n")
    fake.chmod(0o755)
    clocks = device.GpuClocks(str(tmp_path / "clocks.csv")).start()
    import time

    time.sleep(0.5)
    assert [mhz for _, mhz in clocks.stop()] == [1980.0, 1410.0]


def test_summary_reports_the_hog_servers_ratio_and_the_hogs_cores(tmp_path: Path):
    import summarize

    busy = [{"recording": True, "scheduler": 1.0, "exporter": 0.0, "other": 0.5, "hog": 0.18},
            {"recording": False, "scheduler": 1.0, "exporter": 0.0, "other": 0.5, "hog": 0.0}]
    doc = {"windows": {"ab_hog_0": {"recording": [1.0], "paused": [1.0], "cores_busy": busy}},
           "verdict": {"hog": {"all_pairs": {"median_ratio": 0.985}}}}
    (tmp_path / "gpu_sglang_rX_overhead_ab.json").write_text(json.dumps(doc))
    got = summarize.summarize("t", [str(tmp_path)])["overhead_in_server"]
    assert got["no_probe_cpu_hog_over_quiet"] == {"median_ratio": 0.985}
    assert got["cores_busy_p50"]["ab_hog_0"]["hog_recording"] == 0.18
    assert got["cores_busy_p50"]["ab_hog_0"]["hog_paused"] == 0.0


def test_cpu_hog_uses_cpu_while_running_and_none_while_stopped():
    """The stand-in exporter load of overhead_ab's ``hog`` server: SIGSTOP / SIGCONT switch it."""
    import os
    import signal
    import subprocess
    import time

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "probe_pause"))
    from control import group_cpu_s

    hog = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_sglang" / "cpu_hog.py"
    proc = subprocess.Popen([sys.executable, str(hog), "0.5", "0.1"], start_new_session=True)
    try:
        time.sleep(0.5)  # interpreter start-up
        c0 = group_cpu_s(proc.pid)["other"]
        time.sleep(1.5)
        running = group_cpu_s(proc.pid)["other"] - c0
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        c0 = group_cpu_s(proc.pid)["other"]
        time.sleep(1.0)
        stopped = group_cpu_s(proc.pid)["other"] - c0
    finally:
        proc.kill()
        proc.wait()
    assert running > 0.2  # ~0.75 s asked for; a busy 2-core machine still gives it a good share
    assert stopped == 0.0


def test_pool_judges_the_pairs_of_servers_from_several_calls_as_one(tmp_path: Path):
    import pool

    def call(windows: dict) -> str:
        return json.dumps({"windows": windows})

    (tmp_path / "gpu_sglang_r1_overhead_ab.json").write_text(call({"ab_probe_0": {"recording": [90.0, 99.0], "paused": [100.0, 100.0]},
                                                                  "ab_aa_0": {"recording": [1.0], "paused": [1.0]}}))
    (tmp_path / "gpu_sglang_r2_overhead_ab.json").write_text(call({"ab_ref_0": {"recording": [98.0], "paused": [100.0]}}))
    got = pool.pool(tmp_path, ["r1:ab_probe_0", "r2:ab_ref_0"])
    assert got["pairs"] == 3 and got["pairs_by_server"] == {"r1:ab_probe_0": 2, "r2:ab_ref_0": 1}
    assert got["median_ratio"] == pytest.approx(0.98)  # of 0.90, 0.99, 0.98; the A/A server left out
    assert got["ci95"][0] <= 0.98 <= got["ci95"][1]
    # an overhead_cross call's pairs: sqrt((a_X / b_X) / (a_Y / b_Y)), X the window where a recorded
    cross = [{"a_records": True, "a": 96.0, "b": 100.0}, {"a_records": False, "a": 100.0, "b": 96.0}]
    (tmp_path / "gpu_sglang_r3_probe_overhead_cross.json").write_text(call(cross))
    got = pool.pool(tmp_path, ["r3_probe:cross", "r2:ab_ref_0"])
    assert got["pairs_by_server"] == {"r3_probe:cross": 1, "r2:ab_ref_0": 1}
    assert got["median_ratio"] == pytest.approx((0.96 + 0.98) / 2)


def test_pool_reads_a_gzipped_result_as_the_file_itself(tmp_path: Path):
    import pool

    cross = [{"a_records": True, "a": 96.0, "b": 100.0}, {"a_records": False, "a": 100.0, "b": 96.0}]
    with gzip.open(tmp_path / "gpu_sglang_r4_overhead_cross.json.gz", "wt") as f:
        json.dump({"windows": cross}, f)
    assert pool.pool(tmp_path, ["r4:cross"])["median_ratio"] == pytest.approx(0.96)
    with pytest.raises(FileNotFoundError):
        pool.pool(tmp_path, ["r5:cross"])


def pair(x: float, streamed: float | None = None) -> list:
    """One overhead_cross pair of windows whose cross ratio is ``x`` (and ``streamed`` from the
    streamed rates, where given)."""
    out = [{"a_records": True, "a": 100.0 * x * x, "b": 100.0}, {"a_records": False, "a": 100.0, "b": 100.0}]
    if streamed is not None:
        out[0].update(a_stream=50.0 * streamed * streamed, b_stream=50.0)
        out[1].update(a_stream=50.0, b_stream=50.0)
    return out


def test_pool_and_the_judge_read_the_streamed_rates_where_a_call_has_them(tmp_path: Path):
    """After r133, a call's windows carry both kinds of rate: ``cross`` judges the spread one (as the
    calls before), ``cross_stream`` the streamed one, each with its own control; pool.py's
    ``TAG:stream`` and ``TAG:stream_control`` pick them, and a call without them has none."""
    import device
    import pool
    import summarize

    res = {"windows": pair(0.99, 0.985) + pair(0.99, 0.987),
           "control": {"windows": pair(1.0, 0.999) + pair(1.0, 0.999)}}
    v = device.cross_judge(res)
    assert v["cross"]["median_ratio"] == pytest.approx(0.99)
    assert v["cross_stream"]["median_ratio"] == pytest.approx(0.986) and v["cross_stream"]["pairs"] == 2
    assert v["over_control_stream"]["median_ratio"] == pytest.approx(0.986 / 0.999)
    folded = summarize.fold_overhead_cross(dict(res, verdict=v))
    assert folded["recording_over_paused_streamed"]["median_ratio"] == pytest.approx(0.986)
    assert folded["over_control_streamed"]["median_ratio"] == pytest.approx(0.986 / 0.999)
    (tmp_path / "gpu_sglang_r10_overhead_cross.json").write_text(json.dumps(res))
    (tmp_path / "gpu_sglang_r11_overhead_cross.json").write_text(json.dumps({"windows": pair(0.98)}))
    got = pool.pool(tmp_path, ["r10:stream"])
    assert got["median_ratio"] == pytest.approx(0.986) and got["over_control"]["median_ratio"] == pytest.approx(0.986 / 0.999)
    assert pool.pool(tmp_path, ["r10:stream_control"])["median_ratio"] == pytest.approx(0.999)
    assert pool.pool(tmp_path, ["r10:cross"])["over_control"]["median_ratio"] == pytest.approx(0.99)
    assert pool.pool(tmp_path, ["r10:stream", "r11:stream"])["pairs"] == 2  # r11 has no streamed rates
    assert "over_control" not in pool.pool(tmp_path, ["r10:stream", "r11:cross"])  # two kinds: no one control


def test_pool_takes_the_estimators_bias_out_with_each_calls_control(tmp_path: Path):
    """Calls whose control (neither server records) reads 0.99 too: the recording pairs' 0.97 is
    0.98 over the control; a call without a control (a warm call on the same machine) borrows the
    others', and calls with none have no control to divide by."""
    import pool

    for tag, rec, ctrl in (("r6", (0.97, 0.96, 0.98), (0.99, 0.98, 1.0)), ("r7", (0.97, 0.97), (0.99, 0.99))):
        body = {"windows": sum((pair(x) for x in rec), []),
                "control": {"windows": sum((pair(x) for x in ctrl), [])}}
        (tmp_path / f"gpu_sglang_{tag}_overhead_cross.json").write_text(json.dumps(body))
    got = pool.pool(tmp_path, ["r6:cross", "r7:cross"])
    assert got["median_ratio"] == pytest.approx(0.97)
    assert got["control"]["median_ratio"] == pytest.approx(0.99) and got["control"]["pairs"] == 5
    assert got["control"]["control_from"] == ["r6:cross", "r7:cross"]
    assert got["over_control"]["median_ratio"] == pytest.approx(0.97 / 0.99)
    assert pool.pool(tmp_path, ["r6:control"])["median_ratio"] == pytest.approx(0.99)
    (tmp_path / "gpu_sglang_r8_overhead_cross.json").write_text(json.dumps({"windows": sum((pair(x) for x in (0.95, 0.95, 0.95)), [])}))
    got = pool.pool(tmp_path, ["r7:cross", "r8:cross"])  # r8's three pairs over r7's control
    assert got["pairs"] == 5 and got["control"]["pairs"] == 2 and got["control"]["control_from"] == ["r7:cross"]
    assert got["over_control"]["median_ratio"] == pytest.approx(0.95 / 0.99)
    assert "over_control" not in pool.pool(tmp_path, ["r8:cross"])


def test_pool_over_compares_two_settings_measured_in_the_same_calls(tmp_path: Path, monkeypatch, capsys):
    """Two kinds of one call, each on its own server pair (h100-32's 40 ms beside 10 ms): ``over``
    is one's median pair over the other's, its interval resampling both; the picks' own pooled
    numbers stay as without ``--over``. From the command line: the same, and a bare ``--over``
    refused with the usage text."""
    import pool

    for tag, ratios in (("r9_sparse", (1.00, 1.01, 0.99, 1.00)), ("r9_self", (0.98, 0.97, 0.99))):
        body = {"windows": sum((pair(x) for x in ratios), [])}
        (tmp_path / f"gpu_sglang_{tag}_overhead_cross.json").write_text(json.dumps(body))
    got = pool.pool(tmp_path, ["r9_sparse:cross"], over=["r9_self:cross"])
    assert got["median_ratio"] == pytest.approx(1.00) and got["pairs"] == 4
    assert got["over"]["median_ratio"] == pytest.approx(1.00 / 0.98) and got["over"]["pairs"] == [4, 3]
    lo, hi = got["over"]["ci95"]
    assert lo <= 1.00 / 0.98 <= hi and lo > 1.0  # (the sparse pairs 0.99-1.01, the self ones 0.97-0.99)
    assert got["over"]["picks"] == ["r9_self:cross"]
    assert "over" not in pool.pool(tmp_path, ["r9_sparse:cross"])
    monkeypatch.setattr(sys, "argv", ["pool.py", str(tmp_path), "r9_sparse:cross", "--over", "r9_self:cross"])
    pool.main()
    assert json.loads(capsys.readouterr().out)["over"]["median_ratio"] == pytest.approx(1.00 / 0.98)
    monkeypatch.setattr(sys, "argv", ["pool.py", str(tmp_path), "r9_sparse:cross", "--over"])
    with pytest.raises(SystemExit):
        pool.main()


def test_result_files_over_100_kb_are_kept_gzipped():
    """What is kept in benchmarks/results stays small enough to travel to the GPU machine with the
    checkout (64 MiB a call): a large result goes in as ``NAME.gz`` (``gzip -n -9``)."""
    big = [p.name for p in (ROOT / "benchmarks" / "results").iterdir()
           if p.suffix != ".gz" and p.stat().st_size > 100 * 1024]
    assert big == []


def test_pool_by_server_interval_carries_the_spread_between_servers():
    """Five servers of the same code, each tight around its own speed (0.93-1.01, as the tiny
    server's pairs were in h200-14): pairs taken as independent give a narrow interval around the
    middle server; resampling the servers first spans the spread between them."""
    import pool

    rng = __import__("random").Random(1)
    groups = [[m + rng.uniform(-0.003, 0.003) for _ in range(20)] for m in (0.93, 0.96, 0.97, 0.98, 1.01)]
    lo, hi = pool.by_server_ci(groups)
    naive = pool.analysis.bootstrap_ratio([1.0] * 100, sum(groups, []))["ci95"]
    assert lo < 0.95 and hi > 0.99 and naive[0] > 0.955 and naive[1] < 0.985
    assert pool.by_server_ci(groups[:1]) is None  # one server: no spread between servers to carry


def test_cross_estimator_cancels_what_slows_both_servers_and_each_servers_own_speed():
    """Rates built from a true recording/paused factor of 0.98, server speeds 6,000 and 7,000
    tok/s and a host speed that wanders by up to +-30 % from window to window: every cross pair
    reads 0.98 exactly, while each server's own pairs scatter."""
    import random

    sys.path.insert(0, str(GPU))
    import device

    rng = random.Random(3)
    rates = []
    for i in range(12):
        for a_records in ((True, False) if i % 2 == 0 else (False, True)):
            host = rng.uniform(0.7, 1.3)
            rates.append({"a_records": a_records, "a": 6000 * host * (0.98 if a_records else 1.0),
                          "b": 7000 * host * (1.0 if a_records else 0.98)})
    assert device.cross_ratios(rates) == pytest.approx([0.98] * 12)
    v = device.cross_judge({"windows": rates})
    assert v["cross"]["median_ratio"] == pytest.approx(0.98) and v["cross"]["pairs"] == 12
    assert v["cross"]["ci95"] == pytest.approx([0.98, 0.98])
    lo, hi = v["one_server_a"]["ci95"]
    assert hi - lo > 0.1  # the wander, which one server's pairs cannot tell from the probe
    assert "over_control" not in v
    # a control whose estimator leans to 0.99 on this host: the probe's own share is 0.98 / 0.99
    lean = [dict(w, a=w["a"] / (0.98 if w["a_records"] else 1.0) * (0.99 if w["a_records"] else 1.0),
                 b=w["b"] / (1.0 if w["a_records"] else 0.98) * (1.0 if w["a_records"] else 0.99)) for w in rates]
    v = device.cross_judge({"windows": rates, "control": {"windows": lean}})
    assert v["over_control"]["median_ratio"] == pytest.approx(0.98 / 0.99)


def test_summary_judges_a_stored_calls_pairs_over_its_control():
    """A call stored before calls judged ``over_control`` still gets it in the summary, from its windows."""
    import summarize

    res = {"windows": pair(0.97) + pair(0.98), "control": {"windows": pair(0.99) + pair(0.99)}, "verdict": {}}
    assert summarize.fold_overhead_cross(res)["over_control"]["median_ratio"] == pytest.approx(0.975 / 0.99)
    assert summarize.fold_overhead_cross({"windows": pair(0.97), "verdict": {}})["over_control"] is None


def test_summary_keeps_each_overhead_cross_call_by_tag(tmp_path: Path):
    import summarize

    threads = {k: 0.5 for k in summarize.THREAD_KEYS}
    cores = [{"server": "cross_0", "recording": r, "scheduler": 1.0, "exporter": 0.2 if r else 0.0, "other": 0.3,
              "threads": dict(threads, main_asleep=0.007 if r else 0.001)} for r in (True, False, False, True)]
    verdict = {"cross": {"median_ratio": 0.99, "ci95": [0.98, 1.0], "pairs": 20},
               "one_server_a": {"median_ratio": 1.01}, "one_server_b": {"median_ratio": 0.97},
               "control": {"cross": {"median_ratio": 1.0, "pairs": 6}},
               "received_spans": {"sglang:sglang.decode": 9}, "decode_spans_in_trace_dirs": {"cross_0": 9}}
    (tmp_path / "gpu_sglang_r32_overhead_cross.json").write_text(
        json.dumps({"tokens": 1024, "export": "probe", "cores_busy": cores, "verdict": verdict}))
    (tmp_path / "machine.txt").write_text("NVIDIA H200\ntorch 2 sglang 0.5.23\n")
    assert summarize.summarize("h200-x", [str(tmp_path)])["host_cpu"] is None  # run.sh before it wrote one
    (tmp_path / "machine.txt").write_text("NVIDIA H200\nhost cpu Some CPU @ 2.0GHz, 16 cpus\ntorch 2 sglang 0.5.23\n")
    whole = summarize.summarize("h200-x", [str(tmp_path)])
    assert whole["host_cpu"] == "Some CPU @ 2.0GHz, 16 cpus" and whole["sglang_version"] == "0.5.23"
    got = whole["overhead_cross"]["r32"]
    assert got["recording_over_paused"]["median_ratio"] == 0.99 and got["tokens"] == 1024
    assert got["control"]["pairs"] == 6 and got["one_server"]["b"]["median_ratio"] == 0.97
    assert got["cores_busy_p50"]["exporter_recording"] == 0.2 and got["cores_busy_p50"]["exporter_paused"] == 0.0
    assert got["scheduler_threads_p50"]["main_asleep_recording"] == 0.007
    assert got["received_spans"] == {"sglang:sglang.decode": 9}
    assert "elapsed_source" not in got  # files from before the pause shim reported it
    cores[-1]["gc_at_flip"] = {"t": 1.0, "count": [0, 0, 0], "seconds": [0.0] * 3, "elapsed_source": "cuda_runtime",
                               "probe_file": "/tmp/probe_ref/sgl_probe/__init__.py", "anchor_events": 19}
    (tmp_path / "gpu_sglang_r32_overhead_cross.json").write_text(
        json.dumps({"tokens": 1024, "export": "probe", "cores_busy": cores, "verdict": verdict}))
    got = summarize.summarize("h200-x", [str(tmp_path)])["overhead_cross"]["r32"]
    assert got["elapsed_source"] == {"cross_0": "cuda_runtime"} and got["anchor_events"] == {"cross_0": 19}
    assert got["probe_file"] == {"cross_0": "/tmp/probe_ref/sgl_probe/__init__.py"}
    assert "first_pair_ratio" not in got
    (tmp_path / "gpu_sglang_r32_overhead_cross.json").write_text(json.dumps(
        {"tokens": 1024, "export": "probe", "cores_busy": cores, "verdict": verdict, "first_pair": {"ratio": 0.8}}))
    assert summarize.summarize("h200-x", [str(tmp_path)])["overhead_cross"]["r32"]["first_pair_ratio"] == 0.8


@pytest.mark.parametrize("export, env, match", [("hog", {}, "not one of"), ("ref", {"GPU_BENCH_PROBE_REF": "absent"}, "no probe wheel")])
def test_overhead_cross_refuses_a_kind_it_cannot_run_before_starting_anything(tmp_path: Path, monkeypatch, export, env, match):
    import device

    for k, v in env.items():
        monkeypatch.setenv(k, str(tmp_path / v))
    with pytest.raises(ValueError, match=match):
        device.suite_overhead_cross(tmp_path, tmp_path, 1, 1.0, exports=(export,))
    assert not list(tmp_path.iterdir())


def test_cross_us_per_step_divides_each_windows_thread_time_by_its_own_servers_steps():
    """Server a runs 16,000 tok/s (1,000 steps/s at batch 16), b 8,000: a thread busy 100 % is
    1,000 µs per step on a and 2,000 on b, and the medians are taken per window kind."""
    import summarize

    windows = [{"a_records": True, "a": 16000.0, "b": 8000.0}, {"a_records": False, "a": 16000.0, "b": 8000.0}]

    def row(server, recording, cpu):
        return {"server": server, "recording": recording,
                "threads": {"main_cpu": cpu, "main_asleep": 0.01 if recording else 0.0, "others_cpu": 0.02}}

    res = {"servers": ["cross_0", "cross_1"], "windows": windows,
           "cores_busy": [row("cross_0", True, 1.0), row("cross_1", False, 0.9),
                          row("cross_0", False, 0.9), row("cross_1", True, 1.0)]}
    got = summarize.cross_us_per_step(res)
    assert got["main_cpu_recording"] == pytest.approx((1000 + 2000) / 2)
    assert got["main_cpu_paused"] == pytest.approx((1800 + 900) / 2)
    assert got["main_asleep_recording"] == pytest.approx((10 + 20) / 2) and got["main_asleep_paused"] == 0
    assert summarize.cross_us_per_step({"windows": [], "cores_busy": []}) == {}


def test_cross_us_per_step_charges_the_collections_between_two_flips_to_the_first_windows_state():
    """cross_0's flips at t 0, 10, 20: 10 s recording with 0.5 s of collections (2 full), then
    10 s paused with 0.1 s (none). At 1,000 steps/s that is 50 and 10 µs per step."""
    import summarize

    windows = [{"a_records": r, "a": 16000.0, "b": 16000.0} for r in (True, False, True)]

    def row(recording, t, seconds, full):
        return {"server": "cross_0", "recording": recording,
                "threads": {"main_cpu": 1.0, "main_asleep": 0.0, "others_cpu": 0.0},
                "gc_at_flip": {"t": t, "seconds": [seconds, 0.0, 0.0], "count": [0, 0, full]}}

    res = {"servers": ["cross_0", "cross_1"], "windows": windows,
           "cores_busy": [row(True, 0.0, 1.0, 3), row(False, 10.0, 1.5, 5), row(True, 20.0, 1.6, 5)]}
    got = summarize.cross_us_per_step(res)
    assert got["gc_recording"] == pytest.approx(50) and got["gc_paused"] == pytest.approx(10)
    assert got["gc_full_per_1000_steps_recording"] == pytest.approx(0.2)
    assert got["gc_full_per_1000_steps_paused"] == 0
    res["cores_busy"][1]["gc_at_flip"] = None  # a flip that reported nothing: no interval either side
    assert "gc_recording" not in summarize.cross_us_per_step(res)


def test_cross_us_per_step_takes_the_probes_own_time_between_two_flips_from_the_self_kinds_totals():
    """The ``self`` kind's flips report (ns inside the wrappers, ns inside SGLang's functions,
    calls). 10 s recording at 1,000 steps/s with 0.5 s inside the wrappers, 0.3 s of it in SGLang:
    20 µs per step of the probe's own; then 10 s paused with 0.1 s of which 0.09 in SGLang: 1."""
    import summarize

    windows = [{"a_records": r, "a": 16000.0, "b": 16000.0} for r in (True, False, True)]

    def row(recording, t, self_ns):
        return {"server": "cross_0", "recording": recording,
                "threads": {"main_cpu": 1.0, "main_asleep": 0.0, "others_cpu": 0.0},
                "gc_at_flip": {"t": t, "seconds": [0.0] * 3, "count": [0] * 3, "self_ns": self_ns}}

    res = {"servers": ["cross_0", "cross_1"], "windows": windows,
           "cores_busy": [row(True, 0.0, [0, 0, 0]), row(False, 10.0, [5e8, 3e8, 30000]),
                          row(True, 20.0, [6e8, 3.9e8, 60000])]}
    got = summarize.cross_us_per_step(res)
    assert got["probe_self_recording"] == pytest.approx(20) and got["probe_self_paused"] == pytest.approx(1)
    assert got["hooked_calls_recording"] == pytest.approx(3)
    # Per target, where the shim reports it: one wrapper with all of it, one never called.
    for c, (o, i, n) in zip(res["cores_busy"], ((0, 0, 0), (5e8, 3e8, 10000), (6e8, 3.9e8, 20000))):
        c["gc_at_flip"]["self_by_target"] = {"step": [o, i, n], "graph": [0, 0, 0]}
    got = summarize.cross_us_per_step(res)
    assert got["probe_self:step_recording"] == pytest.approx(20) and got["probe_self:step_paused"] == pytest.approx(1)
    assert not any(k.startswith("probe_self:graph") for k in got)
    # The CUDA timer's calls (ns, calls), where the shim timed them: 0.1 s of records in 10,000 steps is
    # 10 µs per step; a call never made in a window reports nothing for it.
    for c, (ns, n) in zip(res["cores_busy"], ((0, 0), (1e8, 20000), (1.5e8, 40000))):
        c["gc_at_flip"]["self_timer_calls"] = {"_record": [ns, n], "_new": [0, 0]}
    got = summarize.cross_us_per_step(res)
    assert got["timer_call:_record_recording"] == pytest.approx(10) and got["timer_call:_record_paused"] == pytest.approx(5)
    assert got["timer_calls:_record_recording"] == pytest.approx(2)
    assert not any(k.startswith("timer_call:_new") for k in got)
    # Where the shim counts steps, its count wins over the token rate: half the steps, twice the time.
    for c, steps in zip(res["cores_busy"], (0, 5000, 10000)):
        c["gc_at_flip"]["self_ns"].append(steps)
    assert summarize.cross_us_per_step(res)["probe_self_recording"] == pytest.approx(40)
    for c in res["cores_busy"]:
        c["gc_at_flip"]["self_ns"] = None  # any other kind
    assert "probe_self_recording" not in summarize.cross_us_per_step(res)


def test_overhead_cross_with_several_kinds_writes_one_result_file_per_kind(tmp_path: Path, monkeypatch):
    """``--ab-exports probe,drop``: each kind's result in its own tagged file, which the summary
    then keeps apart by tag and kind."""
    import device
    import summarize

    def fake_suite(carry, out, pairs, window_s, conc, control_pairs, exports, tokens):
        assert exports == ("probe", "drop") and tokens == 1024 and pairs == 3
        return {k: {"export": k, "tokens": tokens, "windows": [], "verdict": {"cross": {"median_ratio": r}}}
                for k, r in zip(exports, (0.99, 0.97))}

    monkeypatch.setattr(device, "suite_overhead_cross", fake_suite)
    monkeypatch.setattr(device, "pack", lambda out, suite: None)
    monkeypatch.setattr(device.os, "sched_setaffinity", lambda pid, cpus: None)
    assert device.main(["overhead_cross", "--carry", str(tmp_path), "--out", str(tmp_path), "--tag", "r99",
                        "--ab-exports", "probe,drop", "--tokens", "1024", "--pairs", "3"]) == 0
    names = sorted(p.name for p in tmp_path.glob("gpu_sglang_*.json"))
    assert names == ["gpu_sglang_r99_drop_overhead_cross.json", "gpu_sglang_r99_probe_overhead_cross.json"]
    got = summarize.summarize("h200-x", [str(tmp_path)])["overhead_cross"]
    assert got["r99_probe"]["recording_over_paused"]["median_ratio"] == 0.99
    assert got["r99_drop"]["export"] == "drop"


def test_a_server_imports_the_probe_from_its_own_wheel_folder_not_the_checkout(tmp_path: Path, monkeypatch):
    """Run from the checkout (as run.sh does), ``python -m`` puts the checkout first on sys.path:
    a reference server once ran the checkout's probe instead of its reference wheel's."""
    import device

    wheel = tmp_path / "probe_ref"
    (wheel / "sgl_probe").mkdir(parents=True)
    (wheel / "sgl_probe" / "__init__.py").write_text("")
    monkeypatch.setenv("GPU_BENCH_SITE", str(tmp_path / "site"))
    monkeypatch.chdir(ROOT)
    srv = device.Server("ref_0", 0, [], probe=str(wheel), out=tmp_path)
    env = srv.env
    srv.env = {**env, "SGL_PROBE": "0"}  # only the import is asked about, nothing armed
    proc = srv.spawn([sys.executable, "-c", "import sgl_probe; print(sgl_probe.__file__)"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert Path(out.strip()).resolve() == (wheel / "sgl_probe" / "__init__.py").resolve()


@pytest.mark.parametrize("kind, switches", [("gil", {"SGL_BENCH_KEEP_GIL": "1"}),
                                             ("self", {"SGL_BENCH_SELF_TIME": "1"}),
                                             ("selfcpu", {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_TIMER": "cpu"}),
                                             ("selfdrop", {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_MAX_PENDING": "1"}),
                                             ("selfgil", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_KEEP_GIL": "1"}),
                                             ("self2ev", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_START_EVENTS": "1"}),
                                             ("selflone", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_GPU_RUN": "1"}),
                                             ("selfsparse", {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_GPU_EVERY_MS": "40"}),
                                             ("selfref", {"SGL_BENCH_SELF_TIME": "1"}),
                                             ("selfyield", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_YIELD_US": "50",
                                                            "SGL_BENCH_DRAIN_CHUNK": "4"}),
                                             ("selfbatch", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_CHUNK": "64",
                                                            "SGL_BENCH_KEEP_GIL": "1"}),
                                             ("selfdrain", {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_DRAIN_S": "0.1"}),
                                             ("selfchunk", {"SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_CHUNK": "512",
                                                            "SGL_BENCH_DRAIN_YIELD_US": "2000"}),
                                             ("selfnodrain", {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_DRAIN_S": "30",
                                                              "SGL_PROBE_MAX_PENDING": "65536",
                                                              "SGL_BENCH_POOL_MAX": "65536"}),
                                             ("selfsampled", {"SGL_BENCH_SELF_TIME": "1",
                                                              "OTEL_TRACES_SAMPLER": "traceidratio",
                                                              "OTEL_TRACES_SAMPLER_ARG": "0.1"})])
def test_the_shims_kinds_are_the_probe_kind_plus_the_shims_switch(kind, switches, monkeypatch):
    import device

    monkeypatch.delenv("GPU_BENCH_DRAIN_S", raising=False)
    monkeypatch.delenv("GPU_BENCH_NODRAIN_S", raising=False)
    monkeypatch.delenv("GPU_BENCH_SAMPLE_RATE", raising=False)
    monkeypatch.delenv("GPU_BENCH_EVERY_MS", raising=False)

    probe, env = device.ab_env("probe", "127.0.0.1:1"), device.ab_env(kind, "127.0.0.1:1")
    assert {k: env.pop(k) for k in switches} == switches and env.pop("OTEL_SERVICE_NAME") == f"sglang-{kind}"
    assert env == {k: v for k, v in probe.items() if k != "OTEL_SERVICE_NAME"}


def test_selfnone_is_the_none_kind_plus_the_self_timers():
    """``selfnone`` splits ``self``'s cost: the same recording and drain, nothing exported (no
    OTLP endpoint, no trace dir), so no exporter process starts."""
    import device

    env = device.ab_env("selfnone", "127.0.0.1:1")
    assert env.pop("SGL_BENCH_SELF_TIME") == "1"
    assert env == device.ab_env("none", "127.0.0.1:1")
    assert not any(k.startswith("OTEL_EXPORTER_OTLP") for k in env) and env["SGL_PROBE_TRACE_DIR"] == ""


def test_overhead_servers_take_the_reference_only_where_its_wheel_is_installed(tmp_path: Path, monkeypatch):
    """The old overhead suite looks its wheels up as every other suite does (``kind_wheel``): the
    probe's is required, the reference's optional."""
    import device

    probe, ref = tmp_path / "probe", tmp_path / "probe_ref"
    probe.mkdir()
    monkeypatch.setenv("GPU_BENCH_SITE", str(tmp_path / "site"))
    monkeypatch.setenv("GPU_BENCH_PROBE", str(probe))
    monkeypatch.setenv("GPU_BENCH_PROBE_REF", str(ref))
    names = lambda: [s.name for s in device.overhead_servers(tmp_path, tmp_path, 1, "127.0.0.1:1")]  # noqa: E731
    assert names() == ["off_0", "probe_0", "sglang_obs_0"]
    ref.mkdir()
    assert names() == ["off_0", "probe_0", "probe_ref_0", "sglang_obs_0"]
    monkeypatch.setenv("GPU_BENCH_PROBE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="no probe wheel"):
        names()
