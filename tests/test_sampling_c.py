"""The sampling decision in C (``sgl_probe._hot.StepSampler``): its BLAKE2b is hashlib's, it keeps
and counts exactly the steps the Python rules of :mod:`sgl_probe.sampling` keep, and the drain's
packed pass with it sends what the rows' pass and the Python rules send."""

from __future__ import annotations

import hashlib
import logging
import random
from types import SimpleNamespace as NS

import pytest

from sgl_probe import drain, recorder, sampling, spans, timing
from sgl_probe.instrument import Hook
from sgl_probe.recorder import Recorder
from tests.hotpaths import c_module
from tests.test_exact_recorder import FORWARD, STEP, ForwardMode

LOG = logging.getLogger("sgl_probe.test")
RATIO = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}


@pytest.fixture
def hot():
    return c_module()


def test_its_blake2b_is_hashlibs_on_every_length_around_the_block(hot):
    s = hot.StepSampler(0)
    rnd = random.Random(7)
    for plen in range(0, 290):
        prefix = rnd.randbytes(plen)
        s.set_prefix(prefix)
        for dlen in (0, 1, 7, 127, 128, 129, 255, 256, 257):
            data = rnd.randbytes(dlen)
            assert s.digest(data) == hashlib.blake2b(prefix + data, digest_size=16).digest(), (plen, dlen)


def _rows(n: int, seed: int) -> list:
    """Rows as the drain resolves them (index, start, end, mode, ...): a steady decode with a slow
    step every 97th, a prefill every 5th, a mode of None now and then, indexes past 64 bits."""
    rnd = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        ms = 20.0 if i % 97 == 96 else 1.0 + rnd.random() * 0.1
        mode = None if i % 211 == 0 else ("EXTEND" if i % 5 == 0 else "DECODE")
        index = i if i % 503 else (1 << 70) + i
        start = rnd.randrange(10**15)
        out.append((index, start, start + int(ms * 1e6), mode, 4, 4, 0.1, "cuda", ()))
    return out


@pytest.mark.parametrize("env", [{**RATIO, "OTEL_TRACES_SAMPLER_ARG": rate} for rate in ("0", "1e-6", "0.2", "0.5", "1")]
                         + [{"OTEL_TRACES_SAMPLER": "always_off"}])
def test_it_keeps_and_counts_the_steps_the_python_rules_keep(hot, env):
    ident = {"tp_rank": 0, "dp_rank": 1}
    by_c = sampling.StepSampling("run-c", ident, env, fast=hot)
    by_py = sampling.StepSampling("run-c", ident, env)
    assert by_c.c_state() is not None and by_py.c_state() is None
    for row in _rows(3000, 11):
        assert by_c.keep_row(row) == by_py.keep_row(row), row[0]
    assert (by_c.kept_slow, by_c.sampled_out) == (by_py.kept_slow, by_py.sampled_out)
    rate = env.get("OTEL_TRACES_SAMPLER_ARG")
    if rate in ("0", "0.2") or rate is None:
        assert by_c.kept_slow > 0 and by_c.sampled_out > 0


def test_untimed_steps_have_a_slow_step_p99_of_their_own_in_c_as_in_python(hot):
    """A sampled CUDA timer's untimed steps (timer ``host``) hold host times, GPU-timed ones GPU
    times: each kind's slow steps are judged against the p99 of their own kind. Here the timed
    steps take 10 ms, the untimed 1 ms with a 5 ms one every 97th: in one window the 5 ms steps
    would pass as fast and every timed step as slow."""
    env = {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0"}
    by_c = sampling.StepSampling("run-h", {"tp_rank": 0}, env, fast=hot)
    by_py = sampling.StepSampling("run-h", {"tp_rank": 0}, env)
    rows = []
    for i, row in enumerate(_rows(3000, 5)):
        timed = i % 6 == 0
        ms = 10.0 if timed else (5.0 if i % 97 == 0 else 1.0)
        rows.append((row[0], row[1], row[1] + int(ms * 1e6), "DECODE", 4, 4, 0.1, "cuda" if timed else "host", ()))
    kept = []
    for row in rows:
        got = by_c.keep_row(row)
        assert got == by_py.keep_row(row), row[0]
        kept.append(got[1])
    slow_host = sum(k for k, r in zip(kept, rows) if r[7] == "host")
    slow_timed = sum(k for k, r in zip(kept, rows) if r[7] == "cuda")
    assert slow_host > 20 and slow_timed == 0, (slow_host, slow_timed)


def test_its_trace_ids_follow_a_dp_rank_learned_later(hot):
    ident = {"tp_rank": 0}
    env = {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    by_c, by_py = sampling.StepSampling("run-d", ident, env, fast=hot), sampling.StepSampling("run-d", ident, env)
    rows = _rows(400, 3)
    first = [by_c.keep_row(r) for r in rows[:200]]
    assert first == [by_py.keep_row(r) for r in rows[:200]]
    ident["dp_rank"] = 2
    assert [by_c.keep_row(r) for r in rows[200:]] == [by_py.keep_row(r) for r in rows[200:]]
    assert spans.step_trace_prefix("run-d", ident) == b"run-d/dp2/step/"


def test_a_sampler_replaced_at_run_time_is_asked_in_python(hot):
    s = sampling.StepSampling("run-x", {}, {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.5"}, fast=hot)
    assert s.c_state() is not None
    s.sampler = sampling.TraceIdRatioBased(0.25)
    assert s.c_state() is None  # its bound was the old sampler's
    row = _rows(1, 0)[0]
    assert s.keep_row(row)[0] == (s._sampled(row[0]))


def _recorded(hot, monkeypatch, n: int, first_index: int = 1) -> Recorder:
    """``n`` steps recorded by the C wrappers with the CPU timer, their durations from a clock the
    phase advances: steady decode, a slow step every 97th, a prefill every 5th; their indexes from
    ``first_index`` on."""
    now = [10**12]
    monkeypatch.setattr(recorder, "perf_counter_ns", lambda: now[0])
    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)  # the same wall-clock offset every time
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    rec = Recorder("cpu", 10**6, LOG, "c")
    assert rec.c is hot
    rec.ensure_timer()
    rec.step_count = first_index - 1
    rnd = random.Random(5)

    def body(worker, batch, i):
        now[0] += int((20.0 if i % 97 == 96 else 1.0 + rnd.random() * 0.1) * 1e6)
        return NS(can_run_cuda_graph=True)

    fwd = rec.phase_method(Hook(FORWARD), body)
    step = rec.step_method(Hook(STEP), lambda s, b, call: call())
    worker = NS(model_runner=NS(server_args=NS(disable_cuda_graph=False)))
    dec = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    ext = NS(forward_mode=ForwardMode.EXTEND, seq_lens=NS(shape=(2,)), extend_num_tokens=9)
    for i in range(1, n + 1):
        b = ext if i % 5 == 0 else dec
        step(None, b, lambda: fwd(worker, b, i))
        now[0] += 50_000
    return rec


@pytest.mark.parametrize("env,first", [({**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.2"}, 1),
                                       ({"OTEL_TRACES_SAMPLER": "always_off"}, 1),
                                       ({**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.2"}, (1 << 63) - 1000)])
def test_the_packed_pass_with_it_sends_what_the_rows_and_the_python_rules_send(hot, monkeypatch, env, first):
    """Every step decided once, as the rows' pass and the Python rules decide it; ``first``: from
    the 1,000th step on, the indexes no longer fit the message's 64 bits, so those steps become
    rows again (their decision in the pass undone, keep_row's taken)."""
    ident = {"tp_rank": 0, "dp_rank": 0}
    rec = _recorded(hot, monkeypatch, 2000, first)
    rows: list = []
    while drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, rows):
        pass
    by_py = sampling.StepSampling("run-p", ident, env)
    want = [(row, slow) for row in rows for keep, slow in [by_py.keep_row(row)] if keep]

    rec = _recorded(hot, monkeypatch, 2000, first)
    by_c = sampling.StepSampling("run-p", ident, env, fast=hot)
    pk, left, got = hot.PackedSteps(8 * 1024), [], []
    while True:
        taken = drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, left, pk, None, None, by_c.c_state())
        got += [(row, slow) for row in left for keep, slow in [by_c.keep_row(row)] if keep]  # as the drain does
        left.clear()
        if pk.full or not taken:
            data = pk.finish()
            if data is not None:
                sent, slow = hot.unpack_steps(data)
                got += zip(sent, slow)
        if not taken:
            break
    assert not rec.steps
    got.sort(key=lambda item: item[0][0])
    assert got == want
    assert (by_c.c_state() is not None) and len(got) < 1000
    assert sum(row[0] >= 1 << 63 for row, _slow in got) > (10 if first > 1 else -1)
    assert (by_c.kept_slow, by_c.sampled_out) == (by_py.kept_slow, by_py.sampled_out)
    assert by_c.kept_slow > 0 and by_c.sampled_out > 1000
    assert sum(slow for _row, slow in got) == by_c.kept_slow


def test_a_sampled_drain_counts_every_step_it_resolved(hot, monkeypatch):
    """The drain's count (what ``Pipeline.drain`` returns) holds the steps the sampler dropped in
    the packed pass, as it holds the rows the Python rules dropped."""
    from sgl_probe import export

    rec = _recorded(hot, monkeypatch, 600)
    by_c = sampling.StepSampling("run-n", {}, {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.1"}, fast=hot)
    sent = []
    sink = NS(pack=hot.pack_steps, send_packed=lambda pk: sent.append(pk.finish()), poll=lambda: None,
              send_steps=lambda *a: pytest.fail("rows from the packed pass"), max_message=export.wire.MAX_MESSAGE)
    pipe = NS(recorder=rec, sink=sink, sampling=by_c, _packed_type=hot.PackedSteps, summary=None, metrics=None,
              _lock=export.threading.Lock(), _log_summary=lambda: None)
    assert export.Pipeline.drain(pipe) == 600
    kept = sum(len(hot.unpack_steps(m)[0]) for m in sent if m is not None)
    assert 0 < kept < 600 and kept + by_c.sampled_out == 600


def test_a_drain_whose_sampler_was_replaced_decides_in_python_on_rows(hot, monkeypatch):
    """A sampler the C state was not made for (replaced at run time) is never bypassed: the drain
    takes the rows and the Python rules decide them."""
    from sgl_probe import export

    rec = _recorded(hot, monkeypatch, 300)
    by_c = sampling.StepSampling("run-r", {}, {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.5"}, fast=hot)
    by_c.sampler = sampling.ALWAYS_OFF
    sent = []
    sink = NS(pack=hot.pack_steps, send_packed=lambda pk: pytest.fail("the packed pass ran"), poll=lambda: None,
              send_steps=lambda rows, slow: sent.extend(zip(rows, slow)), max_message=export.wire.MAX_MESSAGE)
    pipe = NS(recorder=rec, sink=sink, sampling=by_c, _packed_type=hot.PackedSteps, summary=NS(add_rows=len),
              metrics=None, _lock=export.threading.Lock(), _log_summary=lambda: None, observe_rows=lambda rows: None)
    assert export.Pipeline.drain(pipe) == 300
    assert all(slow for _row, slow in sent) and len(sent) == by_c.kept_slow < 30  # always_off: the slow ones


def test_the_steps_it_drops_still_reach_the_summary_and_the_metrics(hot, monkeypatch):
    """The summary line and the metrics count every step, sampled out or not: the packed pass with
    the sampler leaves them as the rows' pass leaves them."""
    from sgl_probe.metrics import PhaseMetrics
    from sgl_probe.summary import Summary
    from tests.test_hotpath_c import _metrics_state, _summary_state

    env = {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    states = []
    for packed in (False, True):
        rec = _recorded(hot, monkeypatch, 700)
        summ, pm = Summary(30, {"tp_rank": 0}, hot), PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=hot)
        by = sampling.StepSampling("run-m", {}, env, fast=hot)
        rows: list = []
        if packed:
            pk = hot.PackedSteps(1 << 20)
            while drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, rows, pk, summ, pm, by.c_state()):
                pass
            assert not rows and 0 < pk.rows < 200
        else:
            while drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, rows):
                pass
            summ.add_rows(rows)
            pm.observe_rows(rows)
        states.append((_summary_state(summ), _metrics_state(pm)))
    assert states[0] == states[1]
    assert sum(n for _labels, n in states[1][1][1]) == 700  # the metrics' steps: every one


def test_the_packed_pass_over_a_sampled_cuda_timer_decides_as_the_python_rules(hot, monkeypatch):
    """A sampled CUDA timer (stand-in torch: one step in two timed on the GPU, the others with
    host times, timer ``host``), a ratio sampler: the packed pass in C keeps, flags slow and drops
    exactly what the rows' pass and the Python rules do, the untimed steps judged against a p99 of
    their own (in one window the timed steps' 10 ms would hide the untimed ones' 5 ms stalls)."""
    from tests.test_gpu_free_parts import _FakeTorch

    def recorded() -> Recorder:
        now = [10**12]
        monkeypatch.setattr(recorder, "perf_counter_ns", lambda: now[0])
        monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)
        monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
        ft = _FakeTorch()
        rec = Recorder("cuda", 10**6, LOG, "c")
        timer = rec.timer = timing.CudaTimer(ft, hot, every_ns=6_000_000)
        timer.relax_capture_mode = False
        state = timer._prepared
        state.exchange, state.elapsed, state.done = None, None, True

        def body(worker, batch, i):
            # A host stall now and then, on an untimed step (2 ms steps, 6 ms: the even ones are timed)
            now[0] += int((5.0 if i % 212 == 1 else 1.0) * 1e6)
            ft.queued_ms += 10.0  # the GPU's step, longer than the host's
            return NS(can_run_cuda_graph=True)

        fwd = rec.phase_method(Hook(FORWARD), body)
        step = rec.step_method(Hook(STEP), lambda s, b, call: call())
        worker = NS(model_runner=NS(server_args=NS(disable_cuda_graph=False)))
        dec = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
        for i in range(1, 1501):
            step(None, dec, lambda: fwd(worker, dec, i))
            now[0] += 1_000_000
        ft.gpu_ms = ft.queued_ms + 1  # all done
        return rec

    env = {**RATIO, "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    ident = {"tp_rank": 0, "dp_rank": 0}
    rec = recorded()
    rows: list = []
    while drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, rows):
        pass
    assert {r[7] for r in rows} == {"cuda", "host"}
    by_py = sampling.StepSampling("run-s", ident, env)
    want = [(row, slow) for row in rows for keep, slow in [by_py.keep_row(row)] if keep]
    rec = recorded()
    by_c = sampling.StepSampling("run-s", ident, env, fast=hot)
    pk, got = hot.PackedSteps(1 << 20), []
    while drain.take_ready(rec.steps, rec.timer, 10**13, False, 128, [], pk, None, None, by_c.c_state()):
        pass
    sent, slow = hot.unpack_steps(pk.finish())
    got = sorted(zip(sent, slow), key=lambda item: item[0][0])
    assert got == want
