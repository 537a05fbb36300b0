"""SGL_PROBE_DRAIN_CPU=scheduler: the drain thread moves to the CPU the recording thread last ran
on, with real threads and real affinity; anything that fails turns it off with one line."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from sgl_probe import config, drain_cpu
from tests.test_probe_inprocess import probe_factory  # noqa: F401 (fixture)
from tests import workload
from tests.workload import Batch, ForwardMode

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to tell them apart")


class Pinned(threading.Thread):
    """A thread that spins on one CPU (so that it "last ran" there) until told to move or stop."""

    def __init__(self, cpu: int) -> None:
        super().__init__(daemon=True)
        self.cpu = cpu
        self.stop = threading.Event()
        self.moved = threading.Event()
        self.tid = None

    def move(self, cpu: int) -> None:
        self.moved.clear()
        self.cpu = cpu
        assert self.moved.wait(5)

    def run(self) -> None:
        self.tid = threading.get_native_id()
        where = None
        while not self.stop.is_set():
            if where != self.cpu:
                os.sched_setaffinity(0, {self.cpu})
                where = self.cpu
                while drain_cpu.last_cpu(self.tid) != where:
                    time.sleep(0.001)
                self.moved.set()
            time.sleep(0.0005)


@needs_two
def test_follows_the_recording_thread_from_cpu_to_cpu():
    spinner = Pinned(CPUS[0])
    spinner.start()
    try:
        assert spinner.moved.wait(5)
        follow = drain_cpu.FollowScheduler()
        follow(spinner.tid)
        assert os.sched_getaffinity(0) == {CPUS[0]} and follow.enabled
        spinner.move(CPUS[-1])
        follow(spinner.tid)
        assert os.sched_getaffinity(0) == {CPUS[-1]}
    finally:
        spinner.stop.set()
        os.sched_setaffinity(0, set(CPUS))


def test_a_thread_that_is_gone_turns_it_off_with_one_line_and_puts_the_mask_back(caplog):
    home = os.sched_getaffinity(0)
    follow = drain_cpu.FollowScheduler()
    logger = logging.getLogger("sgl_probe")
    old, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            follow(2 ** 30)  # no such thread
            follow(2 ** 30)
    finally:
        logger.propagate = old
    lines = [r.getMessage() for r in caplog.records if "SGL_PROBE_DRAIN_CPU" in r.getMessage()]
    assert len(lines) == 1 and "turned off" in lines[0] and not follow.enabled
    assert os.sched_getaffinity(0) == home


def test_no_recording_thread_yet_changes_nothing():
    home = os.sched_getaffinity(0)
    drain_cpu.FollowScheduler()(None)
    assert os.sched_getaffinity(0) == home


def test_the_setting_is_validated():
    assert config.load({}).drain_cpu == "any"
    assert config.load({"SGL_PROBE_DRAIN_CPU": "Scheduler"}).drain_cpu == "scheduler"
    cfg = config.load({"SGL_PROBE_DRAIN_CPU": "core0"})  # exact lines: test_exact_parsers
    assert cfg.drain_cpu == "any" and "accepted values are any, scheduler" in cfg.problems[0]


@needs_two
@pytest.mark.parametrize("setting, follows", [("scheduler", True), ("any", False)])
def test_the_probes_drain_thread_runs_where_the_scheduler_thread_ran(probe_factory, setting, follows):  # noqa: F811
    """The real probe over the stand-in scheduler, its steps run on a thread pinned to the last
    CPU: after a drain pass the probe's drain thread is pinned there too, or (``any``) untouched."""
    probe = probe_factory({"SGL_PROBE_TIMER": "cpu", "SGL_PROBE_DRAIN_CPU": setting, "SGL_PROBE_DRAIN_S": "0.02"})
    probe.ensure_pipeline()  # the drain thread starts here, with this thread's mask (every CPU)
    assert os.sched_getaffinity(probe.pipeline._thread.native_id) == set(CPUS)
    done, leave = threading.Event(), threading.Event()

    def scheduler() -> None:  # lives on, as SGLang's does
        os.sched_setaffinity(0, {CPUS[-1]})
        sched = workload.Scheduler(None, tp_rank=0)
        for _ in range(5):
            sched.run_batch(Batch(ForwardMode.DECODE, 2))
        done.set()
        leave.wait(10)

    t = threading.Thread(target=scheduler, daemon=True)
    t.start()
    assert done.wait(10) and probe.recorder.hot_tid == t.native_id
    drainer = probe.pipeline._thread
    deadline = time.monotonic() + 5
    want = {CPUS[-1]} if follows else set(CPUS)
    while os.sched_getaffinity(drainer.native_id) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    if not follows:
        time.sleep(0.2)  # several passes
    try:
        assert os.sched_getaffinity(drainer.native_id) == want
    finally:
        leave.set()
