"""The trace-file exporter when its file system refuses writes: a real kernel limit
(``RLIMIT_FSIZE``: short writes, then EFBIG, as on a full disk) in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, logging, os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer at the limit
    from opentelemetry.sdk.trace import TracerProvider
    from sgl_probe.sinks import JsonLinesExporter

    tracer = TracerProvider().get_tracer("t")

    def spans(n):
        out = []
        for i in range(n):
            s = tracer.start_span("s%d" % i)
            s.set_attribute("pad", "p" * 300)
            s.end()
            out.append(s)
        return out

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("sgl_probe").addHandler(handler)
    exp = JsonLinesExporter(sys.argv[1])
    results = [exp.export(spans(3)).name]
    # Room for part of the next line only.
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(sys.argv[1]) + 1000, resource.RLIM_INFINITY))
    results += [exp.export(spans(10)).name for _ in range(4)]
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    results += [exp.export(spans(2)).name]
    print(json.dumps({"results": results, "records": records}))
""")


def test_full_file_system_one_line_each_way_and_no_half_lines(tmp_path):
    path = tmp_path / "sgl-probe-1.jsonl"
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["results"] == ["SUCCESS"] + ["FAILURE"] * 4 + ["SUCCESS"]
    cannot = [r for r in got["records"] if "cannot write" in r]
    again = [r for r in got["records"] if "again" in r and "cannot" not in r]
    assert len(cannot) == 1 and "File too large" in cannot[0] and str(path) in cannot[0], got["records"]
    assert len(again) == 1 and len(got["records"]) == 2, got["records"]
    names = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)  # a half-written line would not parse
        names += [s["name"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert names == ["s0", "s1", "s2", "s0", "s1"]


def test_trace_dir_breakers_without_mount(tmp_path):
    """The fallbacks the server test uses where it may not mount a tmpfs, on the real exporter."""
    import logging

    from opentelemetry.sdk.trace import TracerProvider

    from sgl_probe.sinks import JsonLinesExporter
    from tests.test_reliability_faults import TraceFs

    fs = TraceFs(tmp_path / "traces", mount=False)
    (kind,) = fs.kinds
    exp = JsonLinesExporter(str(fs.path / "sgl-probe-1.jsonl"))
    span = TracerProvider().get_tracer("t").start_span("s")
    span.end()
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("sgl_probe").addHandler(handler)
    try:
        assert exp.export([span]).name == "SUCCESS"
        fs.break_(kind)
        assert exp.export([span]).name == "FAILURE"
        fs.repair(kind)
        assert exp.export([span]).name == "SUCCESS"
    finally:
        logging.getLogger("sgl_probe").removeHandler(handler)
    assert {"ENOSPC": "No space left", "EACCES": "Permission denied"}[kind] in records[0], records
    assert len((fs.path / "sgl-probe-1.jsonl").read_text().splitlines()) == 2
