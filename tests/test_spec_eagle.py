"""EAGLE-3 speculative decoding end to end on CPU: real SGLang 0.5.23, real EAGLE worker, probe spans.

Three real servers, each launched once per module: a plain one (no speculative decoding, probe
off) for the reference output, and EAGLE-3 with topk 1 (2 steps, 3 draft tokens) and topk 2
(3 steps, 4 draft tokens), float32, the probe installed from its wheel and exporting over real
OTLP/gRPC. The target is the harness's tiny random Llama (4 layers: EAGLE-3 captures layers
0-2), the draft a hand-built "copy" EAGLE-3 draft that gets drafts accepted
(``tests/harness/make_eagle_draft.py``), the kernel ops EAGLE needs on CPU come from the
harness's ``sgl_kernel`` test stand-ins (``tests/test_kernel_standins.py``), and the launch
flags are in ``tests/harness/eagle.py``.

What is compared with what SGLang itself reports for the same run:
- generated ids: EAGLE-3 == plain, token for token (greedy speculative decoding is lossless);
- per decode batch, in order: the probe's verify batch size and ``sglang.spec.accept_length``
  == the ``#running-req`` and ``accept len`` of SGLang's decode log line
  (``--decode-log-interval 1``), and so are their means; the verify rows == SGLang's
  ``spec_verify_calls_total``; the graph flag == the log's ``cpu graph: False``;
- per prefill batch, in order: the extend and draft-extend spans' batch size and tokens == the
  ``#new-seq`` / ``#new-token`` of SGLang's prefill log line.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan
from tests.harness.eagle import draft_info, eagle_args, ensure_eagle_models
from tests.harness.server import SGLangServer, output_ids
from tests.harness.venv import ensure_venv, venv_python
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

VERSION = "0.5.23"
PROMPTS = ["hello world the quick", "the cat sat on the mat and", "one two three four five six seven"]
LENGTHS = (8, 16, 32)
# float32: greedy equality is exact; no radix cache: every prompt is prefilled in full (token
# accounting); decode log every batch and metrics: SGLang's own numbers to compare with.
COMMON = ("--dtype", "float32", "--disable-radix-cache", "--decode-log-interval", "1", "--enable-metrics")
CONFIGS = {
    "topk1": {"topk": 1, "num_steps": 2, "num_draft_tokens": 3},
    "topk2": {"topk": 2, "num_steps": 3, "num_draft_tokens": 4},
}
PHASES = ("sglang.extend", "sglang.decode", "sglang.draft", "sglang.verify", "sglang.draft_extend")
CHECK_READERS = Path(__file__).resolve().parent / "harness" / "check_probe_readers.py"

_DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+),.*?accept len: ([0-9.]+), accept rate: ([0-9.]+)"
                          r".*?cpu graph: (\w+)")
_PREFILL_LINE = re.compile(r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+),.*?cpu graph: (\w+)")


@dataclass
class Run:
    name: str
    outputs: dict = field(default_factory=dict)  # (prompt | "batch", length) -> response(s)
    spans: list = field(default_factory=list)
    log: str = ""
    metrics: str = ""
    seconds: dict = field(default_factory=dict)
    trace_dir: Path | None = None
    wait_error: str = ""

    def transport_report(self) -> str:
        """For a failed count: which steps the probe wrote to its trace file but OTLP did not
        deliver, and what the exporter said in the server log."""
        otlp = {s.attributes["sglang.step_index"] for s in self.spans if s.name == "sglang.step"}
        filed = set()
        for f in sorted(self.trace_dir.glob("*.jsonl")) if self.trace_dir else ():
            for line in f.read_text().splitlines():
                for rs in json.loads(line)["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        for sp in ss["spans"]:
                            if sp["name"] == "sglang.step":
                                attrs = {a["key"]: a["value"] for a in sp.get("attributes", [])}
                                filed.add(int(attrs["sglang.step_index"]["intValue"]))
        export_log = [l for l in self.log.splitlines() if "export" in l.lower() and "rror" in l][:5]
        return (f"steps over OTLP {len(otlp)}, in the trace file {len(filed)}; in the file only: "
                f"{sorted(filed - otlp)[:20]}; wait: {self.wait_error[:300]}; exporter log: {export_log}")

    def phase_spans(self) -> list[ReceivedSpan]:
        return sorted((s for s in self.spans if s.name in PHASES),
                      key=lambda s: (s.attributes["sglang.step_index"], s.start_ns))

    def by_step(self) -> dict[str, list[ReceivedSpan]]:
        steps = defaultdict(list)
        for s in self.phase_spans():
            steps[s.parent_span_id].append(s)
        return steps

    def decode_lines(self) -> list[tuple[int, float, float, str]]:
        return [(int(m[1]), float(m[2]), float(m[3]), m[4]) for m in _DECODE_LINE.finditer(self.log)]

    def prefill_lines(self) -> list[tuple[int, int, str]]:
        return [(int(m[1]), int(m[2]), m[3]) for m in _PREFILL_LINE.finditer(self.log)]

    def responses(self) -> list[dict]:
        out = []
        for value in self.outputs.values():
            out.extend(value if isinstance(value, list) else [value])
        return out


def workload(server: SGLangServer) -> dict:
    """Each prompt alone, then all three at once (batched), at three lengths."""
    out = {}
    for n in LENGTHS:
        for p in PROMPTS:
            out[(p, n)] = server.generate(p, n)
        out[("batch", n)] = server.generate_many(PROMPTS, n)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    venv = ensure_venv(VERSION)
    install_wheel(venv, build_wheel(tmp_path_factory.mktemp("wheel")))
    return venv


@pytest.fixture(scope="module")
def models(venv) -> tuple[Path, Path]:
    return ensure_eagle_models(venv)


@pytest.fixture(scope="module")
def plain(venv, models, tmp_path_factory) -> Run:
    target, _ = models
    run = Run("plain")
    t0 = time.monotonic()
    with SGLangServer(venv, target, env={"SGL_PROBE": "0"}, extra_args=COMMON,
                      log_path=tmp_path_factory.mktemp("plain") / "server.log") as server:
        run.seconds["startup"] = time.monotonic() - t0
        t1 = time.monotonic()
        run.outputs = workload(server)
        run.seconds["requests"] = time.monotonic() - t1
        run.log = server.log_text()
    return run


@pytest.fixture(scope="module", params=list(CONFIGS))
def eagle(request, venv, models, tmp_path_factory) -> Run:
    target, draft = models
    cfg = CONFIGS[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    run = Run(request.param, trace_dir=tmp / "traces")
    with OTLPReceiver() as receiver:
        # A generous export deadline: on a loaded 2-core machine a 10 s default can drop a batch.
        env = {**receiver.env("grpc"), "SGL_PROBE": "1", "SGL_PROBE_SUMMARY_S": "0",
               "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
               "SGL_PROBE_TRACE_DIR": str(run.trace_dir), "SGL_PROBE_RUN_ID": None,
               "SGL_PROBE_LAUNCHER_ENV": None}
        t0 = time.monotonic()
        with SGLangServer(venv, target, env=env, extra_args=(*COMMON, *eagle_args(draft, **cfg)),
                          log_path=tmp / "server.log") as server:
            run.seconds["startup"] = time.monotonic() - t0
            t1 = time.monotonic()
            run.outputs = workload(server)
            run.seconds["requests"] = time.monotonic() - t1

            def complete(spans: list[ReceivedSpan]) -> bool:
                # SGLang's log is read again each time: its last decode lines may reach the file
                # after the last response (a loaded machine), and their verifies come after them.
                n_decode = len(_DECODE_LINE.findall(server.log_text()))
                verified = [s for s in spans if s.name == "sglang.verify"]
                return len(verified) >= n_decode and all("sglang.spec.accept_length" in s.attributes
                                                         for s in verified)

            try:
                receiver.wait_for(complete, timeout=60)
            except TimeoutError as exc:
                run.wait_error = str(exc)  # the assertions below say what is missing
            run.metrics = server.request_text("/metrics")
            run.log = server.log_text()
        run.spans = receiver.spans()
    print(f"\n[{run.name}] startup {run.seconds['startup']:.0f}s, requests {run.seconds['requests']:.1f}s")
    return run


# -- correctness of the harness -----------------------------------------------------------------

def test_greedy_output_identical_to_plain(eagle: Run, plain: Run):
    assert set(eagle.outputs) == set(plain.outputs)
    cases = 0
    for key, want in plain.outputs.items():
        got = eagle.outputs[key]
        pairs = zip(got, want) if isinstance(want, list) else [(got, want)]
        for g, w in pairs:
            assert output_ids(g) == output_ids(w), (eagle.name, key)
            cases += 1
    assert cases == len(PROMPTS) * len(LENGTHS) * 2  # each prompt alone and batched, three lengths


def test_drafts_get_accepted(eagle: Run, models):
    """The copy draft gets drafts accepted: SGLang's own mean accept length is above 1.5, and
    some verify steps accept every draft of the chain."""
    lines = eagle.decode_lines()
    assert lines, eagle.log[-3000:]
    rows = sum(bs for bs, *_ in lines)
    mean = sum(bs * length for bs, length, *_ in lines) / rows
    assert mean > 1.5, mean
    full = CONFIGS[eagle.name]["num_steps"] + 1
    assert any(length == full for _, length, *_ in lines)
    assert draft_info(models[1])["copy_rate_selfcheck"] >= 0.99


# -- the probe's spans ----------------------------------------------------------------------------

def test_one_draft_verify_draft_extend_per_spec_step(eagle: Run):
    steps = {s.span_id: s for s in eagle.spans if s.name == "sglang.step"}
    shapes = defaultdict(int)
    for parent, phases in eagle.by_step().items():
        names = tuple(p.name for p in sorted(phases, key=lambda p: p.start_ns))
        shapes[names] += 1
        step = steps[parent]
        for p in phases:
            assert step.start_ns <= p.start_ns and p.end_ns <= step.end_ns
            assert p.trace_id == step.trace_id
    spec = ("sglang.draft", "sglang.verify", "sglang.draft_extend")
    prefill = ("sglang.extend", "sglang.draft_extend")
    assert set(shapes) == {spec, prefill}, dict(shapes)
    # as many of each as SGLang logged decode / prefill batches
    assert shapes[spec] == len(eagle.decode_lines()), eagle.transport_report()
    assert shapes[prefill] == len(eagle.prefill_lines()), eagle.transport_report()
    assert not [s for s in eagle.spans if s.name == "sglang.decode"], "spec decode is never plain decode"


def test_phase_attributes(eagle: Run):
    cfg = CONFIGS[eagle.name]
    want_spec = {"sglang.spec.algorithm": "EAGLE3", "sglang.spec.topk": cfg["topk"],
                 "sglang.spec.num_steps": cfg["num_steps"], "sglang.spec.num_draft_tokens": cfg["num_draft_tokens"]}
    for phases in eagle.by_step().values():
        by_name = {p.name: p.attributes for p in phases}
        for a in by_name.values():
            assert a["sglang.cuda_graph"] is False and a["sgl_probe.timer"] == "cpu"
            assert a["sgl_probe.duration_ms"] > 0
            assert a["sglang.tp_rank"] == 0
        if "sglang.verify" in by_name:
            v, d, de = by_name["sglang.verify"], by_name["sglang.draft"], by_name["sglang.draft_extend"]
            bs = v["sglang.batch_size"]
            assert d["sglang.batch_size"] == de["sglang.batch_size"] == bs
            assert v["sglang.forward_mode"] == "TARGET_VERIFY"
            assert v["sglang.num_tokens"] == bs * cfg["num_draft_tokens"]
            assert 1.0 <= v["sglang.spec.accept_length"] <= cfg["num_steps"] + 1
            assert d["sglang.forward_mode"] == "DECODE"
            assert d["sglang.num_tokens"] == bs * cfg["topk"] * (cfg["num_steps"] - 1)
            assert de["sglang.forward_mode"] == "DRAFT_EXTEND_V2"
            assert de["sglang.num_tokens"] == bs * cfg["num_draft_tokens"]
            assert de["sgl_probe.target"].endswith("EagleDraftWorker._draft_extend_for_decode")
            for a in (v, d, de):
                assert {k: a.get(k) for k in want_spec} == want_spec
        else:
            e, de = by_name["sglang.extend"], by_name["sglang.draft_extend"]
            # the draft re-runs the prompt in the prefill's own mode, on the same tokens
            assert e["sglang.forward_mode"] == de["sglang.forward_mode"] == "EXTEND"
            assert e["sglang.num_tokens"] == de["sglang.num_tokens"]
            assert e["sglang.batch_size"] == de["sglang.batch_size"]
            assert de["sgl_probe.target"].endswith("EagleDraftWorker._draft_extend_for_prefill")
            assert {k: de.get(k) for k in want_spec} == want_spec
            assert "sglang.spec.topk" not in e
    per_phase = defaultdict(list)
    for p in eagle.phase_spans():
        per_phase[p.name].append(p.attributes["sgl_probe.duration_ms"])
    print(f"\n[{eagle.name}] " + ", ".join(f"{n[7:]} n={len(v)} mean={statistics.mean(v):.1f}ms"
                                           for n, v in sorted(per_phase.items())))


def test_prefill_spans_match_sglangs_prefill_log(eagle: Run):
    ours = [(p.attributes["sglang.batch_size"], p.attributes["sglang.num_tokens"])
            for p in eagle.phase_spans() if p.name == "sglang.extend"]
    theirs = [(bs, tokens) for bs, tokens, _ in eagle.prefill_lines()]
    assert ours == theirs, eagle.transport_report()
    # every prompt sent was prefilled (besides SGLang's own warmup and health-check requests)
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in eagle.responses())
    assert sum(t for _, t in ours) >= prompt_tokens


def test_accept_length_equals_sglangs_own(eagle: Run):
    """Per decode batch, in order, and on average: the probe's accept length is SGLang's."""
    verifies = [p for p in eagle.phase_spans() if p.name == "sglang.verify"]
    lines = eagle.decode_lines()
    assert len(verifies) == len(lines) > 0, eagle.transport_report()
    ours = [(v.attributes["sglang.batch_size"], v.attributes["sglang.spec.accept_length"]) for v in verifies]
    assert [bs for bs, _ in ours] == [bs for bs, *_ in lines]
    assert [round(length, 2) for _, length in ours] == [length for _, length, *_ in lines]
    assert statistics.mean(a for _, a in ours) == pytest.approx(statistics.mean(l for _, l, *_ in lines), abs=0.005)
    weighted = sum(bs * a for bs, a in ours) / sum(bs for bs, _ in ours)
    assert weighted == pytest.approx(sum(bs * l for bs, l, *_ in lines) / sum(bs for bs, *_ in lines), abs=0.005)
    assert weighted > 1.5
    assert max(bs for bs, _ in ours) == len(PROMPTS), "the concurrent requests were verified as one batch"
    calls = re.search(r"^sglang:spec_verify_calls_total\{[^}]*\} ([0-9.e+]+)$", eagle.metrics, re.M)
    assert calls and float(calls.group(1)) == sum(bs for bs, _ in ours)
    print(f"\n[{eagle.name}] {len(ours)} verify steps, mean accept length {statistics.mean(a for _, a in ours):.3f} "
          f"(per step), {weighted:.3f} (per request row); SGLang's decode log: "
          f"{statistics.mean(l for _, l, *_ in lines):.3f}")


def test_graph_flag_false_like_sglangs_own(eagle: Run):
    assert {g for *_, g in eagle.decode_lines()} == {"False"}
    assert {g for *_, g in eagle.prefill_lines()} == {"False"}
    assert all(s.attributes["sglang.cuda_graph"] is False
               for s in eagle.spans if s.name in PHASES or s.name == "sglang.step")
    assert {s.attributes.get("sglang.no_graph_reason") for s in eagle.spans if s.name in PHASES} == \
        {"graphs_disabled"}  # from the real EAGLE workers' runners: none built on CPU


# -- the graph=true path, with SGLang's own objects ----------------------------------------------

@pytest.fixture(scope="module", params=["0.5.23", "0.5.9"])
def readers_report(request, tmp_path_factory) -> dict:
    venv = ensure_venv(request.param)
    install_wheel(venv, build_wheel(tmp_path_factory.mktemp("wheel-readers")))
    out = subprocess.run([str(venv_python(venv)), str(CHECK_READERS)], capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads(out.stdout)
    assert report["sglang_version"] == request.param
    return report


def test_graph_true_path_with_sglangs_result_objects(readers_report):
    """SGLang's GenerationBatchResult / ModelRunnerOutput / v1 verify tuple with the flag set
    come out of the probe as ``sglang.cuda_graph = true`` on the phase and its step."""
    leave = readers_report["leave"]
    assert {r["object"] for r in leave} >= {"GenerationBatchResult", "ModelRunnerOutput"}
    assert any(r["target"].endswith("EAGLEWorkerV2.verify") for r in leave)
    assert all(r["read"] is r["flag"] for r in leave), leave
    for r in readers_report["spans"]:
        assert r["phase_cuda_graph"] is r["flag"] and r["step_cuda_graph"] is r["flag"], r
    assert any(r["span"] == "sglang.verify" and r["flag"] for r in readers_report["spans"])


def test_graph_runner_hooks_mark_the_open_phase(readers_report):
    hooks = readers_report["graph_hooks"]
    phases = {h["phase"] for h in hooks}
    assert {"sglang.decode", "sglang.draft", "sglang.draft_extend"} <= phases
    for h in hooks:
        assert h["wrapped_by_probe"] and h["phase_cuda_graph"] and h["step_cuda_graph"], h


def test_spec_readers_on_sglangs_own_objects(readers_report):
    assert readers_report["idle"] and all(r["phase"] is None for r in readers_report["idle"])
    if readers_report["sglang_version"] == "0.5.9":  # EAGLE v1: re-runs accepted tokens only
        assert readers_report["v1_draft_extend"] == {"phase": "draft_extend", "mode": "DRAFT_EXTEND",
                                                     "batch_size": 3, "num_tokens": 6}


def test_uninstrument_then_import_leaves_sglang_unwrapped(readers_report):
    """Instrumented, uninstrumented, then SGLang's worker module imported: nothing wrapped;
    instrumenting again wraps every target loaded by then."""
    u = readers_report["uninstrument"]
    assert "sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation" in u["loaded"]
    assert u["wrapped_while_off"] == [] and u["wrapped_again"] == u["loaded"]


def test_no_graph_reasons_on_sglangs_own_classes(readers_report):
    ng = readers_report["no_graph"]
    assert all(ng["layout"].values()), ng["layout"]
    assert {n: r["got"] for n, r in ng["reasons"].items()} == {n: r["want"] for n, r in ng["reasons"].items()}
    assert ng["eager_runner"] is (readers_report["sglang_version"] == "0.5.23")  # 0.5.14+ has one
