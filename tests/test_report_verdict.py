"""The speculative-decoding break-even verdict: the seed case's numbers (decode 12.1 ms with a graph,
verify 29 ms without one, draft + draft-extend 6 ms, τ 2.0), through the math alone, through a
trace the probe's own span builder and exporter wrote, and in the live summary line."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from sgl_probe.cli import main
from sgl_probe.resolved import ResolvedPhase
from sgl_probe.stats import evaluate
from sgl_probe.summary import Summary

SEED_SHORT = "spec 0.69× vs graph decode (τ 2.0, break-even 2.9; verify had no graph in 100 % of steps)"


def seed(**kw):
    args = dict(tau=2.0, t_decode=12.1, t_verify=29.0, t_draft=4.0, t_draft_extend=2.0, verify_no_graph=1.0,
                verify_graph_ms=12.1, verify_graph_source="taken as one graph decode forward")
    args.update(kw)
    return evaluate(**args)


def test_seed_numbers_say_spec_decoding_loses():
    v = seed()
    assert v.wins is False
    assert v.cycle_ms == pytest.approx(35.0)
    assert v.speedup == pytest.approx(2.0 * 12.1 / 35.0)  # 0.69x
    assert v.break_even == pytest.approx(35.0 / 12.1)  # tau* 2.89
    assert v.verify_max_ms == pytest.approx(2.0 * 12.1 - 6.0)  # 18.2 ms
    assert v.whatif_speedup == pytest.approx(2.0 * 12.1 / (6.0 + 12.1))  # 1.34x with a graph verify
    assert v.short() == SEED_SHORT
    assert v.sentence() == (
        "Speculative decoding loses: 0.69× graph decode (τ 2.00 < break-even 2.89). Verify ran without "
        "a CUDA graph in 100 % of steps; at graph speed (12.1 ms, taken as one graph decode forward) it "
        "would win by 1.34×. To win at τ 2.00, verify must take under 18.2 ms (now 29.0 ms), or τ must "
        "reach 2.89.")


def test_a_winning_cycle_says_how_much_room_is_left():
    v = seed(tau=3.2, t_verify=13.0, verify_no_graph=0.0, verify_graph_ms=None)
    assert v.wins and v.speedup == pytest.approx(3.2 * 12.1 / 19.0)
    assert v.sentence().startswith("Speculative decoding wins: 2.04× graph decode (τ 3.20 ≥ break-even 1.57).")
    assert "keeps winning while verify stays under 32.7 ms" in v.sentence()
    assert v.whatif_speedup is None and "verify had no graph in 0 % of steps" in v.short()


def test_when_even_a_free_verify_cannot_win():
    v = seed(tau=1.2, t_draft=14.0)
    assert not v.wins and v.verify_max_ms < 0
    assert "Even a free verify would not win at τ 1.20" in v.sentence()


def test_eager_decode_baseline_is_named_as_such():
    v = seed(verify_no_graph=None, verify_graph_ms=None)
    v2 = evaluate(2.0, 12.1, 29.0, 4.0, 2.0, decode_graph=False)
    assert v.short() == "spec 0.69× vs graph decode (τ 2.0, break-even 2.9)"
    assert v2.short() == "spec 0.69× vs eager decode (τ 2.0, break-even 2.9)"
    assert "eager decode (no graph decode seen)" in v2.sentence()


@pytest.mark.parametrize("bad", [dict(tau=float("nan")), dict(t_decode=0.0), dict(tau=0.0),
                                 dict(t_verify=None), dict(t_decode=float("inf"))])
def test_no_verdict_without_usable_inputs(bad):
    assert seed(**bad) is None


# -- the seed case as a trace: real span builder, real exporter, `sgl-probe report` --------------

class _Timer:
    kind = "cuda"

    def interval_kind(self, start, end):
        return start, end, None

    def wall(self, host_ns):
        return host_ns


def write_trace(path: str, steps: list[list[tuple]], tp_rank: int = 0, sizes: list[int] | None = None) -> None:
    """Steps of (phase, mode, ms, graph, accept_length) with no gaps: the step lasts exactly as
    long as its phases (no "other" time), so the report must reproduce the seed numbers.
    ``sizes``: each step's batch size (default 8)."""
    from sgl_probe import spans as spans_mod
    from sgl_probe.drain import resolve_step
    from sgl_probe.sinks import JsonLinesExporter, make_resource
    from sgl_probe.readers import Facts
    from sgl_probe.recorder import PhaseRecord, StepRecord

    ident = {"tp_rank": tp_rank, "dp_rank": 0, "pp_rank": 0}
    spec = {"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    res = make_resource(ident, "seed-run", "0.5.8")
    exporter = JsonLinesExporter(path)
    now = 1_790_000_000_000_000_000
    out = []
    for i, phases in enumerate(steps, 1):
        bs = sizes[i - 1] if sizes else 8
        st = StepRecord(i, Facts("step", phases[0][1], bs, bs), now)
        for phase, mode, ms, graph, accept in phases:
            ph = PhaseRecord(Facts(phase, mode, bs, bs), "seed:" + phase, now, now)
            ph.t_end = now + round(ms * 1e6)
            ph.host1 = ph.t_end
            ph.graph, ph.accept_length = graph, accept
            st.phases.append(ph)
            now = ph.t_end
        st.host1 = now
        out += spans_mod.build_step_spans(resolve_step(st, _Timer()), "seed-run", ident, spec, res)
        now += 1_000_000
    for k in range(0, len(out), 512):
        exporter.export(out[k:k + 512])


def cycle(accept: float, draft: float = 4.0, verify: float = 29.0, draft_extend: float = 2.0) -> list[tuple]:
    return [("draft", "DECODE", draft, True, None), ("verify", "TARGET_VERIFY", verify, False, accept),
            ("draft_extend", "DRAFT_EXTEND", draft_extend, True, None)]


def test_seed_numbers_through_a_probe_trace(tmp_path, capsys):
    spec_dir, base_dir = tmp_path / "eagle3", tmp_path / "baseline"
    spec_dir.mkdir()
    base_dir.mkdir()

    write_trace(str(spec_dir / "sgl-probe-1.jsonl"), [cycle(a) for a in (1.75, 2.25) * 20])
    write_trace(str(base_dir / "sgl-probe-2.jsonl"), [[("decode", "DECODE", 12.1, True, None)]] * 40)
    capsys.readouterr()
    assert main(["report", str(spec_dir), "--baseline", str(base_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v = doc["speculative"]["verdict"]
    assert v["short"] == SEED_SHORT and v["wins"] is False
    assert v["speedup"] == pytest.approx(0.6914, abs=1e-4) and v["break_even"] == pytest.approx(2.8926, abs=1e-4)
    assert doc["speculative"]["cycle"]["other_ms"] == pytest.approx(0.0, abs=1e-6)
    assert main(["report", str(spec_dir), "--baseline", str(base_dir)]) == 0
    out = capsys.readouterr().out
    assert ("=> Speculative decoding loses: 0.69× graph decode (τ 2.00 < break-even 2.89). Verify ran without "
            "a CUDA graph in 100 % of steps; at graph speed (12.1 ms, taken as one graph decode forward) it "
            "would win by 1.34×.") in out


def test_warmup_does_not_decide_the_verdict(tmp_path, capsys):
    """The shape of a real GPU run: the first call of every shape pays for JIT compilation and
    autotuning (0.1-14 s), then the steady state is the seed case. The verdict must be the steady
    state's; from plain means it would be decided by those few calls (break-even 5.16, not 2.89)."""
    spec_dir, base_dir = tmp_path / "eagle3", tmp_path / "baseline"
    spec_dir.mkdir()
    base_dir.mkdir()
    sizes = [8, 4] + [8, 4] * 30
    spec = [cycle(2.0, 5000.0, 14000.0, 800.0), cycle(2.0, 300.0, 2500.0, 150.0)]
    spec += [cycle(a) for a in (1.75, 2.25) * 30]
    spec[20] = cycle(1.75, verify=600.0)  # a stall in the steady state: not a first call, kept
    write_trace(str(spec_dir / "sgl-probe-1.jsonl"), spec, sizes=sizes)
    base = [[("decode", "DECODE", ms, True, None)] for ms in (3000.0, 1200.0)] + \
        [[("decode", "DECODE", 12.1, True, None)]] * 60
    write_trace(str(base_dir / "sgl-probe-2.jsonl"), base, sizes=sizes)

    # What plain means over every call would say (read from the trace files, not by the report):
    calls: dict = {}
    for d in (spec_dir, base_dir):
        for line in next(d.iterdir()).read_text().splitlines():
            for sp in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]:
                attrs = {a["key"]: next(iter(a["value"].values())) for a in sp["attributes"]}
                calls.setdefault(sp["name"], []).append(attrs["sgl_probe.duration_ms"])
    mean = {k[7:]: sum(v) / len(v) for k, v in calls.items()}
    plain = evaluate(2.0, mean["decode"], mean["verify"], mean["draft"], mean["draft_extend"])
    assert plain.break_even == pytest.approx(5.16, abs=0.01) and plain.short() != SEED_SHORT

    capsys.readouterr()
    assert main(["report", str(spec_dir), "--baseline", str(base_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v = doc["speculative"]["verdict"]
    assert v["short"] == SEED_SHORT and v["break_even"] == pytest.approx(2.8926, abs=1e-4)
    assert doc["speculative"]["cycle"]["statistic"] == "median"
    assert doc["speculative"]["decode"]["n"] == 60 and doc["speculative"]["decode"]["warmup_calls"] == 2
    w = doc["warmup"]
    assert (w["calls"], w["steps"]) == (6, 2) and w["by_phase"] == {"draft": 2, "verify": 2, "draft_extend": 2}
    assert w["calls_ms"] == pytest.approx(5000 + 14000 + 800 + 300 + 2500 + 150)
    rows = {r["phase"]: r for r in doc["phases"]}
    assert rows["verify"]["count"] == 60 and rows["verify"]["warmup_calls"] == 2
    assert rows["verify"]["max_ms"] == 600.0 and rows["verify"]["p50_ms"] == 29.0  # the stall stays
    assert doc["steps"][0]["count"] == 60 and doc["steps"][0]["max_ms"] == pytest.approx(606.0)

    assert main(["report", str(spec_dir), "--baseline", str(base_dir)]) == 0
    out = capsys.readouterr().out
    assert "  warm-up left out: 6 calls (draft 2, verify 2, draft_extend 2; 22,750 ms) in 2 steps; rule: " in out
    assert "per-phase times: medians over steady steps (warm-up left out)" in out
    assert "(graph, 60 steps from --baseline, 2 warm-up calls left out, matched" in out
    assert "=> Speculative decoding loses: 0.69× graph decode (τ 2.00 < break-even 2.89)." in out
    verify_row = next(line.split() for line in out.splitlines() if line.startswith("verify "))
    assert verify_row[2] == "60" and verify_row[-1] == "2"  # count, warm-up


def test_a_shape_called_once_is_compared_with_its_phase(tmp_path, capsys):
    """A batch size seen once has no other calls of its shape: its first (only) call is compared
    with the phase's other calls on that rank, so a slow one is still warm-up, a normal one not."""
    d = tmp_path / "once"
    d.mkdir()
    steps = [cycle(2.0) for _ in range(20)] + [cycle(2.0, verify=3000.0), cycle(2.0, verify=31.0)]
    write_trace(str(d / "sgl-probe-1.jsonl"), steps, sizes=[8] * 20 + [16, 32])
    capsys.readouterr()
    assert main(["report", str(d), "--json", "--by-bs"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warmup"]["by_phase"] == {"verify": 1} and doc["warmup"]["steps"] == 1
    verify = {r["bs"]: (r["count"], r["warmup_calls"]) for r in doc["phases_by_bs"] if r["phase"] == "verify"}
    assert verify == {"5-8": (20, 0), "9-16": (0, 1), "17-32": (1, 0)}


def test_warmup_rule():
    from sgl_probe.stats import is_warmup

    assert is_warmup(14000.0, 29.0) and is_warmup(130.0, 29.0)
    assert not is_warmup(80.0, 20.0)  # 4x, but under 100 ms more: scheduler jitter, not warm-up
    assert not is_warmup(250.0, 100.0)  # 150 ms more, but only 2.5x: a slow call, not warm-up
    assert not is_warmup(5000.0, None) and not is_warmup(5000.0, float("nan"))  # nothing to compare


# -- the live verdict at the end of the summary line ----------------------------------------------

_T0 = 1_790_000_000_000_000_000


def phase(name: str, ms: float, graph: bool, accept: float | None = None, bs: int = 8,
          reason: str | None = None) -> ResolvedPhase:
    mode = {"verify": "TARGET_VERIFY", "extend": "EXTEND", "draft_extend": "DRAFT_EXTEND"}.get(name, "DECODE")
    return ResolvedPhase(name, _T0, _T0 + round(ms * 1e6), graph, mode, bs, bs, 0.1, "test:" + name,
                         accept_length=accept, no_graph_reason=reason)


def test_summary_line_ends_with_the_live_verdict():
    s = Summary(30, {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0})
    s.add([phase("decode", 12.1, True)] * 5)
    s._window = {}  # a new window: the decode time is remembered across windows
    for _ in range(10):
        s.add([phase("draft", 4.0, True), phase("verify", 29.0, False, 2.0, reason="graphs_disabled"),
               phase("draft_extend", 2.0, True)])
    line = s.line()
    assert line.startswith("sgl-probe summary [tp_rank=0 dp_rank=0 pp_rank=0]: draft n=10 ")
    assert " | verify n=10 p50=29.00ms p90=29.00ms graph=0% (graphs_disabled) | " in line
    assert line.endswith(" | verdict from medians, 0 warm-up calls left out | " + SEED_SHORT)


def test_summary_line_has_no_verdict_until_there_is_one():
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("draft", 4.0, True), phase("verify", 29.0, False, 2.0)])
    assert "spec " not in s.line()  # no decode time yet
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("decode", 12.1, True), phase("verify", 29.0, False)])  # no accept length
    assert "spec " not in s.line()
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("decode", 12.1, True), phase("extend", 40.0, False, reason="mode_not_captured")])
    assert s.line() == ("sgl-probe summary [tp_rank=0]: decode n=1 p50=12.10ms p90=12.10ms graph=100% | "
                        "extend n=1 p50=40.00ms p90=40.00ms graph=0% (mode_not_captured)")


def test_summary_line_says_how_late_graph_phases_launched_their_graph():
    s = Summary(30, {"tp_rank": 0})
    launched = [phase("decode", ms, True)._replace(graph_ms=0.4) for ms in (1.2, 1.3, 1.4)]
    s.add(launched + [phase("decode", 9.0, False, reason="batch_too_large"), phase("extend", 5.0, False),
                      phase("extend", 5.0, False)._replace(graph_ms=1.0)])  # a launch SGLang calls no graph
    line = s.line()
    # (1.2, 1.3, 1.4) - 0.4: median 0.90; the eager calls and the eager phase carry none
    assert ": decode n=4 p50=1.40ms p90=9.00ms graph=75% (batch_too_large) launch@0.90ms | extend n=2 " in line
    assert "launch@" not in line.split("| extend")[1]
    s._last -= s.every_ns  # the window is due
    assert s.maybe_line() is not None and s._launch == {}  # every window starts afresh
    s.add([phase("decode", 1.0, True)])
    assert "launch@" not in s.line()


def test_summary_line_names_several_no_graph_reasons_by_share():
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("verify", 29.0, False, 2.0, bs=64, reason="batch_too_large")] * 3
          + [phase("verify", 29.0, False, 2.0, reason="runner_refused"), phase("verify", 12.0, True, 2.0)])
    assert "verify n=5 p50=29.00ms p90=29.00ms graph=20% (batch_too_large 75%, runner_refused 25%)" in s.line()


def test_summary_line_counts_reasons_only_where_no_graph_ran_and_one_was_given():
    """A graph call's reason never counts; a call without a graph and without a reason (None or
    empty) is in the share of neither; the order of the reasons is the order they came in."""
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("extend", 5.0, False, reason=None), phase("extend", 5.0, False, reason=""),
           phase("extend", 5.0, True, reason="stale"), phase("extend", 5.0, False, reason="mode_not_captured"),
           phase("extend", 5.0, False, reason="batch_too_large"), phase("extend", 5.0, False, reason="mode_not_captured")])
    assert "extend n=6 p50=5.00ms p90=5.00ms graph=17% (mode_not_captured 67%, batch_too_large 33%)" in s.line()
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("extend", 5.0, False, reason=None), phase("extend", 5.0, True, reason="stale")])
    assert "graph=50% |" in s.line() + " |" and "(" not in s.line().split("graph=50%")[1]


def test_summary_line_leaves_warmup_out_of_times_and_verdict():
    """Warm-up-shaped steps in one window: the first call of each shape huge, then the seed case.
    The line's times and verdict are the steady state's, and it says what was left out."""
    s = Summary(30, {"tp_rank": 0})
    s.add([phase("decode", 3000.0, True)])
    s.add([phase("decode", 12.1, True)] * 5)
    s.add([phase("draft", 5000.0, True), phase("verify", 14000.0, False, 2.0), phase("draft_extend", 800.0, True)])
    for _ in range(10):
        s.add([phase("draft", 4.0, True), phase("verify", 29.0, False, 2.0), phase("draft_extend", 2.0, True)])
    line = s.line()
    assert ": decode n=6 p50=12.10ms p90=12.10ms graph=100% warm-up=1 |" in line
    assert "| verify n=11 p50=29.00ms p90=29.00ms graph=0% warm-up=1 |" in line
    assert line.endswith(" | verdict from medians, 4 warm-up calls left out | " + SEED_SHORT)


def test_live_verdict_in_the_server_log_through_the_probe(monkeypatch, caplog):
    """The real wrappers, recorder and drain thread, on the spec-shaped workload, with the summary
    every 0.2 s. The step's spans go to the summary (they carry the accept length)."""
    from sgl_probe import config
    from sgl_probe.activate import Probe
    from tests import workload_spec as ws

    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "SGL_PROBE_TRACE_DIR"):
        monkeypatch.delenv(key, raising=False)
    for key, val in {"SGL_PROBE_SUMMARY_S": "0.2", "SGL_PROBE_DRAIN_S": "0.05", "SGL_PROBE_TIMER": "cpu"}.items():
        monkeypatch.setenv(key, val)
    monkeypatch.setattr(logging.getLogger("sgl_probe"), "propagate", True)
    probe = Probe(config.load(), targets=ws.TABLE)
    probe.instrumentor.instrument()
    try:
        sched = ws.Scheduler(ws.ServerArgs(spec=True), tp_rank=0)
        with caplog.at_level(logging.INFO, logger="sgl_probe"):
            for _ in range(5):
                sched.run_batch(ws.Batch(ws.ForwardMode.DECODE, 2, spec=False))
            deadline = time.monotonic() + 20
            lines = []
            while time.monotonic() < deadline and not lines:
                sched.run_batch(ws.Batch(ws.ForwardMode.DECODE, 2, accept=3.0))
                lines = [r.getMessage() for r in caplog.records if "× vs graph decode" in r.getMessage()]
    finally:
        probe.instrumentor.uninstrument()
        probe.pipeline.shutdown()
    assert lines, [r.getMessage() for r in caplog.records]
    assert re.search(r"\| verify n=\d+ p50=[\d.]+ms p90=[\d.]+ms graph=0%(?: \([a-z_]+\))? \| "
                     r"draft_extend n=\d+ .* \| verdict from medians, \d+ warm-up calls? left out \| "
                     r"spec \d+\.\d\d× vs graph decode \(τ 3\.0, break-even \d+\.\d; verify had no graph in "
                     r"100 % of steps\)$", lines[0]), lines[0]
