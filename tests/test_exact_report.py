"""The speculative-decoding verdict from aggregated spans, with exact numbers: batch-size buckets
with unequal step counts are combined weighted by their counts (the spec side) and the decode
reference is matched to the spec steps' buckets with the spec side's weights."""

from __future__ import annotations

import math

import pytest

from sgl_probe import stats
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.model import Resource, Span
from sgl_probe.report.speculative import NO_BASELINE, analyse, decode_reference, spec_cycle

RES = Resource({"sgl_probe.run_id": "run", "service.name": "sglang", "sglang.tp_rank": 0})
MS = 1_000_000


class Trace:
    """Spans as the probe writes them: one ``sglang.step`` per step, its phases inside it."""

    def __init__(self, with_steps: bool = True) -> None:
        self.spans: list[Span] = []
        self.t = 1_700_000_000_000_000_000
        self.idx = 0
        self.with_steps = with_steps

    def step(self, bs: int, phases: list[tuple], other_ms: float = 0.0) -> None:
        """phases: (phase, ms, graph, accept_length or None)."""
        self.idx += 1
        start = t = self.t
        for phase, ms, graph, accept in phases:
            attrs = {"sgl_probe.duration_ms": float(ms), "sglang.cuda_graph": graph, "sglang.batch_size": bs,
                     "sglang.step_index": self.idx, "sgl_probe.timer": "cpu", "sglang.tp_rank": 0,
                     "sglang.num_tokens": bs, "sglang.forward_mode": "TARGET_VERIFY" if phase == "verify" else "DECODE"}
            if accept is not None:
                attrs["sglang.spec.accept_length"] = accept
            if phase in ("draft", "verify", "draft_extend"):
                attrs.update({"sglang.spec.algorithm": "EAGLE3", "sglang.spec.num_steps": 3})
            self.spans.append(Span("sglang." + phase, "t%d" % self.idx, "p%d" % len(self.spans), "s%d" % self.idx,
                                   t, t + round(ms * MS), attrs, RES))
            t += round(ms * MS)
        end = t + round(other_ms * MS)
        if self.with_steps:
            self.spans.append(Span("sglang.step", "t%d" % self.idx, "s%d" % self.idx, "", start, end,
                                   {"sglang.step_index": self.idx, "sglang.batch_size": bs, "sglang.tp_rank": 0},
                                   RES))
        self.t = end + MS

    def spec(self, bs: int, draft: float, verify: float, draft_extend: float, other: float, tau: float,
             verify_graph: bool = True) -> None:
        self.step(bs, [("draft", draft, True, None), ("verify", verify, verify_graph, tau),
                       ("draft_extend", draft_extend, True, None)], other)

    def decode(self, bs: int, ms: float, other: float, graph: bool = True) -> None:
        self.step(bs, [("decode", ms, graph, None)], other)

    def aggregate(self) -> Aggregator:
        agg = Aggregator()
        for s in self.spans:
            agg.add(s)
        return agg.finish()


def spec_run(with_steps: bool = True) -> Trace:
    tr = Trace(with_steps)
    # Bucket "1": three steps (verify median 10); bucket "5-8": one step. Unequal weights 3:1.
    for verify in (9.0, 10.0, 14.0):
        tr.spec(1, 2.0, verify, 1.0, 2.0, 2.0)
    tr.spec(8, 4.0, 30.0, 2.0, 4.0, 3.0)
    return tr


def baseline_run() -> Trace:
    tr = Trace()
    for _ in range(2):
        tr.decode(1, 5.0, 1.0)
    for _ in range(5):  # the baseline's own weights (2:5) must not be used
        tr.decode(8, 8.0, 2.0)
    return tr


def test_spec_cycle_weights_buckets_by_their_step_counts():
    cyc = spec_cycle(spec_run().aggregate())
    assert cyc["from_steps"] is True and cyc["n_steps"] == 4 and cyc["n_verify"] == 4
    assert {b: v["n"] for b, v in cyc["buckets"].items()} == {"1": 3, "5-8": 1}
    assert cyc["buckets"]["1"]["verify_ms"] == 10.0 and cyc["buckets"]["5-8"]["verify_ms"] == 30.0
    assert cyc["draft_ms"] == pytest.approx((2 * 3 + 4) / 4)
    assert cyc["verify_ms"] == pytest.approx((10 * 3 + 30) / 4)
    assert cyc["draft_extend_ms"] == pytest.approx((1 * 3 + 2) / 4)
    assert cyc["other_ms"] == pytest.approx((2 * 3 + 4) / 4)
    assert cyc["tau"] == pytest.approx((2 * 3 + 3) / 4) and cyc["n_tau"] == 4
    assert (cyc["buckets"]["1"]["tau"], cyc["buckets"]["5-8"]["tau"]) == (2.0, 3.0)
    assert cyc["verify_no_graph"] == 0.0 and cyc["verify_graph_ms"] == 12.0 and cyc["n_verify_graph"] == 4  # median of 9, 10, 14, 30


def test_without_step_spans_buckets_are_weighted_by_verify_calls():
    cyc = spec_cycle(spec_run(with_steps=False).aggregate())
    assert cyc["from_steps"] is False and cyc["n_steps"] == 4
    assert cyc["verify_ms"] == pytest.approx(15.0) and cyc["draft_ms"] == pytest.approx(2.5)
    assert cyc["other_ms"] == 0.0


def test_decode_reference_per_bucket():
    ref = decode_reference(baseline_run().aggregate())
    assert (ref["graph"], ref["from_steps"], ref["n"], ref["warmup_calls"]) == (True, True, 7, 0)
    assert ref["decode_ms"] == 8.0 and ref["other_ms"] == 2.0  # medians over all 7 steps
    assert ref["buckets"] == {"1": {"n": 2, "decode_ms": 5.0, "other_ms": 1.0},
                              "5-8": {"n": 5, "decode_ms": 8.0, "other_ms": 2.0}}


def test_decode_reference_prefers_graph_decode_and_falls_back_to_eager():
    tr = Trace()
    tr.decode(1, 50.0, 0.0, graph=False)
    tr.decode(1, 50.0, 0.0, graph=False)
    tr.decode(1, 7.0, 1.0, graph=True)
    ref = decode_reference(tr.aggregate())
    assert ref["graph"] is True and ref["n"] == 1 and ref["decode_ms"] == 7.0
    tr = Trace()
    tr.decode(1, 50.0, 0.0, graph=False)
    ref = decode_reference(tr.aggregate())
    assert ref["graph"] is False and ref["decode_ms"] == 50.0
    assert decode_reference(spec_run().aggregate()) is None


def test_decode_reference_without_step_spans():
    tr = Trace(with_steps=False)
    for ms in (5.0, 6.0, 9.0):
        tr.decode(2, ms, 0.0)
    ref = decode_reference(tr.aggregate())
    assert (ref["from_steps"], ref["n"], ref["decode_ms"], ref["other_ms"]) == (False, 3, 6.0, 0.0)
    assert ref["buckets"] == {"2": {"n": 3, "decode_ms": 6.0, "other_ms": 0.0}}


def test_verdict_matches_decode_to_the_spec_buckets_with_the_spec_weights():
    out = analyse(spec_run().aggregate(), baseline_run().aggregate())
    assert out["decode_source"] == "--baseline" and out["notes"] == []
    dec = (5.0 * 3 + 8.0 * 1) / 4
    other = (1.0 * 3 + 2.0 * 1) / 4
    assert out["decode_matched_ms"] == pytest.approx(dec)
    assert out["decode_matched_other_ms"] == pytest.approx(other)
    v = out["verdict"]
    cycle = 2.5 + 15.0 + 1.25 + 2.5
    tau = 2.25
    assert v["cycle_ms"] == pytest.approx(cycle)
    assert v["t_decode"] == pytest.approx(dec + other)
    assert v["speedup"] == pytest.approx(tau * (dec + other) / cycle)
    assert v["break_even"] == pytest.approx(cycle / (dec + other))
    assert v["verify_max_ms"] == pytest.approx(tau * (dec + other) - (cycle - 15.0))
    assert v["wins"] is False and v["decode_graph"] is True
    assert v["verify_no_graph"] == 0.0 and v["whatif_speedup"] is None
    rows = {r["bs"]: r for r in out["by_bucket"]}
    assert [r["bs"] for r in out["by_bucket"]] == ["1", "5-8"]
    assert rows["1"]["n"] == 3 and rows["1"]["tau"] == 2.0
    assert rows["1"]["cycle_ms"] == pytest.approx(15.0) and rows["1"]["decode_ms"] == pytest.approx(6.0)
    assert rows["1"]["speedup"] == pytest.approx(2.0 * 6.0 / 15.0)
    assert rows["1"]["break_even"] == pytest.approx(15.0 / 6.0)
    assert rows["5-8"]["speedup"] == pytest.approx(3.0 * 10.0 / 40.0)


def test_unmatched_bucket_uses_the_overall_decode_and_says_so():
    tr = spec_run()
    tr.spec(3, 2.0, 10.0, 1.0, 2.0, 2.0)
    out = analyse(tr.aggregate(), baseline_run().aggregate())
    assert out["notes"] == ["no decode steps at batch size 3-4: the overall decode mean stands in for them"]
    # Weights 3 (bs 1), 1 (bs 3-4, the overall medians 8 + 2), 1 (bs 5-8).
    assert out["decode_matched_ms"] == pytest.approx((5.0 * 3 + 8.0 + 8.0) / 5)
    assert out["decode_matched_other_ms"] == pytest.approx((1.0 * 3 + 2.0 + 2.0) / 5)
    assert [r["bs"] for r in out["by_bucket"]] == ["1", "5-8"]  # no per-bucket row without a match


def test_graph_less_verifies_give_the_measured_what_if():
    tr = Trace()
    tr.spec(1, 2.0, 20.0, 1.0, 0.0, 2.0, verify_graph=False)
    tr.spec(1, 2.0, 20.0, 1.0, 0.0, 2.0, verify_graph=False)
    tr.spec(1, 2.0, 20.0, 1.0, 0.0, 2.0, verify_graph=False)
    tr.spec(1, 2.0, 6.0, 1.0, 0.0, 2.0, verify_graph=True)
    out = analyse(tr.aggregate(), baseline_run().aggregate())
    v = out["verdict"]
    assert v["verify_no_graph"] == 0.75 and v["whatif_verify_ms"] == 6.0
    assert v["whatif_source"] == "measured on 1 graph verifies"
    assert v["t_verify"] == 20.0  # the median over all four
    assert v["whatif_speedup"] == pytest.approx(2.0 * 6.0 / (2.0 + 6.0 + 1.0))
    assert out["by_bucket"] == []  # one bucket: no per-bucket table


def test_no_graph_verify_at_all_takes_one_graph_decode_forward():
    tr = Trace()
    tr.spec(1, 2.0, 20.0, 1.0, 0.0, 2.0, verify_graph=False)
    out = analyse(tr.aggregate(), baseline_run().aggregate())
    v = out["verdict"]
    assert v["whatif_verify_ms"] == 5.0 and v["whatif_source"] == "taken as one graph decode forward"
    eager = Trace()
    eager.decode(1, 5.0, 1.0, graph=False)
    v = analyse(tr.aggregate(), eager.aggregate())["verdict"]
    assert v["whatif_speedup"] is None and v["decode_graph"] is False


def test_what_is_missing_is_said():
    out = analyse(spec_run().aggregate())
    assert out["verdict"] is None and out["notes"] == [NO_BASELINE] and out["decode_source"] is None
    out = analyse(spec_run().aggregate(), Trace().aggregate())
    assert out["notes"] == ["the --baseline input has no decode spans: no decode time to compare with"]
    tr = Trace()
    tr.spec(1, 2.0, 10.0, 1.0, 0.0, None)
    out = analyse(tr.aggregate(), baseline_run().aggregate())
    assert out["notes"] == ["verify spans carry no sglang.spec.accept_length: no τ, no verdict"]
    assert out["cycle"]["tau"] is None and out["cycle"]["n_tau"] == 0
    assert analyse(baseline_run().aggregate()) is None


def test_own_decode_steps_are_the_reference_without_a_baseline():
    tr = spec_run()
    tr.decode(1, 5.0, 1.0)
    out = analyse(tr.aggregate())
    assert out["decode_source"] == "this run's own decode steps"
    assert out["decode_matched_ms"] == pytest.approx(5.0)  # the bs-1 decode stands in for both buckets


# -- the verdict's arithmetic ------------------------------------------------------------------------

def test_evaluate_exact():
    v = stats.evaluate(2.0, 10.0, 12.0, 4.0, 2.0, 2.0, verify_no_graph=0.5, verify_graph_ms=6.0,
                       verify_graph_source="x")
    assert (v.cycle_ms, v.speedup, v.break_even, v.verify_max_ms) == (20.0, 1.0, 2.0, 12.0)
    assert v.wins is True  # exactly at break-even counts as a win
    assert v.whatif_speedup == pytest.approx(20.0 / 14.0) and v.whatif_source == "x"
    v = stats.evaluate(2.0, 10.0, 12.0, 4.0, 2.0, -5.0)
    assert v.t_other == 0.0 and v.cycle_ms == 18.0 and v.whatif_speedup is None and v.whatif_source == ""
    v = stats.evaluate(2.0, 10.0, 12.0, float("nan"), float("inf"), float("nan"), verify_no_graph=float("nan"))
    assert (v.t_draft, v.t_draft_extend, v.t_other, v.cycle_ms, v.verify_no_graph) == (0.0, 0.0, 0.0, 12.0, None)
    v = stats.evaluate(2.0, 10.0, 12.0, verify_no_graph=0.5, verify_graph_ms=6.0)
    assert v.whatif_source == "graph verify" and v.whatif_speedup == pytest.approx(20.0 / 6.0)
    assert stats.evaluate(2.0, 10.0, 12.0, verify_no_graph=0.0, verify_graph_ms=6.0).whatif_speedup is None
    assert stats.evaluate(2.0, 10.0, 12.0, verify_no_graph=0.5, verify_graph_ms=0.0).whatif_speedup is None


@pytest.mark.parametrize("args", [(0.0, 10.0, 5.0), (2.0, 0.0, 5.0), (-1.0, 10.0, 5.0), (2.0, -1.0, 5.0),
                                  (2.0, 10.0, 0.0), (math.nan, 10.0, 5.0), (2.0, 10.0, math.inf),
                                  (None, 10.0, 5.0), (2.0, 10.0, -1.0)])
def test_evaluate_refuses_unusable_inputs(args):
    assert stats.evaluate(*args) is None


def test_verdict_sentences_exact():
    win = stats.evaluate(3.0, 10.0, 10.0, 5.0, 1.0, 0.0, verify_no_graph=0.25, verify_graph_ms=5.0,
                         verify_graph_source="measured")
    assert win.short() == "spec 1.88× vs graph decode (τ 3.0, break-even 1.6; verify had no graph in 25 % of steps)"
    assert win.sentence() == (
        "Speculative decoding wins: 1.88× graph decode (τ 3.00 ≥ break-even 1.60). "
        "Verify ran without a CUDA graph in 25 % of steps; at graph speed (5.0 ms, measured) it would "
        "reach 2.73×. It keeps winning while verify stays under 24.0 ms (now 10.0 ms) and τ above 1.60.")
    lose = stats.evaluate(2.0, 10.0, 25.0, 4.0, 1.0, decode_graph=False, verify_no_graph=1.0,
                          verify_graph_ms=10.0, verify_graph_source="s")
    assert lose.short() == "spec 0.67× vs eager decode (τ 2.0, break-even 3.0; verify had no graph in 100 % of steps)"
    assert lose.sentence() == (
        "Speculative decoding loses: 0.67× eager decode (no graph decode seen) (τ 2.00 < break-even 3.00). "
        "Verify ran without a CUDA graph in 100 % of steps; at graph speed (10.0 ms, s) it would win by 1.33×. "
        "To win at τ 2.00, verify must take under 15.0 ms (now 25.0 ms), or τ must reach 3.00.")
    still = stats.evaluate(1.5, 10.0, 25.0, 4.0, 1.0, verify_no_graph=1.0, verify_graph_ms=12.0,
                           verify_graph_source="s")
    assert "it would still lose at 0.88×" in still.sentence()
    free = stats.evaluate(1.2, 10.0, 5.0, 10.0, 4.0)
    assert free.short() == "spec 0.63× vs graph decode (τ 1.2, break-even 1.9)"
    assert free.sentence().endswith(
        "Even a free verify would not win at τ 1.20: draft + draft_extend + other already take 14.0 ms "
        "≥ τ × decode (12.0 ms); τ must reach 1.90.")
    d = free.as_dict()
    assert d["short"] == free.short() and d["sentence"] == free.sentence() and d["tau"] == 1.2


# -- order statistics and the warm-up rule -------------------------------------------------------------

def test_order_statistics_exact():
    assert stats.median([3, 1, 2]) == 2 and stats.median([4, 1, 3, 2]) == 2.5 and math.isnan(stats.median([]))
    vals = [float(x) for x in range(1, 11)]
    assert [stats.percentile(vals, q) for q in (0, 0.5, 0.9, 0.99, 1, 1.5, -1)] == [1, 5, 9, 10, 10, 10, 1]  # round(4.5) == 4
    assert math.isnan(stats.percentile([], 0.5))
    d = stats.describe([4.0, 1.0, 3.0, 2.0])
    assert d == {"count": 4, "sum_ms": 10.0, "mean_ms": 2.5, "p50_ms": 3.0, "p90_ms": 4.0, "p99_ms": 4.0,
                 "max_ms": 4.0}
    e = stats.describe([])
    assert e["count"] == 0 and e["sum_ms"] == 0 and all(math.isnan(e[k]) for k in ("mean_ms", "p50_ms", "max_ms"))


@pytest.mark.parametrize("n,label", [(None, "?"), (0, "?"), (-3, "?"), (True, "?"), (2.0, "?"), (1, "1"),
                                     (2, "2"), (3, "3-4"), (4, "3-4"), (5, "5-8"), (8, "5-8"), (9, "9-16"),
                                     (1024, "513-1024"), (1025, "1025-2048")])
def test_bucket_labels(n, label):
    assert stats.bucket(n) == label


def test_bucket_order_and_token_class():
    labels = ["?", "9-16", "1", "3-4", "2"]
    assert sorted(labels, key=stats.bucket_order) == ["1", "2", "3-4", "9-16", "?"]
    assert [stats.token_class(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert [stats.token_class(n) for n in (0, -1, None, True, 2.0)] == [None] * 5
    assert stats.shape_key("decode", "DECODE", 4, True, 300) == ("decode", "DECODE", 4, True, 9)


@pytest.mark.parametrize("ms,ref,want", [
    (400.0, 100.0, True), (300.0, 100.0, False),       # > 3x, not >= 3x
    (301.0, 100.0, True), (149.0, 40.0, True), (139.0, 40.0, False),  # >= 100 ms more
    (140.0, 40.0, True), (50.0, 1.0, False),
    (1000.0, None, False), (1000.0, float("nan"), False),
])
def test_warmup_rule_exact(ms, ref, want):
    assert stats.is_warmup(ms, ref) is want


def test_verdict_boundaries():
    # An accept length of exactly 1 (no draft ever accepted) still gets a verdict.
    v = stats.evaluate(1.0, 10.0, 10.0)
    assert v is not None and v.speedup == 1.0 and v.wins is True
    # An infinite "other" time is unusable, like a missing one.
    assert stats.evaluate(2.0, 10.0, 12.0, 0.0, 0.0, math.inf).cycle_ms == 12.0
    # Exactly break-even at graph speed: "would win by 1.00×".
    v = stats.evaluate(2.0, 10.0, 30.0, verify_no_graph=1.0, verify_graph_ms=20.0, verify_graph_source="m")
    assert v.whatif_speedup == 1.0 and "it would win by 1.00×" in v.sentence()
    # verify_max_ms exactly 0: even a free verify would not win.
    v = stats.evaluate(1.0, 10.0, 5.0, 10.0)
    assert v.verify_max_ms == 0.0 and "Even a free verify would not win" in v.sentence()
    # verify_max_ms between 0 and 1 ms: there is (a little) room.
    v = stats.evaluate(1.0, 10.0, 5.0, 9.5)
    assert v.verify_max_ms == 0.5 and "verify must take under 0.5 ms" in v.sentence()


def test_sub_millisecond_cycles_and_graph_verifies_count():
    v = stats.evaluate(2.0, 0.4, 0.5, verify_no_graph=0.5, verify_graph_ms=0.25)
    assert v.cycle_ms == 0.5 and v.speedup == pytest.approx(1.6)
    assert v.whatif_verify_ms == 0.25 and v.whatif_speedup == pytest.approx(3.2)


def test_describe_percentiles_are_the_right_ranks():
    d = stats.describe([float(x) for x in range(1, 102)])  # 1 .. 101
    assert (d["p50_ms"], d["p90_ms"], d["p99_ms"], d["max_ms"]) == (51.0, 91.0, 100.0, 101.0)


def test_several_unmatched_buckets_are_listed_in_size_order():
    tr = spec_run()
    tr.spec(20, 2.0, 10.0, 1.0, 2.0, 2.0)
    tr.spec(3, 2.0, 10.0, 1.0, 2.0, 2.0)
    out = analyse(tr.aggregate(), baseline_run().aggregate())
    assert out["notes"] == ["no decode steps at batch size 3-4, 17-32: the overall decode mean stands in for them"]


def test_without_step_spans_every_part_is_weighted_and_only_verify_buckets_count():
    tr = spec_run(with_steps=False)
    tr.decode(20, 5.0, 0.0, graph=False)  # the run's own eager decode, in a bucket no verify has
    agg = tr.aggregate()
    cyc = spec_cycle(agg)
    assert sorted(cyc["buckets"]) == ["1", "5-8"]
    assert cyc["draft_extend_ms"] == pytest.approx(1.25) and cyc["draft_ms"] == pytest.approx(2.5)
    assert cyc["verify_no_graph"] == 0.0  # an eager decode is not an eager verify
    assert cyc["settings"] == {"algorithm": "EAGLE3", "num_steps": 3}
    ref = decode_reference(agg)
    assert (ref["graph"], ref["from_steps"], ref["warmup_calls"]) == (False, False, 0)
    bare = Trace(with_steps=False)
    bare.step(1, [("verify", 10.0, True, 2.0)])  # no draft / draft_extend spans at all
    cyc = spec_cycle(bare.aggregate())
    assert (cyc["draft_ms"], cyc["draft_extend_ms"], cyc["verify_ms"]) == (0.0, 0.0, 10.0)


def test_buckets_without_accept_lengths_have_no_tau_and_rows_sort_by_size():
    tr = Trace()
    for _ in range(2):
        tr.spec(20, 2.0, 30.0, 1.0, 1.0, 3.0)
        tr.spec(3, 2.0, 10.0, 1.0, 1.0, None)
    base = Trace()
    base.decode(3, 5.0, 1.0)
    base.decode(20, 8.0, 2.0)
    out = analyse(tr.aggregate(), base.aggregate())
    cyc = out["cycle"]
    assert cyc["buckets"]["3-4"]["tau"] is None and cyc["buckets"]["17-32"]["tau"] == 3.0
    assert [r["bs"] for r in out["by_bucket"]] == ["17-32"]  # no τ, no per-bucket verdict
    tr.spec(3, 2.0, 10.0, 1.0, 1.0, 2.0)
    out = analyse(tr.aggregate(), base.aggregate())
    assert [r["bs"] for r in out["by_bucket"]] == ["3-4", "17-32"]


def test_verify_warmup_is_not_counted_as_decode_warmup():
    tr = Trace()
    tr.spec(1, 2.0, 500.0, 1.0, 0.0, 2.0)  # the first verify of its shape: compile time
    for _ in range(4):
        tr.spec(1, 2.0, 10.0, 1.0, 0.0, 2.0)
    for _ in range(3):
        tr.decode(1, 5.0, 0.0)
    out = analyse(tr.aggregate())
    assert out["decode"]["warmup_calls"] == 0 and out["cycle"]["n_verify"] == 4


def test_a_zero_decode_time_gives_no_verdict():
    base = Trace()
    base.decode(1, 0.0, 0.0)
    out = analyse(spec_run().aggregate(), base.aggregate())
    assert out["verdict"] is None and out["decode_matched_ms"] == 0.0
