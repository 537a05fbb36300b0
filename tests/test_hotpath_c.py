"""The C hot path (``sgl_probe._hot``) against the Python one it mirrors: the same calls through both
give the same records, field by field; the C wrappers behave as functions in a class (bound,
unbound, introspected, put back); the C clock is ``time.perf_counter_ns``; nothing leaks per call;
a KeyboardInterrupt in the probe's own work propagates as in Python; SGL_PROBE_HOTPATH picks."""

from __future__ import annotations

import functools
import gc
import logging
import sys
import time
import tracemalloc
from types import SimpleNamespace as NS

import pytest

from sgl_probe import config, hotpath, recorder, targets
from sgl_probe.instrument import Hook, Instrumentor
from sgl_probe.recorder import Recorder
from sgl_probe.timing import CpuTimer, CudaTimer
from tests.hotpaths import c_module
from tests.test_exact_recorder import FORWARD, STEP, VERIFY_V1, VERIFY_V2, ForwardMode, _target
from tests.test_gpu_free_parts import _FakeTorch

LOG = logging.getLogger("sgl_probe.test")


DRAFT = _target(role="phase", reader="spec_call", phases=("draft",), since="0.5.5")

PHASE_FIELDS = ("phase", "mode", "batch_size", "num_tokens", "host0", "host1", "t_start", "t_end", "graph",
                "graph_hook", "launch_ns", "no_graph_reason", "error", "accept_length", "target")
STEP_FIELDS = ("index", "mode", "batch_size", "num_tokens", "host0", "host1", "error")


@pytest.fixture
def hot():
    return c_module()


def _plain(value):
    """A record field, comparable across the two implementations (exceptions by type and text)."""
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    return value


def _dump(rec: Recorder) -> list:
    out = []
    for st in rec.steps:
        phases = [{f: _plain(getattr(ph, f)) for f in PHASE_FIELDS} for ph in st.phases]
        out.append(({f: _plain(getattr(st, f)) for f in STEP_FIELDS}, phases))
    return out


class Timer(CpuTimer):
    """A CPU timer whose stop says "a graph was being captured" for chosen calls."""

    def __init__(self, capture_at=()):
        super().__init__()
        self.calls = 0
        self.capture_at = set(capture_at)

    def stop(self, token, now_ns):
        self.calls += 1
        return None if self.calls in self.capture_at else now_ns


def _scenario(rec: Recorder, monkeypatch) -> list:
    """Every path of the two wrappers, on one recorder; returns what the recorder kept."""
    clock = iter(range(1_000, 10_000_000, 1_000))
    monkeypatch.setattr(recorder, "perf_counter_ns", lambda: next(clock))
    rec.timer = Timer(capture_at={5})
    hooks = {n: Hook(t) for n, t in (("step", STEP), ("fwd", FORWARD), ("verify", VERIFY_V2), ("v1", VERIFY_V1),
                                     ("draft", DRAFT))}
    replay = rec.graph_method(Hook(_target(role="graph")), lambda obj: None)

    def body(worker, batch, result=None, replay_graph=False, raise_=None, is_verify=False, pp_proxy_tensors=None,
             **kw):
        if replay_graph:
            replay(None)
        if raise_ is not None:
            raise raise_
        return result

    fwd = rec.phase_method(hooks["fwd"], body)
    verify = rec.phase_method(hooks["verify"], body)
    v1 = rec.phase_method(hooks["v1"], body)
    draft = rec.phase_method(hooks["draft"], body)
    step = rec.step_method(hooks["step"], lambda sched, batch, call, **kw: call())
    worker = NS(model_runner=NS(server_args=NS(disable_cuda_graph=True)))
    dec = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0, 0])
    ext = NS(forward_mode=ForwardMode.EXTEND, seq_lens=[0, 0], extend_num_tokens=17)
    idle = NS(forward_mode=ForwardMode.IDLE, seq_lens=[])
    # As SGLang passes them: sequence lengths with a shape (the C readers' own case).
    sdec = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(4,)))
    sext = NS(forward_mode=ForwardMode.EXTEND, seq_lens=NS(shape=(2,)), extend_num_tokens=9)
    sidle = NS(forward_mode=ForwardMode.IDLE, seq_lens=NS(shape=(0,)))
    sbare = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=()), batch_size=lambda: 6)
    results = []
    runs = [
        (dec, lambda: fwd(worker, dec, NS(can_run_cuda_graph=True))),  # graph from the result
        (dec, lambda: fwd(worker, dec, NS(can_run_cuda_graph=False))),  # no graph: asks why
        (dec, lambda: fwd(worker, dec, None, True)),  # no flag, the replay hook ran
        (ext, lambda: fwd(worker, ext, NS(can_run_graph=False))),  # the reader's other spelling
        (dec, lambda: fwd(worker, dec, NS(can_run_cuda_graph=True))),  # timer: capturing (5th stop)
        (dec, lambda: verify(worker, dec, NS(can_run_cuda_graph=True))),  # queued for the accept length
        (dec, lambda: v1(worker, dec, (1, 2, 3, False))),  # v1's tuple result
        (dec, lambda: (draft(worker, dec), fwd(worker, dec, NS(can_run_cuda_graph=1)))),  # two phases
        (dec, lambda: fwd(worker, dec, result=NS(can_run_cuda_graph=True), extra=1)),  # keywords
        (idle, lambda: fwd(worker, idle, NS())),  # IDLE: no phase, no step queued
        (dec, lambda: fwd(worker, dec, raise_=KeyError("sglang"))),  # SGLang raised
        (dec, lambda: verify(worker, dec, NS(can_run_cuda_graph=True), False, None)),  # positional
        (dec, lambda: fwd(worker, dec, NS(can_run_cuda_graph=True), False, None)),
        (sdec, lambda: fwd(worker, sdec, NS(can_run_cuda_graph=True))),
        (sdec, lambda: fwd(worker, sdec, NS(can_run_cuda_graph=False))),
        (sdec, lambda: fwd(worker, sdec, None, True)),
        (sext, lambda: fwd(worker, sext, NS(can_run_cuda_graph=False))),  # prefill: the Python reader
        (sidle, lambda: fwd(worker, sidle, NS())),
        (sbare, lambda: fwd(worker, sbare, NS(can_run_cuda_graph=True))),  # an empty shape
        (sdec, lambda: fwd(worker, sdec, None, False, None, True)),  # is_verify, positional
        (sdec, lambda: fwd(worker, sdec, is_verify=True)),  # is_verify, keyword
        (sdec, lambda: fwd(worker, sdec, raise_=KeyError("sglang"))),
        (sdec, lambda: fwd(worker, None, forward_batch=sdec)),  # a ForwardBatch handed over
        (sdec, lambda: fwd(worker, sdec, pp_proxy_tensors=None)),  # as SGLang's scheduler calls it
        (sdec, lambda: fwd(worker, sdec, pp_proxy_tensors=None, is_verify=False)),
    ]
    for batch, call in runs:
        try:
            results.append(step(None, batch, call))
        except KeyError as exc:
            results.append(("raised", str(exc)))
    fwd(worker, dec, "outside a step")  # not a phase: no step open
    step(None, dec, lambda: step(None, dec, lambda: fwd(worker, dec, "nested")), k=1)  # a nested step
    results.append(rec.step_count)
    results.append([(ph.phase, ph.batch_size) for ph in rec.awaiting_accept])
    return [_dump(rec), [_plain(r) if not isinstance(r, NS) else vars(r) for r in results]]


def test_the_same_calls_give_the_same_records_in_c_and_in_python(hot, monkeypatch):
    from sgl_probe import readers

    py = Recorder("cpu", 100, LOG, "python")
    c = Recorder("cpu", 100, LOG, "c")
    assert (py.hotpath, c.hotpath) == ("python", "c")
    python_reads = {}
    for rec in (py, c):
        counts = python_reads[rec.hotpath] = {"step": 0, "forward": 0}
        for name in counts:
            monkeypatch.setitem(readers.ENTER, name, (lambda fn, name, counts: lambda *a: (
                counts.__setitem__(name, counts[name] + 1), fn(*a))[1])(readers.__dict__[name], name, counts))
        if rec is py:
            want = _scenario(py, monkeypatch)
        else:
            got = _scenario(c, monkeypatch)
    assert got == want
    # The C readers took the shaped decode batches themselves; everything else went to Python's.
    assert python_reads["python"] == {"step": 26, "forward": 23}
    assert python_reads["c"] == {"step": 26 - 9, "forward": 23 - 6}
    steps, _ = want
    assert len(steps) == 23 and sum(len(p) for _, p in steps) == 24  # the scenario reaches every path
    assert any(ph["no_graph_reason"] for _, p in steps for ph in p)
    assert any(st["error"] for st, _ in steps)


def test_a_full_queue_drops_alike(hot, monkeypatch):
    dumps = []
    for which in ("python", "c"):
        rec = Recorder("cpu", 2, LOG, which)
        rec.timer = CpuTimer()
        dropped = []
        rec.drop = dropped.append
        fwd = rec.phase_method(Hook(FORWARD), lambda w, b: NS(can_run_cuda_graph=True))
        step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
        for _ in range(5):
            step(None, b)
        dumps.append((len(rec.steps), [st.index for st in dropped]))
    assert dumps[0] == dumps[1] == (2, [3, 4, 5])


class _Rows(list):
    """Stands in for torch.Tensor over torch._C.TensorBase (here ``list``, whose length is C code
    too): a ``shape``, and a Python ``__len__`` of its own that the hot path must not call."""

    def __init__(self, n, shape=None, asked=None):
        super().__init__([0] * n)
        self._shape, self._asked = (n,) if shape is None else shape, asked

    @property
    def shape(self):
        self._asked.append("shape")
        return self._shape

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")  # as torch's
        raise AssertionError("torch.Tensor.__len__ is Python code: not on the hot path")


class _SubRows(_Rows):
    """A subclass of the tensor type: its shape decides, whatever the base's length says."""


def test_the_c_readers_take_a_plain_tensors_rows_from_torchs_c_length(hot, monkeypatch):
    """SGLang's sequence lengths are a plain torch.Tensor: the C readers take the batch size from
    torch._C.TensorBase's own C length, without building ``seq_lens.shape`` or calling torch.Tensor's
    Python ``__len__``; a subclass, a 0-d tensor, a torch laid out otherwise and no torch at all
    take the shape's way, and every case gives the records the Python readers give."""
    torch_ok = NS(Tensor=_Rows, _C=NS(TensorBase=list))
    cases = [  # (torch in sys.modules, rows, shape, batch size, whether the shape was asked)
        (torch_ok, 4, None, 4, False),
        (torch_ok, 1, None, 1, False),
        (torch_ok, 300, None, 300, False),  # beyond the small ints
        (torch_ok, 4, (5,), 5, True),  # a subclass (below): its shape
        (torch_ok, 0, (), 6, True),  # 0-d: the shape is empty, the Python reader asks batch_size()
        (NS(Tensor=_Rows, _C=NS(TensorBase=dict)), 4, None, 4, True),  # not torch.Tensor's base
        (NS(Tensor=_Rows), 4, None, 4, True),  # no torch._C
        (None, 4, None, 4, True),  # torch not imported
    ]
    for i, (torch, n, shape, bs, shaped) in enumerate(cases):
        if torch is None:
            monkeypatch.delitem(sys.modules, "torch", raising=False)
        else:
            monkeypatch.setitem(sys.modules, "torch", torch)
        dumps, asked = [], []
        for which in ("python", "c"):
            rec = Recorder("cpu", 100, LOG, which)
            rec.timer = CpuTimer()
            fwd = rec.phase_method(Hook(FORWARD), lambda w, b: NS(can_run_cuda_graph=True))
            step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
            asked.clear()
            kind = _SubRows if shape == (5,) else _Rows
            b = NS(forward_mode=ForwardMode.DECODE, seq_lens=kind(n, shape, asked), batch_size=lambda: 6)
            for _ in range(3):  # the type is settled at the first read, then used
                step(None, b)
            dumps.append([(st.batch_size, st.num_tokens, [(ph.batch_size, ph.num_tokens) for ph in st.phases])
                          for st in rec.steps])
        assert dumps[0] == dumps[1] == [(bs, bs, [(bs, bs)])] * 3, i
        assert ("shape" in asked) == shaped, (i, asked)


def test_looking_for_torchs_tensor_type_never_swallows_a_keyboard_interrupt(hot, monkeypatch):
    """The C readers look torch.Tensor up once, at a hook's first read: an Exception on the way
    means the shape's way (the records are the Python readers'), a KeyboardInterrupt propagates as
    the probe's own, and the hook stays on."""
    class Torch:
        def __init__(self, exc):
            self.exc = exc

        def __getattr__(self, name):
            raise self.exc

    for exc in (RuntimeError("no such torch"), KeyboardInterrupt()):
        monkeypatch.setitem(sys.modules, "torch", Torch(exc))
        rec = Recorder("cpu", 100, LOG, "c")
        rec.timer = CpuTimer()
        hook = Hook(FORWARD)
        fwd = rec.phase_method(hook, lambda w, b: NS(can_run_cuda_graph=True))
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=_Rows(3, asked=[]))
        step_hook = Hook(STEP)
        step = rec.step_method(step_hook, lambda s, b: fwd(None, b))
        if isinstance(exc, KeyboardInterrupt):
            with pytest.raises(KeyboardInterrupt):
                step(None, b)
            assert rec.tls.cur == [None, None] and step_hook.enabled and hook.enabled
        else:
            step(None, b)
            assert [(st.batch_size, [ph.batch_size for ph in st.phases]) for st in rec.steps] == [(3, [3])]


def test_the_c_records_are_the_python_records_fields(hot):
    facts = ("decode", "DECODE", 2, 2)
    for cls, pycls, args in ((hot.PhaseRecord, recorder.PhaseRecord, (facts, "t", 5, 6)),
                             (hot.StepRecord, recorder.StepRecord, (3, facts, 5))):
        c, py = cls(*args), pycls(*args)
        assert {f: getattr(c, f) for f in pycls.__slots__} == {f: getattr(py, f) for f in pycls.__slots__}
        for f in pycls.__slots__:
            setattr(c, f, "x")
            assert getattr(c, f) == "x"
        with pytest.raises(ValueError):
            cls(*[("too", "few") if a is facts else a for a in args])


def test_the_c_wrappers_sit_in_a_class_like_functions(hot):
    rec = Recorder("cpu", 100, LOG, "c")
    rec.timer = CpuTimer()

    class Worker:
        def forward_batch_generation(self, batch, *rest, **kw):
            """SGLang's docstring."""
            return NS(me=self, rest=rest, kw=kw, can_run_cuda_graph=True)

    class Scheduler:
        def run_batch(self, batch, worker):
            return worker.forward_batch_generation(batch, 1, k=2)

    orig = Worker.__dict__["forward_batch_generation"]
    wrapped = rec.phase_method(Hook(FORWARD), orig)
    functools.update_wrapper(wrapped, orig)
    Worker.forward_batch_generation = wrapped
    Scheduler.run_batch = rec.step_method(Hook(STEP), Scheduler.__dict__["run_batch"])
    assert type(wrapped).__name__ == "PhaseHook"
    assert Worker.forward_batch_generation is wrapped  # from the class: itself, as a function is
    assert wrapped.__name__ == "forward_batch_generation" and wrapped.__doc__ == "SGLang's docstring."
    assert wrapped.__wrapped__ is orig and wrapped.sgl_probe_original is orig
    w, s = Worker(), Scheduler()
    bound = w.forward_batch_generation
    assert bound.__self__ is w and bound.__func__ is wrapped
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0])
    out = s.run_batch(b, w)
    assert (out.me, out.rest, out.kw) == (w, (1,), {"k": 2})
    assert bound(b).me is w and Worker.forward_batch_generation(w, b).me is w
    (st,) = rec.steps
    assert [ph.phase for ph in st.phases] == ["decode"] and st.batch_size == 2


def test_instrument_and_uninstrument_put_c_wrappers_in_and_take_them_out(hot, monkeypatch):
    import sys
    import types

    mod = types.ModuleType("sgl_probe_test_fake_sched")

    class TpModelWorker:
        def forward_batch_generation(self, batch):
            return NS(can_run_cuda_graph=True)

    mod.TpModelWorker = TpModelWorker
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    orig = TpModelWorker.__dict__["forward_batch_generation"]
    target = targets.Target("phase", ("decode",), mod.__name__, "TpModelWorker.forward_batch_generation",
                            "forward")
    probe = NS(recorder=Recorder("cpu", 100, LOG, "c"))
    inst = Instrumentor(probe, (target,))
    inst.instrument()
    inst.apply(target, mod)
    assert type(TpModelWorker.__dict__["forward_batch_generation"]).__name__ == "PhaseHook"
    assert inst.apply(target, mod)  # already ours: not wrapped twice
    inst.uninstrument()
    assert TpModelWorker.__dict__["forward_batch_generation"] is orig


def test_the_c_clock_is_perf_counter_ns(hot):
    for _ in range(1000):
        a = time.perf_counter_ns()
        b = hot.now_ns()
        c = time.perf_counter_ns()
        assert a <= b <= c


def test_a_keyboard_interrupt_in_the_probe_propagates_as_in_python(hot):
    for which in ("python", "c"):
        rec = Recorder("cpu", 100, LOG, which)
        rec.timer = CpuTimer()
        calls = []

        def read(*a):
            raise KeyboardInterrupt

        step = rec.step_method(Hook(STEP), lambda s, b: calls.append(1))
        hook = Hook(FORWARD)
        fwd = rec.phase_method(hook, lambda w, b: calls.append(2))
        b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
        import sgl_probe.readers as readers

        orig = readers.ENTER["forward"]
        readers.ENTER["forward"] = read
        try:
            fwd2 = rec.phase_method(Hook(FORWARD), lambda w, b: calls.append(3))
        finally:
            readers.ENTER["forward"] = orig
        with pytest.raises(KeyboardInterrupt):
            step(None, b) if False else rec.step_method(Hook(STEP), lambda s, bb: fwd2(None, bb))(None, b)
        assert calls == [] and hook.enabled
        assert rec.tls.cur == [None, None], which
        step(None, b)
        fwd(None, b)
        assert calls == [1, 2]


def test_an_error_inside_the_probe_disables_the_hook_and_sglang_runs(hot, caplog):
    rec = Recorder("cpu", 100, LOG, "c")

    class Broken(CpuTimer):
        def start(self, now_ns, first=True):
            raise RuntimeError("timer broke")

    rec.timer = Broken()
    hook = Hook(FORWARD)
    fwd = rec.phase_method(hook, lambda w, b: "sglang")
    step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    with caplog.at_level(logging.ERROR, logger="sgl_probe"):
        assert step(None, b) == "sglang" and step(None, b) == "sglang"
    assert not hook.enabled
    assert [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()] == [
        "sgl-probe: hook " + FORWARD.name + " disabled after an internal error: RuntimeError('timer broke') "
        "(SGLang is unaffected)"]


def test_no_memory_is_kept_per_call(hot):
    rec = Recorder("cpu", 10, LOG, "c")
    rec.timer = CpuTimer()
    rec.drop = lambda st: None
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b, **k: NS(can_run_cuda_graph=False))
    verify = rec.phase_method(Hook(VERIFY_V2), lambda w, b: NS(can_run_cuda_graph=True))
    step = rec.step_method(Hook(STEP), lambda s, b: (fwd(s, b, x=1), verify(s, b)))
    worker = NS(model_runner=NS(server_args=NS(disable_cuda_graph=True)))
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0, 0])

    def run(n):
        for _ in range(n):
            step(worker, b)
            rec.steps.clear()
            rec.awaiting_accept.clear()

    run(2000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(20000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20000, f"{grown} bytes kept over 20,000 steps"


def test_the_c_timer_start_and_stop_match_the_python_ones(hot, monkeypatch):
    ends = []
    for fast, runtime in ((None, False), (hot, False), (hot, True)):
        ft = _FakeTorch()
        if runtime:
            from sgl_probe import timing

            rt = _FakeRuntime(ft)
            monkeypatch.setattr(timing, "_runtime_entry_points", lambda on_fail: rt.addresses + (on_fail,))
        timer = CudaTimer(ft, fast)
        _STREAMS[:] = list(timer._streams.values())
        assert timer.hot_calls == ("cuda_runtime" if runtime else "torch")
        timer.relax_capture_mode = False
        assert timer.fast_stream
        assert (type(timer.start).__name__ == "builtin_function_or_method") == (fast is not None)
        seen = []
        for i, queued in enumerate((0.0, 2.0, 2.0, 5.0, 5.0)):
            tok = timer.start(10**12 + i * 1_000_000)
            ft.queued_ms = queued
            if i == 3:
                ft.capturing = True
            end = timer.stop(tok, 10**12 + i * 1_000_000 + 500)
            ft.capturing = False
            seen.append((len(tok), tok[0], tok[1] is not None,
                         None if end is None else (end[2], end[3][1], end[0] is end[3][0])))
            if end is not None and i % 2:
                timer.release(tok, end)
        ends.append((seen, len(ft.records), sorted(timer._anchors)))
    assert ends[0] == ends[1] == ends[2]


def test_sgl_probe_hotpath_picks_and_a_bad_value_names_the_variable(hot, caplog):
    assert config.load({"SGL_PROBE_HOTPATH": "python"}).hotpath == "python"
    assert config.load({}).hotpath == "auto"
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        cfg = config.load({"SGL_PROBE_HOTPATH": "fast"})
    assert cfg.hotpath == "auto"
    assert "SGL_PROBE_HOTPATH='fast': accepted values are auto, c, python" in caplog.text
    assert hotpath.name(hotpath.load("python")) == "python"
    assert hotpath.name(hotpath.load("auto")) == "c" == hotpath.name(hotpath.load("c"))


def test_the_function_a_c_wrapper_calls_can_be_layered_as_a_closure_cell_can(hot):
    """What benchmarks/probe_pause does to time the probe from inside: a layer between the wrapper
    and SGLang's function, through ``sgl_probe_original``."""
    rec = Recorder("cpu", 100, LOG, "c")
    rec.timer = CpuTimer()
    seen = []
    orig = lambda w, b: "sglang"  # noqa: E731
    fwd = rec.phase_method(Hook(FORWARD), orig)
    fwd.sgl_probe_original = lambda *a: seen.append(a) or orig(*a)
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])
    assert fwd("w", b) == "sglang" and seen == [("w", b)]
    with pytest.raises(TypeError):
        fwd.sgl_probe_original = 3


def test_each_thread_and_each_recorder_keeps_its_own_open_step(hot):
    """The C wrappers remember the last thread state they read on each OS thread: another
    recorder's step inside a step, and the same recorder's step on another thread meanwhile, are
    steps of their own."""
    import threading

    def wrapped(rec):
        rec.timer = CpuTimer()
        fwd = rec.phase_method(Hook(FORWARD), lambda w, b: "fwd")
        return rec.step_method(Hook(STEP), lambda w, b, then=None: (fwd(w, b), then and then()))

    a, b = Recorder("cpu", 100, LOG, "c"), Recorder("cpu", 100, LOG, "c")
    step_a, step_b = wrapped(a), wrapped(b)
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=[0])

    def inside_a():
        t = threading.Thread(target=step_a, args=("w", batch))
        t.start()
        t.join()
        step_b("w", batch)

    step_a("w", batch, then=inside_a)
    step_b("w", batch)
    assert [len(st.phases) for st in a.steps] == [1, 1] and [len(st.phases) for st in b.steps] == [1, 1]
    assert a.tls.cur == [None, None] == b.tls.cur


class _FakeRuntime:
    """libcudart's cudaEventRecord / cudaStreamIsCapturing / cudaGetLastError / cudaStreamQuery as
    real C function pointers (ctypes callbacks) over a stand-in torch, for the C timer's direct
    runtime calls."""

    def __init__(self, ft, fail_record: int = 0, fail_capture: int = 0, fail_query: int = 0) -> None:
        import ctypes

        self.ft, self.calls, self.cleared = ft, [], 0
        self.fail_record, self.fail_capture, self.fail_query = fail_record, fail_capture, fail_query
        ft.cuda.Stream.cuda_stream = property(lambda s: 0x1000 + s.key[0])

        def record(ev, stream):
            self.calls.append(("record", ev, stream))
            if self.fail_record:
                return self.fail_record
            # ctypes passes NULL as None; a default stream's handle names the current device's
            (st,) = [s for s in timer_streams(ft) if s.cuda_stream == (stream or 0) and (stream or s.key == ft.current)]
            ft._record(ft.handles[ev], st)
            return 0

        def capturing(stream, status):
            self.calls.append(("capturing", stream))
            status[0] = 1 if ft.capturing else 0
            return self.fail_capture

        def last_error():
            self.cleared += 1
            return 0

        def query(stream):
            self.calls.append(("query", stream))
            if self.fail_query:
                return self.fail_query
            return 0 if ft.queued_ms <= ft.gpu_ms else 600  # cudaErrorNotReady

        self._fns = (ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(record),
                     ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))(capturing),
                     ctypes.CFUNCTYPE(ctypes.c_int)(last_error),
                     ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(query))
        self.addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in self._fns)


_STREAMS: list = []


def timer_streams(ft):
    return _STREAMS


def _runtime_timer(hot, monkeypatch, ft=None, **fail):
    from sgl_probe import timing

    ft = ft or _FakeTorch()
    rt = _FakeRuntime(ft, **fail)
    monkeypatch.setattr(timing, "_runtime_entry_points", lambda on_fail: rt.addresses + (on_fail,))
    timer = CudaTimer(ft, hot)
    timer.relax_capture_mode = False
    _STREAMS[:] = list(timer._streams.values())
    return ft, rt, timer


def test_the_c_timer_records_through_the_runtime_with_the_same_results(hot, monkeypatch):
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    assert timer.hot_calls == "cuda_runtime"
    tok = timer.start(10**12)  # takes the anchor (an idle stream), through torch as in Python
    torch_records = []
    record = timer._record
    timer._record = lambda ev, st: torch_records.append(ev) or record(ev, st)
    end = timer.stop(tok, 10**12 + 500)  # the pool is empty: a new event; it has a handle here too
    assert [c[0] for c in rt.calls] == ["capturing", "record"] and torch_records == []
    assert rt.calls[1][1] == end[0].cuda_event and rt.calls[1][2] == 0x1000 + ft.current[0]
    assert ft.records[-1] == (end[0], ft.current)
    ft.capturing = True
    assert timer.stop(timer.start(10**12 + 10**6), 10**12 + 10**6 + 5) is None
    assert rt.calls[-1][0] == "capturing" and len(ft.records) == 2  # the anchor and one end
    ft.capturing = False
    # An event torch never created (no handle yet): torch records it, which creates it.
    fresh = ft.cuda.Event(enable_timing=True)
    fresh.cuda_event = 0
    timer._pool.append(fresh)
    end2 = timer.stop(timer.start(10**12 + 2 * 10**6), 10**12 + 2 * 10**6 + 5)
    assert end2[0] is fresh and torch_records == [fresh] and rt.cleared == 0


def test_the_c_timer_names_the_stream_by_its_raw_handle_once_the_full_look_up_has(hot, monkeypatch):
    """torch's raw handle of the current stream (one call returning an int) stands for the full
    look-up (torch's key, the dict, the Stream's handle) once that has named the same stream; a
    switch of streams is followed; the default streams' handles (the same on every device) always
    take the full look-up; a torch whose raw handle disagrees at start is not asked."""
    ft = _FakeTorch()
    raw = {"calls": 0}

    def handle(key):  # stream 0 stands for a default stream: handle 0 on every device
        return 0 if key[0] == 0 else 0x1000 + key[0]

    def raw_stream(idx):
        assert idx == -1
        raw["calls"] += 1
        return handle(ft.current)

    ft._C._cuda_getCurrentRawStream = staticmethod(raw_stream)
    ft, rt, timer = _runtime_timer(hot, monkeypatch, ft=ft)
    ft.cuda.Stream.cuda_stream = property(lambda st: handle(st.key))
    assert timer._raw_stream is not None
    full = []
    key = timer._stream_key
    timer._stream_key = lambda i: full.append(i) or key(i)
    other = (5, 0, 1)
    _STREAMS.append(ft.cuda.Stream(*other))
    plan = [None, None, other, other, None, other, None]
    got = []
    for i, cur in enumerate(plan):
        ft.current = other if cur else (3, 0, 1)
        tok = timer.start(10**12 + i * 10**6)  # (an anchor's refresh looks the stream up in Python)
        before = len(full)
        end = timer.stop(tok, 10**12 + i * 10**6 + 5)
        got.append((end[1].key, ft.records[-1][1], len(full) - before))
    # the full look-up at each stream's first phase end (a stream new to the timer: torch's key
    # twice, as in Python), none after; the record on the current stream each time
    assert [g[2] for g in got] == [1, 0, 2, 0, 0, 0, 0]
    assert all(g[0] == g[1] == ((5, 0, 1) if cur else (3, 0, 1)) for g, cur in zip(got, plan))
    assert raw["calls"] == 1 + len(plan)  # the check at start, then one per phase end
    # the default streams of two devices (one handle): the full look-up every time
    _STREAMS.extend(ft.cuda.Stream(*k) for k in ((0, 0, 1), (0, 1, 1)))
    for i in range(4):
        ft.current = (0, i % 2, 1)
        tok = timer.start(10**13 + i * 10**6)
        before = len(full)
        end = timer.stop(tok, 10**13 + i * 10**6 + 5)
        assert len(full) > before and end[1].key == ft.current == ft.records[-1][1]
    ft2 = _FakeTorch()
    ft2._C._cuda_getCurrentRawStream = staticmethod(lambda idx: 0x9999)
    _, _, timer2 = _runtime_timer(hot, monkeypatch, ft=ft2)
    assert timer2._raw_stream is None and timer2.fast_stream and timer2.stream_calls == "torch"


class _StreamEntry:
    """torch's ``aoti_torch_get_current_cuda_stream`` as a real C function pointer (a ctypes
    callback): the current stream's raw handle, or ``fail_at``'s call fails as a throwing torch
    would (a non-zero return, nothing written)."""

    def __init__(self, handle, fail_at: int = 0) -> None:
        import ctypes

        self.calls, self.fail_at = [], fail_at

        def entry(device, out):
            self.calls.append(device)
            if len(self.calls) == self.fail_at:
                return 1
            out[0] = handle() or None  # ctypes passes a NULL handle as None
            return 0

        self._fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))(entry)
        self.address = ctypes.cast(self._fn, ctypes.c_void_p).value


@pytest.mark.parametrize("fail_at", [0, 5])
def test_the_c_timer_takes_the_current_stream_from_torchs_c_entry_point_where_given(hot, monkeypatch, fail_at):
    """Given torch's C entry point for the current stream, the phase end asks it instead of
    torch's Python call (one C call; the stream it names found from the last phase end's, else
    through the handle map) and records on the same streams as the Python call would; where the
    entry point fails, the Python call takes over for good, the records unchanged."""
    from sgl_probe import timing

    ft = _FakeTorch()
    raw = {"calls": 0}

    def handle(key):  # stream 0 stands for a default stream: handle 0 on every device
        return 0 if key[0] == 0 else 0x1000 + key[0]

    def raw_stream(idx):
        raw["calls"] += 1
        return handle(ft.current)

    ft._C._cuda_getCurrentRawStream = staticmethod(raw_stream)
    entry = _StreamEntry(lambda: handle(ft.current), fail_at)
    given = []
    monkeypatch.setattr(timing, "_torch_stream_entry",
                        lambda torch_mod, rs: given.append((torch_mod, rs)) or entry.address)
    ft, rt, timer = _runtime_timer(hot, monkeypatch, ft=ft)
    ft.cuda.Stream.cuda_stream = property(lambda st: handle(st.key))
    assert given == [(ft, raw_stream)] and timer._c.stream_c and timer.stream_calls == "torch_c"
    other = (5, 0, 1)
    _STREAMS.extend([ft.cuda.Stream(*other), ft.cuda.Stream(0, 0, 1), ft.cuda.Stream(0, 1, 1)])
    plan = [(3, 0, 1), (3, 0, 1), other, other, (3, 0, 1), (0, 0, 1), (0, 1, 1), other, (3, 0, 1), other]
    raw_before = raw["calls"]
    for i, cur in enumerate(plan):
        ft.current = cur
        tok = timer.start(10**12 + i * 10**6)
        end = timer.stop(tok, 10**12 + i * 10**6 + 5)
        assert end[1].key == ft.current == ft.records[-1][1], i
    if not fail_at:
        assert len(entry.calls) == len(plan) and set(entry.calls) == {-1}
        assert raw["calls"] == raw_before and timer._c.stream_c  # no Python call on any phase end
    else:
        assert len(entry.calls) == fail_at and not timer._c.stream_c and timer.stream_calls == "torch_raw"
        assert raw["calls"] - raw_before == len(plan) - fail_at + 1  # from the failing call on


def test_torchs_stream_entry_is_taken_only_where_its_header_and_its_answer_agree(monkeypatch, tmp_path):
    """The header torch ships must declare (device_index, ret_stream), the order the C half calls
    (torch's first releases took the result first: called so, it would write through the device
    index); the library must be loaded; one call must answer what torch's Python call answers."""
    from sgl_probe import timing

    shim = tmp_path.joinpath("torch", *timing._STREAM_HEADER)
    shim.parent.mkdir(parents=True)
    torch_mod = NS(__file__=str(tmp_path / "torch" / "__init__.py"))
    entry = _StreamEntry(lambda: 0x4242)
    lib = NS(aoti_torch_get_current_cuda_stream=entry._fn)
    monkeypatch.setattr(timing, "_loaded_library", lambda name: lib if name == "libtorch_cuda.so" else None)
    new_order = ("AOTI_TORCH_EXPORT AOTITorchError\n"
                 "aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);\n")
    old_order = "AOTITorchError aoti_torch_get_current_cuda_stream(\n    void** ret,\n    int32_t device_index);\n"

    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4242) is None  # no header
    shim.write_text(old_order)
    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4242) is None
    assert entry.calls == []  # never called in the other order
    shim.write_text(new_order)
    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4242) == entry.address
    assert entry.calls == [-1]
    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4343) is None  # another answer
    failing = _StreamEntry(lambda: 0x4242, fail_at=1)
    lib.aoti_torch_get_current_cuda_stream = failing._fn
    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4242) is None
    monkeypatch.setattr(timing, "_loaded_library", lambda name: None)
    assert timing._torch_stream_entry(torch_mod, lambda d: 0x4242) is None  # torch's CUDA library not loaded


def test_a_failing_runtime_call_falls_back_to_torch_once_with_one_line(hot, monkeypatch, caplog):
    for fail in ({"fail_record": 400}, {"fail_capture": 900}):
        ft, rt, timer = _runtime_timer(hot, monkeypatch, **fail)
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            caplog.clear()
            ends = [timer.stop(timer.start(10**12 + i * 10**6), 10**12 + i * 10**6 + 5) for i in range(3)]
        assert all(e is not None for e in ends) and timer.hot_calls == "torch"
        assert rt.cleared == 1  # the runtime's last error cleared: torch's own checks must not see it
        assert len(ft.records) == 1 + 3  # the anchor, and every end recorded (by torch after the failure)
        (line,) = [r.getMessage() for r in caplog.records]
        what = "cudaEventRecord" if "fail_record" in fail else "cudaStreamIsCapturing"
        assert line == f"sgl-probe: {what} through the CUDA runtime failed; the hot path uses torch's calls " \
                       "from now on"
        assert len([c for c in rt.calls if c[0] == "record"]) == (1 if "fail_record" in fail else 0)


def test_a_runs_start_event_records_as_a_phase_end_does_through_the_runtime(hot, monkeypatch, caplog):
    """A sampled timer's run starts with a start event of its own, recorded through the same
    sequence as a phase end: through the runtime; where a runtime call fails (the capture check or
    the record) the runtime's error is cleared, one line says so and torch records it, as every
    event after it; while a graph is being captured it records nothing."""
    from sgl_probe import timing

    for fail, capturing in (({}, False), ({"fail_capture": 900}, False), ({"fail_record": 400}, False),
                            ({}, True)):
        ft = _FakeTorch()
        rt = _FakeRuntime(ft)
        monkeypatch.setattr(timing, "_runtime_entry_points", lambda on_fail: rt.addresses + (on_fail,))
        timer = CudaTimer(ft, hot, every_ns=10_000_000)
        timer.relax_capture_mode = False
        _STREAMS[:] = list(timer._streams.values())
        t = 10**12
        for index in range(16):  # k = 4 from the second step: steps 0-3 timed, then host times
            tok = timer.start(t, index)
            timer.release(tok, timer.stop(tok, t + 100_000))
            t += 1_600_000
        assert timer.gpu_stride == 4 and type(tok) is int and timer.hot_calls == "cuda_runtime"
        rt.fail_capture, rt.fail_record = fail.get("fail_capture", 0), fail.get("fail_record", 0)
        ft.capturing = capturing
        records, runtime_records = len(ft.records), sum(c[0] == "record" for c in rt.calls)
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            caplog.clear()
            tok = timer.start(t, 16)  # a run's first step after untimed ones
        lines = [r.getMessage() for r in caplog.records]
        if capturing:
            assert (len(tok) == 2 or tok[2] is None) and len(ft.records) == records and not lines
            continue
        assert tok[2] is not None and ft.records[records:] == [(tok[2], ft.current)]
        if not fail:
            assert sum(c[0] == "record" for c in rt.calls) == runtime_records + 1 and not lines
            continue
        what = "cudaEventRecord" if "fail_record" in fail else "cudaStreamIsCapturing"
        assert lines == [f"sgl-probe: {what} through the CUDA runtime failed; the hot path uses torch's calls "
                         "from now on"]
        assert timer.hot_calls == "torch" and rt.cleared == 1
        end = timer.stop(tok, t + 100_000)  # by torch from now on
        assert end[0] is not None and ft.records[-1] == (end[0], ft.current)
        assert sum(c[0] == "record" for c in rt.calls) == runtime_records + ("fail_record" in fail)


def _take_packed(hot, steps, timer, now: int, final: bool, limit: int, rows: list, pk, summary, msgs: list,
                 metrics=None) -> int:
    """``drain.take_ready`` in the packed pass, as the drain loops it: a full message is sent
    (kept in ``msgs``) and the rest of ``limit`` taken into the next."""
    from sgl_probe import drain

    total = 0
    while total < limit:
        got = drain.take_ready(steps, timer, now, final, limit - total, rows, pk, summary, metrics)
        total += got
        if not pk.full:
            return total
        msgs.append((pk.spans, pk.finish()))
    return total


def _unpacked(hot, msgs: list, rows: list) -> list:
    """The rows a packed pass sent (its messages read back) and the ones it left as rows, by step."""
    out = [r for _spans, data in msgs for r in hot.unpack_steps(data)[0]] + rows
    return sorted(out, key=lambda r: r[0])


def _summary_state(s) -> tuple:
    return (s._window, s._launch, s._accept, {g: list(q) for g, q in s._decode.items()}, s._seen)


def _metrics_state(m) -> tuple:
    snap = m.snapshot()
    return snap.phases, snap.steps, snap.accept_length, m._dirty, m.failed


def _drained_rows(hot, monkeypatch, c_take: bool, runtime: bool, refuse_second: bool = False,
                  keep_gil: bool = False, packed_bytes: int = 0, metrics_fast: object = False,
                  every_ns: int = 0, c_timer: bool = True) -> tuple:
    """Steps recorded by the C wrappers with the CUDA timer over a stand-in GPU (idle at some
    calls, behind at others, a launched graph, a raising phase, a verify), then drained by
    ``drain.take_ready``: in C (``CudaTimer.take_rows``) or by its Python loop; the elapsed times
    read by torch's reader or, once checked, the runtime's function itself (``keep_gil``: holding
    the GIL, the default; else releasing it, which the C drain does once per chunk, reading ahead).
    ``packed_bytes``: the packed pass, messages of that many bytes (the rows it returns are those
    its messages carry), which feeds the summary itself; else the rows are summed up by
    ``Summary.add_rows``. ``metrics_fast`` (not False): a PhaseMetrics made with it (the C module
    or None) is fed the same way, its state the last item. ``every_ns``: the timer's step sampling
    (``SGL_PROBE_GPU_EVERY_MS``); ``c_timer`` False: the timer's Python start / stop."""
    from sgl_probe.summary import Summary
    from sgl_probe import drain
    from tests.test_gpu_free_parts import _FakeCudart

    from sgl_probe import timing

    clock = iter(range(10**12, 10**13, 2_000_000))  # 2 ms between two clock reads: anchors fall due
    monkeypatch.setattr(recorder, "perf_counter_ns", lambda: next(clock))
    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)  # the same wall-clock offset every time
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    ft = _FakeTorch()
    rec = Recorder("cuda", 10_000, LOG, "c")
    timer = rec.timer = CudaTimer(ft, hot if c_timer else None, every_ns=every_ns)
    timer.relax_capture_mode = False
    timer.elapsed_keeps_gil = keep_gil
    state = timer._prepared  # as _prepare_thread leaves the drain thread
    state.exchange, state.elapsed, state.done = None, None, True
    rt = None
    rows: list = []
    seen: list = []  # how many rows were built at each runtime read
    if runtime:
        rt = _FakeCudart(ft)
        rt.on_call = lambda: seen.append(len(rows))
        state.elapsed = timer.checked_elapsed(rt)
    if not c_take:
        monkeypatch.setattr(timer, "take_rows", lambda *a: 0)
    launch = rec.launch_method(Hook(_target(role="graph_launch")), lambda g: None)

    def body(worker, batch, i=0, raise_=False):
        if i % 3:
            ft.queued_ms = max(ft.queued_ms, ft.gpu_ms) + 15.0  # the GPU still behind at the next call
        else:
            ft.gpu_ms = ft.queued_ms  # caught up: the next phase starts at its call
        if i % 4 == 1:
            launch("graph")
        ft.queued_ms += 0.5
        if raise_:
            raise KeyError("sglang")
        return NS(can_run_cuda_graph=bool(i % 2))

    starts = []
    start = timer.start
    timer.start = lambda now, first=True: starts.append(start(now, first)) or starts[-1]
    fwd = rec.phase_method(Hook(FORWARD), body)
    verify = rec.phase_method(Hook(VERIFY_V2), body)
    step = rec.step_method(Hook(STEP), lambda s, b, call: call())
    b = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    worker = NS(model_runner=NS(server_args=NS(disable_cuda_graph=False)))
    for i in range(60):
        try:
            if i % 10 == 7:
                step(None, b, lambda: (fwd(worker, b, i), verify(worker, b, i + 1)))
            else:
                step(None, b, lambda: fwd(worker, b, i, raise_=i == 23))
        except KeyError:
            pass
    for ph in rec.awaiting_accept:
        ph.accept_length = 2.0
    ft.gpu_ms = ft.queued_ms + 10  # everything done
    summ = Summary(30, {"tp_rank": 0}, hot)
    from sgl_probe.metrics import PhaseMetrics

    pm = None if metrics_fast is False else PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=metrics_fast)
    if packed_bytes:
        pk, msgs = hot.PackedSteps(packed_bytes), []
        take = functools.partial(_take_packed, hot, rec.steps, timer, 10**13, False, rows=rows, pk=pk,
                                 summary=summ, msgs=msgs, metrics=pm)
    else:
        take = functools.partial(drain.take_ready, rec.steps, timer, 10**13, False, out=rows)
    taken = take(limit=25)  # two chunks, as the drain does
    if refuse_second:
        rt.error = 700  # the runtime refuses from now on: the reads ahead, then the reads again
    taken += take(limit=1000)
    left = len(rows)  # steps the packed pass left as rows
    if packed_bytes:
        msgs.append((pk.spans, pk.finish()))
        sent = [r for _n, data in msgs for r in hot.unpack_steps(data)[0]]
        assert sum(n for n, _ in msgs) == len(sent) + sum(len(r[8]) for r in sent)  # the spans a drop costs
        rows = _unpacked(hot, msgs, rows)
    else:
        summ.add_rows(rows)
        if pm is not None:
            pm.observe_rows(rows)
    busy_due = sum(type(t) is tuple and len(t) > 2 for t in starts)
    return (rows, taken, len(timer._returned), timer._chain[1], timer.elapsed_source, rt and rt.calls, busy_due,
            seen, _summary_state(summ), left, len(msgs) if packed_bytes else 0,
            None if pm is None else _metrics_state(pm))


def test_the_c_drain_resolves_the_same_rows_as_the_python_loop(hot, monkeypatch):
    for runtime in (False, True):
        want = _drained_rows(hot, monkeypatch, c_take=False, runtime=runtime)
        got = _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime)
        assert got[:5] == want[:5]
        rows = got[0]
        assert len(rows) == got[1] == 60
        assert got[6] > 0  # starts made with a due anchor and a busy stream (their own branch)
        kinds = {ph[10] for row in rows for ph in row[8]}
        assert kinds == {"gpu_event", "host_clock"}
        assert any(ph[13] is not None for row in rows for ph in row[8])  # graph_ms from a launch
        assert any(ph[12] for row in rows for ph in row[8])  # the raising phase's error text
        assert got[4] == ("cuda_runtime" if runtime else "torch")
        if runtime:  # the checks through both readers, then the runtime's function alone, called from C
            assert got[5] == want[5] and got[5] > 16
            # The first pass checks the runtime's answers against torch's, one read at a time; the
            # second reads all of its elapsed times ahead, before its first row (one release of
            # the GIL), where the Python loop reads as it goes.
            second = [n for n in got[7] if n >= 25]
            assert len(second) > 30 and set(second) == {25}
            assert max(want[7]) > 50
    # The release's read keeps the GIL: the same rows, nothing read ahead (each read as the row
    # asks for it, in C as in Python).
    want = _drained_rows(hot, monkeypatch, c_take=False, runtime=True, keep_gil=True)
    got = _drained_rows(hot, monkeypatch, c_take=True, runtime=True, keep_gil=True)
    assert got[:4] == want[:4] and got[4] == want[4] == "cuda_runtime_gil" and got[5] == want[5]
    assert got[0] == _drained_rows(hot, monkeypatch, c_take=True, runtime=True)[0]
    assert max(got[7]) > 50 and len(set(n for n in got[7] if n >= 25)) > 10


def test_the_packed_pass_sends_the_rows_and_sums_up_the_steps_the_drain_would(hot, monkeypatch):
    """The drain's packed pass (every step exported, nothing else reading the rows): each step
    the C wrappers recorded is written straight into the link's message and added to the summary.
    Read back, the messages carry exactly the rows of the pass that makes them (types included),
    the summary holds the same, the timer is left in the same state; small messages end early
    (``full``) and the pass goes on in the next."""
    for runtime in (False, True):
        want = _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime)
        for size in (1 << 20, 700):
            got = _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime, packed_bytes=size)
            assert got[0] == want[0] and len(got[0]) == 60
            assert got[1:5] == want[1:5]
            if size > 1 << 16 or not runtime:
                assert got[5] == want[5]  # the same reads (a take that stops early reads the rest again)
            assert got[8] == want[8]  # the summary: windows, launches, accepts, decode histories, shapes
            assert got[9] == 0  # every step packed
            assert got[10] == 1 if size > 1 << 16 else got[10] > 8  # ~150 bytes a step: several messages
    assert any(ph[12] for row in want[0] for ph in row[8]) and any(ph[13] is not None for row in want[0] for ph in row[8])


def test_the_packed_pass_adds_to_the_metrics_what_their_loop_adds_from_the_rows(hot, monkeypatch):
    """With metrics on (``--enable-metrics``, OTLP metrics), the packed pass feeds them as it takes
    each step: every series (steps by mode, each (phase, mode, graph) histogram, accept lengths)
    ends as the rows' pass leaves it through ``observe_rows``, in C or in Python, whether the
    messages are large or end early; the metrics stay on, marked changed."""
    for runtime in (False, True):
        want = _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime, metrics_fast=None)
        assert want[11] == _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime, metrics_fast=hot)[11]
        for size in (1 << 20, 700):
            got = _drained_rows(hot, monkeypatch, c_take=True, runtime=runtime, packed_bytes=size, metrics_fast=hot)
            assert got[0] == want[0] and got[9] == 0
            assert got[11] == want[11] and got[11][3] and not got[11][4]
            assert got[8] == want[8]  # and the summary as before
    phases, steps, accept = want[11][:3]
    assert sum(n for _labels, n in steps) == 60 and sum(h.count for h in phases) == sum(len(r[8]) for r in want[0])
    assert accept is not None and accept.count > 0 and len({h.labels["cuda_graph"] for h in phases}) == 2


def test_a_metrics_error_in_the_packed_pass_turns_them_off_and_keeps_every_step(hot, monkeypatch, caplog):
    """A metrics series that cannot be made (its sink's labels refused, say) in the packed pass: the
    metrics switch themselves off with their one log line, as ``observe_rows`` does, and every step
    is still sent and summed up; later takes leave the metrics alone."""
    from sgl_probe import timing
    from sgl_probe.metrics import PhaseMetrics
    from sgl_probe.summary import Summary

    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    got = {}
    for broken in (False, True):
        rec = Recorder("cpu", 100, LOG, "c")
        _scenario(rec, monkeypatch)
        timer = rec.timer = CpuTimer(hot)
        m, summ = PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=hot), Summary(30, {"tp_rank": 0}, hot)
        if broken:
            made = m._new_hist
            calls = []

            def new_hist(key):
                calls.append(key)
                if len(calls) == 3:
                    raise ValueError("no such label")
                return made(key)

            m._new_hist = new_hist
        pk, msgs, rows = hot.PackedSteps(1 << 20), [], []
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            caplog.clear()
            n = _take_packed(hot, rec.steps, timer, 10**13, True, 10, rows, pk, summ, msgs, metrics=m)
            n += _take_packed(hot, rec.steps, timer, 10**13, True, 1000, rows, pk, summ, msgs, metrics=m)
        msgs.append((pk.spans, pk.finish()))
        got[broken] = (n, _unpacked(hot, msgs, rows), _summary_state(summ))
        warnings = [r.getMessage() for r in caplog.records]
        if broken:
            assert m.failed and len(calls) == 3 and m.c_state() is None
            assert warnings == ["sgl-probe: metrics disabled in this process after an error in observe_rows: "
                                "ValueError('no such label')"]
        else:
            assert not m.failed and not warnings and m._dirty
    assert got[True] == got[False] and got[True][0] == 23


def test_a_runtime_that_refuses_the_reads_ahead_is_asked_again_then_given_up(hot, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="sgl_probe"):
        want = _drained_rows(hot, monkeypatch, c_take=False, runtime=True, refuse_second=True)
        caplog.clear()
        got = _drained_rows(hot, monkeypatch, c_take=True, runtime=True, refuse_second=True)
    assert got[:5] == want[:5] and len(got[0]) == 60 and got[4] == "torch"
    assert [r.getMessage() for r in caplog.records if "cudaEventElapsedTime" in r.getMessage()] == [
        "sgl-probe: cudaEventElapsedTime through the CUDA runtime failed (error 700); the drain asks torch from now on"]


def test_the_c_drain_leaves_python_made_records_to_the_python_loop(hot, monkeypatch):
    from sgl_probe import drain

    ft = _FakeTorch()
    timer = CudaTimer(ft, hot)
    timer.relax_capture_mode = False
    state = timer._prepared
    state.exchange, state.elapsed, state.done = None, None, True
    import collections

    steps = collections.deque()
    for i in range(3):
        tok = timer.start(10**12 + i * 10**6)
        st = recorder.StepRecord(i, ("step", "DECODE", 1, 1), 10**12 + i * 10**6)
        ph = recorder.PhaseRecord(("decode", "DECODE", 1, 1), "t", 10**12 + i * 10**6, tok)
        ph.t_end = timer.stop(tok, 10**12 + i * 10**6 + 10)
        st.phases.append(ph)
        steps.append(st)
    ft.gpu_ms = 100.0
    rows: list = []
    assert timer.take_rows(steps, 3, rows, drain.error_text, drain._drop) == 0 and len(steps) == 3
    assert drain.take_ready(steps, timer, 10**13, False, 10, rows) == 3 and [r[0] for r in rows] == [0, 1, 2]


def test_the_c_drain_resolves_cpu_timer_steps_as_the_python_loop(hot, monkeypatch):
    """The CPU timer's steps (host-clock tokens): CpuTimer.take_rows in C against the Python loop."""
    from sgl_probe import drain, timing

    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)  # the same wall-clock offset every time
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    got = {}
    for c_take in (True, False):
        rec = Recorder("cpu", 100, LOG, "c")
        _scenario(rec, monkeypatch)  # its steps: errors, a capture, graphs and not, verifies
        timer = rec.timer = CpuTimer(hot)
        if not c_take:
            monkeypatch.setattr(timer, "take_rows", lambda *a: 0)
        rows: list = []
        n = drain.take_ready(rec.steps, timer, 10**13, True, 5, rows)
        n += drain.take_ready(rec.steps, timer, 10**13, True, 1000, rows)
        got[c_take] = (n, rows)
    assert got[True] == got[False]
    n, rows = got[True]
    assert n == len(rows) == 23 and {row[7] for row in rows} == {"cpu"}
    assert any(row[9] for row in rows) and any(ph[12] for row in rows for ph in row[8])  # errors' texts


def _cpu_steps(hot, monkeypatch, python_at: int) -> tuple:
    """The scenario's steps with the CPU timer, a step the Python wrappers made at ``python_at``."""
    from sgl_probe import timing

    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    rec = Recorder("cpu", 100, LOG, "c")
    _scenario(rec, monkeypatch)
    timer = rec.timer = CpuTimer(hot)
    py = recorder.StepRecord(10**6, ("step", "DECODE", 1, 1), 10**7)
    ph = recorder.PhaseRecord(("decode", "DECODE", 1, 1), "t", 10**7, 10**7)
    ph.t_end = ph.host1 = py.host1 = 10**7 + 5
    py.phases.append(ph)
    rec.steps.insert(python_at, py)
    return rec, timer


@pytest.mark.parametrize("python_at", [0, 1, 7, 20])
def test_the_c_drain_gives_back_the_steps_it_popped_ahead_in_their_order(hot, monkeypatch, python_at):
    """The C loop pops a few steps ahead of the one it takes (their lines fetched meanwhile): where
    it stops early (a step the Python wrappers made, a full message), those go back to the front of
    the queue in their order, untaken, and the rows are the Python loop's."""
    from sgl_probe import drain

    rec, timer = _cpu_steps(hot, monkeypatch, python_at)
    order = [st.index for st in rec.steps]
    rows: list = []
    taken = timer.take_rows(rec.steps, len(rec.steps), rows, drain.error_text, drain._drop)
    assert taken == python_at and [r[0] for r in rows] == order[:python_at]
    assert [st.index for st in rec.steps] == order[python_at:]  # the Python-made step first, then the rest
    assert drain.take_ready(rec.steps, timer, 10**13, True, 1000, rows) == len(order) - python_at
    rec2, timer2 = _cpu_steps(hot, monkeypatch, python_at)
    monkeypatch.setattr(timer2, "take_rows", lambda *a: 0)
    want: list = []
    drain.take_ready(rec2.steps, timer2, 10**13, True, 1000, want)
    assert rows == want and not rec.steps

    # A message that fills after a few steps: each call stops there, the rest waits in order.
    rec, timer = _cpu_steps(hot, monkeypatch, 10**6)  # the Python-made step last
    order = [st.index for st in rec.steps]
    pk, sent, n, calls = hot.PackedSteps(700), [], 0, 0
    while len(rec.steps) > 1:
        got = timer.take_rows(rec.steps, len(rec.steps), [], drain.error_text, drain._drop, pk, None)
        assert got > 0 and [st.index for st in rec.steps] == order[n + got:]
        n, calls = n + got, calls + 1
        sent += [r[0] for r in hot.unpack_steps(pk.finish())[0]]
    assert sent == order[:-1] and calls > 3


def test_the_packed_pass_leaves_a_step_the_layout_cannot_carry_as_a_row(hot, monkeypatch):
    """CPU timer steps (errors, a capture, graphs and not, verifies) in the packed pass: a step with
    a value the packed layout has no tag for (a mode that is not a str, a string that is not
    UTF-8) is left as a row, taken back from the message without a trace (its string not in the
    message's table); every other step is in the message. Rows and summary (in step order) as the
    rows' pass."""
    from sgl_probe import drain, timing
    from sgl_probe.summary import Summary

    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)  # the same wall-clock offset every time
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)

    class Mode(int):
        pass

    got = {}
    for packed in (True, False):
        rec = Recorder("cpu", 100, LOG, "c")
        _scenario(rec, monkeypatch)
        timer = rec.timer = CpuTimer(hot)
        steps = list(rec.steps)
        steps[3].mode = Mode(7)
        steps[8].phases[0].target = "t\ud800"
        summ = Summary(30, {"tp_rank": 0}, hot)
        rows: list = []
        if packed:
            pk, msgs = hot.PackedSteps(1 << 20), []
            n = _take_packed(hot, rec.steps, timer, 10**13, True, 1000, rows, pk, summ, msgs)
            left = [r[0] for r in rows]
            data = pk.finish()
            assert data[:4] == b"\xa7SP1"  # not None: no string in its table that is not UTF-8
            assert not any("t\ud800" in ph for r in hot.unpack_steps(data)[0] for ph in r[8])
            msgs.append((0, data))
            rows = _unpacked(hot, msgs, rows)
        else:
            n = drain.take_ready(rec.steps, timer, 10**13, True, 1000, rows)
            summ.add_rows(rows)
        got[packed] = (n, rows, _summary_state(summ))
    assert left == [steps[3].index, steps[8].index]
    assert got[True][0] == got[False][0] == 23
    assert got[True][1] == got[False][1] and type(got[True][1][3][3]) is Mode
    assert got[True][2] == got[False][2]


def test_the_packed_pass_without_a_summary_adds_to_none(hot, monkeypatch):
    """SGL_PROBE_SUMMARY_S=0 (no summary line): the packed pass writes the same steps and adds
    nothing anywhere; a Summary that is off is handed over as such and stays empty."""
    from sgl_probe import timing
    from sgl_probe.summary import Summary

    monkeypatch.setattr(timing, "perf_counter_ns", lambda: 0)
    monkeypatch.setattr(timing.time, "time_ns", lambda: 10**18)
    got = []
    for summary in (None, Summary(0, {"tp_rank": 0}, hot)):
        rec = Recorder("cpu", 100, LOG, "c")
        _scenario(rec, monkeypatch)
        timer = rec.timer = CpuTimer(hot)
        pk, msgs, rows = hot.PackedSteps(1 << 20), [], []
        assert _take_packed(hot, rec.steps, timer, 10**13, True, 1000, rows, pk, summary, msgs) == 23
        msgs.append((pk.spans, pk.finish()))
        got.append(_unpacked(hot, msgs, rows))
        assert not rows  # every step packed
        if summary is not None:
            assert summary.c_state() is None and summary._window == {}
    assert got[0] == got[1] and len(got[0]) == 23


def _summary_rows(seed: int, n: int) -> list:
    """Drain rows (resolved.from_row's order) of every kind the summary tells apart: decode with and
    without graphs, verify with and without an accept length, draft, extend with token buckets,
    graph launch leads, reasons, ints beyond a long long, odd token counts."""
    import random

    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        phases = []
        for _ in range(rnd.choice((1, 1, 2, 3))):
            phase = rnd.choice(("decode", "decode", "verify", "draft", "extend", "draft_extend"))
            graph = rnd.random() < 0.6
            if rnd.random() < 0.05:
                graph = int(graph)  # not a bool: the histories are still found by it
            t0 = rnd.randrange(10**18, 2 * 10**18) if rnd.random() < 0.9 else rnd.choice((2**64, -(2**63) - 5))
            t1 = t0 + rnd.randrange(0, 40_000_000)
            ntok = rnd.choice((1, 2, 7, 8, 9, 1000, 0, -3, None, 2**70, 3.0))
            phases.append((phase, t0, t1, graph, rnd.choice(("DECODE", "EXTEND", "TARGET_VERIFY")),
                           rnd.choice((1, 8, 16)), ntok, 0.01, "t", rnd.choice((None, 1.5, 3)),
                           rnd.choice((None, "host", "prev")), None if graph else rnd.choice(("disabled", None)),
                           None, rnd.choice((None, 0.25, 12.0))))
        rows.append((i, 0, 1, "DECODE", 1, 1, 0.1, "cuda", tuple(phases), None))
    return rows


def test_the_c_metrics_add_the_rows_as_the_python_loop(hot):
    """PhaseMetrics.observe_rows in C (``metrics_add``) changes the same series the same way as
    the Python loop: step counts by mode (None among them), every (phase, mode, graph) histogram's
    counts, sum, min and max (types included: an int accept length stays an int as min / max),
    accept lengths; times beyond a long long and an accept length that is not an int or float go
    through the Python arithmetic, and so does every value added once such a one is a minimum; the
    snapshots the sinks get are equal, and the metrics stay on."""
    import fractions

    from sgl_probe import metrics

    def snap(m):
        got = m.snapshot()
        return got.phases, got.steps, got.accept_length, m._dirty

    for seed in range(4):
        py = metrics.PhaseMetrics({"tp_rank": 0}, [], flush_s=3600)
        c = metrics.PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=hot)
        assert c._fast_add is not None and py._fast_add is None
        for chunk in range(5):
            rows = _summary_rows(seed * 100 + chunk, 60)
            if chunk == 2:
                rows = [r[:3] + (None,) + r[4:] for r in rows[:20]] + rows[20:]  # mode None: "unknown"
            if chunk == 3:
                # an accept length that is neither an int nor a float, which becomes the minimum:
                # every later step's accept length then goes through Hist.add's own comparisons
                ph = ("verify", 10, 10 + 3_000_000, True, "TARGET_VERIFY", 1, 1, 0.1, "t", fractions.Fraction(1, 2),
                      None, None, None, None)
                rows.append((999, 0, 1, "DECODE", 1, 1, 0.1, "cuda", (ph,), None))
            py.observe_rows(rows)
            c.observe_rows(rows)
            assert not py.failed and not c.failed
            assert snap(c) == snap(py)
        phases = snap(c)[0]
        accept = snap(c)[2]
        assert len(phases) > 10 and (accept.min, type(accept.max)) == (fractions.Fraction(1, 2), int)  # 1/2, 3
        assert {h.labels["forward_mode"] for h in phases} >= {"DECODE", "EXTEND", "TARGET_VERIFY"}
        assert sum(h.count for h in phases) == sum(len(r[8]) for chunk in range(5)
                                                    for r in _summary_rows(seed * 100 + chunk, 60)) + 1


def test_the_c_metrics_fail_as_the_python_loop_does(hot, caplog):
    """A row the loop cannot read: both switch the metrics off with one log line; the C loop
    never crashes on it."""
    from sgl_probe import metrics

    for fast in (None, hot):
        m = metrics.PhaseMetrics({"tp_rank": 0}, [], flush_s=3600, fast=fast)
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            caplog.clear()
            m.observe_rows([(0, 0, 1, "DECODE", 1, 1, 0.1, "cuda", (("decode", "x", 5, True),), None)])
        assert m.failed
        assert [r.getMessage().split(" after ")[0] for r in caplog.records] == ["sgl-probe: metrics disabled in this process"]


def test_the_c_summary_adds_as_the_python_one(hot):
    """The drain's per-phase accounting for the summary line in C changes the same state the same
    way (shapes seen, the window's items, launch leads, accept lengths, the decode history), and
    the line it prints is the same; the shape cap holds."""
    from sgl_probe import summary as summary_mod
    from sgl_probe.summary import Summary

    def state(s):
        return (s._seen, {k: list(v) for k, v in s._window.items()}, s._launch, s._accept,
                {k: list(v) for k, v in s._decode.items()})

    for seed, cap in ((1, summary_mod.MAX_SHAPES), (2, 25)):
        old = summary_mod.MAX_SHAPES
        summary_mod.MAX_SHAPES = cap
        try:
            py, c = Summary(30, {"tp_rank": 0}), Summary(30, {"tp_rank": 0}, hot)
            assert c._fast_add is not None and py._fast_add is None
            for chunk in range(6):
                rows = _summary_rows(seed * 100 + chunk, 80)
                py.add_rows(rows)
                c.add_rows(rows if chunk % 2 else tuple(rows))
            assert state(c) == state(py)
            assert len(c._seen) <= cap
            assert c.line() == py.line()
        finally:
            summary_mod.MAX_SHAPES = old
    bad = Summary(30, {"tp_rank": 0}, hot)
    with pytest.raises(ValueError):
        bad.add_rows([(0, 0, 1, "DECODE", 1, 1, 0.1, "cuda", (("decode", 0, 1),), None)])
    off = Summary(0, {"tp_rank": 0}, hot)
    off.add_rows(_summary_rows(3, 5))
    assert not off._window


def test_the_c_ready_checks_take_the_steps_the_python_ones_take(hot):
    """drain.take_ready's checks before its loop (timers completed, then no verify still waiting
    for its accept length unless it is older than the wait) in C give the same count as the
    Python ones, over C and Python records alike, for the CUDA timer (ready_prefix) and a
    host-clock one."""
    import collections
    import random

    from sgl_probe import drain
    from sgl_probe.readers import Facts

    class Timer:
        host_clock = False

        def __init__(self):
            self.asked = []

        def ready_prefix(self, ends):
            self.asked.append(list(ends))
            return next((i for i, e in enumerate(ends) if e[2]), len(ends))

    class HostTimer:
        host_clock = True

    rnd = random.Random(7)
    now = 10**13
    for trial in range(300):
        steps = collections.deque()
        for i in range(rnd.randrange(0, 12)):
            c = rnd.random() < 0.5
            Step = hot.StepRecord if c else recorder.StepRecord
            Phase = hot.PhaseRecord if c else recorder.PhaseRecord
            st = Step(i, Facts("step", "DECODE", 1, 1), 0)
            st.host1 = now - rnd.choice((0, 10, drain.ACCEPT_WAIT_NS, drain.ACCEPT_WAIT_NS + 1, 3 * drain.ACCEPT_WAIT_NS))
            for j in range(rnd.choice((0, 1, 1, 2, 3))):
                ph = Phase(Facts(rnd.choice(("decode", "verify", "draft")), "DECODE", 1, 1), "t", 0, 0)
                ph.t_end = None if rnd.random() < 0.2 else ("e", (i, j), rnd.random() < 0.08)
                ph.accept_length = rnd.choice((None, 2))
                ph.error = rnd.choice((None, None, None, KeyError("x")))
                st.phases.append(ph)
            steps.append(st)
        n = rnd.randrange(0, len(steps) + 1)
        for timer in (Timer(), HostTimer()):
            prefix = getattr(timer, "ready_prefix", None)
            want = drain.ready_steps(steps, n, timer, now)
            asked = list(getattr(timer, "asked", []))
            got = hot.ready_steps(prefix, steps, n, now - drain.ACCEPT_WAIT_NS)
            assert got == want, (trial, n)
            if prefix is not None and n:
                assert timer.asked[-1] == asked[-1]  # the same ends, in the same order
    with pytest.raises(ValueError):
        hot.ready_steps(lambda ends: len(ends) + 1, collections.deque([steps[0]] if steps else []) or
                        collections.deque([recorder.StepRecord(0, Facts("step", "DECODE", 1, 1), 0)]), 1, now)


def test_a_clock_patched_after_the_real_one_was_seen_is_read(hot, monkeypatch):
    """The C wrappers remember that the recorder module's clock is time.perf_counter_ns (CPython
    3.12+ watches that module's dict); a clock patched in later, and the real one put back, are
    each read from their next call on."""
    rec = Recorder("cpu", 100, LOG, "c")
    rec.timer = CpuTimer()
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b: None)
    step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    step(None, batch)
    step(None, batch)
    assert rec.steps[-1].host0 > 10**6  # the real clock, now remembered
    monkeypatch.setattr(recorder, "perf_counter_ns", lambda: 7)
    step(None, batch)
    last = rec.steps[-1]
    assert (last.host0, last.host1, last.phases[0].host0, last.phases[0].host1) == (7, 7, 7, 7)
    monkeypatch.undo()
    before = time.perf_counter_ns()
    step(None, batch)
    step(None, batch)
    assert rec.steps[-1].host0 >= before and rec.steps[-1].phases[0].host1 >= before


def test_enabled_is_read_from_the_hooks_slot_and_from_any_other_hook(hot):
    """instrument.Hook keeps ``enabled`` in a slot, which the C wrappers read directly; turning it
    off stops the recording at the next call; a hook object without the slot (any object with an
    ``enabled`` attribute) is read through getattr, with the same effect."""
    assert "enabled" in Hook.__slots__
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    for hook in (Hook(STEP), NS(enabled=True, target=STEP, fail=lambda exc: None)):
        rec = Recorder("cpu", 100, LOG, "c")
        rec.timer = CpuTimer()
        fwd = rec.phase_method(Hook(FORWARD), lambda w, b: None)
        step = rec.step_method(hook, lambda s, b: fwd(None, b))
        step(None, batch)
        hook.enabled = False
        step(None, batch)
        hook.enabled = 1  # truthy, not True: still on
        step(None, batch)
        assert len(rec.steps) == 2, type(hook)


def test_the_c_timer_reads_each_events_handle_from_torch_once(hot, monkeypatch):
    """The runtime path keeps each pooled event's raw handle: events cycling through the pool (the
    drain releasing them, stop() reusing them) are each read from torch once, and every record
    names the event it was given; an event torch has not created yet (handle 0) is not kept, and is
    read again once it has one."""
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    Event = ft.cuda.Event
    reads = []
    handle = {}

    def cuda_event(ev):
        reads.append(ev)
        return handle.get(id(ev), id(ev))

    monkeypatch.setattr(Event, "cuda_event", property(cuda_event, lambda ev, v: handle.__setitem__(id(ev), v)),
                        raising=False)
    t = 10**12
    tok = timer.start(t)
    ends = []
    for i in range(60):
        end = timer.stop(tok, t + 500 + i)
        assert rt.calls[-1][0] == "record" and rt.calls[-1][1] == id(end[0])
        ends.append(end)
        if len(ends) > 3:  # the drain hands the oldest back: the pool cycles a few events
            old = ends.pop(0)
            timer.release(None, old)
        tok = timer.start(t + 1000 + i)
    used = {id(e[0]) for e in ends} | {c[1] for c in rt.calls if c[0] == "record"}
    assert len(used) <= 6
    assert len(reads) <= len(used), (len(reads), len(used))
    fresh = Event(enable_timing=True)
    fresh.cuda_event = 0
    timer._pool.append(fresh)
    before = len(reads)
    timer.stop(timer.start(t + 10**6), t + 10**6 + 5)  # not created: torch records it
    fresh.cuda_event = 0xABC0  # created now
    ft.handles[0xABC0] = fresh
    timer._returned.append(fresh)
    timer._pool.clear()
    timer.stop(timer.start(t + 2 * 10**6), t + 2 * 10**6 + 5)
    assert rt.calls[-1][:2] == ("record", 0xABC0)
    assert sum(1 for ev in reads[before:] if ev is fresh) == 2
    assert timer._c.handles_kept == len(used) + 1


def test_the_event_handle_table_stays_bounded_and_takes_only_pool_events(hot, monkeypatch):
    """A pool that keeps making new events fills the table at half its size, and it starts again:
    events only the table held are let go, every record still names its event. The drain's reads
    (the anchors, made anew every 100 ms) look handles up but add none."""
    import weakref

    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    t = 10**12
    first = []
    for i in range(4200):
        ev = ft.cuda.Event(enable_timing=True)
        if 0 < i <= 10:  # (the first end is the device's first anchor, which the timer keeps)
            first.append(weakref.ref(ev))
        timer._pool.append(ev)
        end = timer.stop(timer.start(t + i), t + i + 1)
        assert end[0] is ev and rt.calls[-1][:2] == ("record", id(ev))
        if i < 4000:
            ft.handles.pop(id(ev), None)
        ft.records.clear()  # (the stand-in GPU's log of records)
        del ev, end
        assert timer._c.handles_kept <= 4096
    timer._last_end = None
    import gc as _gc

    _gc.collect()
    assert all(r() is None for r in first)  # let go at the restart
    kept = timer._c.handles_kept
    assert 0 < kept < 4096

    from tests.test_gpu_free_parts import _FakeCudart

    timer._prepared.elapsed = timer.checked_elapsed(_FakeCudart(ft))
    a = timer.start(t + 10**7)
    end = timer.stop(a, t + 10**7 + 5)
    anchor = ft.cuda.Event(enable_timing=True)
    ft._record(anchor, end[1])
    for _ in range(50):  # until the runtime's reader has been checked against torch's
        timer.interval_kind(a, end)
        if timer.elapsed_source == "cuda_runtime_gil":
            break
    assert timer.elapsed_source == "cuda_runtime_gil"
    kept = timer._c.handles_kept
    end2 = (end[0], end[1], end[2], (anchor, t + 10**7))  # an anchor the table has never seen
    reads = []
    Event = type(anchor)
    monkeypatch.setattr(Event, "cuda_event", property(lambda ev: reads.append(ev) or id(ev)), raising=False)
    for _ in range(3):  # the anchor of many phases: read from torch once
        timer.interval_kind(a, end2)
    assert timer._c.handles_kept == kept
    assert reads.count(anchor) == 1 and end[0] not in reads


def test_values_the_c_wrappers_keep_follow_a_change(hot, monkeypatch):
    """What the C wrappers read on every call from the recorder and its timer follows a change
    from the next call on: a timer swapped in, a stop replaced on the instance, a max_pending
    lowered, a pool replaced (none of it may be remembered past a change)."""
    rec = Recorder("cpu", 100, LOG, "c")
    first, second = CpuTimer(), CpuTimer()
    rec.timer = first
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b: None)
    step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    for _ in range(3):
        step(None, batch)
    stops = []
    second.stop = lambda token, now: stops.append(now) or now
    rec.timer = second
    step(None, batch)
    assert len(stops) == 1 and rec.steps[-1].phases[0].t_end == stops[0]
    second.stop = lambda token, now: 42
    step(None, batch)
    assert rec.steps[-1].phases[0].t_end == 42 and len(stops) == 1
    n = len(rec.steps)
    rec.max_pending = n  # full: the next step is dropped
    step(None, batch)
    assert len(rec.steps) == n and rec.dropped_steps == 1

    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    t = 10**12
    end = timer.stop(timer.start(t), t + 5)
    timer.release(None, end)
    mine = ft.cuda.Event(enable_timing=True)
    timer._pool = [mine]
    assert timer.stop(timer.start(t + 10), t + 15)[0] is mine


def _cuda_steps(timer, max_pending: int = 100) -> tuple:
    """A recorder over ``timer`` and its C step wrapper around one decode phase's wrapper."""
    rec = Recorder("cuda", max_pending, LOG, "c")
    rec.timer = timer
    fwd = rec.phase_method(Hook(FORWARD), lambda w, b: None)
    return rec, rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))


def test_the_phase_wrapper_calls_the_cuda_timers_c_half_and_follows_a_replaced_method(hot, monkeypatch):
    """With the CUDA timer's C half (``timer._c``) the phase wrapper calls its start and stop
    directly; a stop replaced on the timer's instance, the class's method put back, and another
    timer swapped in are each what the next call runs."""
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    rec, step = _cuda_steps(timer)
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    mine = ft.cuda.Event(enable_timing=True)
    step(None, batch)
    timer._pool.append(mine)
    step(None, batch)
    ends = [st.phases[0].t_end for st in rec.steps]
    assert ends[1][0] is mine and ends[0][1] is ends[1][1]  # (event, stream, now, anchor)
    assert rec.steps[1].phases[0].t_start[1] is ends[0]  # start: (now, the previous end)
    assert [c[0] for c in rt.calls].count("record") >= 2

    timer.stop = lambda token, now: ("replaced", token, now)
    step(None, batch)
    assert rec.steps[-1].phases[0].t_end[0] == "replaced"
    del timer.stop  # the class's method (Python) from the next call on
    n = len(ft.records) + sum(c[0] == "record" for c in rt.calls)
    step(None, batch)
    assert isinstance(rec.steps[-1].phases[0].t_end, tuple) and rec.steps[-1].phases[0].t_end[0] != "replaced"
    assert len(ft.records) + sum(c[0] == "record" for c in rt.calls) == n + 1

    timer.stop = timer._c.stop  # as CudaTimer sets it
    step(None, batch)
    ft2, rt2, second = _runtime_timer(hot, monkeypatch)
    theirs = ft2.cuda.Event(enable_timing=True)
    second._pool.append(theirs)
    rec.timer = second
    step(None, batch)
    assert rec.steps[-1].phases[0].t_end[0] is theirs
    assert any(c[0] == "record" for c in rt2.calls)


def _put_stop(timer, fn):  # one store site, run often enough for CPython to specialize it
    timer.stop = fn


def test_the_timers_methods_are_known_without_a_look_up_until_its_dict_changes(hot, monkeypatch):
    """Where CPython can watch a dict (3.12+), the C half's start and stop, once found in the timer's
    instance dict, are called without looking again until that dict changes: a stop replaced (from
    a specialized store too), any other attribute set, are each seen by the next phase; a timer's C
    half gives its watch back when it goes. Before 3.12 every call looks."""
    import sys

    watching = sys.version_info >= (3, 12)
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    rec, step = _cuda_steps(timer, 10_000)
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    step(None, batch)
    assert timer._c.methods_known is watching
    own = timer._c.stop
    for i in range(60):
        _put_stop(timer, lambda token, now, i=i: ("replaced", i))
        assert not timer._c.methods_known
        step(None, batch)
        assert rec.steps[-1].phases[0].t_end == ("replaced", i)
        _put_stop(timer, own)
        step(None, batch)
        assert rec.steps[-1].phases[0].t_end[0] in ft.handles.values()
        assert timer._c.methods_known is watching
    timer.unrelated = 1
    assert not timer._c.methods_known
    step(None, batch)
    assert timer._c.methods_known is watching
    del rec, step
    # More timers than there are watch slots, one after another, each C half let go while its
    # timer's dict lives on: each gives its slot back.
    dicts = []
    for _ in range(3 * 8):
        _, _, other = _runtime_timer(hot, monkeypatch)
        r, other_step = _cuda_steps(other)
        other_step(None, batch)
        assert other._c.methods_known is watching
        dicts.append(vars(other))
        for name in ("_c", "start", "stop"):
            dicts[-1].pop(name)
        del other, r, other_step
        gc.collect()


def test_the_recorders_per_step_attributes_are_slots_and_any_other_kind_is_read_as_python_does(hot):
    """The C wrappers read ``timer``, ``step_count`` and ``max_pending`` from the recorder's slots
    (and write the count there); a recorder class that makes any of them a property is read and
    written through it, with the same effect."""
    assert {"timer", "step_count", "max_pending"} <= set(Recorder.__slots__)
    batch = NS(forward_mode=ForwardMode.DECODE, seq_lens=NS(shape=(2,)))
    seen = []

    class Props(Recorder):
        timer = property(lambda self: seen.append("timer") or self.__dict__["t"],
                         lambda self, v: self.__dict__.__setitem__("t", v))
        step_count = property(lambda self: self.__dict__["n"], lambda self, v: seen.append(v) or
                              self.__dict__.__setitem__("n", v))
        max_pending = property(lambda self: self.__dict__["m"], lambda self, v: self.__dict__.__setitem__("m", v))

    for cls in (Recorder, Props):
        seen.clear()
        rec = cls("cpu", 3, LOG, "c")
        rec.timer = CpuTimer()
        fwd = rec.phase_method(Hook(FORWARD), lambda w, b: None)
        step = rec.step_method(Hook(STEP), lambda s, b: fwd(None, b))
        for _ in range(5):
            step(None, batch)
        assert rec.step_count == 5 and [st.index for st in rec.steps] == [1, 2, 3], cls
        assert rec.dropped_steps == 2, cls
        rec.max_pending = 10**30  # beyond a machine word: Python's comparison
        step(None, batch)
        assert len(rec.steps) == 4, cls
        if cls is Props:
            assert seen.count("timer") >= 12 and [v for v in seen if v != "timer"] == [0, 1, 2, 3, 4, 5, 6]



def test_the_timers_per_phase_values_live_in_its_c_half_and_read_the_same_from_python(hot, monkeypatch):
    """``_anchor_due``, ``_anchor_busy``, ``_last_end``, ``_chain``, ``_pool``, ``_anchors`` and
    ``_raw_stream`` move into the C half when the timer gets one (no stale copies left in the instance dict); a write
    from Python is what the C start, stop and drain use next, and what they write is what Python
    reads. A timer without a C half keeps them as plain attributes."""
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    assert not {"_anchor_due", "_anchor_busy", "_last_end", "_chain", "_pool", "_anchors", "_raw_stream"} \
        & set(vars(timer))
    assert (timer._anchor_due, timer._anchor_busy, timer._last_end, timer._chain) == (0, False, None, (None, 0))
    t = 10**12
    end = timer.stop(timer.start(t), t + 5)  # the first start takes an anchor
    assert timer._last_end is end and timer._anchor_due == t + CudaTimer._ANCHOR_EVERY_NS
    timer._last_end = marker = ("marker",)
    assert timer.start(t + 10)[1] is marker
    timer._anchor_busy = True  # what the C start marks its tokens by (the anchor not due: not asked)
    assert timer.start(t + 11) == (t + 11, marker, None) and timer._c.anchor_busy is True
    timer._anchor_busy = False
    assert timer.start(t + 12) == (t + 12, marker)
    timer._anchor_due = t + 20  # due: the next start past it takes a fresh anchor (one more record)
    n = len(ft.records)
    timer.start(t + 19)
    assert len(ft.records) == n
    timer.start(t + 20)
    assert len(ft.records) == n + 1 and timer._anchor_due == t + 20 + CudaTimer._ANCHOR_EVERY_NS
    timer._chain = (end, 42)
    assert timer._c.chain == (end, 42)
    timer._anchors = {}  # no anchor on this device: the next end is its own anchor
    e = timer.stop(timer.start(t + 30), t + 35)
    assert e[3][0] is e[0] and timer._anchors[ft.current[1]] is e[3]
    mine = ft.cuda.Event(enable_timing=True)
    timer._pool = [mine]
    timer._pop = lambda: pytest.fail("the pool had an event: taken in C, without the Python fallback")
    assert timer.stop(timer.start(t + 40), t + 45)[0] is mine and timer._pool == []
    del timer._pop
    asked = []
    timer._raw_stream = lambda device: asked.append(device) or 0x7777  # a handle no look-up named
    timer.stop(timer.start(t + 50), t + 55)
    assert asked == [-1]
    with pytest.raises(TypeError):
        timer._chain = None
    plain = CudaTimer(_FakeTorch(), None)  # no C half: plain attributes, as its Python methods read fastest
    assert type(plain) is CudaTimer and isinstance(timer, CudaTimer) and type(timer) is not CudaTimer
    assert plain._c is None and vars(plain)["_anchor_due"] == 0 and vars(plain)["_last_end"] is None
    plain._chain = (None, 7)
    assert vars(plain)["_chain"] == (None, 7) == plain._chain


def test_the_anchor_is_refreshed_through_the_runtime_from_events_the_drain_thread_made(hot, monkeypatch):
    """With the runtime's calls, a due anchor is refreshed in C with the GIL held: the stream asked
    by cudaStreamQuery (busy: asked again _ANCHOR_RETRY_NS later), and an idle one gets an event
    the drain thread made and recorded once (replenish) recorded through cudaEventRecord, never
    through torch, whose record releases the GIL and creates a new event. With nothing stocked, a
    runtime answer other than idle or busy, or on a thread whose capture mode is not relaxed, the
    Python refresh decides as before."""
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    t = 10**12
    timer.stop(timer.start(t), t + 5)  # the first anchor: nothing stocked yet, through Python
    first = timer._anchors[0]
    torch_records: list = []
    record = timer._record
    timer._record = lambda ev, st: torch_records.append(ev) or record(ev, st)
    timer.replenish()
    assert timer._fresh == {} and torch_records == []  # this thread's capture mode is not relaxed
    timer._prepared.relaxed = True  # as _prepare_thread leaves a probe thread
    timer.replenish()
    stock = timer._fresh[0]
    assert len(stock) == CudaTimer._FRESH_STOCK and torch_records == stock and all(ev.t is not None for ev in stock)
    timer.replenish()  # stocked: nothing made
    assert len(torch_records) == CudaTimer._FRESH_STOCK
    torch_records.clear()
    rt.calls.clear()
    due = timer._anchor_due
    ft.queued_ms = ft.gpu_ms + 5.0  # busy
    cleared = rt.cleared
    tok = timer.start(due)
    assert tok[2:] == (None,) and [c[0] for c in rt.calls] == ["capturing", "query"]
    assert timer._anchor_due == due + CudaTimer._ANCHOR_RETRY_NS and timer._anchors[0] is first
    assert rt.cleared == cleared + 1  # "not ready" cleared, as torch's query clears it
    rt.calls.clear()
    assert timer.start(due + 1)[2:] == (None,) and rt.calls == []  # within the retry: not asked
    ft.gpu_ms = ft.queued_ms  # idle
    ev, at = stock[-1], due + CudaTimer._ANCHOR_RETRY_NS
    tok = timer.start(at)
    assert len(tok) == 2 and [c[0] for c in rt.calls] == ["capturing", "query", "record"]
    assert rt.calls[-1][1] == ev.cuda_event and ft.records[-1][0] is ev and torch_records == []
    assert timer._anchors[0] == (ev, at) and len(stock) == CudaTimer._FRESH_STOCK - 1
    assert timer._anchor_due == at + CudaTimer._ANCHOR_EVERY_NS and not timer._anchor_busy
    end = timer.stop(tok, at + 5)
    assert end[3] is timer._anchors[0] and end[0] is not ev  # the ends map through it; it is never pooled
    # A capture running: nothing recorded, not busy, asked again at the next start.
    ft.capturing = True
    rt.calls.clear()
    timer._anchor_due = 0
    assert len(timer.start(at + 10)) == 2 and [c[0] for c in rt.calls] == ["capturing"] and timer._anchor_due == 0
    ft.capturing = False
    # An error of earlier work from the query: torch's query (Python's refresh) decides.
    rt.fail_query = 700
    asked: list = []
    timer._stream_query = lambda st: asked.append(st) or True
    n = len(stock)
    timer.start(at + 20)
    assert len(asked) == 1 and len(torch_records) == 1 and timer._anchors[0][0] is torch_records[0]
    assert len(stock) == n and rt.cleared == cleared + 1 and timer.hot_calls == "cuda_runtime"


def test_replenishing_that_fails_stops_with_one_line_and_anchors_go_through_torch(hot, monkeypatch, caplog):
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    t = 10**12
    timer.stop(timer.start(t), t + 5)
    timer._prepared.relaxed = True

    def broken():
        raise RuntimeError("no events today")

    new, timer._new = timer._new, broken
    with caplog.at_level(logging.INFO, logger="sgl_probe"):
        timer.replenish()
        timer.replenish()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("sgl-probe: making anchor events on the drain thread failed (RuntimeError(")
    assert timer._fresh is None
    timer._new = new
    asked: list = []
    query = timer._stream_query
    timer._stream_query = lambda st: asked.append(st) or query(st)
    timer._anchor_due = 0
    timer.start(t + 10)
    assert len(asked) == 1  # Python's refresh, through torch


def test_without_the_runtime_calls_nothing_is_stocked():
    from tests.test_gpu_free_parts import _FakeTorch

    timer = CudaTimer(_FakeTorch(), c_module())  # no libcudart on this machine: torch's calls
    t = 10**12
    timer.stop(timer.start(t), t + 5)
    timer._prepared.relaxed = True
    timer.replenish()
    assert timer._fresh == {} and timer.hot_calls == "torch"


def test_anchor_events_go_back_to_the_stock_once_nothing_maps_through_them(hot, monkeypatch):
    """An event replenish made is stocked again once it is no longer the anchor and no end token
    that maps through it is left; an end still waiting for the drain keeps it out (recording it
    again would move that end). Only what recycling does not cover is made, and free events beyond
    what the stock takes are let go."""
    ft, rt, timer = _runtime_timer(hot, monkeypatch)
    t = 10**12
    timer.stop(timer.start(t), t + 5)
    timer._prepared.relaxed = True
    timer._pool.extend(ft.cuda.Event(enable_timing=True) for _ in range(8))  # the ends' events
    made: list = []
    new = timer._new
    timer._new = lambda: made.append(1) or new()
    timer.replenish()
    stock = timer._fresh[0]
    assert len(made) == CudaTimer._FRESH_STOCK

    def anchored_phase(at):
        ft.gpu_ms = ft.queued_ms  # idle: the due anchor is refreshed from the stock
        end = timer.stop(timer.start(at), at + 5)
        assert end[3] is timer._anchors[0] and end[3][1] == at
        return end

    def ids(evs):  # by id: a name for an event here would hold it
        return {id(ev) for ev in evs}

    every = CudaTimer._ANCHOR_EVERY_NS
    at = timer._anchor_due
    ends = [anchored_phase(at + i * every) for i in range(3)]
    taken = [id(e[3][0]) for e in ends]
    assert len(stock) == CudaTimer._FRESH_STOCK - 3 and not ids(stock) & set(taken)
    ft.records.clear()  # the stand-in's own log of records holds every event
    timer.replenish()  # the first two are no longer anchors, but their ends still wait: made anew
    assert len(made) == CudaTimer._FRESH_STOCK + 3 and not ids(stock) & set(taken)
    del ends[:2]  # the drain is done with those ends
    ends.append(anchored_phase(at + 3 * every))
    ft.records.clear()
    timer.replenish()
    assert len(made) == CudaTimer._FRESH_STOCK + 3  # nothing made: one of the two free ones taken back
    assert len(ids(stock) & set(taken[:2])) == 1 and len(stock) == CudaTimer._FRESH_STOCK
    assert taken[2] not in ids(stock)  # its end still waits
    assert len(ids(timer._made[0]) & set(taken[:2])) == 1  # the other free one let go
    stock.sort(key=lambda ev: id(ev) in taken)  # the recycled one is taken next
    end = anchored_phase(at + 4 * every)  # it anchors again, recorded through the runtime
    assert id(end[3][0]) in taken[:2] and len(made) == CudaTimer._FRESH_STOCK + 3 == timer.anchor_events_made
    assert [c for c in rt.calls if c[0] == "record"][-2][1] == end[3][0].cuda_event


def test_a_sampled_cuda_timer_times_a_step_per_interval_and_resolves_the_others_as_host_times(hot, monkeypatch):
    """``SGL_PROBE_GPU_EVERY_MS``: the timer times runs of four steps, the steps whose index
    modulo 4k is below 4, k the largest power of two with k steps within its interval (every clock
    read here is 2 ms, a step 8-12 ms: with 50 ms, k is 4 once the first step has given the period;
    the first is timed), the step's first phase deciding for all of them; the others keep
    their host times, under the timer kind ``host``, and cost no event. The C and Python timers
    and drains resolve the same rows (a timed step after an untimed one has a start event of its
    own: its start is the GPU's, not the chain's), and the summary takes only the timed steps."""
    from sgl_probe.summary import Summary

    rows = None
    for c_timer in (True, False):
        for c_take in (True, False):
            got = _drained_rows(hot, monkeypatch, c_take=c_take, runtime=True, every_ns=50_000_000, c_timer=c_timer)
            if rows is None:
                rows, first = got[0], got
            assert got[0] == rows and got[8] == first[8] and got[1] == 60
    timers = [r[7] for r in rows]
    timed = [r for r in rows if r[7] == "cuda"]
    assert set(timers) == {"cuda", "host"}
    assert [r[0] for r in timed] == [i for i in sorted(r[0] for r in rows) if i % 16 < 4 or i == rows[0][0]]
    for r in rows:
        for ph in r[8]:
            if r[7] == "host":
                # the phase's host call: its interval is its host time, no start kind
                assert ph[10] is None and ph[2] - ph[1] == round(ph[7] * 1e6)
            else:
                assert ph[10] in ("gpu_event", "host_clock")
    after_host = [rows[i] for i in range(1, len(rows)) if rows[i][7] == "cuda" and rows[i - 1][7] == "host"]
    assert after_host and all(r[8][0][10] == "gpu_event" for r in after_host if r[8])
    # every event back in the pool, the start events as well (but the first phase's end where
    # that was the timer's first anchor, which stays)
    n = sum(len(r[8]) for r in timed) + len(after_host)
    assert first[2] in (n, n - 1), (first[2], n)
    # the summary as if it had only been given the timed steps
    only = Summary(30, {"tp_rank": 0}, hot)
    only.add_rows(timed)
    assert first[8] == _summary_state(only)
    # with every step timed (0) nothing is "host"
    assert {r[7] for r in _drained_rows(hot, monkeypatch, c_take=True, runtime=True)[0]} == {"cuda"}


def test_a_sampled_cuda_timer_packs_and_counts_its_untimed_steps_as_the_rows_pass_does(hot, monkeypatch):
    """The packed pass with a sampled timer: the messages carry the same rows (the untimed steps'
    timer kind ``host`` included); the metrics count every step and every accept length, and their
    phase histograms hold only the timed steps' phases (GPU times), in C as in Python."""
    want = _drained_rows(hot, monkeypatch, c_take=True, runtime=True, every_ns=50_000_000, metrics_fast=None)
    for size in (1 << 20, 700):
        got = _drained_rows(hot, monkeypatch, c_take=True, runtime=True, every_ns=50_000_000, packed_bytes=size,
                            metrics_fast=hot)
        assert got[0] == want[0] and got[9] == 0 and got[8] == want[8] and got[11] == want[11]
    phases, steps, accept = want[11][:3]
    rows = want[0]
    assert sum(n for _labels, n in steps) == 60
    assert sum(h.count for h in phases) == sum(len(r[8]) for r in rows if r[7] == "cuda") > 0
    assert accept.count == sum(1 for r in rows for ph in r[8] if ph[9] is not None)
    assert any(ph[9] is not None for r in rows if r[7] == "host" for ph in r[8])


def test_a_sampled_timer_records_a_timed_steps_start_event_in_c_as_python_does(hot, monkeypatch):
    """Steps 3 ms apart, two phases each, ``every_ns`` 14 ms: once the steps' period is known (from
    the second step on) k is 4 and the runs of four steps whose index modulo 16 is below 4 are
    timed, a step's first phase deciding for both phases, and the first step of a run after an
    untimed one records a start event (the run's others start from the step before's end). The
    C timer (torch's calls, or the runtime's with the GIL held) makes the same tokens and records
    as the Python one; through the runtime, no start event goes through torch's record (which
    releases the GIL)."""
    from sgl_probe import timing

    runs = []
    for fast, runtime in ((None, False), (hot, False), (hot, True)):
        ft = _FakeTorch()
        if runtime:
            rt = _FakeRuntime(ft)
            monkeypatch.setattr(timing, "_runtime_entry_points", lambda on_fail: rt.addresses + (on_fail,))
        timer = CudaTimer(ft, fast, every_ns=14_000_000)
        _STREAMS[:] = list(timer._streams.values())
        timer.relax_capture_mode = False
        by_torch: list = []
        record = timer._record
        timer._record = lambda ev, st: by_torch.append(ev) or record(ev, st)
        seen, leads, t = [], [], 10**12
        for step in range(24):
            for first in (True, False):
                tok = timer.start(t, step if first else None)
                end = timer.stop(tok, t + 500)
                if type(tok) is int:
                    seen.append((step, "host", end == t + 500))
                else:
                    lead = len(tok) > 2 and tok[2] is not None
                    if lead:
                        leads.append(tok[2])
                    seen.append((step, lead, end[2] == t + 500))
                    timer.release(tok, end)
                t += 1_000_000
            t += 1_000_000
        runs.append((seen, len(ft.records), timer.gpu_stride))
        timed = sorted({s for s, kind, _ in seen if kind != "host"})
        assert timer.gpu_stride == 4
        assert timed == [0, 1, 2, 3, 16, 17, 18, 19] and len(leads) == 1
        assert len(ft.records) == 2 * len(timed) + len(leads) + 1  # each phase's end, the lead, the anchor
        if runtime:
            assert not any(ev in by_torch for ev in leads)
    assert runs[0] == runs[1] == runs[2]
