"""Benchmark-only (not part of sgl-probe): a stand-in for the CPU the probe's exporter process
uses, without the probe. Every ``period`` seconds it encodes span-shaped dicts to JSON for
``cores * period`` seconds, then sleeps: the exporter's shape on the tiny server (a batch from the
drain every 0.2 s, ~0.18 cores of protobuf and JSON work).

overhead_ab's ``hog`` server has no probe at all; this process runs beside it (on the server's
CPUs) during that server's "recording" windows only (SIGCONT / SIGSTOP), so its ratio says what
another process's CPU of that size costs the launch-bound scheduler on the host.

    python3 cpu_hog.py CORES [PERIOD_S]
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    cores = float(sys.argv[1])
    period = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "parentSpanId": "eee19b7ec3c1b173",
            "name": "sglang.decode", "kind": 1, "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000000001000000",
            "attributes": [{"key": "sglang.batch_size", "value": {"intValue": "16"}},
                           {"key": "sgl_probe.graph", "value": {"boolValue": True}},
                           {"key": "sglang.forward_mode", "value": {"stringValue": "DECODE"}}]}
    batch = [dict(span, spanId="%016x" % i) for i in range(64)]
    burst = cores * period
    while True:
        t0 = time.monotonic()
        while time.monotonic() - t0 < burst:
            json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": batch}]}]})
        left = period - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)


if __name__ == "__main__":
    main()
