"""Read many spans on several cores: files of OTLP/JSON lines are cut at line boundaries into
byte ranges, each range is parsed and aggregated in a worker process, and the partial
aggregators merge exactly (:meth:`Aggregator.merge`). JSON parsing is most of a report's time,
and the only part that parallelises; a trace dir of N rank files is N natural pieces.

Everything a worker finds wrong is reported with the file's real line numbers (the chunk's first
line number is counted only when its chunk had a problem).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Optional

from sgl_probe.report import otlp, sources
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.keep import TraceKeeper
from sgl_probe.report.model import Problems

#: Below this much input a pool costs more than it saves.
MIN_PARALLEL_BYTES = 48 * 1024 * 1024

Job = tuple  # (path, start, end): a byte range of an OTLP-lines file; start None: the whole file


def _is_otlp_lines(path: str) -> bool:
    if path.endswith(".gz"):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b'{"resourceSpans"')


def plan(paths: list[str], workers: int) -> list[Job]:
    """Whole files when there are enough of them to keep every worker busy; otherwise the big
    OTLP-lines files are cut into about ``2 * workers`` pieces in all."""
    sizes = {p: (os.path.getsize(p) if os.path.isfile(p) else 0) for p in paths}
    total = sum(sizes.values()) or 1
    target = 2 * workers
    jobs: list[Job] = []
    for p in paths:
        pieces = 1
        if len(paths) < target and _is_otlp_lines(p):
            pieces = max(1, round(target * sizes[p] / total))
        if pieces == 1:
            jobs.append((p, None, None))
            continue
        bounds = [0]
        with open(p, "rb") as fh:
            for k in range(1, pieces):
                fh.seek(max(bounds[-1], sizes[p] * k // pieces))
                fh.readline()  # to the start of the next line
                pos = fh.tell()
                if pos < sizes[p] and pos > bounds[-1]:
                    bounds.append(pos)
        bounds.append(sizes[p])
        jobs += [(p, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return jobs


def _range_lines(fh, end: int):
    while fh.tell() < end:
        line = fh.readline()
        if not line:
            return
        yield line


def work(job: Job, keep: Optional[int]) -> tuple:
    """In a worker: one job's aggregator, problems and kept traces."""
    import gc

    gc.disable()  # see command.run
    path, start, end = job
    problems = Problems()
    agg = Aggregator()
    keeper = TraceKeeper(keep) if keep is not None else None
    if start is None:
        spans = sources.read_file(path, problems)
        with_lines = None
    else:
        fh = open(path, "rb")
        fh.seek(start)
        spans = otlp.read_lines(_range_lines(fh, end), path, problems)
        with_lines = start
    add = agg.add
    if keeper is None:
        for s in spans:
            add(s)
    else:
        for s in spans:
            add(s)
            keeper.add(s)
    if start is not None:
        fh.close()
    return agg, problems, keeper, with_lines


def _lines_before(path: str, offset: int) -> int:
    n = 0
    with open(path, "rb") as fh:
        left = offset
        while left > 0:
            block = fh.read(min(left, 16 << 20))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def run(paths: list[str], workers: int, keep: Optional[int], agg: Aggregator, problems: Problems,
        keeper: Optional[TraceKeeper]) -> None:
    """Aggregate ``paths`` into ``agg`` / ``problems`` / ``keeper`` with ``workers`` processes."""
    jobs = plan(paths, workers)
    # fork is cheapest, but only safe while this process runs a single thread (the CLI does; a
    # test process or an embedding application may hold locks in other threads).
    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
        else "spawn"
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as pool:
        # map() keeps job order: the merge sees files and chunks in the order a single reader would.
        results = pool.map(work, jobs, [keep] * len(jobs))
        for job, (part, part_problems, part_keeper, start) in zip(jobs, results):
            agg.merge(part)
            offset = _lines_before(job[0], start) if start and part_problems.items else 0
            problems.merge(part_problems, offset)
            if keeper is not None and part_keeper is not None:
                keeper.merge(part_keeper)


def auto_workers(paths: list[str], requested: Optional[int]) -> int:
    if requested is not None:
        return max(1, requested)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    return 1 if total < MIN_PARALLEL_BYTES else max(1, min(cpus, 8))
