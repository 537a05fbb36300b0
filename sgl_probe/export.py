"""Off the hot path: the drain thread resolves finished records, feeds the summary line (and
anything else that watches every step), samples, and hands the kept steps to a sink.

With no OTLP endpoint and no ``SGL_PROBE_TRACE_DIR`` there is no sink: nothing is built or sent,
the summary line still counts every step. The sink never blocks the drain thread: what does not
fit is dropped and counted (``dropped=`` on the summary line).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any, Optional

from sgl_probe import metrics_setup, sinks, wire
from sgl_probe.contract import ENV_SPAN
from sgl_probe.drain import take_ready
from sgl_probe.drop_hints import DropHints
from sgl_probe.exporter_process import ProcessSink
from sgl_probe.resolved import ResolvedStep, from_row
from sgl_probe.sampling import StepSampling
from sgl_probe.summary import Summary

log = logging.getLogger("sgl_probe")

#: Steps resolved (and summarised, and sampled) at a time. Each chunk costs a few Python calls and
#: resumes on caches the scheduler's launches emptied; 128 keeps that per-step share small while
#: a chunk stays near the yield budget below on a slow host (~4-6 µs a step).
CHUNK = 128
#: Drain work between two GIL hand-overs. A pass over a second's backlog takes milliseconds, and a
#: scheduler thread that wants the GIL would otherwise wait for all of it (up to the 5 ms switch
#: interval). Each hand-over costs too: the scheduler takes the GIL and this thread waits for
#: it again (up to the switch interval), then resumes on cold caches (~100 µs of its CPU per
#: hand-over on a launch-bound loop, ``benchmarks/gpu_bench_drainprof.py``), so a time budget:
#: a hold stays near 0.5 ms on a slow host and a fast one does not hand over more often.
YIELD_AFTER_NS = 500_000
#: A real sleep: ``sleep(0)`` releases the GIL but this thread, still on its CPU, usually takes it
#: back before the woken scheduler thread can.
YIELD_S = 50e-6
#: Room a packed message keeps for the step that fills it and its strings' table: the message is
#: full once its rows hold the link's largest message less this (the take stops before the next
#: step), so it stays under that size.
PACKED_ROOM = 4096


def packed_limit(sink: Any) -> int:
    """The bytes of rows that make the packed pass's message full, for ``sink``'s link (its
    ``max_message``; ``wire.MAX_MESSAGE`` for a sink without one)."""
    return max(PACKED_ROOM, getattr(sink, "max_message", wire.MAX_MESSAGE) - PACKED_ROOM)


def packed_due(packed: Any, reads_ahead: bool = False) -> bool:
    """Whether the drain's packed pass sends its message now: full (the take stopped before the
    step that would not fit; the next take goes on from it into the next message), or, where the
    take reads a chunk's GPU times ahead (``reads_ahead``: the CUDA timer without
    ``elapsed_keeps_gil``), before the next chunk might not fit (a take stopping at the limit would
    read the rest's again for the next message). Not before: each send is a few Python calls and
    three system calls, each of which hands the GIL to a scheduler thread that wants it, and this
    thread then waits to get it back."""
    return packed.full or (reads_ahead and packed.nbytes + CHUNK * packed.nbytes // max(1, packed.rows) > packed.max_bytes)


class InProcessSink:
    """Spans built and exported in the server's own process, the design before the exporter
    process: only ``Pipeline(in_process=True)`` runs it, for ``benchmarks/export_cpu.py`` to
    measure it beside the exporter process. A server whose exporter process cannot start gives
    export up (counted), it does not fall back to this."""

    def __init__(self, cfg, run_id: str, ident: dict, spec: dict, sglang_version: Optional[str]) -> None:
        self.run_id, self.ident, self.spec, self.version = run_id, ident, spec, sglang_version
        self.spans = sinks.SpanSink(cfg.trace_dir, os.getpid())
        self._resource = None
        self._resource_key = None

    def _res(self) -> Any:
        key = tuple(sorted(self.ident.items()))
        if key != self._resource_key:  # the ranks arrive after the first env snapshot may
            self._resource = sinks.make_resource(self.ident, self.run_id, self.version)
            self._resource_key = key
        return self._resource

    def send_steps(self, steps: list[tuple], kept_slow: list[bool]) -> None:
        self.spans.steps([from_row(st) for st in steps], self.run_id, self.ident, self.spec, self._res(), kept_slow)

    def send_env(self, attrs: dict, when_ns: int, name: str) -> None:
        from sgl_probe.spans import build_env_span

        self.spans.offer([build_env_span(attrs, when_ns, self.run_id, self.ident, self._res(), name)])

    @property
    def dropped(self) -> int:
        return self.spans.dropped

    @property
    def dropped_by(self) -> dict[str, int]:
        return self.spans.dropped_by

    def flush(self, timeout_s: float) -> None:
        self.spans.flush(timeout_s)

    def shutdown(self, timeout_s: float) -> None:
        self.spans.shutdown()

    def poll(self) -> None:
        pass

    backlogged = False


def exporting(cfg) -> bool:
    """Whether spans go anywhere (an OTLP endpoint or a trace dir)."""
    return bool(cfg.trace_dir) or sinks.otlp_configured()


class Pipeline:
    """Drains the recorder on one daemon thread. ``in_process`` builds and exports the spans in
    this process instead of the exporter process (for comparison in benchmarks)."""

    def __init__(self, recorder, cfg, run_id: str, ident: dict, sglang_version: Optional[str],
                 in_process: bool = False) -> None:
        self.recorder = recorder
        self.cfg = cfg
        self.run_id = run_id
        self.ident = ident
        self.summary = Summary(cfg.summary_s, ident, getattr(recorder, "c", None))
        self.sampling = StepSampling(run_id, ident, fast=getattr(recorder, "c", None))
        self.sink: Any = None
        if exporting(cfg):
            kind = InProcessSink if in_process else ProcessSink
            self.sink = kind(cfg, run_id, ident, recorder.spec, sglang_version)
            if not in_process:
                self.sink.pack = getattr(getattr(recorder, "c", None), "pack_steps", None)
        self.metrics = metrics_setup.phase_metrics(
            ident, sinks.make_resource(ident, run_id, sglang_version), cfg.metrics, fast=getattr(recorder, "c", None))
        # The packed pass: with nothing but the summary, the metrics and the sampler (all of them
        # in C) reading the drain's rows, the C drain writes the steps straight into the link's
        # message (see drain.take_ready).
        packed = getattr(getattr(recorder, "c", None), "PackedSteps", None)
        self._packed_type = packed if (
            packed is not None and (self.sampling.always or self.sampling.c_state() is not None)
            and (self.metrics is None or self.metrics.c_state() is not None)
            and (self.summary.every_ns <= 0 or self.summary.c_state() is not None)
            and getattr(self.sink, "pack", None) is not None and hasattr(self.sink, "send_packed")) else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()
        self._shut_down: Optional[int] = None  # the pid whose shutdown ran (a fork's child has its own)
        self._shutdown_lock = threading.Lock()
        self._hints = DropHints(cfg.max_pending, cfg.drain_interval_s)

    @property
    def export_dropped(self) -> int:
        return self.sink.dropped if self.sink is not None else 0

    def dropped_by(self) -> dict[str, int]:
        """Where the drops happened: ``pending`` (steps, more than SGL_PROBE_MAX_PENDING waited
        for the drain), then the sink's (``link``, ``otlp``, ``trace_dir``: spans)."""
        out = {"pending": self.recorder.dropped_steps}
        if self.sink is not None:
            out.update(self.sink.dropped_by)
        return out

    def start(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sgl-probe-drain", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    def _run(self) -> None:
        interval = self.cfg.drain_interval_s
        while True:
            sink = self.sink
            if sink is not None and sink.backlogged:  # a burst the link could not take at once
                sink.pump_for(interval)
                if self._stop.is_set():
                    break
            elif self._stop.wait(interval):
                break
            try:
                self.drain()
            except Exception as exc:  # keep draining; one bad record must not stop export
                log.warning("sgl-probe: drain error: %r", exc)

    def emit_env(self, attrs: dict, when_ns: int, name: str = ENV_SPAN) -> None:
        """An env snapshot span, or (``name``) another once-per-process span in the env trace."""
        if self.sink is not None:
            self.sink.send_env(attrs, when_ns, name)

    def observe(self, step: ResolvedStep) -> None:
        """Every resolved step passes here once, sampled or not (summary line, metrics)."""
        self.observe_rows((step,))

    def observe_rows(self, rows) -> None:
        """:meth:`observe` for steps as the drain resolves them (rows, see :mod:`sgl_probe.drain`).
        The summary takes every phase of them at once: it has no per-step state."""
        self.summary.add_rows(rows)
        if self.metrics is not None:
            self.metrics.observe_rows(rows)

    def drain(self, final: bool = False) -> int:
        """Resolve every step whose timers have completed; returns how many were resolved."""
        with self._lock:
            rec = self.recorder
            timer = rec.timer
            steps = rec.steps
            sink = self.sink
            sampling = self.sampling
            always = sampling.always
            kept: list[tuple] = []
            kept_slow: list[bool] = []
            done = 0
            sampler = None if always else sampling.c_state()
            # (a sampler the C rules do not decide for: the rows, decided in Python)
            packed = None if self._packed_type is None or (sampler is None and not always) \
                else self._packed_type(packed_limit(sink))
            ahead = not getattr(timer, "elapsed_keeps_gil", True)
            summary = None if packed is None else self.summary
            metrics = None if packed is None else self.metrics
            now = held = time.perf_counter_ns()
            while steps:
                rows: list[tuple] = []
                before = 0 if packed is None else packed.rows
                dropped = 0 if sampler is None else sampler.sampled_out
                taken = take_ready(steps, timer, now, final, CHUNK, rows, packed, summary, metrics, sampler)
                if not taken:
                    break
                done += len(rows)
                if packed is not None:  # written, or resolved and dropped by the sampler in C
                    done += packed.rows - before + (0 if sampler is None else sampler.sampled_out - dropped)
                    if packed_due(packed, ahead):
                        sink.send_packed(packed)
                else:  # (the packed pass adds its steps to the summary and the metrics itself)
                    self.observe_rows(rows)
                if sink is not None:
                    if always:
                        kept += rows
                        kept_slow += [False] * len(rows)
                    else:
                        for row in rows:
                            keep, slow = sampling.keep_row(row)
                            if keep:
                                kept.append(row)
                                kept_slow.append(slow)
                if taken == CHUNK and steps and time.perf_counter_ns() - held >= YIELD_AFTER_NS:
                    # Rows are sent before the hand-over, so a pass's last stretch does not pickle
                    # all of them; the packed pass wrote its steps as it took them, and sends once
                    # the message is due or the pass ends.
                    if kept:
                        sink.send_steps(kept, kept_slow)
                        kept, kept_slow = [], []
                    time.sleep(YIELD_S)  # let a waiting scheduler thread have the GIL (see YIELD_AFTER_NS)
                    held = time.perf_counter_ns()
            if packed is not None and packed.rows:
                sink.send_packed(packed)
                if kept:
                    sink.send_steps(kept, kept_slow)
            elif kept:
                sink.send_steps(kept, kept_slow)
            elif sink is not None:
                sink.poll()
            replenish = getattr(timer, "replenish", None)  # the CUDA timer's anchor events, made here
            if replenish is not None and not final:
                replenish()
            self._log_summary()
            return done

    def _log_summary(self) -> None:
        by = self.dropped_by()
        dropped = sum(by.values())
        if dropped:
            for hint in self._hints.new_lines(by):
                log.warning(hint)
        line = self.summary.maybe_line(dropped=dropped, by=by)
        if self.metrics is not None:
            self.metrics.set_dropped(by)
            if line and self.summary.last_verdict is not None:  # a window without one keeps the last
                self.metrics.set_verdict(self.summary.last_verdict)
            self.metrics.maybe_flush()
        if line:
            if not self.sampling.always:
                line += " | sampled_out=%d kept_slow=%d" % (self.sampling.sampled_out, self.sampling.kept_slow)
            stride = getattr(self.recorder.timer, "gpu_stride", 1)
            if stride > 1:  # the phase times above are those of the steps timed on the GPU
                line += " | gpu_timed=1/%d" % stride
            log.info(line)

    def flush(self, timeout_s: float = 5.0) -> None:
        self.drain()
        if self.sink is not None:
            self.sink.flush(timeout_s)

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Bounded: an unreachable collector must not hold the worker's exit hostage. Once per
        process: the atexit entry runs after an explicit call, and a second final drain would
        print a summary line and feed the metrics after their final export."""
        with self._shutdown_lock:  # not ``_lock``: a drain in progress on this thread holds that one
            if self._shut_down == os.getpid():
                return
            self._shut_down = os.getpid()
        self._stop.set()

        drainer = self._thread if self._pid == os.getpid() else None

        def _finish() -> None:
            try:
                # The drain thread may be inside a pass that began before the stop: once it is
                # done, nothing but this final drain feeds the summary and the metrics, so their
                # last values are the ones the final export carries.
                if drainer is not None and drainer is not threading.current_thread():
                    drainer.join(timeout_s / 2)
                self.drain(final=True)
                if self.metrics is not None:
                    with self._lock:  # a drain still running on the drain thread feeds it too
                        self.metrics.flush()
                    metrics_setup.shutdown(timeout_s)
                if self.sink is not None:
                    self.sink.shutdown(timeout_s)
            except Exception:
                pass

        t = threading.Thread(target=_finish, name="sgl-probe-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)
