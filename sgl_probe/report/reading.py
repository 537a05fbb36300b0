"""SOURCE arguments (and Jaeger's answer) -> an aggregator: one reader process, or several for big
inputs (:mod:`sgl_probe.report.parallel`). Shared by ``sgl-probe report`` and ``sgl-probe diff``."""

from __future__ import annotations

from typing import Iterator

from sgl_probe.report import sources as sources_mod
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.keep import TraceKeeper
from sgl_probe.report.model import Problems, Span


def _stream(paths: list[str], jaeger: dict | None, problems: Problems) -> Iterator[Span]:
    for path in paths:
        yield from sources_mod.read_file(path, problems)
    if jaeger:
        from sgl_probe.report import jaeger_in

        yield from jaeger_in.fetch(jaeger["url"], jaeger["service"], jaeger["limit"], jaeger["lookback_s"], problems)


def read(srcs: list[str], jaeger: dict | None, jobs: int | None, agg: Aggregator, problems: Problems,
          keeper: TraceKeeper | None) -> None:
    """Every span of ``srcs`` (and Jaeger's answer) into ``agg`` (and ``keeper``)."""
    from sgl_probe.report import parallel

    paths = [p for src in srcs for p in sources_mod.files_of(src, problems)]
    workers = parallel.auto_workers(paths, jobs)
    if workers > 1 and paths:
        keep = (keeper.max_traces or 0) if keeper is not None else None  # 0: keep every trace
        parallel.run(paths, workers, keep, agg, problems, keeper)
        stream = _stream([], jaeger, problems)
    else:
        stream = _stream(paths, jaeger, problems)
    add = agg.add
    if keeper is None:
        for span in stream:
            add(span)
    else:
        keep = keeper.add
        for span in stream:
            add(span)
            keep(span)


def read_aggregator(srcs: list[str], jobs: int | None) -> tuple[Aggregator, Problems]:
    """Every span of ``srcs``, aggregated and finished."""
    agg, problems = Aggregator(), Problems()
    read(srcs, None, jobs, agg, problems, None)
    return agg.finish(), problems
