"""How far CUDA event time and the host clock drift apart, and how well an idle-stream anchor maps
one onto the other: the numbers behind the timer's host-clock phase starts.

    python3 benchmarks/gpu_clock.py [--out DIR]

When the stream is idle at a phase's start, the probe takes the start from the host clock
(``perf_counter_ns``) and records only the end event; the end's host time comes from an anchor
(an event recorded on an idle stream, paired with ``perf_counter_ns``) plus
``elapsed_time(anchor, end)``. That is exact only if the two clocks run at the same rate and the
anchor's pairing is tight. This script measures both on the GPU machine:

  drift    anchor A at t0, a second idle-stream event B after a gap of 10 ms .. 4 s:
           (elapsed_time(A, B) - host gap) per gap, in µs and ppm
  pairing  back-to-back idle-stream anchors: spread of (elapsed - host gap) at ~0 gap, i.e. the
           error of one anchor pairing
  phase    a launch-bound eager phase timed both ways in the same call: start event + end event
           (today's design) vs host start + end event mapped through an anchor of a given age
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

perf = time.perf_counter_ns


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    cuda = torch.cuda
    E = lambda: cuda.Event(enable_timing=True)  # noqa: E731
    cuda.synchronize()

    def anchor():
        cuda.synchronize()
        ev = E()
        ev.record()
        return ev, perf()

    res: dict = {"drift": [], "pairing_us": [], "phase": []}
    for gap in (0.01, 0.2, 1.0, 4.0):
        for _ in range(args.reps):
            a, ha = anchor()
            time.sleep(gap)
            b, hb = anchor()
            cuda.synchronize()
            d_us = a.elapsed_time(b) * 1e3 - (hb - ha) / 1e3
            res["drift"].append({"gap_s": gap, "gpu_minus_host_us": d_us,
                                 "ppm": d_us / ((hb - ha) / 1e3) * 1e6})
    for _ in range(200):
        a, ha = anchor()
        b, hb = anchor()
        cuda.synchronize()
        res["pairing_us"].append(a.elapsed_time(b) * 1e3 - (hb - ha) / 1e3)

    H, L = 1024, 64
    Ws = [torch.randn(H, H, device="cuda", dtype=torch.bfloat16) * 0.01 for _ in range(L)]
    x = torch.randn(8, H, device="cuda", dtype=torch.bfloat16)

    def work():
        y = x
        for W in Ws:
            y = torch.nn.functional.silu(y @ W) * 0.5 + 0.1
        return y

    for _ in range(5):
        work()
    for age in (0.0, 0.05, 1.0):
        for _ in range(args.reps * 4):
            a, ha = anchor()
            time.sleep(age)
            cuda.synchronize()
            h0 = perf()
            s = E()
            s.record()
            work()
            e = E()
            e.record()
            cuda.synchronize()
            two_events_us = s.elapsed_time(e) * 1e3
            host_start_us = (ha + a.elapsed_time(e) * 1e6 - h0) / 1e3
            res["phase"].append({"anchor_age_s": age, "two_events_us": two_events_us,
                                 "host_start_us": host_start_us,
                                 "diff_us": host_start_us - two_events_us})

    summary = {"device": cuda.get_device_name(0), "torch": torch.__version__}
    by_gap: dict = {}
    for r in res["drift"]:
        by_gap.setdefault(r["gap_s"], []).append(r)
    summary["drift"] = {str(g): {"median_us": statistics.median(x["gpu_minus_host_us"] for x in rs),
                                 "median_ppm": statistics.median(x["ppm"] for x in rs),
                                 "min_us": min(x["gpu_minus_host_us"] for x in rs),
                                 "max_us": max(x["gpu_minus_host_us"] for x in rs)}
                        for g, rs in by_gap.items()}
    p = sorted(res["pairing_us"])
    summary["pairing_us"] = {"median": statistics.median(p), "p5": p[len(p) // 20], "p95": p[-len(p) // 20]}
    by_age: dict = {}
    for r in res["phase"]:
        by_age.setdefault(r["anchor_age_s"], []).append(r)
    summary["phase"] = {str(a): {"two_events_us": statistics.median(x["two_events_us"] for x in rs),
                                 "host_start_us": statistics.median(x["host_start_us"] for x in rs),
                                 "diff_us_median": statistics.median(x["diff_us"] for x in rs),
                                 "diff_us_min": min(x["diff_us"] for x in rs),
                                 "diff_us_max": max(x["diff_us"] for x in rs)}
                        for a, rs in by_age.items()}
    print(json.dumps(summary, indent=1))
    with open(os.path.join(args.out, "gpu_clock.json"), "w") as fh:
        json.dump({"summary": summary, "raw": res}, fh, indent=1)


if __name__ == "__main__":
    main()
