"""gpu_bench section accuracy: probe phase time vs the torch profiler's kernel sum and kernel
envelope over the same steps."""

from __future__ import annotations

import json
import os
import statistics
import tempfile

import gpu_common as gc
from gpu_bench_env import RESULTS, Env, log


def _kernel_events(trace_path: str) -> list[tuple[float, float]]:
    with open(trace_path, encoding="utf-8") as fh:
        data = json.load(fh)
    evs = []
    for e in data.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            evs.append((float(e["ts"]), float(e["dur"])))
    evs.sort()
    return evs


def section_accuracy(env: Env, rcv: gc.ReceiverProcess, names: list, cpu_us: float) -> dict:
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for name in names:
        sh = RESULTS["_shapes"][name]
        # Re-instrument a fresh probe: the loop's probe was shut down after its section.
        tag = sh.tags["probe"] + "_acc"
        cls = gc.make_variant(tag, sh._eager, sh.cuda_graph)
        probe = gc.make_probe(tag, {**rcv.env(), **gc.EVERY_STEP})
        s = cls(None, tp_rank=0)
        S = 20 if sh.ms < 5 else 8
        for _ in range(3):
            s.run_batch(sh.batch)
        env.sync()
        first = probe.recorder.step_count + 1
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(S):
                s.run_batch(sh.batch)
                gc.spin_us(cpu_us)
            env.sync()
        last = probe.recorder.step_count
        probe.pipeline.flush()
        trace = os.path.join(tempfile.gettempdir(), "acc_%s.json" % name)
        prof.export_chrome_trace(trace)
        kev = _kernel_events(trace)
        def mine(spans: list, tag=tag, first=first, last=last) -> list:
            return [x for x in spans if x["name"] != "sglang.step" and x["attributes"].get("sgl_probe.target", "").endswith(
                "Worker_%s.forward_batch_generation" % tag) and first <= x["attributes"]["sglang.step_index"] <= last]

        spans = mine(rcv.spans_when(lambda got: len(mine(got)) >= last - first + 1))
        spans.sort(key=lambda x: x["attributes"]["sglang.step_index"])
        probe_ms = [x["attributes"]["sgl_probe.duration_ms"] for x in spans]
        res = {"steps": S, "spans": len(spans), "kernels": len(kev)}
        if probe_ms and kev:
            ksum_total = sum(d for _, d in kev) / 1e3
            res["probe_ms_mean"] = sum(probe_ms) / len(probe_ms)
            res["kernel_sum_ms_mean"] = ksum_total / S
            res["probe_over_kernel_sum"] = res["probe_ms_mean"] / res["kernel_sum_ms_mean"]
            if len(kev) % S == 0 and len(probe_ms) == S:
                k = len(kev) // S
                env_ms, ks_ms = [], []
                for i in range(S):
                    chunk = kev[i * k:(i + 1) * k]
                    ks_ms.append(sum(d for _, d in chunk) / 1e3)
                    env_ms.append((chunk[-1][0] + chunk[-1][1] - chunk[0][0]) / 1e3)
                res["kernels_per_step"] = k
                res["per_step_probe_over_kernel_sum"] = [p / q for p, q in zip(probe_ms, ks_ms)]
                res["per_step_probe_over_envelope"] = [p / q for p, q in zip(probe_ms, env_ms)]
                res["probe_over_envelope_median"] = statistics.median(res["per_step_probe_over_envelope"])
                res["probe_over_kernel_sum_median"] = statistics.median(res["per_step_probe_over_kernel_sum"])
                res["envelope_ms_mean"] = sum(env_ms) / S
        out[name] = res
        probe.instrumentor.uninstrument()
        probe.pipeline.shutdown()
        log("accuracy %-24s %s" % (name, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()
                                         if not isinstance(v, list)}))
    return out
