"""gpu_bench section syncdebug: no host sync from the probe, under torch's sync debug mode, spies
on every synchronize/wait entry point, and a host running ahead of a busy GPU."""

from __future__ import annotations

import logging
import time

import gpu_common as gc
from gpu_bench_env import RESULTS, Env, log


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record) -> None:
        self.records.append(record.getMessage())


class _SyncSpy:
    """Counts every Python-visible host-sync entry point, from any thread, while installed."""

    def __init__(self, t) -> None:
        import threading

        self.t, self.calls, self._saved, self._lock = t, [], [], threading.Lock()
        targets = [(t.cuda, "synchronize"), (t._C, "_cuda_synchronize"), (t.cuda.Event, "synchronize"),
                   (t.cuda.Event, "wait"), (t.cuda.Stream, "synchronize"), (t.cuda.Stream, "wait_event"),
                   (t.cuda.Stream, "wait_stream")]
        for owner, name in targets:
            orig = getattr(owner, name, None)
            if orig is None:
                continue
            self._saved.append((owner, name, orig))
            setattr(owner, name, self._spy(name, orig))

    def _spy(self, name, orig):
        import threading

        def spy(*a, **k):
            with self._lock:
                self.calls.append((name, threading.current_thread().name))
            return orig(*a, **k)
        return spy

    def remove(self) -> None:
        for owner, name, orig in self._saved:
            setattr(owner, name, orig)


def section_syncdebug(env: Env, rcv: gc.ReceiverProcess, cpu_us: float, steps: int) -> dict:
    """No host sync, three ways: (1) torch's sync debug mode set to "error" for a probed loop (its
    drain thread resolving and exporting meanwhile), with a positive control proving the detector
    is live; (2) spies on every Python-level synchronize/wait entry point, from any thread;
    (3) the host runs ahead: a probed step queues ~1 s of GPU work and returns at once, more
    probed steps follow, and the drain thread keeps polling (query() == False) while the GPU is
    still busy, so nothing in the probe, on any thread, waited for the GPU."""
    t = env.torch
    sh = RESULTS["_shapes"]["eager_launchbound_2ms"]
    tag = "syncdbg"
    cls = gc.make_variant(tag, sh._eager, None)
    probe = gc.make_probe(tag, {**rcv.env(), **gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "0.05"})
    handler = _Collect()
    logging.getLogger("sgl_probe").addHandler(handler)
    s = cls(None, tp_rank=0)
    batch = gc.Batch(gc.ForwardMode.TARGET_VERIFY, 3)
    for _ in range(5):
        s.run_batch(batch)
    env.sync()
    probe.pipeline.flush()
    first = probe.recorder.step_count + 1
    res: dict = {"steps": steps}
    # (1) + (2)
    spy = _SyncSpy(t)
    error = None
    t.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            s.run_batch(batch)
            gc.spin_us(cpu_us)
        time.sleep(0.5)  # the drain thread resolves (query/elapsed_time) inside the error window
    except Exception as exc:
        error = repr(exc)
    finally:
        t.cuda.set_sync_debug_mode(0)
        spy.remove()
    res["probe_loop_error"] = error
    res["sync_calls_seen_by_spies"] = spy.calls[:20]
    # Positive controls: the detector is live (a D2H copy is caught); whether it also sees
    # torch.cuda.synchronize() is recorded, not assumed (it is a prototype feature).
    x = t.ones(4, device="cuda")
    for name, fn in (("item", lambda: x.sum().item()), ("cuda_synchronize", t.cuda.synchronize)):
        t.cuda.set_sync_debug_mode("error")
        try:
            fn()
            res["detector_caught_" + name] = False
        except Exception as exc:
            res["detector_caught_" + name] = True
            res["detector_message_" + name] = str(exc)[:160]
        finally:
            t.cuda.set_sync_debug_mode(0)
    env.sync()
    probe.pipeline.flush()
    last = probe.recorder.step_count
    def verifies(spans: list) -> list:
        return [x for x in spans if x["name"] == "sglang.verify" and
                x["attributes"].get("sgl_probe.target", "").endswith("Worker_%s.forward_batch_generation" % tag)
                and first <= x["attributes"]["sglang.step_index"] <= last]

    got = verifies(rcv.spans_when(lambda spans: len(verifies(spans)) >= last - first + 1))
    res["verify_spans_exported"] = len(got)
    res["probe_log_lines_during_run"] = handler.records[:20]
    logging.getLogger("sgl_probe").removeHandler(handler)
    # (3) the host runs ahead of a busy GPU with the probe on
    # Few, long kernels: ~1 s of GPU work in well under the launch queue's depth, so the host
    # is never held back by a full queue (that is backpressure, not a sync).
    a = t.randn(16384, 16384, device="cuda", dtype=t.bfloat16)
    bm = t.randn(16384, 16384, device="cuda", dtype=t.bfloat16)
    per = env.step_ms(lambda: a @ bm, n=5)
    reps = max(1, int(1000.0 / max(per, 1e-3)))

    def long_work():
        for _ in range(reps):
            a @ bm

    cls_long = gc.make_variant(tag + "_long", long_work, None)
    p_long = gc.make_probe(tag + "_long", {**gc.EVERY_STEP, "SGL_PROBE_DRAIN_S": "0.02", "SGL_PROBE_SUMMARY_S": "0"})
    s_long = cls_long(None, tp_rank=0)
    s_long.run_batch(gc.Batch(gc.ForwardMode.EXTEND, 1, extend_tokens=1))  # timer + warm-up
    env.sync()
    time.sleep(0.1)
    timer = p_long.recorder.timer
    polls = []
    # Every readiness query of an end event goes through _done (the drain asks ready_prefix).
    real_done = timer._done

    def counting_done(end):
        r = real_done(end)
        polls.append((time.perf_counter(), r))
        return r

    timer._done = counting_done
    marker = t.cuda.Event()
    h0 = time.perf_counter()
    s_long.run_batch(gc.Batch(gc.ForwardMode.EXTEND, 1, extend_tokens=1))  # queues ~1 s of GPU work
    h1 = time.perf_counter()
    for _ in range(10):
        s_long.run_batch(gc.Batch(gc.ForwardMode.DECODE, 1))  # probed steps behind it (no GPU work)
    marker.record()
    time.sleep(0.3)
    h2 = time.perf_counter()
    busy_after = not marker.query()
    polls_busy = [r for (ts, r) in polls if h1 <= ts <= h2]
    env.sync()
    del timer._done
    res["host_ahead"] = {
        "gpu_work_ms_queued": per * reps, "probed_call_host_ms": (h1 - h0) * 1e3,
        "gpu_still_busy_after_s": round(h2 - h0, 3), "gpu_was_still_busy": busy_after,
        "drain_polls_while_busy": len(polls_busy), "drain_poll_results_while_busy": sorted({str(r) for r in polls_busy}),
    }
    p_long.instrumentor.uninstrument()
    p_long.pipeline.shutdown()
    ha = res["host_ahead"]
    # The host finished the probed steps (and slept) while the GPU was still busy: nothing on the
    # main thread waited for it; the drain thread kept returning from query() == False meanwhile.
    res["no_host_sync"] = (error is None and len(got) == steps and not handler.records and not spy.calls
                           and res["detector_caught_item"] is True and ha["gpu_was_still_busy"]
                           and ha["drain_polls_while_busy"] >= 3 and ha["drain_poll_results_while_busy"] == ["False"])
    probe.instrumentor.uninstrument()
    probe.pipeline.shutdown()
    log("syncdebug %s" % {k: v for k, v in res.items() if k != "probe_log_lines_during_run"})
    return res
