"""Can a CUDA graph time itself? A feasibility check for GPU-written step timestamps (an
experiment on the GPU machine; the probe does not do this).

    python3 benchmarks/gpu_graph_timestamp.py [--replays N] [--blocks B] [--out DIR]

The probe times a graph replay with a CUDA event recorded after it: one driver call on SGLang's
scheduler thread per step (~3 µs on the lent H100 hosts, ~0.2 % of the tiny server's step,
BENCHMARKS.md). Here the graph writes its own timestamp: a one-thread kernel, compiled from PTX by
the driver (no compiler needed), captured as the graph's last node, writes the GPU's global timer
into a ring in mapped host memory at the slot a device-side counter gives it, and advances the
counter. Each replay of the graph then leaves its end time where the host reads it with no CUDA
call, in replay order.

Prints one JSON object (and writes ``gpu_graph_timestamp.json`` under ``--out``):

- ``accuracy``: back-to-back replays of the self-timing graph, each also followed by a CUDA
  event: the interval between two replays' ends by the ring against the events' elapsed time
  (median ratio, absolute differences in µs);
- ``order``: the counter equals the replays and every slot was written once, in order;
- ``host_us_per_replay``: the calling thread's CPU per replay, medians over alternating blocks:
  the plain graph, the plain graph plus an event record (the probe's way, through ``ctypes``),
  the plain graph plus a cheap driver call (``ctypes``' own share), the self-timing graph, and the
  plain graph followed by the timestamp kernel launched eagerly (what an eager step, with no
  graph to carry it, would pay instead of the event record).

Where the driver or the capture refuses the timestamp kernel, ``stamp_error`` says how and the
event record's cost is still measured. Without CUDA it prints ``{"skipped": ...}``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from typing import Any, Sequence

from gpu_capture_check import small_workload, warm_on_side_stream

#: sglp_stamp(ring, counter, mask): ring[atomicAdd(counter, 1) & mask] = %globaltimer (ns).
#: PTX 7.0 for sm_70 and later: the driver compiles it for the GPU it runs on.
PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry sglp_stamp(
    .param .u64 ring,
    .param .u64 counter,
    .param .u32 mask
)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [ring];
    ld.param.u64 %rd2, [counter];
    ld.param.u32 %r1, [mask];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mov.u64 %rd5, %globaltimer;
    atom.global.add.u32 %r2, [%rd4], 1;
    and.b32 %r3, %r2, %r1;
    mul.wide.u32 %rd6, %r3, 8;
    add.s64 %rd7, %rd3, %rd6;
    st.volatile.global.u64 [%rd7], %rd5;
    membar.sys;
    ret;
}
"""

CU_MEMHOSTALLOC_DEVICEMAP = 0x02


def interval_agreement(ring_ns: Sequence[int], event_ms: Sequence[float]) -> dict:
    """``ring_ns``: N replays' end times by the ring; ``event_ms``: the N-1 events' elapsed times
    between consecutive replays' ends. The ring's intervals against the events'."""
    if len(ring_ns) != len(event_ms) + 1 or len(event_ms) < 1:
        raise ValueError("need N ring times and N-1 event intervals")
    ring_us = [(b - a) / 1e3 for a, b in zip(ring_ns, ring_ns[1:])]
    event_us = [ms * 1e3 for ms in event_ms]
    ratios = [r / e for r, e in zip(ring_us, event_us) if e > 0]
    diffs = sorted(abs(r - e) for r, e in zip(ring_us, event_us))
    return {"intervals": len(event_us), "median_interval_us": statistics.median(event_us),
            "ring_over_event_median": statistics.median(ratios) if ratios else None,
            "abs_diff_us_p50": diffs[len(diffs) // 2], "abs_diff_us_p99": diffs[min(len(diffs) - 1, int(len(diffs) * 0.99))],
            "abs_diff_us_max": diffs[-1]}


def ring_in_order(ring: Sequence[int], start: int, n: int, mask: int) -> dict:
    """The ``n`` slots from ``start`` (mod ``mask + 1``) all written (non-zero) and non-decreasing."""
    got = [ring[(start + i) & mask] for i in range(n)]
    unwritten = sum(1 for v in got if v == 0)
    backwards = sum(1 for a, b in zip(got, got[1:]) if b < a)
    return {"slots": n, "unwritten": unwritten, "backwards": backwards, "ok": unwritten == 0 and backwards == 0}


class Driver:
    """The few CUDA driver calls the experiment makes, through ctypes on torch's context."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        vp, u = ctypes.c_void_p, ctypes.c_uint
        self.lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        self.lib.cuEventRecord.argtypes = [vp, vp]
        self.lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: CUresult {rc}")

    def function(self, ptx: str, name: bytes) -> ctypes.c_void_p:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(ptx.encode())), "cuModuleLoadData")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, ctypes.c_char_p(name)), "cuModuleGetFunction")
        return fn

    def mapped_ring(self, slots: int) -> tuple:
        """(host array of ``slots`` u64, zeroed; its device address)."""
        host, dev = ctypes.c_void_p(), ctypes.c_uint64()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(slots * 8),
                                           ctypes.c_uint(CU_MEMHOSTALLOC_DEVICEMAP)), "cuMemHostAlloc")
        self.check(self.lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), host, ctypes.c_uint(0)),
                   "cuMemHostGetDevicePointer")
        ring = (ctypes.c_uint64 * slots).from_address(host.value)
        ctypes.memset(host.value, 0, slots * 8)
        return ring, dev.value


def capture(torch, step, stamp=None):
    """``step`` warmed up, then captured; ``stamp`` (given the capturing stream) as the last node."""
    warm_on_side_stream(torch, step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        if stamp is not None:
            stamp(torch.cuda.current_stream().cuda_stream)  # captured: the graph's last node
    torch.cuda.synchronize()
    return graph


def host_cost(torch, ways: dict, blocks: int, block: int) -> dict:
    """Median µs of the calling thread's CPU per replay for each way (a function running ``block``
    replays), the ways taking turns block by block; the first round warms each one up."""
    cpu: dict = {k: [] for k in ways}
    for b in range(blocks + 1):
        for name, fn in ways.items():
            torch.cuda.synchronize()
            t0 = time.thread_time_ns()
            fn()
            t1 = time.thread_time_ns()
            torch.cuda.synchronize()
            if b:
                cpu[name].append((t1 - t0) / block / 1e3)
    return {k: statistics.median(v) for k, v in cpu.items()}


def run(replays: int, blocks: int, block: int, hidden: int, layers: int) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    torch.zeros(1, device="cuda")  # torch's primary context, current on this thread
    drv = Driver()
    step, _ = small_workload(torch, hidden, layers)
    plain = capture(torch, step)
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "replays": replays}
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(block)]
    for ev in pool:
        ev.record()  # torch makes an event at its first record
    handles = [ctypes.c_void_p(ev.cuda_event) for ev in pool]
    ctx = ctypes.c_void_p()
    record, get_ctx = drv.lib.cuEventRecord, drv.lib.cuCtxGetCurrent

    def plain_only() -> None:
        for _ in range(block):
            plain.replay()

    def plain_event() -> None:
        for h in handles:
            plain.replay()
            record(h, stream)

    def plain_call() -> None:
        for _ in range(block):
            plain.replay()
            get_ctx(ctypes.byref(ctx))

    ways = {"graph": plain_only, "graph_event_record": plain_event, "graph_cheap_driver_call": plain_call}
    # The self-timing graph, in its own part: where the driver or the capture refuses it, the
    # event record's cost above is still measured and the refusal is reported.
    try:
        fn = drv.function(PTX, b"sglp_stamp")
        slots = 1 << 16
        ring, ring_dev = drv.mapped_ring(slots)
        counter = torch.zeros(1, dtype=torch.int32, device="cuda")
        args = (ctypes.c_uint64(ring_dev), ctypes.c_uint64(counter.data_ptr()), ctypes.c_uint32(slots - 1))
        params = (ctypes.c_void_p * 3)(*[ctypes.addressof(a) for a in args])

        def stamp(raw_stream: Any) -> None:
            drv.check(drv.lib.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, raw_stream, params, None), "cuLaunchKernel")

        timed = capture(torch, step, lambda s: stamp(ctypes.c_void_p(s)))
        out["counter_after_capture"] = int(counter.item())  # capturing launches nothing

        # Accuracy and order: back-to-back replays, an event after each.
        counter.zero_()
        ctypes.memset(ctypes.addressof(ring), 0, slots * 8)
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for ev in events:
            timed.replay()
            ev.record()
        torch.cuda.synchronize()
        out["order"] = {"counter": int(counter.item()), **ring_in_order(ring, 0, replays, slots - 1)}
        ring_ns = [ring[i] for i in range(replays)]
        out["accuracy"] = interval_agreement(ring_ns, [a.elapsed_time(b) for a, b in zip(events, events[1:])])

        def self_timed() -> None:
            for _ in range(block):
                timed.replay()

        def plain_then_stamp() -> None:  # the kernel launched eagerly instead: an eager step's way
            for _ in range(block):
                plain.replay()
                stamp(stream)

        ways.update(graph_self_timed=self_timed, graph_then_stamp_launch=plain_then_stamp)
    except Exception as exc:  # the experiment's answer, not a crash
        out["stamp_error"] = repr(exc)
    med = host_cost(torch, ways, blocks, block)
    out["host_us_per_replay"] = med
    out["event_record_us"] = med["graph_event_record"] - med["graph_cheap_driver_call"]
    if "graph_self_timed" in med:
        out["self_timed_extra_us"] = med["graph_self_timed"] - med["graph"]
        out["stamp_launch_us"] = med["graph_then_stamp_launch"] - med["graph_cheap_driver_call"]
    return out


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--block", type=int, default=64, help="replays per timed block")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    try:
        out = run(a.replays, a.blocks, a.block, a.hidden, a.layers)
    except ImportError:
        out = {"skipped": "no torch"}
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gpu_graph_timestamp.json"), "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
