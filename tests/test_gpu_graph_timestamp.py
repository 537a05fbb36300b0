"""The self-timing graph experiment's analysis (benchmarks/gpu_graph_timestamp.py), without a GPU:
the ring's intervals against the events', the ring's order, and the script's answer off a GPU."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import gpu_graph_timestamp as gts  # noqa: E402


def test_intervals_that_agree_read_one_and_the_differences_are_the_events_errors():
    ring = [1_000_000 + i * 1_500_000 for i in range(6)]  # 1.5 ms apart
    events = [1.5, 1.5, 1.5, 1.501, 1.499]
    got = gts.interval_agreement(ring, events)
    assert got["intervals"] == 5 and got["median_interval_us"] == pytest.approx(1500.0)
    assert got["ring_over_event_median"] == pytest.approx(1.0)
    assert got["abs_diff_us_p50"] == pytest.approx(0.0) and got["abs_diff_us_max"] == pytest.approx(1.0)


def test_a_ring_that_runs_slow_reads_below_one():
    ring = [i * 900_000 for i in range(5)]  # 0.9 ms between ends by the ring, 1 ms by the events
    got = gts.interval_agreement(ring, [1.0] * 4)
    assert got["ring_over_event_median"] == pytest.approx(0.9) and got["abs_diff_us_p50"] == pytest.approx(100.0)
    with pytest.raises(ValueError):
        gts.interval_agreement(ring, [1.0] * 5)


def test_the_ring_is_in_order_only_when_every_slot_was_written_and_none_went_back():
    mask = 7
    ring = [0] * 8
    for i, t in enumerate([10, 20, 30, 40, 50]):
        ring[(6 + i) & mask] = t  # wraps past the end
    assert gts.ring_in_order(ring, 6, 5, mask) == {"slots": 5, "unwritten": 0, "backwards": 0, "ok": True}
    assert gts.ring_in_order(ring, 6, 6, mask)["unwritten"] == 1
    ring[(6 + 3) & mask] = 5
    got = gts.ring_in_order(ring, 6, 5, mask)
    assert got["backwards"] == 1 and not got["ok"]


def test_off_a_gpu_it_says_it_skipped(tmp_path, capsys):
    assert gts.main(["--replays", "10", "--out", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"skipped"}
    assert json.loads((tmp_path / "gpu_graph_timestamp.json").read_text()) == out
