"""What every gpu_bench section shares: the torch workload (weights, eager stack, captured graph),
step timing, the results dict the sections hand each other shapes through, and the log line."""

from __future__ import annotations

import time

RESULTS: dict = {}


def log(msg: str) -> None:
    print("[gpu_bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Env:
    def __init__(self, smoke: bool) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available() and not smoke
        self.smoke = smoke or not self.cuda
        self.dev = torch.device("cuda:0" if self.cuda else "cpu")
        self._weights: dict = {}

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def weights(self, H: int, L: int):
        key = (H, L)
        if key not in self._weights:
            t = self.torch
            g = t.Generator(device=self.dev).manual_seed(H * 1000 + L)
            dt = t.bfloat16 if self.cuda else t.float32
            self._weights[key] = [t.randn(H, H, device=self.dev, dtype=dt, generator=g) * 0.01 for _ in range(L)]
        return self._weights[key]

    def make_eager(self, H: int, L: int, passes: int, bs: int):
        t = self.torch
        Ws = self.weights(H, L)
        x = t.randn(bs, H, device=self.dev, dtype=Ws[0].dtype)
        silu = t.nn.functional.silu

        def step():
            y = x
            for _ in range(passes):
                for W in Ws:
                    y = silu(y @ W)
                    y = y * 0.5 + 0.1
            return y
        return step

    def make_graph(self, H: int, L: int, passes: int):
        """(graph, eager reference fn, static output) -- captured before any probe exists, as
        SGLang captures at startup."""
        t = self.torch
        step = self.make_eager(H, L, passes, bs=1)
        if not self.cuda:  # --smoke: a "CPU graph runner" (SGLang has one too) replays eagerly
            return _CpuReplay(step), step, None
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(3):
                step()
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            out = step()
        t.cuda.synchronize()
        return g, step, out

    def step_ms(self, fn, n: int = 10) -> float:
        for _ in range(3):
            fn()
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n * 1e3
        t = self.torch
        t.cuda.synchronize()
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        t.cuda.synchronize()
        return a.elapsed_time(b) / n


class _CpuReplay:
    def __init__(self, fn) -> None:
        self.replay = fn
