"""``sgl-probe report``: the glue. Read every source once (streaming), aggregate, then render."""

from __future__ import annotations

import argparse
import json
import sys

from sgl_probe.report import document, text
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.keep import TraceKeeper
from sgl_probe.report.model import Problems
from sgl_probe.report.reading import read

#: With --plot only, this many traces are kept for its timeline.
PLOT_TRACES = 400


def _fail(msg: str) -> int:
    print(f"sgl-probe report: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    # Spans and their dicts form no reference cycles: the cyclic GC would only re-scan millions of
    # live objects while reading (about a quarter of the time). Memory is bounded by streaming.
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if was_enabled:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    if not args.sources and not args.jaeger:
        return _fail("give a SOURCE (trace folder, OTLP/JSON or Jaeger JSON file) or --jaeger URL")
    jaeger = None
    if args.jaeger:
        from sgl_probe.report import jaeger_in

        try:
            lookback_s = jaeger_in.parse_lookback(args.lookback)
        except ValueError:
            return _fail(f"--lookback {args.lookback!r}: use e.g. 90s, 30m, 2h, 1d")
        jaeger = {"url": args.jaeger, "service": args.service, "limit": args.limit, "lookback_s": lookback_s}
    problems = Problems()
    agg = Aggregator()
    wants_files = bool(args.jaeger_json or args.perfetto)
    keep_n = args.max_traces if wants_files else PLOT_TRACES
    keeper = TraceKeeper(keep_n if keep_n > 0 else None) if (wants_files or args.plot) else None
    read(args.sources, jaeger, args.jobs, agg, problems, keeper)
    agg.finish()
    base = None
    if args.baseline:
        base = Aggregator()
        read(args.baseline, None, args.jobs, base, problems, None)
        base.finish()
    for line in problems.lines():
        print(f"sgl-probe report: {line}", file=sys.stderr)
    if agg.n_phase_spans == 0 and agg.n_steps == 0:
        where = " ".join(args.sources) + (f" {args.jaeger}" if args.jaeger else "")
        return _fail(f"nothing to report: no sgl-probe step or phase spans in {where.strip()}"
                     + (f" ({problems.count()} input problems above)" if problems else ""))
    if args.json:
        want = document.ALL
    else:
        want = (("by_bs",) if args.by_bs else ()) + (("by_rank", "stragglers") if args.by_rank else ())
    doc = document.build(agg, problems, list(args.sources) + ([args.jaeger] if args.jaeger else []), base,
                         args.baseline, want=want, by_rank_bs=args.by_rank and args.by_bs)
    fp_diff = None
    if base is not None:
        from sgl_probe.report import diff

        fp_diff = doc["baseline_diff"] = diff.compare(base, agg)
        diff.mark_verdict(doc.get("speculative"), fp_diff)
    rc = 0
    try:
        if args.jaeger_json:
            from sgl_probe.report import jaeger_out

            n = jaeger_out.write(args.jaeger_json, keeper.traces.items())
            more = f", {keeper.n_skipped:,} more not written (--max-traces)" if keeper.n_skipped else ""
            doc["files"]["jaeger_json"] = {"path": args.jaeger_json, "traces": n,
                                           "traces_not_written": keeper.n_skipped, "detail": f"{n:,} traces{more}"}
        if args.perfetto:
            from sgl_probe.report import perfetto

            n = perfetto.write(args.perfetto, keeper.spans(), agg.rank_of, agg.label, agg.rank_sort_key)
            doc["files"]["perfetto"] = {"path": args.perfetto, "events": n, "traces": len(keeper),
                                        "traces_not_written": keeper.n_skipped,
                                        "detail": f"{n:,} events from {len(keeper):,} traces"}
        if args.plot:
            from sgl_probe.report import plot

            try:
                detail = plot.write(args.plot, agg, keeper, title=" ".join(args.sources) or args.jaeger or "")
                doc["files"]["plot"] = {"path": args.plot, "detail": detail}
            except plot.MissingMatplotlib as exc:
                print(f"sgl-probe report: {exc}", file=sys.stderr)
                rc = 3
            except ValueError as exc:  # e.g. no phase spans at all
                print(f"sgl-probe report: no plot: {exc}", file=sys.stderr)
                rc = 2
    except OSError as exc:
        print(f"sgl-probe report: cannot write {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        rc = 2
    doc = document.clean(doc)
    try:
        if args.json:
            json.dump(doc, sys.stdout, indent=1, ensure_ascii=False)
            sys.stdout.write("\n")
        else:
            if fp_diff is not None:  # what differs from the baseline comes first
                from sgl_probe.report.diff import render

                sys.stdout.write("\n".join(render(fp_diff, "baseline", "this run")) + "\n\n")
            sys.stdout.write(text.render(doc, by_rank=args.by_rank, by_bs=args.by_bs))
        sys.stdout.flush()
    except BrokenPipeError:  # `sgl-probe report ... | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return rc
