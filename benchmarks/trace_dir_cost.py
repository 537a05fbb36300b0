"""CPU per span of writing the trace dir, side by side: protobuf's ``MessageToDict`` and
``json.dumps`` (the writer before ``sgl_probe.otlp_json``) against ``otlp_json.to_json``, on the
spans the probe builds for decode steps (``spans.build_step_spans``: a step span and its decode
span, the attributes a real CUDA-graph decode carries). Both start from the same ``encode_spans``
message, a new batch every round (the first rounds include otlp_json's first use of each message
type); the SDK's encoding, which both writers pay, is timed too. The two alternate which goes
first; prints one JSON object with the median µs per span (process CPU time) of each part and the
median ratio.

    python3 benchmarks/trace_dir_cost.py [--rounds 31] [--steps 256]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

from sgl_probe import otlp_json, sinks, spans  # noqa: E402
from sgl_probe.resolved import ResolvedPhase, ResolvedStep  # noqa: E402

IDENT = {"tp_rank": 0, "dp_rank": 0, "pp_rank": 0}


def workload(n: int, seed: int = 0) -> list:
    resource = sinks.make_resource(IDENT, "bench-run", "0.5.23", pid=1)
    out = []
    t = 1_796_195_417_000_000_000
    rng = random.Random(seed)
    for i in range(n):
        # Every step's times differ, as measured ones do (no two durations alike).
        gpu_ns = 19_500_000 + rng.randrange(-200_000, 200_000)
        ph = ResolvedPhase("decode", t, t + gpu_ns, True, "DECODE", 8, 8, rng.uniform(0.9, 1.3),
                           "sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation",
                           start_kind="gpu_event", graph_ms=gpu_ns / 1e6 - rng.uniform(0, 0.2))
        step = ResolvedStep(i, t - 1_000_000, t + gpu_ns, "DECODE", 8, 8, rng.uniform(1.8, 2.4), "cuda", (ph,))
        out += spans.build_step_spans(step, "bench-run", IDENT, {}, resource)
        t += gpu_ns + rng.randrange(0, 300_000)
    return out


def per_span_us(fn, arg, n_spans: int) -> float:
    t0 = time.process_time()
    fn(arg)
    return (time.process_time() - t0) / n_spans * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--steps", type=int, default=256, help="decode steps per batch (2 spans each)")
    args = ap.parse_args(argv)
    batch = workload(args.steps)
    msg = encode_spans(batch)
    if otlp_json.via_message_to_dict(msg) != otlp_json.to_json(msg):
        print(json.dumps({"error": "the two writers disagree"}))
        return 1
    parts: dict = {"encode_spans": [], "message_to_dict_and_dumps": [], "otlp_json": []}
    for i in range(args.rounds):
        # A new batch every round: steps' times never repeat, so otlp_json's attribute cache
        # only ever serves what really repeats between steps.
        batch = workload(args.steps, seed=i + 1)
        parts["encode_spans"].append(per_span_us(encode_spans, batch, len(batch)))
        msg = encode_spans(batch)
        order = (("message_to_dict_and_dumps", otlp_json.via_message_to_dict), ("otlp_json", otlp_json.to_json))
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            parts[name].append(per_span_us(fn, msg, len(batch)))
    med = {k: statistics.median(v) for k, v in parts.items()}
    ratios = sorted(a / b for a, b in zip(parts["message_to_dict_and_dumps"], parts["otlp_json"]) if b)
    out = {"spans_per_batch": len(batch), "rounds": args.rounds,
           "us_per_span_median": {k: round(v, 2) for k, v in med.items()},
           "conversion_ratio_before_over_otlp_json": round(statistics.median(ratios), 3),
           "trace_dir_us_per_span": {
               "before": round(med["encode_spans"] + med["message_to_dict_and_dumps"], 2),
               "after": round(med["encode_spans"] + med["otlp_json"], 2)}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
