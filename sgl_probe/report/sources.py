"""SOURCE arguments -> one stream of spans.

A SOURCE is a ``SGL_PROBE_TRACE_DIR`` folder (every ``*.jsonl``/``*.json`` file in it, optionally
gzipped), a file of OTLP/JSON lines, one OTLP/JSON document, or a Jaeger JSON file. The format
is sniffed from the content, not the name. Nothing here raises on bad input: every problem goes
to :class:`~sgl_probe.report.model.Problems` with its file and line, and reading goes on.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
from typing import IO, Iterable, Iterator

from sgl_probe.report import jaeger_in, otlp
from sgl_probe.report.model import Problems, Span

TRACE_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
#: A file whose first line is not a JSON object is only parsed whole below this size.
WHOLE_DOC_MAX_BYTES = 512 * 1024 * 1024


def _open(path: str) -> IO[str]:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "r", encoding="utf-8", errors="replace")


def files_of(source: str, problems: Problems) -> list[str]:
    if os.path.isdir(source):
        names = sorted(n for n in os.listdir(source) if n.endswith(TRACE_SUFFIXES))
        files = [os.path.join(source, n) for n in names if os.path.isfile(os.path.join(source, n))]
        if not files:
            problems.add(source, None, "empty-dir",
                         "folder holds no trace files (*.jsonl, *.json, optionally .gz); is it the "
                         "SGL_PROBE_TRACE_DIR of a run that sent load?")
        return files
    if os.path.isfile(source):
        return [source]
    problems.add(source, None, "missing", "no such file or folder")
    return []


def _preview(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def read_file(path: str, problems: Problems) -> Iterator[Span]:
    try:
        fh = _open(path)
    except OSError as exc:
        problems.add(path, None, "unreadable", f"cannot open: {exc.strerror or exc}")
        return
    with fh:
        try:
            first_lines = []
            for line in fh:
                first_lines.append(line)
                if line.strip():
                    break
        except (OSError, EOFError) as exc:  # e.g. a broken gzip stream
            problems.add(path, None, "unreadable", f"cannot read: {exc}")
            return
        if not first_lines or not first_lines[-1].strip():
            problems.add(path, None, "empty-file", "file is empty")
            return
        first = first_lines[-1]
        head = first.lstrip()
        try:
            doc = json.loads(first)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "resourceSpans" in doc:
            yield from otlp.read_lines(itertools.chain(first_lines, fh), path, problems)
            return
        if isinstance(doc, dict) and "data" in doc:
            yield from jaeger_in.spans_of_document(doc, path, problems)
            return
        if doc is None and head.startswith('{"resourceSpans"'):
            # OTLP lines whose first line was cut: that line is reported, the rest is read.
            yield from otlp.read_lines(itertools.chain(first_lines, fh), path, problems)
            return
        if doc is None and head.startswith(("{", "[")):
            # Maybe one pretty-printed document (Jaeger download, OTLP file).
            try:
                size = os.path.getsize(path)
            except OSError:
                size = 0
            if size <= WHOLE_DOC_MAX_BYTES:
                rest = "".join(first_lines) + fh.read()
                try:
                    doc = json.loads(rest)
                except ValueError as exc:
                    problems.add(path, str(getattr(exc, "lineno", "")) or None, "bad-json",
                                 f"not valid JSON ({getattr(exc, 'msg', exc)}); file skipped")
                    return
                if isinstance(doc, dict) and "resourceSpans" in doc:
                    yield from otlp.spans_of_request(doc, path, "1", problems)
                    return
                if isinstance(doc, dict) and "data" in doc:
                    yield from jaeger_in.spans_of_document(doc, path, problems)
                    return
        lineno = len(first_lines)
        if isinstance(doc, dict) and "traceEvents" in doc or isinstance(doc, list):
            what = "a Chrome/Perfetto trace-event file"
        else:
            what = f"starts with {_preview(head)}"
        problems.add(path, str(lineno), "wrong-format",
                     f"not OTLP/JSON lines, an OTLP/JSON document or Jaeger JSON ({what}); file skipped")


def read_sources(sources: Iterable[str], problems: Problems) -> Iterator[Span]:
    for source in sources:
        for path in files_of(source, problems):
            yield from read_file(path, problems)
