"""A real OTLP receiver in its own process (as a collector would be), for the GPU benchmarks.

    python3 benchmarks/gpu_receiver.py SPANS.jsonl

Prints its gRPC endpoint on the first stdout line, then appends one JSON line per received span
(name, ids, times, attributes, resource) to SPANS.jsonl until stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sgl_probe.testing.receiver import OTLPReceiver  # noqa: E402


class FileReceiver(OTLPReceiver):
    """Writes what the receiver took in every half second and forgets it (``take``), so memory
    stays flat however long the run."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._fh = open(path, "a", encoding="utf-8")
        self._done = threading.Event()
        self.count = 0
        self._writer = threading.Thread(target=self._write_loop, name="receiver-writer", daemon=True)

    def _keep_payload(self, body: bytes) -> None:
        pass  # no need to keep raw bytes for hours of spans

    def start(self) -> "FileReceiver":
        super().start()
        self._writer.start()
        return self

    def _write_loop(self) -> None:
        while not self._done.wait(0.5):
            self.write_out()
        self.write_out()

    def write_out(self) -> None:
        spans = self.take()
        if not spans:
            return
        self._fh.write("".join(json.dumps({
            "name": s.name, "trace_id": s.trace_id, "span_id": s.span_id,
            "parent": s.parent_span_id, "start_ns": s.start_ns, "end_ns": s.end_ns,
            "attributes": s.attributes, "pid": s.resource.get("process.pid"),
            "service": s.resource.get("service.name"), "status": s.status_code,
        }, separators=(",", ":")) + "\n" for s in spans))
        self._fh.flush()
        self.count += len(spans)

    def stop(self) -> None:
        super().stop()
        self._done.set()
        self._writer.join(30)


def main() -> None:
    rcv = FileReceiver(sys.argv[1]).start()
    print(rcv.grpc_endpoint, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    rcv.stop()


if __name__ == "__main__":
    main()
