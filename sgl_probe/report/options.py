"""The ``sgl-probe report`` options: argparse only, so building the CLI parser costs nothing."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="*", metavar="SOURCE",
                   help="SGL_PROBE_TRACE_DIR folder, OTLP/JSON(-lines) file or Jaeger JSON file")
    p.add_argument("--jaeger", metavar="URL", help="read from a Jaeger query service, e.g. http://localhost:16686")
    p.add_argument("--service", default="sglang", help="service name to query with --jaeger (default: sglang)")
    p.add_argument("--limit", type=int, default=1000, help="traces to fetch with --jaeger (default: 1000)")
    p.add_argument("--lookback", default="1h", help="how far back --jaeger looks: 30m, 2h, 1d (default: 1h)")
    p.add_argument("--baseline", action="append", default=[], metavar="SOURCE",
                   help="a run without speculative decoding: its decode steps are what spec must beat "
                        "(repeatable; default: this run's own decode steps)")
    p.add_argument("--by-rank", action="store_true", help="rows per rank, slowest rank flagged, straggler view")
    p.add_argument("--by-bs", action="store_true", help="rows per batch-size bucket (1, 2, 3-4, 5-8, ...)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--jaeger-json", metavar="FILE", help="write Jaeger JSON (Jaeger UI: Search > JSON File)")
    p.add_argument("--perfetto", metavar="FILE", help="write Chrome trace-event JSON (ui.perfetto.dev)")
    p.add_argument("--plot", metavar="FILE.png", help="write histograms and a step timeline (needs matplotlib)")
    p.add_argument("--max-traces", type=int, default=1000, metavar="N",
                   help="traces (steps) written to --jaeger-json / --perfetto: the first N (default 1000; 0 = all)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes for reading (default: one per CPU when the input is over 48 MiB)")


def add_diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the first run (e.g. the baseline): trace folder or file")
    p.add_argument("b", metavar="B", help="the second run")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes for reading (default: one per CPU when the input is over 48 MiB)")
