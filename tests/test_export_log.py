"""The exporter process's log while the collector is down: OpenTelemetry's exporters log every
retry and every failed batch; the exporter process lets one line of each kind through per minute
and says how many it left out."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from sgl_probe import wire
from sgl_probe.export_log import RepeatFilter

ROOT = Path(__file__).resolve().parents[1]


def _record(msg: str, *args, name: str = "opentelemetry.exporter.otlp.proto.grpc.exporter",
            level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_one_line_per_kind_per_interval_then_the_count():
    now = [0.0]
    f = RepeatFilter(every_s=60, clock=lambda: now[0])
    retry = "Transient error %s encountered while exporting %s to %s, retrying in %.2fs."
    assert f.filter(_record(retry, "UNAVAILABLE", "traces", "h:1", 1.1))
    kept = []
    for i in range(1, 30):  # every 2 s for 58 s: the same kind, other details
        now[0] = 2.0 * i
        kept.append(f.filter(_record(retry, "UNAVAILABLE", "traces", "h:1", 0.8 + i / 100)))
    assert not any(kept)
    failed = "Failed to export %s to %s, error code: %s"  # another kind: its own first line
    assert f.filter(_record(failed, "traces", "h:1", "UNAVAILABLE", level=logging.ERROR))
    now[0] = 61.0
    rec = _record(retry, "UNAVAILABLE", "traces", "h:1", 0.9)
    assert f.filter(rec)
    assert rec.getMessage() == ("Transient error UNAVAILABLE encountered while exporting traces to h:1, "
                                "retrying in 0.90s. [29 more like this in the last 61 s]")
    now[0] = 62.0
    assert not f.filter(_record(retry, "UNAVAILABLE", "traces", "h:1", 0.9))
    now[0] = 200.0  # a line after a quiet spell says nothing about left-out lines: there were none
    rec = _record(retry, "UNAVAILABLE", "traces", "h:1", 0.9)
    assert f.filter(rec) and "more like this" in rec.getMessage()  # the one at 62 s
    now[0] = 400.0
    rec = _record(retry, "UNAVAILABLE", "traces", "h:1", 0.9)
    assert f.filter(rec) and "more like this" not in rec.getMessage()


def test_a_down_collector_costs_two_lines_not_two_per_batch():
    """A real exporter process exporting to a port nobody listens on, for 8 s (batches every
    100 ms, each retried for 1 s): unthinned, that is a dozen lines or more."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ours, theirs = wire.pair()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SGL_PROBE": "0",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:%d" % port,
           "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen([sys.executable, "-m", "sgl_probe.exporter_main", str(theirs.fileno()), str(os.getpid())],
                            pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    theirs.close()
    try:
        ours.setblocking(True)
        ours.send(wire.encode(wire.META, ("run", {"tp_rank": 0}, {}, None, os.getpid(), None)))
        deadline = time.monotonic() + 8
        i = 0
        while time.monotonic() < deadline:
            ours.send(wire.encode(wire.ENV, ({"i": i}, time.time_ns(), "sgl_probe.env_snapshot")))
            i += 1
            time.sleep(0.2)
        ours.send(wire.encode(wire.STOP, None))
        _, err = proc.communicate(timeout=30)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    failed = [ln for ln in lines if "Failed to export" in ln]
    retries = [ln for ln in lines if "Transient error" in ln]
    assert len(failed) == 1 and len(retries) <= 1, "\n".join(lines)
    tag = "sgl-probe pid %d exporter]" % os.getpid()
    assert all(tag in ln for ln in failed + retries), "\n".join(lines)
