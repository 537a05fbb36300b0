"""Faults that come and go, on one real SGLang 0.5.23 CPU server with the probe from its wheel.

One launch, phases in order (each one's facts are checked by its own test below):

1. healthy: the prompts, answered; spans reach a real OTLP/gRPC receiver and the trace dir;
2. collector killed: the receiver is stopped; the same prompts; the receiver is started again on
   the same port; the same prompts once more. Token ids must equal phase 1's, export must resume,
   and every span the probe wrote to its trace file but the receiver never got must be counted in
   the summary line's ``dropped=`` (as ``otlp=`` in its breakdown) and in
   ``sgl_probe_dropped_total`` on SGLang's ``/metrics``: no more, no fewer, and no span the trace
   file lacks;
3. trace dir broken mid-run: full (ENOSPC), then read-only (EROFS), each then repaired. Where this
   test may mount, the trace dir is a tiny tmpfs that is filled and remounted read-only; elsewhere
   (no root) the directory and its files are made read-only with chmod. Each episode costs one log
   line, the server's answers are unchanged and OTLP export carries on; no half-written line is
   left in the file;
4. slow collector: a receiver that answers each export after 1.5 s. Step times stay those of
   phase 1 (a blocked step would take the 1.5 s), memory stays bounded, and the spans that did
   not fit the bounded queue are counted exactly, per output (on a busy machine the trace dir's
   queue may overflow in the same bursts: its count must then explain what the file lacks).

The server also carries planted secrets: in allow-listed variables' values (a URL with
``user:password@``, ``hf_`` / ``sk-`` / ``ghp_`` tokens, a JWT) and in its arguments
(``--api-key``, ``--admin-api-key``, a URL with a password). None may reach a receiver, a trace
file or a probe log line; the redacted forms must.

The whole file costs one server launch (about a minute on an idle 2-core machine) plus ~60 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from sgl_probe.testing.receiver import OTLPReceiver
from tests.harness.model import ensure_tiny_model
from tests.harness.server import SGLangServer, output_ids
from tests.harness.venv import ensure_venv
from tests.harness.wheel import build_wheel, install_wheel

pytestmark = pytest.mark.sglang

VERSION = "0.5.23"
PROMPTS = ["hello world the quick", "once upon a time there", "brown fox jumps over lazy"]
NEW_TOKENS = 8
SLOW_S = 1.5
ARGS = ("--disable-radix-cache", "--dtype", "float32", "--enable-metrics")
# Small bounded queues and a short exporter timeout keep each phase to seconds. A drain pass every
# 0.2 s keeps each burst of spans under the 64-span queues, so a fast output (the trace dir) keeps
# up while a slow one (the lagging collector) drops: what the slow-collector check tells apart.
ENV = {"SGL_PROBE": "1", "SGL_PROBE_SUMMARY_S": "1", "SGL_PROBE_DRAIN_S": "0.2", "OTEL_BSP_SCHEDULE_DELAY": "200",
       "OTEL_BSP_MAX_QUEUE_SIZE": "64", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16",
       "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3", "SGL_PROBE_RUN_ID": None}
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJQTEFOVEVEIn0.PLANTEDJWTSIGNATURE1"
SECRET_ENV = {
    "MY_STORE_URL": "https://store-user:PLANTEDURLPASS@store.example.com/bucket",
    "MY_NOTE": "hf_PLANTEDHF0001abc",
    "MY_HEADER": "Bearer " + JWT,
    "MY_GH": "ghp_PLANTEDGITHUB00000000000001",
    "MY_OPENAI": "sk-PLANTEDOPENAI000000001",
    "SGL_PROBE_ENV_ALLOW": "MY_STORE_URL,MY_NOTE,MY_HEADER,MY_GH,MY_OPENAI",
}
API_KEY = "sk-PLANTEDAPIKEY00000001"
SECRET_ARGS = ("--api-key", API_KEY, "--admin-api-key", "PLANTEDADMINKEY0001",
               "--otlp-traces-endpoint", "https://tr:PLANTEDOTLPPASS@collector.example:4317")
SECRETS = ("PLANTEDURLPASS", "PLANTEDHF0001abc", "PLANTEDJWTSIGNATURE1", "eyJzdWIiOiJQTEFOVEVEIn0",
           "PLANTEDGITHUB", "PLANTEDOPENAI", "PLANTEDAPIKEY", "PLANTEDADMINKEY", "PLANTEDOTLPPASS")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DROPPED = re.compile(r"\| dropped=(\d+)(?: \(([^)]*)\))?")


class SlowReceiver(OTLPReceiver):
    """A real OTLP/gRPC receiver that answers each export after ``SLOW_S`` seconds."""

    def _export(self, raw: bytes, context: Any) -> Any:
        time.sleep(SLOW_S)
        return super()._export(raw, context)


# -- the trace dir's file system -------------------------------------------------------------------

class TraceFs:
    """The trace dir, broken and repaired in the most real way this machine allows.

    With root and mount: a 4 MB tmpfs of its own, filled to ENOSPC, then remounted read-only
    (EROFS). Root without mount: each trace file swapped for a link to /dev/full (ENOSPC from
    the kernel). Otherwise: the directory and its files made read-only with chmod (EACCES).
    """

    def __init__(self, path: Path, mount: bool = True) -> None:
        self.path = path
        path.mkdir(parents=True)
        root = os.geteuid() == 0
        self.mounted = mount and root and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "sgl-probe-test", str(path)],
            capture_output=True).returncode == 0
        self.kinds = ("ENOSPC", "EROFS") if self.mounted else ("ENOSPC",) if root else ("EACCES",)
        self._aside: list[tuple[Path, Path]] = []

    def break_(self, kind: str) -> None:
        if kind == "EROFS":
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)
        elif kind == "EACCES":
            for p in [*self.path.iterdir(), self.path]:
                p.chmod(0o555 if p.is_dir() else 0o444)
        elif self.mounted:
            with contextlib.suppress(OSError), open(self.path / "filler", "wb", buffering=0) as fh:
                while True:
                    fh.write(b"\0" * 65536)
        else:
            for p in self.path.glob("*.jsonl"):
                aside = p.with_suffix(".aside")
                p.rename(aside)
                p.symlink_to("/dev/full")
                self._aside.append((p, aside))

    def repair(self, kind: str) -> None:
        if kind == "EROFS":
            subprocess.run(["mount", "-o", "remount,rw", str(self.path)], check=True)
        elif kind == "EACCES":
            for p in [self.path, *self.path.iterdir()]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        elif self.mounted:
            (self.path / "filler").unlink()
        else:
            for p, aside in self._aside:
                p.unlink()
                aside.rename(p)
            self._aside = []

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def trace_file_spans(trace_dir: Path) -> tuple[list[dict], list[str]]:
    """(spans, bad lines) of every trace file: span_id, name, start_ns and flat attributes."""
    spans, bad = [], []
    for path in sorted(trace_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                bad.append(line[:200])
                continue
            for rs in doc.get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for sp in ss.get("spans", ()):
                        attrs = {a["key"]: next(iter(a["value"].values()), None) for a in sp.get("attributes", ())}
                        spans.append({"span_id": sp["spanId"], "name": sp["name"],
                                      "start_ns": int(sp["startTimeUnixNano"]), "attributes": attrs})
    return spans, bad


def generate(server: SGLangServer, text: str, new_tokens: int = NEW_TOKENS) -> list[int]:
    """Greedy /generate with the planted API key (the harness client sends none)."""
    body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                         "ignore_eos": True}}).encode()
    req = urllib.request.Request(server.base_url + "/generate", data=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + API_KEY})
    with _OPENER.open(req, timeout=120) as r:
        return output_ids(json.loads(r.read()))


def generate_many(server: SGLangServer, texts: list[str]) -> list[list[int]]:
    with ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(lambda t: generate(server, t), texts))


# -- the run ---------------------------------------------------------------------------------------

@dataclass
class Phase:
    outputs: list = field(default_factory=list)
    t0: int = 0
    t1: int = 0
    received_spans: int = 0  # of this phase's steps, at the receiver
    log_lines: list = field(default_factory=list)  # probe lines logged during the phase


@dataclass
class FaultRun:
    phases: dict = field(default_factory=dict)
    received: list = field(default_factory=list)  # every span, from every receiver, in order
    trace: list = field(default_factory=list)
    bad_lines: list = field(default_factory=list)
    # the summary line's drop breakdown ({"otlp": n, "trace_dir": n, "link": n}) at these points
    dropped_after_outage: dict | None = None
    dropped_metric_after_outage: float | None = None
    dropped_before_slow: dict | None = None
    dropped_after_slow: dict | None = None
    rss_before_slow: dict = field(default_factory=dict)
    rss_after_slow: dict = field(default_factory=dict)
    fs_kinds: tuple = ()
    log: str = ""
    payloads: list = field(default_factory=list)  # raw OTLP requests, as received
    trace_text: str = ""


def _last_dropped(log: str) -> dict | None:
    """The newest summary line's drops by where they happened, with ``total`` (``dropped=``);
    all zero when that line has none; None: no line."""
    out = None
    for line in log.splitlines():
        if "sgl-probe summary" in line:
            m = DROPPED.search(line)
            out = {"total": 0, "otlp": 0, "trace_dir": 0, "link": 0, "pending": 0}
            if m:
                out["total"] = int(m.group(1))
                for part in (m.group(2) or "").split():
                    key, _, n = part.partition("=")
                    out[key] = int(n)
                assert sum(v for k, v in out.items() if k != "total") == out["total"], line
    return out


def _probe_lines(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if "sgl-probe" in ln and "sgl-probe summary" not in ln]


def _rss_kb(pgid: int) -> dict[int, int]:
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
            if int(stat[2]) != pgid or stat[0] == "Z":
                continue
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        m = re.search(r"VmRSS:\s+(\d+)", status)
        if m:
            out[int(entry.name)] = int(m.group(1))
    return out


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory) -> FaultRun:
    venv = ensure_venv(VERSION)
    install_wheel(venv, build_wheel(tmp_path_factory.mktemp("wheel")))
    model = ensure_tiny_model(venv)
    tmp = tmp_path_factory.mktemp("faults")
    fs = TraceFs(tmp / "traces")
    run = FaultRun(fs_kinds=fs.kinds)
    receiver = OTLPReceiver().start()
    port = receiver.grpc_port
    receivers = [receiver]
    env = {**ENV, **SECRET_ENV, **receiver.env("grpc"), "SGL_PROBE_TRACE_DIR": str(fs.path)}
    server = SGLangServer(venv, model, env=env, extra_args=ARGS + SECRET_ARGS)  # log kept in the harness dir
    try:
        server.start()

        def phase(name: str, between: Callable[[], None] | None = None, log_from: int | None = None) -> Phase:
            """``log_from``: the phase's log lines start at that line (default: the phase's start)."""
            ph = Phase(t0=time.time_ns())
            n_log = len(server.log_text().splitlines()) if log_from is None else log_from
            ph.outputs = [generate(server, t) for t in PROMPTS]
            if between is not None:
                between()
            ph.t1 = time.time_ns()
            ph.log_lines = _probe_lines("\n".join(server.log_text().splitlines()[n_log:]))
            run.phases[name] = ph
            return ph

        def arrived(ph: Phase, rcv: OTLPReceiver, timeout: float) -> None:
            def some(spans: list) -> bool:
                return any(s.name == "sglang.decode" and ph.t0 <= s.start_ns <= ph.t1 for s in spans)
            with contextlib.suppress(TimeoutError):
                rcv.wait_for(some, timeout=timeout)
            ph.received_spans = sum(1 for s in rcv.spans() if ph.t0 <= s.start_ns <= ph.t1)

        def trace_size() -> int:
            return sum(p.stat().st_size for p in fs.path.glob("*.jsonl") if not p.is_symlink())

        def settle(quiet_s: float, timeout: float = 60) -> None:
            """Until neither the receiver nor the trace files grew for ``quiet_s``."""
            deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
            while time.monotonic() < deadline:
                now = (len(receivers[-1].spans()), sum(p.stat().st_size for p in fs.path.glob("*.jsonl")))
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since >= quiet_s:
                    return
                time.sleep(0.25)

        def summary_now() -> dict | None:
            """``dropped=`` of a summary line written after one more step (1 s windows)."""
            n = len(server.log_text().splitlines())
            generate(server, PROMPTS[0], 2)
            log = server.wait_for_log(lambda text: _last_dropped("\n".join(text.splitlines()[n:])) is not None)
            return _last_dropped("\n".join(log.splitlines()[n:]))

        # 1. healthy
        arrived(phase("healthy"), receiver, 30)
        # 2. collector killed, then back on the same port
        receiver.stop()
        phase("collector_down", between=lambda: time.sleep(8))  # exports fail (3 s timeout) meanwhile
        receiver = OTLPReceiver(grpc_port=port).start()
        receivers.append(receiver)
        arrived(phase("collector_back"), receiver, 60)
        settle(quiet_s=3)
        run.dropped_after_outage = summary_now()
        settle(quiet_s=2)
        with contextlib.suppress(Exception):
            for line in server.request_text("/metrics").splitlines():
                if line.startswith("sgl_probe_dropped_total"):
                    run.dropped_metric_after_outage = (run.dropped_metric_after_outage or 0) + float(line.split()[-1])
        # 3. the trace dir's file system breaks and is repaired, one kind after the other
        for kind in fs.kinds:
            fs.break_(kind)
            n_log_broken = len(server.log_text().splitlines())

            def refused(n_log0: int = n_log_broken) -> None:
                """Until the exporter tried to write this phase's spans and logged why it could
                not (its batches leave every few seconds; a busy machine delays them)."""
                # A second line, were there one, would land in this phase too (settle_s).
                server.wait_for_log(lambda text: "cannot write" in "\n".join(text.splitlines()[n_log0:]),
                                    settle_s=1)

            ph = phase("trace_" + kind, between=refused)
            arrived(ph, receiver, 30)
            fs.repair(kind)
            size0 = trace_size()
            n_log0 = len(server.log_text().splitlines())

            def written_again(size0: int = size0, n_log_broken: int = n_log_broken) -> None:
                """Until the exporter wrote this phase's spans (its batches leave every few
                seconds), so the next fault does not hit them in flight. Its "again" line may
                have come before the repair: a full file system still takes a short batch into
                the file's last page, which is writing again (the test below allows that for
                ENOSPC alone)."""
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    new_log = server.log_text().splitlines()[n_log_broken:]
                    # (The failure's own line ends "until it can be written again".)
                    if trace_size() > size0 and any("again" in ln and "cannot write" not in ln for ln in new_log):
                        return
                    time.sleep(0.25)

            # Its log from the repair on: the exporter may write the broken phase's last spans (and
            # say "again") before this phase's first request, which written_again counts too.
            arrived(phase("trace_repaired_" + kind, between=written_again, log_from=n_log0), receiver, 30)
        settle(quiet_s=3)
        # 4. slow collector
        run.dropped_before_slow = summary_now()
        settle(quiet_s=2)
        receiver.stop()
        receiver = SlowReceiver(grpc_port=port).start()
        receivers.append(receiver)
        run.rss_before_slow = _rss_kb(server.proc.pid)
        slow = phase("slow_collector")
        for _ in range(2):
            slow.outputs += generate_many(server, PROMPTS)
        # More spans than the 64-span queue and the lagging receiver take between them, whatever
        # the scheduler's batching made of the requests above (64 spans in one CI run, > 64 in
        # others): longer requests, not compared, each one step per token.
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            list(pool.map(lambda t: generate(server, t, 32), PROMPTS * 2))
        slow.t1 = time.time_ns()
        run.rss_after_slow = _rss_kb(server.proc.pid)
        settle(quiet_s=2 * SLOW_S + 1, timeout=120)
        run.dropped_after_slow = summary_now()
        settle(quiet_s=2 * SLOW_S + 1, timeout=60)
        run.log = server.log_text()
    finally:
        server.stop()
        for r in receivers:
            run.received += r.spans()
            run.payloads += r.raw_payloads()
            r.stop()
        run.trace, run.bad_lines = trace_file_spans(fs.path)
        run.trace_text = "".join(p.read_text(errors="replace") for p in fs.path.glob("*.jsonl"))
        fs.close()
    return run


# -- the checks ------------------------------------------------------------------------------------

def _in(spans: list, ph: Phase, get: Callable[[Any], int]) -> list:
    return [s for s in spans if ph.t0 <= get(s) <= ph.t1]


def test_token_output_unchanged_through_every_fault(fault_run: FaultRun):
    ref = fault_run.phases["healthy"].outputs
    assert len(ref) == len(PROMPTS) and all(len(ids) == NEW_TOKENS for ids in ref)
    for name, ph in fault_run.phases.items():
        # Sequential requests: batched ones may differ in float rounding on their own.
        assert ph.outputs[:len(PROMPTS)] == ref, name
        assert all(len(ids) == NEW_TOKENS for ids in ph.outputs), name


def test_export_resumes_after_the_collector_restarts(fault_run: FaultRun):
    ph = fault_run.phases
    assert ph["healthy"].received_spans > 0
    assert ph["collector_back"].received_spans > 0, "no span of the steps after the restart arrived"


def test_spans_lost_in_the_outage_are_counted_none_invented(fault_run: FaultRun):
    received_ids = [s.span_id for s in fault_run.received]
    trace_ids = {s["span_id"] for s in fault_run.trace}
    assert len(received_ids) == len(set(received_ids)), "a span arrived twice"
    outage_end = fault_run.phases["collector_back"].t1
    received_then = {s.span_id for s in fault_run.received if s.start_ns <= outage_end}
    written_then = {s["span_id"] for s in fault_run.trace if s["start_ns"] <= outage_end}
    by = fault_run.dropped_after_outage
    # The trace dir's queue is as small as OTLP's here (OTEL_BSP_MAX_QUEUE_SIZE=64 holds for both)
    # and can overflow in a burst on a busy machine: a span it dropped may still have arrived.
    assert len(received_then - trace_ids) <= by["trace_dir"], \
        "the receiver got spans the probe never made (invented)"
    lost = written_then - received_then
    down = fault_run.phases["collector_down"]
    assert any(down.t0 <= s["start_ns"] <= down.t1 for s in fault_run.trace if s["span_id"] in lost), \
        "the outage lost nothing: the collector was not really down"
    assert by["link"] == 0 and by["pending"] == 0, by
    # Each output's count is exactly what it did not deliver of the same spans.
    assert len(received_then) + by["otlp"] == len(written_then) + by["trace_dir"], (
        f"summary line says {by}; {len(written_then)} spans in the trace file, {len(received_then)} received")
    assert by["otlp"] >= len(lost), by
    # SGLang's /metrics (--enable-metrics), where the probe adds its series
    assert fault_run.dropped_metric_after_outage == by["total"]


def test_collector_outage_logs_no_flood(fault_run: FaultRun):
    # OpenTelemetry's own retry / failure lines come through the exporter process's log, thinned
    lines = fault_run.phases["collector_down"].log_lines + fault_run.phases["collector_back"].log_lines
    assert len(lines) <= 6, "\n".join(lines)
    assert sum("Failed to export" in ln for ln in lines) == 1, "\n".join(lines)
    bare = [ln for ln in fault_run.log.splitlines() if ln.startswith(("Failed to export", "Transient error"))]
    assert bare == [], bare[:3]


def test_broken_trace_dir_costs_one_log_line_each_time(fault_run: FaultRun):
    for kind in fault_run.fs_kinds:
        broken = fault_run.phases["trace_" + kind].log_lines
        about_file = [ln for ln in broken if "cannot write" in ln]
        assert len(about_file) == 1, (kind, broken)
        assert {"ENOSPC": "No space left", "EROFS": "Read-only file system",
                "EACCES": "Permission denied"}[kind] in about_file[0]
        repaired = fault_run.phases["trace_repaired_" + kind].log_lines
        assert [ln for ln in repaired if "cannot write" in ln] == [], repaired
        # Once writing works again, one line says so. On a full file system a short batch may
        # still fit the file's last page before the repair: the line then comes in the broken
        # phase, after the one about the failure, and not again after the repair.
        after_failure = broken[broken.index(about_file[0]) + 1:] if kind == "ENOSPC" else []
        again = [ln for ln in after_failure + repaired if "again" in ln]
        assert len(again) == 1, (kind, broken, repaired)


def test_otlp_export_unaffected_by_the_trace_dir(fault_run: FaultRun):
    for kind in fault_run.fs_kinds:
        ph = fault_run.phases["trace_" + kind]
        assert ph.received_spans > 0, kind
        if kind != "ENOSPC":  # on a full file system a short batch may still fit the file's last page
            assert _in(fault_run.trace, ph, lambda s: s["start_ns"]) == [], f"{kind}: the file was written anyway"
        after = fault_run.phases["trace_repaired_" + kind]
        assert _in(fault_run.trace, after, lambda s: s["start_ns"]), f"trace file not written again after {kind}"


def test_trace_file_holds_only_whole_lines(fault_run: FaultRun):
    assert fault_run.bad_lines == [], fault_run.bad_lines[:3]


def test_slow_collector_does_not_slow_steps(fault_run: FaultRun):
    """A step that waited on the collector would take the receiver's 1.5 s; noise here is far
    below that (the side-by-side overhead is measured by benchmarks/, not here)."""
    def decode_ms(ph: Phase) -> list[float]:
        return [s["attributes"]["sgl_probe.duration_ms"] for s in _in(fault_run.trace, ph, lambda s: s["start_ns"])
                if s["name"] == "sglang.decode"]

    healthy, slow = decode_ms(fault_run.phases["healthy"]), decode_ms(fault_run.phases["slow_collector"])
    assert healthy and slow
    assert statistics.median(slow) < 2 * statistics.median(healthy) + 5, (statistics.median(healthy),
                                                                          statistics.median(slow))
    assert max(slow) < SLOW_S * 1000 / 2


def test_slow_collector_memory_bounded_and_drops_counted(fault_run: FaultRun):
    run = fault_run
    growth_mb = {pid: (run.rss_after_slow.get(pid, kb) - kb) / 1024 for pid, kb in run.rss_before_slow.items()}
    assert growth_mb and max(growth_mb.values()) < 20, growth_mb
    slow = run.phases["slow_collector"]
    written = {s["span_id"] for s in _in(run.trace, slow, lambda s: s["start_ns"])}
    got = {s.span_id for s in _in(run.received, slow, lambda s: s.start_ns)}
    delta = {k: run.dropped_after_slow[k] - run.dropped_before_slow[k] for k in run.dropped_before_slow}
    facts = (run.dropped_before_slow, run.dropped_after_slow, len(written), len(got), len(written - got),
             len(got - written))
    assert len(written | got) > 64, "the load did not exceed the 64-span queue"
    assert delta["link"] == 0 and delta["pending"] == 0, facts
    # Each output's count is exactly what it did not deliver of the same spans (those the server
    # made in the phase): received + dropped by OTLP == written + dropped by the trace dir.
    assert len(got) + delta["otlp"] == len(written) + delta["trace_dir"], facts
    # What one output has and the other lacks is the other's drop; beyond that, a span both lost
    # counts once in each.
    assert delta["otlp"] >= len(written - got) > 0, facts
    assert delta["trace_dir"] >= len(got - written), facts


def test_no_planted_secret_leaves_the_process(fault_run: FaultRun):
    probe_log = "\n".join(ln for ln in fault_run.log.splitlines() if "sgl-probe" in ln or "sgl_probe" in ln)
    assert fault_run.payloads and fault_run.trace_text
    for secret in SECRETS:
        where = [name for name, blob in (("OTLP", b"".join(fault_run.payloads)),
                                         ("trace file", fault_run.trace_text.encode()),
                                         ("probe log", probe_log.encode())) if secret.encode() in blob]
        assert not where, f"{secret} reached {where}"


def test_secrets_in_values_are_redacted_not_dropped(fault_run: FaultRun):
    attrs: dict = {}
    for s in fault_run.received:
        for key, value in s.attributes.items():
            attrs.setdefault(key, value)
    assert attrs.get("env.MY_STORE_URL") == "https://store-user:<redacted>@store.example.com/bucket", attrs.keys()
    assert attrs.get("env.MY_HEADER") == "Bearer <redacted>"
    for name in ("MY_NOTE", "MY_GH", "MY_OPENAI"):
        assert attrs.get("env." + name) == "<redacted>", name
    args = list(attrs.get("fingerprint.server_args") or [])
    assert args, "no fingerprint span with the server arguments"
    for flag in ("--api-key", "--admin-api-key"):
        assert args[args.index(flag) + 1] == "<redacted>", args
    assert "https://tr:<redacted>@collector.example:4317" in args
    assert attrs.get("fingerprint.launcher_env.MY_STORE_URL", "").endswith(":<redacted>@store.example.com/bucket")
