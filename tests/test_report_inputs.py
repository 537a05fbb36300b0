"""Bad input for `sgl-probe report`: a truncated JSON line, files in the wrong format, empty folders,
spans from an unknown sgl-probe version or not from sgl-probe at all. Each costs one clear message
naming the file (and line), and the rest of the input is still reported. Plus the 1M-span
benchmark's generator and timing at 20k spans."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sgl_probe.cli import main
from tests import workload_spec as ws


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory) -> str:
    return ws.cached_trace_dir(tmp_path_factory, "spec", ws.SPEC_PLAN)


def report(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["report", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def verify_count(out: str) -> int:
    return sum(int(line.split()[2]) for line in out.splitlines() if line.startswith("verify "))


def spans_in(line: str, name: str) -> int:
    return sum(sp["name"] == name for rs in json.loads(line)["resourceSpans"]
               for ss in rs["scopeSpans"] for sp in ss["spans"])


def copy_dir(src: str, dst: Path) -> list[Path]:
    shutil.copytree(src, dst)
    return sorted(dst.iterdir())


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_truncated_and_garbage_lines_cost_only_themselves(spec_dir, tmp_path, capsys, jobs):
    files = copy_dir(spec_dir, tmp_path / "t")
    lines = files[0].read_text().splitlines(keepends=True)
    assert len(lines) >= 3, "the workload should flush several export batches"
    lost = spans_in(lines[-1], "sglang.verify") + spans_in(lines[1], "sglang.verify")
    # A killed process leaves half a line at the end; a bad disk leaves junk in the middle.
    lines[1] = "{\"resourceSpans\": [oops\n"
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
    files[0].write_text("".join(lines))
    rc, out, err = report(capsys, str(tmp_path / "t"), "--jobs", jobs)
    assert rc == 0
    assert f"{files[0]}:2: invalid JSON" in err
    assert f"{files[0]}:{len(lines)}: truncated JSON" in err and "line skipped" in err
    assert verify_count(out) == 60 - lost


def test_wrong_format_files_are_named_and_skipped(spec_dir, tmp_path, capsys):
    files = copy_dir(spec_dir, tmp_path / "w")
    (tmp_path / "w" / "notes.json").write_text("hello, this is not a trace\n")
    (tmp_path / "w" / "chrome.json").write_text(json.dumps({"traceEvents": [{"ph": "X"}]}))
    (tmp_path / "w" / "other.jsonl").write_text('{"some": "json"}\n')
    rc, out, err = report(capsys, str(tmp_path / "w"))
    assert rc == 0 and verify_count(out) == 60 and len(files) == 2
    assert f"{tmp_path / 'w' / 'notes.json'}:1: not OTLP/JSON lines, an OTLP/JSON document or Jaeger JSON " \
           f"(starts with 'hello, this is not a trace'); file skipped" in err
    assert "chrome.json:1: not OTLP/JSON lines" in err and "(a Chrome/Perfetto trace-event file)" in err
    assert "other.jsonl:1: not OTLP/JSON lines" in err


def test_a_single_otlp_document_and_gzip_are_read(spec_dir, tmp_path, capsys):
    import gzip

    first = sorted(Path(spec_dir).iterdir())[0]
    lines = first.read_text().splitlines()
    merged = {"resourceSpans": [rs for line in lines for rs in json.loads(line)["resourceSpans"]]}
    (tmp_path / "doc.json").write_text(json.dumps(merged, indent=2))  # pretty-printed, one document
    with gzip.open(tmp_path / "lines.jsonl.gz", "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    rc1, out1, err1 = report(capsys, str(tmp_path / "doc.json"))
    rc2, out2, err2 = report(capsys, str(tmp_path / "lines.jsonl.gz"))
    assert rc1 == rc2 == 0 and err1 == err2 == ""
    assert verify_count(out1) == verify_count(out2) == 30


def test_empty_folder(tmp_path, spec_dir, capsys):
    (tmp_path / "empty").mkdir()
    rc, out, err = report(capsys, str(tmp_path / "empty"))
    assert rc == 2 and out == ""
    assert f"{tmp_path / 'empty'}: folder holds no trace files" in err and "nothing to report" in err
    rc, out, err = report(capsys, str(tmp_path / "empty"), spec_dir, str(tmp_path / "missing"))
    assert rc == 0 and verify_count(out) == 60
    assert "folder holds no trace files" in err and f"{tmp_path / 'missing'}: no such file or folder" in err


def test_empty_file(tmp_path, capsys):
    (tmp_path / "sgl-probe-1.jsonl").write_text("")
    rc, _, err = report(capsys, str(tmp_path))
    assert rc == 2 and "sgl-probe-1.jsonl: file is empty" in err


def _rewrite_resource(path: Path, key: str, value: str) -> None:
    out = []
    for line in path.read_text().splitlines():
        msg = json.loads(line)
        for rs in msg["resourceSpans"]:
            for a in rs["resource"]["attributes"]:
                if a["key"] == key:
                    a["value"] = {"stringValue": value}
        out.append(json.dumps(msg))
    path.write_text("\n".join(out) + "\n")


def test_spans_from_an_unknown_version_are_named_and_skipped(spec_dir, tmp_path, capsys):
    files = copy_dir(spec_dir, tmp_path / "v")
    _rewrite_resource(files[1], "sgl_probe.version", "7.3.0")
    rc, out, err = report(capsys, str(tmp_path / "v"))
    assert rc == 0 and verify_count(out) == 30 and "ranks tp0 ·" in out
    assert f"{files[1]}:1: spans from sgl-probe 7.3.0, whose span contract this report (sgl-probe 0.1.0, " \
           f"knows 0.1.x) does not know;" in err and "spans skipped" in err
    n_lines = len(files[1].read_text().splitlines())
    if n_lines > 3:
        assert "more unknown-version problems" in err  # one message per line would drown the report


def test_spans_not_from_sgl_probe(spec_dir, tmp_path, capsys):
    files = copy_dir(spec_dir, tmp_path / "f")
    out_lines = []
    for line in files[1].read_text().splitlines():
        msg = json.loads(line)
        for rs in msg["resourceSpans"]:
            rs["resource"]["attributes"] = [a for a in rs["resource"]["attributes"]
                                            if a["key"] != "sgl_probe.version"]
            for ss in rs["scopeSpans"]:
                ss["scope"] = {"name": "my.web.app"}
        out_lines.append(json.dumps(msg))
    files[1].write_text("\n".join(out_lines) + "\n")
    rc, out, err = report(capsys, str(tmp_path / "f"))
    assert rc == 0 and verify_count(out) == 30
    assert "not sgl-probe spans (service 'sglang', scope 'my.web.app', no sgl_probe.version)" in err


def test_broken_jaeger_json(tmp_path, capsys):
    procs = {"p1": {"serviceName": "sglang", "tags": [{"key": "sgl_probe.version", "type": "string",
                                                      "value": "0.1.0"}]}}
    (tmp_path / "j.json").write_text(json.dumps({"data": [
        {"traceID": "ab", "spans": [{"spanID": "1", "processID": "p1"}], "processes": procs}, 7]}))
    rc, _, err = report(capsys, str(tmp_path / "j.json"))
    assert rc == 2
    assert "j.json:trace[0].spans[0]: span not in Jaeger JSON shape" in err
    assert "j.json:trace[1]: trace is not an object; skipped" in err


# -- scale ------------------------------------------------------------------------------------

def test_report_scale_benchmark_at_20k_spans(tmp_path):
    """benchmarks/report_scale.py at 20k spans (the 1M run is the benchmark, not a test)."""
    from benchmarks import report_scale

    n = report_scale.generate(str(tmp_path), 20_000, ranks=4)
    assert 20_000 <= n < 20_020
    r = report_scale.time_report(str(tmp_path), "--by-rank")
    assert r["rc"] == 0, r["stderr"]
    assert r["stderr"] == "" and r["wall_s"] < 60
    assert "spans" in r["stdout"] and "<< slowest" in r["stdout"]
    assert "=> Speculative decoding loses: 0.6" in r["stdout"]  # the seed case's shape: ~0.69x
    j = report_scale.time_report(str(tmp_path), "--json", "--jobs", "2")
    doc = json.loads(j["stdout"])
    assert doc["input"]["spans"] == n and doc["problems"] == []
    assert [s["slowest_rank"] for s in doc["stragglers"] if s["phase"] == "verify"] == ["tp3"]
    assert doc["speculative"]["cycle"]["verify_no_graph"] == pytest.approx(0.97, abs=0.03)


# -- attributes: new keys, why no graph ran, which start a phase used -------------------------------

NEW_VALUES = [
    {"stringValue": "x"}, {"intValue": "7"}, {"doubleValue": "NaN"}, {"boolValue": True},
    {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}, {"intValue": "not a number"}]}},
    {"kvlistValue": {"values": [{"key": "k", "value": {"doubleValue": 1.5}}, {"key": "empty"}]}},
    {"bytesValue": "AAE="}, {"fancyValueFromAFutureOtlp": {"a": 1}}, {}, {"intValue": "12abc"},
]


def test_new_attribute_keys_and_graph_reasons(spec_dir, tmp_path, capsys):
    """Spans carrying keys this report has never seen (every OTLP value kind, an unknown kind,
    malformed values) read exactly as without them; ``sglang.no_graph_reason`` and
    ``sgl_probe.start`` are shown per phase, also after a round trip through Jaeger JSON."""
    from sgl_probe.contract import DURATION_MS, GRAPH_MS, NO_GRAPH_REASON, PHASES, START, phase_span
    from sgl_probe.stats import median

    PHASE_SPANS = {phase_span(p) for p in PHASES}

    files = copy_dir(spec_dir, tmp_path / "n")
    stripped = copy_dir(spec_dir, tmp_path / "o")  # as from a probe that records neither
    host_clock = 0
    before_launch: dict = {}  # phase -> ms before the graph's launch, per launched call
    for f in files + stripped:
        new = f in files
        out_lines = []
        for line in f.read_text().splitlines():
            msg = json.loads(line)
            for rs in msg["resourceSpans"]:
                if new:
                    rs["resource"]["attributes"].append({"key": "host.future_thing", "value": NEW_VALUES[4]})
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        attrs = sp["attributes"] = [a for a in sp["attributes"]
                                                    if a["key"] not in (START, NO_GRAPH_REASON)]
                        if not new:
                            continue
                        attrs += [{"key": f"future.key{i}", "value": v} for i, v in enumerate(NEW_VALUES)]
                        if sp["name"] not in PHASE_SPANS:
                            continue
                        graph = next(a["value"]["boolValue"] for a in attrs if a["key"] == "sglang.cuda_graph")
                        start = "host_clock" if sp["name"] == "sglang.decode" else "gpu_event"
                        host_clock += start == "host_clock"
                        attrs.append({"key": START, "value": {"stringValue": start}})
                        if graph and sp["name"] in ("sglang.decode", "sglang.draft"):
                            ms = next(a["value"]["doubleValue"] for a in attrs if a["key"] == DURATION_MS)
                            attrs.append({"key": GRAPH_MS, "value": {"doubleValue": ms / 4}})
                            before_launch.setdefault(sp["name"][7:], []).append((ms - ms / 4, ms / 4))
                        if not graph:
                            reason = "graphs_disabled" if sp["name"] == "sglang.verify" else "mode_not_captured"
                            attrs.append({"key": NO_GRAPH_REASON, "value": {"stringValue": reason}})
            out_lines.append(json.dumps(msg))
        f.write_text("\n".join(out_lines) + "\n")
    capsys.readouterr()
    assert main(["report", spec_dir, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["report", str(tmp_path / "n"), "--json", "--jaeger-json", str(tmp_path / "n.jaeger.json"),
                 "--max-traces", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"] == [] and doc["input"] == plain["input"]
    assert doc["phases"] == plain["phases"] and doc["steps"] == plain["steps"]
    assert doc["speculative"]["verdict"] == plain["speculative"]["verdict"]
    graphs = {g["phase"]: g for g in doc["graphs"]}
    assert graphs["verify"]["graph"] == 0.0 and graphs["verify"]["no_graph_reasons"] == {"graphs_disabled": 1.0}
    assert graphs["extend"]["no_graph_reasons"] == {"mode_not_captured": 1.0}
    assert graphs["draft"]["graph"] == 1.0 and graphs["draft"]["no_graph_reasons"] == {}
    assert graphs["decode"]["start"] == {"host_clock": 1.0} and graphs["verify"]["start"] == {"gpu_event": 1.0}
    assert host_clock == graphs["decode"]["calls"] == 12
    for phase in ("decode", "draft"):  # where a graph phase's time went, every launched call
        calls = before_launch[phase]
        assert graphs[phase]["graph_launch"] == {
            "calls": len(calls), "before_launch_p50_ms": pytest.approx(median(b for b, _ in calls)),
            "graph_p50_ms": pytest.approx(median(g for _, g in calls))}
    assert "graph_launch" not in graphs["verify"] and "graph_launch" not in graphs["extend"]
    # Spans from a probe that records neither attribute: the reason is "not recorded".
    assert main(["report", str(tmp_path / "o"), "--json"]) == 0
    old = {g["phase"]: g for g in json.loads(capsys.readouterr().out)["graphs"]}
    assert old["verify"]["no_graph_reasons"] == {"not recorded": 1.0} and old["verify"]["start"] == {}

    rc, out, err = report(capsys, str(tmp_path / "n"))
    assert rc == 0 and err == ""
    assert "  verify:       no graph in 100.0 % of calls: graphs_disabled 100.0 %; start gpu_event 100.0 %" in out
    assert "  decode:       start host_clock 100.0 %; graph launched " in out
    assert "ms after the call, graph" in out
    rc, out, _ = report(capsys, str(tmp_path / "o"))
    assert "CUDA graphs" not in out  # nothing recorded: no section

    via = json.loads(report(capsys, str(tmp_path / "n.jaeger.json"), "--json")[1])
    assert via["problems"] == [] and via["graphs"] == doc["graphs"]
    assert [r["count"] for r in via["phases"]] == [r["count"] for r in doc["phases"]]
