"""`sgl-probe report` on traces the probe itself wrote: two "TP rank" processes drive the real
wrappers, recorder, span builder and trace-file exporter through tests/workload_spec.py (an
EAGLE-shaped scheduler: draft, verify without a graph, draft-extend, SGLang's accept-length sink),
into a ``SGL_PROBE_TRACE_DIR`` exactly like a server's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from sgl_probe.cli import main
from tests import workload_spec as ws

ROOT = Path(__file__).resolve().parents[1]
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory) -> str:
    return ws.cached_trace_dir(tmp_path_factory, "spec", ws.SPEC_PLAN)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return ws.cached_trace_dir(tmp_path_factory, "base", ws.BASELINE_PLAN)


def report(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["report", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def report_json(capsys, *args: str) -> dict:
    rc, out, err = report(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def file_spans(trace_dir: str) -> list[dict]:
    """The trace files read independently of the report code."""
    out = []
    for name in sorted(os.listdir(trace_dir)):
        for line in Path(trace_dir, name).read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        attrs = {}
                        for a in sp.get("attributes", ()):
                            (_k, v), = a["value"].items()
                            attrs[a["key"]] = v
                        out.append({"name": sp["name"], "trace": sp["traceId"], "attrs": attrs, "res": res,
                                    "span": sp["spanId"], "parent": sp.get("parentSpanId", "")})
    return out


def test_phase_table_from_probe_traces(spec_dir, capsys):
    rc, out, err = report(capsys, spec_dir)
    assert rc == 0 and err == ""
    first = out.splitlines()[0]
    assert "ranks tp0 tp1" in first and "76 steps" in first and "timer cpu" in first
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in ("extend", "decode", "draft", "verify", "draft_extend")}
    # 2 ranks x (2 prefills, 30 spec steps, 6 plain decode steps)
    assert rows[("verify", "no")][2] == "60" and rows[("draft", "yes")][2] == "60"
    assert rows[("draft_extend", "no")][2] == "64" and rows[("extend", "no")][2] == "4"
    assert rows[("decode", "yes")][2] == "12"
    assert "Speculative decoding (EAGLE3, 3 steps, topk 1, 4 draft tokens)" in out
    assert "=> Speculative decoding " in out


def test_json_numbers_match_the_spans(spec_dir, capsys):
    doc = report_json(capsys, spec_dir)
    spans = file_spans(spec_dir)
    durs = defaultdict(list)
    for s in spans:
        if s["name"].startswith("sglang.") and s["name"] != "sglang.step":
            durs[(s["name"][7:], s["attrs"]["sglang.cuda_graph"])].append(s["attrs"]["sgl_probe.duration_ms"])
    rows = {(r["phase"], r["cuda_graph"]): r for r in doc["phases"]}
    assert set(rows) == set(durs)
    for key, vals in durs.items():
        assert rows[key]["count"] == len(vals)
        assert rows[key]["mean_ms"] == pytest.approx(sum(vals) / len(vals), rel=1e-9)
        vals.sort()
        assert rows[key]["p50_ms"] == vals[round(0.5 * (len(vals) - 1))]
        assert rows[key]["max_ms"] == vals[-1]
    assert doc["input"]["spans"] == len(spans) and doc["input"]["env_snapshots"] == 4
    assert doc["input"]["steps"] == sum(s["name"] == "sglang.step" for s in spans) == 76
    shares = [r["share_of_step_time"] for r in doc["phases"]]
    assert all(0 < s < 1 for s in shares) and sum(shares) <= 1.0 + 1e-9
    assert doc["ranks"] == ["tp0", "tp1"] and doc["timers"] == {"cpu": sum(len(v) for v in durs.values())}
    assert doc["runs"][0]["sgl_probe_version"] == "0.1.0" and doc["runs"][0]["ranks"] == 2
    assert doc["problems"] == []


def test_spec_verdict_against_a_baseline_run(spec_dir, base_dir, capsys):
    doc = report_json(capsys, spec_dir, "--baseline", base_dir)
    spec = doc["speculative"]
    cyc, v = spec["cycle"], spec["verdict"]
    assert spec["decode_source"] == "--baseline" and spec["decode"]["graph"] is True
    assert spec["decode"]["n"] == 60  # the baseline's 2 x 30 graph decode steps
    assert cyc["tau"] == pytest.approx(3.0, abs=1e-12) and cyc["n_steps"] == 60
    assert cyc["verify_no_graph"] == 1.0 and cyc["verify_graph_ms"] is None
    assert cyc["settings"] == {"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    # One formula, evaluated on the report's own numbers:
    t_dec = spec["decode_matched_ms"] + spec["decode_matched_other_ms"]
    cycle = cyc["draft_ms"] + cyc["verify_ms"] + cyc["draft_extend_ms"] + cyc["other_ms"]
    assert v["cycle_ms"] == pytest.approx(cycle)
    assert v["speedup"] == pytest.approx(3.0 * t_dec / cycle)
    assert v["break_even"] == pytest.approx(cycle / t_dec)
    assert v["verify_max_ms"] == pytest.approx(3.0 * t_dec - (cycle - cyc["verify_ms"]))
    # The workload spins decode 0.5 ms, verify 8 ms (rank 1: 12 ms), draft 0.5, draft-extend 0.3
    # (nominal speed-up 0.15x): it loses even on a busy machine, and a verify at graph-decode
    # speed would do better.
    assert v["wins"] is False and v["speedup"] < 0.6
    assert v["whatif_source"] == "taken as one graph decode forward" and v["whatif_speedup"] > v["speedup"]
    assert v["short"].startswith("spec 0.") and "verify had no graph in 100 % of steps" in v["short"]
    assert "Speculative decoding loses" in v["sentence"]
    assert [b["bs"] for b in spec["by_bucket"]] == ["1", "2", "3-4"]
    assert all(b["tau"] == pytest.approx(3.0) for b in spec["by_bucket"])


def test_spec_verdict_from_the_runs_own_decode_steps(spec_dir, capsys):
    spec = report_json(capsys, spec_dir)["speculative"]
    assert spec["decode_source"] == "this run's own decode steps"
    assert spec["decode"]["n"] == 12 and spec["decode"]["graph"] is True
    assert spec["verdict"]["speedup"] == pytest.approx(
        3.0 * (spec["decode_matched_ms"] + spec["decode_matched_other_ms"]) / spec["verdict"]["cycle_ms"])


def test_no_decode_time_means_no_verdict_and_says_why(spec_dir):
    from sgl_probe.report import speculative
    from sgl_probe.report.aggregate import Aggregator
    from sgl_probe.report.model import Problems
    from sgl_probe.report.sources import read_sources

    agg = Aggregator()
    for span in read_sources([spec_dir], Problems()):
        if span.name != "sglang.decode":
            agg.add(span)
    spec = speculative.analyse(agg.finish())
    assert spec["verdict"] is None and spec["notes"] == [speculative.NO_BASELINE]


def test_by_rank_flags_the_straggler_same_step(spec_dir, capsys):
    rc, out, _ = report(capsys, spec_dir, "--by-rank")
    assert rc == 0
    verify = [line for line in out.splitlines() if line.startswith("verify ")]
    assert len(verify) == 2 and "tp1" in verify[1] and "<< slowest" in verify[1] and "<<" not in verify[0]
    assert re.search(r"verify\s+tp1 slowest: \+[\d.]+ ms mean", out)
    doc = report_json(capsys, spec_dir, "--by-rank")
    item = [s for s in doc["stragglers"] if s["phase"] == "verify"][0]
    assert item["slowest_rank"] == "tp1" and item["straggler"] is True
    assert item["steps_compared"] == 30 and item["slowest_share"] > 0.5
    assert 2.0 < item["slowest_excess_ms"] < 10.0  # the workload adds 4 ms to rank 1's verify
    traces = {s["trace"] for s in file_spans(spec_dir) if s["name"] == "sglang.step"}
    worst = item["worst_steps"][0]
    assert worst["trace_id"] in traces and set(worst["ms"]) == {"tp0", "tp1"}
    rows = [r for r in doc["phases_by_rank"] if r["phase"] == "verify"]
    assert [r["rank"] for r in rows if r["slowest"]] == ["tp1"]
    env = doc["env"]
    assert env["differs_across_ranks"] == {"NCCL_IB_HCA": {"tp0": "mlx5_0", "tp1": "mlx5_1"}}
    assert env["per_rank"]["tp0"]["point"] == "nccl_init" and env["per_rank"]["tp0"]["vars"]["NCCL_PROTO"] == "LL"


def test_by_batch_size_rows(spec_dir, capsys):
    rc, out, _ = report(capsys, spec_dir, "--by-bs")
    assert rc == 0
    verify = [line.split() for line in out.splitlines() if line.startswith("verify ")]
    assert [(v[2], v[3]) for v in verify] == [("1", "20"), ("2", "20"), ("3-4", "20")]


def test_parallel_reading_gives_the_same_report(spec_dir, capsys):
    """--jobs 2 cuts each rank file into byte ranges read by two worker processes."""
    from sgl_probe.report import parallel

    files = [os.path.join(spec_dir, n) for n in sorted(os.listdir(spec_dir))]
    assert any(start not in (None, 0) for _p, start, _e in parallel.plan(files, 2))
    one = report_json(capsys, spec_dir, "--by-rank", "--jobs", "1")
    two = report_json(capsys, spec_dir, "--by-rank", "--jobs", "2")

    def rounded(x):
        if isinstance(x, float):
            return round(x, 9)
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rounded(v) for v in x]
        return x

    assert rounded(one) == rounded(two)


# -- files people open without a collector ---------------------------------------------------

@pytest.fixture(scope="module")
def jaeger_file(spec_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("jaeger") / "spec.jaeger.json"
    assert main(["report", spec_dir, "--jaeger-json", str(path), "--max-traces", "0"]) == 0
    return path


TAG_TYPES = {"string": str, "bool": bool, "int64": int, "float64": float}


def test_jaeger_json_has_the_query_api_shape(jaeger_file, spec_dir):
    doc = json.loads(jaeger_file.read_text())
    assert set(doc) >= {"data"} and isinstance(doc["data"], list)
    spans = file_spans(spec_dir)
    assert sum(len(t["spans"]) for t in doc["data"]) == len(spans)
    assert len(doc["data"]) == len({s["trace"] for s in spans})
    step_traces = 0
    for trace in doc["data"]:
        assert HEX32.match(trace["traceID"])
        assert set(trace["processes"]) == {s["processID"] for s in trace["spans"]}
        for pid, proc in trace["processes"].items():
            assert re.match(r"^p\d+$", pid) and proc["serviceName"] == "sglang"
            tags = {t["key"]: t["value"] for t in proc["tags"]}
            assert tags["sgl_probe.version"] == "0.1.0" and "sgl_probe.run_id" in tags
        ids = {s["spanID"] for s in trace["spans"]}
        for s in trace["spans"]:
            assert s["traceID"] == trace["traceID"] and HEX16.match(s["spanID"])
            assert isinstance(s["operationName"], str) and s["operationName"]
            assert isinstance(s["startTime"], int) and s["startTime"] > 1_600_000_000 * 10**6  # µs
            assert isinstance(s["duration"], int) and s["duration"] >= 0
            for t in s["tags"]:
                assert set(t) == {"key", "type", "value"} and isinstance(t["value"], TAG_TYPES[t["type"]])
            for ref in s["references"]:
                assert ref["refType"] == "CHILD_OF" and ref["traceID"] == trace["traceID"]
                assert ref["spanID"] in ids  # the parent is in the same trace
            tags = {t["key"]: t["value"] for t in s["tags"]}
            if s["operationName"] == "sglang.verify":
                assert tags["sglang.cuda_graph"] is False and tags["sglang.spec.accept_length"] > 0
                assert 7 < s["duration"] / 1000 < 500
                assert len(s["references"]) == 1
        if any(s["operationName"] == "sglang.step" for s in trace["spans"]):
            step_traces += 1
            assert len(trace["processes"]) == 2  # both ranks' step N in one trace
    assert step_traces == 38


def test_jaeger_json_round_trip_gives_the_same_report(jaeger_file, spec_dir, capsys):
    direct = report_json(capsys, spec_dir)
    via = report_json(capsys, str(jaeger_file))
    assert via["problems"] == [] and via["input"]["spans"] == direct["input"]["spans"]
    # Phase durations travel as attributes (exact); step times go through Jaeger's microseconds.
    strip = lambda rows: [{k: v for k, v in r.items() if k != "share_of_step_time"} for r in rows]  # noqa: E731
    assert strip(via["phases"]) == strip(direct["phases"])
    for a, b in zip(via["phases"], direct["phases"]):
        assert a["share_of_step_time"] == pytest.approx(b["share_of_step_time"], rel=1e-3)
    assert via["speculative"]["cycle"]["tau"] == direct["speculative"]["cycle"]["tau"]
    assert via["speculative"]["verdict"]["wins"] == direct["speculative"]["verdict"]["wins"]
    assert via["env"]["differs_across_ranks"] == direct["env"]["differs_across_ranks"]


def test_perfetto_file_is_valid_trace_event_json(spec_dir, tmp_path, capsys):
    path = tmp_path / "spec.perfetto.json"
    rc, out, _ = report(capsys, spec_dir, "--perfetto", str(path), "--max-traces", "10")
    assert rc == 0 and f"wrote {path}" in out
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert isinstance(events, list) and doc["displayTimeUnit"] == "ms"
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(procs.values()) == ["tp0", "tp1"]
    complete = [e for e in events if e["ph"] == "X"]
    for e in complete:
        assert isinstance(e["name"], str) and isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert (e["pid"], e["tid"]) in threads and isinstance(e["args"], dict)
    for e in events:
        assert e["ph"] in ("X", "M", "i") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    # One track per rank and phase:
    tracks = {(procs[e["pid"]], threads[(e["pid"], e["tid"])]) for e in complete}
    phases = {"step", "extend", "draft", "verify", "draft_extend"}
    assert tracks == {(r, p) for r in ("tp0", "tp1") for p in phases}
    for (pid, tid), name in threads.items():
        assert all(e["name"].startswith(name) for e in complete if (e["pid"], e["tid"]) == (pid, tid))
    assert {e["name"] for e in complete if e["name"].startswith("verify")} == {"verify · no graph"}
    assert {e["name"] for e in complete if e["name"].startswith("draft ")} == {"draft · graph"}


def test_plot(spec_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "spec.png"
    rc, out, err = report(capsys, spec_dir, "--plot", str(path))
    assert rc == 0, err
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert re.search(r"wrote .*spec\.png \(plot: 5 histograms, timeline of 4 steps\)", out)


def test_plot_without_matplotlib_says_how_to_get_it(spec_dir, tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rc, out, err = report(capsys, spec_dir, "--plot", str(tmp_path / "x.png"))
    assert rc == 3 and "pip install 'sgl-probe[report]'" in err
    assert "Speculative decoding" in out  # the report itself still comes out
    assert not (tmp_path / "x.png").exists()


# -- Jaeger's query API --------------------------------------------------------------------------

class _FileServingJaeger(BaseHTTPRequestHandler):
    """NOT a real Jaeger: a stand-in that answers GET /api/traces with a file our own Jaeger writer
    produced, and records the query it was asked."""

    body = b""
    queries: list = []

    def do_GET(self):  # noqa: N802
        url = urlsplit(self.path)
        type(self).queries.append((url.path, parse_qs(url.query)))
        if url.path != "/api/traces":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_jaeger_query_api_source(jaeger_file, spec_dir, capsys):
    handler = type("H", (_FileServingJaeger,), {"body": jaeger_file.read_bytes(), "queries": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        doc = report_json(capsys, "--jaeger", url, "--service", "sglang", "--limit", "50", "--lookback", "2h")
    finally:
        server.shutdown()
        server.server_close()
    (path, query), = handler.queries
    assert path == "/api/traces" and query["service"] == ["sglang"] and query["limit"] == ["50"]
    assert int(query["end"][0]) - int(query["start"][0]) == 2 * 3600 * 10**6
    direct = report_json(capsys, spec_dir)
    assert doc["input"]["spans"] == direct["input"]["spans"]
    assert [r["count"] for r in doc["phases"]] == [r["count"] for r in direct["phases"]]
    assert [r["mean_ms"] for r in doc["phases"]] == [r["mean_ms"] for r in direct["phases"]]


def test_jaeger_unreachable_is_a_clear_message(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out, err = report(capsys, "--jaeger", f"http://127.0.0.1:{port}")
    assert rc == 2 and out == ""
    assert "cannot reach Jaeger" in err and "nothing to report" in err


# -- the CLI ------------------------------------------------------------------------------------

def test_doctor_and_run_do_not_load_report_code():
    code = ("import sys; from sgl_probe import cli; "
            "rc = cli.main(['doctor', '--json']); "
            "loaded = sorted(m for m in sys.modules if m.startswith('sgl_probe.report')); "
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert loaded == ["sgl_probe.report", "sgl_probe.report.options"], out.stderr  # argparse only


def test_usage_errors(capsys, tmp_path):
    rc, _, err = report(capsys)
    assert rc == 2 and "give a SOURCE" in err
    rc, _, err = report(capsys, "--jaeger", "http://127.0.0.1:9", "--lookback", "soon")
    assert rc == 2 and "--lookback 'soon'" in err


def test_real_sglang_cpu_trace_dir_if_present(capsys):
    """A trace dir from a real SGLang 0.5.23 tp 2 CPU run (`python3 -m tests.harness demo` leaves
    one under .harness/demo-traces/); skipped where none was made on this machine."""
    root = ROOT / ".harness" / "demo-traces"
    runs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not runs:
        pytest.skip("no .harness/demo-traces (run `python3 -m tests.harness demo` once)")
    # The demo writes one folder per server (plain/, eagle3/) under each run's folder.
    plain = runs[-1] / "plain"
    doc = report_json(capsys, str(plain if plain.is_dir() else runs[-1]), "--by-rank")
    assert doc["problems"] == []
    assert {r["phase"] for r in doc["phases"]} >= {"extend", "decode"}
    assert doc["runs"][0]["sglang_version"] and len(doc["ranks"]) >= 1
    counts = Counter()
    for r in doc["phases_by_rank"]:
        counts[r["rank"]] += r["count"]
    assert len(set(counts.values())) == 1  # every rank ran every step
    # every phase span is in the table or counted as warm-up beside it
    assert sum(r["count"] + r["warmup_calls"] for r in doc["phases"]) == doc["input"]["phase_spans"]


def test_verdict_without_step_spans_uses_phase_means(spec_dir, base_dir):
    """A source that lost its sglang.step spans (e.g. a filtered export): one call of each phase per
    cycle, decode from the decode spans alone."""
    from sgl_probe.report import speculative
    from sgl_probe.report.aggregate import Aggregator
    from sgl_probe.report.model import Problems
    from sgl_probe.report.sources import read_sources

    def agg_of(path):
        agg = Aggregator()
        for span in read_sources([path], Problems()):
            if span.name != "sglang.step":
                agg.add(span)
        return agg.finish()

    spec = speculative.analyse(agg_of(spec_dir), agg_of(base_dir))
    cyc = spec["cycle"]
    assert cyc["from_steps"] is False and spec["decode"]["from_steps"] is False
    assert cyc["other_ms"] == 0 and cyc["n_steps"] == 60 and cyc["tau"] == pytest.approx(3.0)
    assert spec["verdict"]["speedup"] == pytest.approx(
        3.0 * spec["decode_matched_ms"] / (cyc["draft_ms"] + cyc["verify_ms"] + cyc["draft_extend_ms"]))
