"""The soak (``benchmarks/soak.py``): its pass criteria on recorded samples here; the run itself
takes the minutes it is given, so it runs only when asked:

    SGL_PROBE_SOAK_MINUTES=20 pytest tests/test_soak.py      # or: python3 benchmarks/soak.py --minutes 20
"""

from __future__ import annotations

import collections
import importlib.util
import os
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("soak", Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py")
soak = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(soak)


def samples(rss_mb: list[float], fds: list[int] | None = None, threads: list[int] | None = None,
            every_s: float = 20) -> list[dict]:
    out = []
    for i, mb in enumerate(rss_mb):
        p = {"pid": 7, "cmd": "sglang::scheduler_TP0", "role": "scheduler", "rss_kb": int(mb * 1024),
             "fds": (fds or [80] * len(rss_mb))[i], "threads": (threads or [40] * len(rss_mb))[i]}
        out.append({"t": i * every_s, "procs": [p, dict(p, pid=8, role="detokenizer", rss_kb=10 ** 9)]})
    return out


def check(s: list[dict]) -> dict:
    return soak.analyse(s, warmup_s=60, rss_bound_mb=5, fd_slack=2, thread_slack=2)


def test_flat_run_passes_and_warmup_is_left_out():
    flat = [600, 640, 680] + [690.0 + 0.1 * (i % 3) for i in range(20)]  # grows only during warm-up
    out = check(samples(flat))
    assert out["ok"] and [p["pid"] for p in out["processes"]] == [7]  # the detokenizer is not watched
    assert abs(out["processes"][0]["rss_mb_growth"]) < 0.5


@pytest.mark.parametrize("what,kwargs", [
    ("rss", {"rss_mb": [690.0 + 0.5 * i for i in range(23)]}),          # ~10 MB over the run
    ("fds", {"rss_mb": [690.0] * 23, "fds": [80 + i for i in range(23)]}),
    ("threads", {"rss_mb": [690.0] * 23, "threads": [40 + i // 4 for i in range(23)]}),
])
def test_a_leak_fails(what, kwargs):
    out = check(samples(**kwargs))
    assert not out["ok"], (what, out)


def test_too_few_samples_after_warmup_fails():
    assert not check(samples([690.0] * 6))["ok"]


def test_every_pass_sglang_counted_must_arrive():
    metrics = ('sglang:cuda_graph_passes_total{mode="decode_none",tp_rank="0"} 120.0\n'
               'sglang:cuda_graph_passes_total{mode="prefill_none",tp_rank="0"} 12.0\n')
    passes = soak.sglang_passes(metrics)
    counts = collections.Counter({(0, "sglang.decode", False): 120, (0, "sglang.extend", False): 12})
    assert soak.exported_vs_counted(counts, passes)["ok"]
    counts[(0, "sglang.decode", False)] -= 1
    assert not soak.exported_vs_counted(counts, passes)["ok"]


@pytest.mark.sglang
@pytest.mark.skipif(not os.environ.get("SGL_PROBE_SOAK_MINUTES"), reason="set SGL_PROBE_SOAK_MINUTES to run the soak")
def test_soak(tmp_path):
    assert soak.main(["--minutes", os.environ["SGL_PROBE_SOAK_MINUTES"], "--json", str(tmp_path / "soak.json")]) == 0


def test_spans_are_counted_as_they_arrive_and_forgotten():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider

    from sgl_probe.testing.receiver import OTLPReceiver

    tracer = TracerProvider().get_tracer("t")
    spans = []
    for name in ("sglang.decode", "sglang.decode", "sglang.extend"):
        s = tracer.start_span(name, attributes={"sglang.tp_rank": 0, "sglang.cuda_graph": False})
        s.end()
        spans.append(s)
    counts: collections.Counter = collections.Counter()
    with OTLPReceiver() as receiver:
        OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True).export(spans)
        soak.tally(receiver, counts)
        assert receiver.spans() == [] and receiver.raw_payloads() == []
    assert counts == {(0, "sglang.decode", False): 2, (0, "sglang.extend", False): 1}
