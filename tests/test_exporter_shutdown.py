"""The exporter process when SGLang ends the server: SGLang's ``kill_process_tree`` sends SIGKILL
to every descendant of its launcher, the probe's exporter process included, with no warning. What
the exporter had when the server went idle must already be out by then."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_export_process import _ORPHAN_SCRIPT, _gone, _wait

ROOT = Path(__file__).resolve().parents[1]


def _decode_spans(path: Path) -> int:
    if not path.exists():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                n += sum(1 for sp in ss["spans"] if sp["name"] == "sglang.decode")
    return n


def test_an_idle_server_s_spans_are_out_before_a_sigkill_of_the_whole_tree(tmp_path):
    # The SDK's own batching would hold them for a minute: only the idle flush writes them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGL_PROBE"))}
    env.update({"SGL_PROBE_TRACE_DIR": str(tmp_path), "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "3600",
                "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    server = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT.format(root=str(ROOT))], env=env,
                              stdout=subprocess.PIPE, text=True)
    trace = tmp_path / ("sgl-probe-%d.jsonl" % server.pid)
    try:
        exporter = int(server.stdout.readline())
        assert server.stdout.readline().strip() == "received"
        assert _wait(lambda: _decode_spans(trace) == 7, 10), "the idle exporter did not flush"
        assert not _gone(exporter) and server.poll() is None  # written while both were alive
        for pid in (exporter, server.pid):  # kill_process_tree: SIGKILL, children first
            os.kill(pid, signal.SIGKILL)
        server.wait(30)
        assert _wait(lambda: _gone(exporter), 15)
    finally:
        if server.poll() is None:
            server.kill()
    assert _decode_spans(trace) == 7



@pytest.mark.parametrize("user_delay", [None, "60000"])
def test_a_busy_server_s_spans_leave_within_the_short_batch_delay(tmp_path, user_delay):
    """No idle flush: the exporter process's own 0.2 s batch delay (the SDK's is 5 s) puts the
    spans out long before a kill would find them; a delay the user set wins over it."""
    from sgl_probe import exporter_main

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SGL_PROBE"))}
    env.update({"SGL_PROBE_TRACE_DIR": str(tmp_path), "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "3600",
                "SGL_PROBE_IDLE_FLUSH_S": "3600"})
    if user_delay:
        env["OTEL_BSP_SCHEDULE_DELAY"] = user_delay
    server = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT.format(root=str(ROOT))], env=env,
                              stdout=subprocess.PIPE, text=True)
    trace = tmp_path / ("sgl-probe-%d.jsonl" % server.pid)
    try:
        int(server.stdout.readline())
        assert server.stdout.readline().strip() == "received"
        if user_delay:
            time.sleep(2.0)
            assert _decode_spans(trace) == 0  # still batched, as the user asked
        else:
            assert exporter_main.BATCH_DELAY_MS <= 500
            assert _wait(lambda: _decode_spans(trace) == 7, 2.5, 0.05)
    finally:
        server.kill()
        server.wait()


def test_the_idle_flush_never_holds_up_the_exporter_s_loop():
    """An unreachable collector makes an export retry for seconds: the idle flush runs beside
    the loop that reads the link and reports the counts, one at a time."""
    import threading

    from sgl_probe import exporter_main

    release = threading.Event()
    flushes = []

    class Sink:
        def flush(self, timeout_s):
            flushes.append(timeout_s)
            release.wait(30)

    exp = exporter_main.Exporter(sock=None)
    exp.sink, exp.unflushed = Sink(), True
    t = threading.Thread(target=exp.idle)
    t.start()
    t.join(2.0)
    try:
        assert not t.is_alive(), "idle() waited for the flush"
        assert _wait(lambda: flushes == [exporter_main.FLUSH_ON_EXIT_S], 5, 0.01)
        exp.unflushed = True
        exp.idle()  # the first flush is still running: no second one
        assert flushes == [exporter_main.FLUSH_ON_EXIT_S] and exp.unflushed
        exp.unflushed = False
        exp.idle()  # nothing new since: nothing to do
    finally:
        release.set()
    assert _wait(lambda: not exp._idle_flush.is_alive(), 5, 0.01)
    exp.unflushed = True
    exp.idle()
    assert _wait(lambda: len(flushes) == 2, 5, 0.01)
