"""The first N traces, kept whole (every span, every attribute) for the file writers: Jaeger JSON,
Perfetto and the plot's timeline. A trace is admitted the first time one of its spans is seen
while fewer than N are kept; later spans of an admitted trace (the other ranks' files) join it."""

from __future__ import annotations

from typing import Optional

from sgl_probe.report.model import Span


class TraceKeeper:
    def __init__(self, max_traces: Optional[int]) -> None:
        self.max_traces = max_traces  # None or 0: all (memory grows with the input)
        self.traces: dict[str, list[Span]] = {}
        self._skipped: set[str] = set()

    def add(self, span: Span) -> None:
        spans = self.traces.get(span.trace_id)
        if spans is None:
            if self.max_traces and len(self.traces) >= self.max_traces:
                if span.trace_id not in self._skipped and len(self._skipped) < 10_000_000:
                    self._skipped.add(span.trace_id)
                return
            spans = self.traces[span.trace_id] = []
        spans.append(span)

    def merge(self, other: "TraceKeeper") -> None:
        """Fold in a later chunk's keeper (chunks in reading order keep "the first N")."""
        for tid, spans in other.traces.items():
            mine = self.traces.get(tid)
            if mine is not None:
                mine.extend(spans)
            elif not self.max_traces or len(self.traces) < self.max_traces:
                self.traces[tid] = list(spans)
            else:
                self._skipped.add(tid)
        self._skipped |= other._skipped - self.traces.keys()

    @property
    def n_skipped(self) -> int:
        return len(self._skipped)

    def spans(self):
        for spans in self.traces.values():
            yield from spans

    def __len__(self) -> int:
        return len(self.traces)
