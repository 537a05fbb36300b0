"""The first drop of each cause is said once, with the settings that change it (sgl_probe.drop_hints)."""

from __future__ import annotations

from sgl_probe import contract as C
from sgl_probe.drop_hints import HINTS, DropHints


def test_each_cause_is_said_once_when_its_count_first_moves():
    hints = DropHints(max_pending=3, drain_s=2.5)
    assert hints.new_lines({"pending": 0, "link": 0, "otlp": 0, "trace_dir": 0}) == []
    first = hints.new_lines({"pending": 4, "link": 0, "otlp": 0})
    assert len(first) == 1
    assert f"{C.ENV_MAX_PENDING}=3 steps" in first[0] and f"{C.ENV_DRAIN_S}=2.5 s" in first[0]
    assert "pending=" in first[0]
    assert hints.new_lines({"pending": 900, "link": 0, "otlp": 0}) == []  # counted, not said again
    later = hints.new_lines({"pending": 901, "link": 7, "otlp": 2, "trace_dir": 0})
    # (link= is said by the exporter process's sink, beside its other lines)
    assert [ln.split(" (")[0] for ln in later] == ["sgl-probe: spans not delivered over OTLP"]
    assert hints.new_lines({"pending": 901, "link": 8, "otlp": 3, "trace_dir": 1})[0].startswith(
        "sgl-probe: spans not written to the trace dir")
    assert hints.new_lines({"pending": 1000, "link": 9, "otlp": 9, "trace_dir": 9, "later_cause": 1}) == []


def test_every_cause_the_summary_line_counts_has_a_line_naming_its_counter_and_settings():
    hints = DropHints(max_pending=8192, drain_s=1.0)
    for cause in ("pending", "otlp", "trace_dir"):
        (line,) = DropHints(8192, 1.0).new_lines({cause: 1})
        assert f"{cause}= on the summary line" in line and line.endswith("Said once.")
    for cause in ("otlp", "trace_dir"):  # a full queue: the queue's size or the pass's length
        (line,) = hints.new_lines({cause: 1})
        assert "OTEL_BSP_MAX_QUEUE_SIZE" in line and f"{C.ENV_DRAIN_S}=1 s" in line
    assert set(HINTS) == {"pending", "otlp", "trace_dir"}
