"""Graph-capture safety of the probe, one case per process (a broken capture can poison a context).

    python3 benchmarks/gpu_capture_check.py CASE

Cases (each prints one JSON line):
  phase_in_capture                  a probed scheduler step (step + phase wrappers, CUDA timer) runs
                                    inside torch.cuda.graph capture, as SGLang's startup capture
                                    would call wrapped code: the capture stays valid, the replay gives
                                    the eager result, and the probe records nothing for those calls
  timing_event_in_capture_control   what the capture check prevents: a timing event recorded on the
                                    capturing stream breaks the capture
  drain_during_capture              the probe's drain thread queries events of an earlier step while
                                    the main thread captures (global mode): the capture stays valid
  drain_during_capture_unrelaxed_control
                                    the same with the drain thread's thread-local capture mode
                                    switched off: shows the hazard that setting avoids
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback

import gpu_common as gc


def small_workload(torch, H=2048, L=8):
    g = torch.Generator(device="cuda").manual_seed(7)
    Ws = [torch.randn(H, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(L)]
    x = torch.randn(4, H, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.zeros(4, H, device="cuda", dtype=torch.bfloat16)

    def eager():
        y = x
        for W in Ws:
            y = torch.nn.functional.silu(y @ W)
        out.copy_(y)

    return eager, out


def warm_on_side_stream(torch, fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


def case_phase_in_capture(torch) -> dict:
    eager, out = small_workload(torch)
    cls = gc.make_variant("cap", eager, None)
    probe = gc.make_probe("cap", {**gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "0.01", "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_TIMER": "cuda"})
    sched = cls(None, tp_rank=0)
    batch = gc.Batch(gc.ForwardMode.EXTEND, 4, extend_tokens=4)
    sched.run_batch(batch)  # an ordinary step first: the timer exists and has recorded events
    torch.cuda.synchronize()
    eager()
    torch.cuda.synchronize()
    want = out.clone()
    timer = probe.recorder.timer
    calls = {"stop": 0, "token": 0}
    real_stop = timer.stop

    def counting_stop(token, now):
        calls["stop"] += 1
        end = real_stop(token, now)
        calls["token"] += end is not None  # an end token: an event was recorded
        return end

    timer.stop = counting_stop
    steps_before = probe.recorder.step_count
    queued_before = len(probe.recorder.steps)
    warm_on_side_stream(torch, lambda: sched.run_batch(batch))
    time.sleep(0.1)  # the drain thread resolves the warm-up steps
    queued_before = len(probe.recorder.steps)
    calls.update(stop=0, token=0)
    out.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sched.run_batch(batch)  # step + phase wrappers inside the capture
    captured_calls = dict(calls)
    queued_after = len(probe.recorder.steps)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    replay_ok = bool(torch.equal(out, want))
    timer.stop = real_stop
    # The probe keeps working after the capture: an ordinary step is timed again.
    sched.run_batch(batch)
    torch.cuda.synchronize()
    time.sleep(0.1)
    n_after = probe.recorder.step_count - steps_before
    res = {"case": "phase_in_capture", "capture_ok": True, "replay_equals_eager": replay_ok,
           "timer_stop_calls_during_capture": captured_calls["stop"],
           "events_recorded_during_capture": captured_calls["token"],
           "steps_queued_by_capture": queued_after - queued_before, "steps_after": n_after}
    res["pass"] = replay_ok and captured_calls["stop"] >= 1 and captured_calls["token"] == 0 \
        and queued_after == queued_before
    probe.pipeline.shutdown()
    return res


def case_timing_event_in_capture_control(torch) -> dict:
    """What the probe's capture check avoids: timing events recorded while the stream captures.
    Depending on the driver the capture fails, or it succeeds and the events hold no usable
    time (they were never recorded on a running stream): a span built from them would be wrong."""
    eager, out = small_workload(torch)
    warm_on_side_stream(torch, eager)
    g = torch.cuda.CUDAGraph()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    res = {"case": "timing_event_in_capture_control"}
    try:
        with torch.cuda.graph(g):
            e0.record()
            eager()
            e1.record()
        res["capture_failed"] = False
    except Exception as exc:
        res.update(capture_failed=True, error=str(exc)[:300])
        return res
    try:
        g.replay()
        torch.cuda.synchronize()
        res["query_after_replay"] = bool(e1.query())
        res["elapsed_ms_after_replay"] = e0.elapsed_time(e1)
    except Exception as exc:
        res["events_unusable"] = str(exc)[:300]
    ref0, ref1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ref0.record()
    g.replay()
    ref1.record()
    torch.cuda.synchronize()
    res["replay_ms_measured_outside"] = ref0.elapsed_time(ref1)
    return res


def _long_gpu_work(torch, ms_target=300.0):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        a @ b
    e1.record()
    torch.cuda.synchronize()
    per = e0.elapsed_time(e1) / 10
    n = max(1, int(ms_target / max(per, 1e-3)))

    def work():
        for _ in range(n):
            a @ b
    return work


def case_drain_during_capture(torch, relax: bool) -> dict:
    name = "drain_during_capture" + ("" if relax else "_unrelaxed_control")
    long_work = _long_gpu_work(torch)
    cls = gc.make_variant("drn", long_work, None)
    probe = gc.make_probe("drn", {**gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "0.002", "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_TIMER": "cuda"})
    sched = cls(None, tp_rank=0)
    from sgl_probe.timing import CudaTimer

    probe.recorder.timer = timer = CudaTimer(torch)  # before any step: the drain thread reads the flag once
    timer.relax_capture_mode = relax
    batch = gc.Batch(gc.ForwardMode.EXTEND, 1, extend_tokens=1)
    eager, out = small_workload(torch)
    warm_on_side_stream(torch, eager)
    eager()
    torch.cuda.synchronize()
    want = out.clone()
    sched.run_batch(batch)
    torch.cuda.synchronize()
    time.sleep(0.05)  # resolved by the drain thread, which has now set its capture mode (or not)
    queries: list = []
    # Every readiness query of an end event goes through _done (the drain asks ready_prefix,
    # which asks _done; ready asks it too): logged here, on whichever thread makes it.
    real_done = timer._done

    def logging_done(end):
        t0 = time.perf_counter()
        try:
            r = real_done(end)
        except Exception as exc:
            queries.append((t0, threading.get_ident(), "raised: %s" % str(exc)[:120]))
            raise
        queries.append((t0, threading.get_ident(), r))
        return r

    timer._done = logging_done
    sched.run_batch(batch)  # ~300 ms of GPU work: its end event stays pending through the capture
    time.sleep(0.03)  # the drain thread has begun polling it
    g = torch.cuda.CUDAGraph()
    error = None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # Not torch.cuda.graph(): its __enter__ synchronizes the device, which would let the long
    # step finish (and be resolved) before the capture begins. capture_begin() is what it wraps.
    t_cap0 = time.perf_counter()
    try:
        with torch.cuda.stream(side):
            g.capture_begin(capture_error_mode="global")
            try:
                eager()
                time.sleep(0.08)  # a slow capture: the drain thread polls ~40 times meanwhile
                eager()
            finally:
                g.capture_end()
    except Exception as exc:
        error = str(exc)[:400]
    t_cap1 = time.perf_counter()
    torch.cuda.current_stream().wait_stream(side)
    during = [q for q in queries if t_cap0 <= q[0] <= t_cap1]
    res = {"case": name, "relax_capture_mode": relax, "capture_ok": error is None, "capture_error": error,
           "drain_queries_during_capture": len(during),
           "drain_query_results_during_capture": sorted({str(q[2]) for q in during}),
           "queries_from_drain_thread": len({q[1] for q in during} - {threading.get_ident()}) > 0}
    if error is None:
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        res["replay_equals_eager"] = bool(torch.equal(out, want))
    try:
        torch.cuda.synchronize()
        time.sleep(0.1)
        res["long_step_resolved"] = len(probe.recorder.steps) == 0
    except Exception as exc:
        res["after_error"] = str(exc)[:200]
    if relax:
        res["pass"] = error is None and res.get("replay_equals_eager") is True and len(during) > 0
    else:
        res["hazard_shown"] = error is not None and len(during) > 0
    del timer._done
    probe.pipeline.shutdown(timeout_s=1.0)
    return res


def main() -> None:
    import torch

    case = sys.argv[1]
    if not torch.cuda.is_available():
        print(json.dumps({"case": case, "skipped": "no CUDA"}))
        return
    try:
        if case == "phase_in_capture":
            res = case_phase_in_capture(torch)
        elif case == "timing_event_in_capture_control":
            res = case_timing_event_in_capture_control(torch)
        elif case == "drain_during_capture":
            res = case_drain_during_capture(torch, relax=True)
        elif case == "drain_during_capture_unrelaxed_control":
            res = case_drain_during_capture(torch, relax=False)
        else:
            raise SystemExit("unknown case %r" % case)
    except Exception:
        res = {"case": case, "error": traceback.format_exc()[-2000:]}
    print(json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
