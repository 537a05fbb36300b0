"""Interval timers behind one interface: CUDA events on the GPU, perf_counter_ns on the CPU.

The CUDA timer never synchronizes: events come from a pool, are recorded on the current stream
around the call, and are later asked ``query()`` by the drain thread; only completed pairs are
read with ``elapsed_time``. Nothing is recorded on a stream that is being captured into a CUDA
graph (SGLang captures at startup), so capture stays valid.

GPU timestamps become wall-clock span times through an *anchor*: an event recorded while the
stream was idle, paired with the host clock at that moment. Anchors are refreshed at most once a
second, and only when the stream is found idle.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple

perf_counter_ns = time.perf_counter_ns


class CpuTimer:
    """SGLang's CPU engine runs the forward synchronously on the calling thread."""

    kind = "cpu"

    def __init__(self) -> None:
        self._offset = time.time_ns() - perf_counter_ns()

    def start(self, now_ns: int) -> Any:
        return now_ns

    def stop(self, token: Any, now_ns: int) -> Any:
        return now_ns

    def ready(self, start: Any, end: Any) -> bool:
        return True

    def interval(self, start: Any, end: Any) -> Tuple[int, int]:
        return start + self._offset, end + self._offset

    def wall(self, host_ns: int) -> int:
        return host_ns + self._offset

    def release(self, start: Any, end: Any) -> None:
        pass


class CudaTimer:
    kind = "cuda"
    _ANCHOR_EVERY_NS = 1_000_000_000
    _POOL_MAX = 4096

    def __init__(self, torch_mod: Any) -> None:
        cuda = torch_mod.cuda
        self._new = lambda: cuda.Event(enable_timing=True)
        self._capturing = cuda.is_current_stream_capturing
        self._current_stream = cuda.current_stream
        self._pool: list = []
        self._offset = time.time_ns() - perf_counter_ns()
        self._anchor: Optional[tuple] = None  # (event, wall_ns)
        self._anchor_host = -self._ANCHOR_EVERY_NS

    def _event(self):
        pool = self._pool
        return pool.pop() if pool else self._new()

    def start(self, now_ns: int) -> Any:
        if self._capturing():
            return None
        if now_ns - self._anchor_host >= self._ANCHOR_EVERY_NS and (
                self._anchor is None or self._current_stream().query()):
            # Idle stream: the event's GPU time is now, give or take the launch latency.
            ev = self._new()
            ev.record()
            self._anchor = (ev, time.time_ns())
            self._anchor_host = now_ns
            return (ev, self._anchor, False)
        ev = self._event()
        ev.record()
        return (ev, self._anchor, True)

    def stop(self, token: Any, now_ns: int) -> Any:
        if token is None:
            return None
        ev = self._event()
        ev.record()
        return ev

    def ready(self, start: Any, end: Any) -> bool:
        return end.query()

    def interval(self, start: Any, end: Any) -> Tuple[int, int]:
        ev, (anchor_ev, anchor_wall), _ = start
        t0 = anchor_wall + int(anchor_ev.elapsed_time(ev) * 1e6) if anchor_ev is not ev else anchor_wall
        return t0, t0 + int(ev.elapsed_time(end) * 1e6)

    def wall(self, host_ns: int) -> int:
        return host_ns + self._offset

    def release(self, start: Any, end: Any) -> None:
        pool = self._pool
        if len(pool) < self._POOL_MAX:
            if start is not None and start[2]:
                pool.append(start[0])
            if end is not None:
                pool.append(end)


def make_timer(choice: str, log) -> Any:
    """``auto`` picks CUDA only where this process has already put work on a CUDA device."""
    if choice == "cpu":
        return CpuTimer()
    try:
        import torch

        usable = torch.cuda.is_available() and (choice == "cuda" or torch.cuda.is_initialized())
    except Exception:
        usable = False
    if usable:
        return CudaTimer(torch)
    if choice == "cuda":
        log.warning("sgl-probe: SGL_PROBE_TIMER=cuda but CUDA is not available here; using the cpu timer")
    return CpuTimer()
