"""The demo's env check (tests/harness/demo.py) says "ok" only when it should, on span dicts shaped
like the OTLP/JSON lines the probe writes (decoded by demo.read_trace_dir)."""

from __future__ import annotations

import json

from tests.harness import demo


def snapshot_line(point: str, env: dict, rank: int = 0) -> str:
    attrs = [{"key": "sgl_probe.snapshot_point", "value": {"stringValue": point}},
             {"key": "sglang.tp_rank", "value": {"intValue": str(rank)}},
             {"key": "sgl_probe.env.differs_from_launcher",
              "value": {"arrayValue": {"values": [{"stringValue": "NCCL_CUMEM_ENABLE"}]}}}]
    attrs += [{"key": f"env.{k}", "value": {"stringValue": v}} for k, v in env.items()]
    span = {"name": "sgl_probe.env_snapshot", "attributes": attrs}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})


def spans_of(tmp_path, *lines: str) -> list[dict]:
    (tmp_path / "sgl-probe-1.jsonl").write_text("\n".join(lines) + "\n")
    return demo.read_trace_dir(tmp_path)


def test_every_point_with_the_launchers_values_is_ok(tmp_path):
    spans = spans_of(tmp_path, snapshot_line("process_start", demo.LAUNCHER_ENV),
                     snapshot_line("nccl_init", demo.LAUNCHER_ENV))
    lines, ok = demo.env_check("plain", spans)
    assert ok and len(lines) == 2 and "NCCL_CUMEM_ENABLE" in lines[0]  # nccl_init sorts first


def test_a_changed_value_or_a_missing_point_is_not_ok(tmp_path):
    changed = {**demo.LAUNCHER_ENV, "NCCL_PROTO": "Simple"}
    lines, ok = demo.env_check("x", spans_of(tmp_path, snapshot_line("process_start", demo.LAUNCHER_ENV),
                                             snapshot_line("nccl_init", changed)))
    assert not ok and any("DIFFERENT" in line for line in lines)
    lines, ok = demo.env_check("x", spans_of(tmp_path, snapshot_line("process_start", demo.LAUNCHER_ENV)))
    assert not ok and "MISSING" in lines[-1] and "nccl_init" in lines[-1]
    assert demo.env_check("x", []) == (["  x      no env snapshot arrived"], False)
