"""A scheduler-shaped workload for exercising the probe's machinery without SGLang.

It is *not* a stand-in for SGLang in the end-to-end tests (those run the real server); it lets
unit tests drive the real wrappers, recorder, span builder and exporters through a target table
of their own, the same mechanism the GPU benchmarks use.
"""

from __future__ import annotations

import enum
import time


class ForwardMode(enum.Enum):
    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 3
    IDLE = 4


class Batch:
    def __init__(self, mode: ForwardMode, bs: int, extend_tokens: int = 0) -> None:
        self.forward_mode = mode
        self.seq_lens = [1] * bs
        self.extend_num_tokens = extend_tokens


class Result:
    def __init__(self, graph: bool) -> None:
        self.can_run_cuda_graph = graph


class Worker:
    def __init__(self, work_s: float = 0.002, fail_on: ForwardMode | None = None) -> None:
        self.work_s = work_s
        self.fail_on = fail_on

    def forward_batch_generation(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False):
        if batch.forward_mode == self.fail_on:
            raise RuntimeError("boom from the workload")
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        if batch.forward_mode == ForwardMode.DECODE:
            GraphRunner().replay()
            return Result(True)
        return Result(False)


class GraphRunner:
    def replay(self):
        return None


class Scheduler:
    def __init__(self, server_args=None, tp_rank: int = 0, pp_rank: int = 0, dp_rank=None) -> None:
        self.worker = Worker()

    def run_batch(self, batch):
        return self.worker.forward_batch_generation(batch)
