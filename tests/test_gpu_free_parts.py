"""CPU-runnable checks of the GPU-facing logic: the NCCL confirm mode (log parsing, the probe-owned
debug file, the span it emits), the CUDA timer's bookkeeping against a stand-in torch, and the
benchmark's statistics. These are unit tests of the logic only; the proof on a GPU is
benchmarks/gpu_*.py (BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import sys
import time
import weakref

import pytest

from sgl_probe import config, nccl_confirm
from sgl_probe.activate import Probe
from sgl_probe.targets import Target
from sgl_probe.testing.receiver import OTLPReceiver

ALLOW = config.DEFAULT_ENV_ALLOW

# What NCCL 2.28 wrote on an H200 (a 2-GPU NCCL init with these variables set), plus lines around it.
NCCL_LOG = """\
h200:1234:1234 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.2<0>
h200:1234:1234 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
h200:1234:1234 [0] NCCL INFO NCCL version 2.28.3+cuda13.0
h200:1234:1290 [0] NCCL INFO NCCL_PROTO set by environment to LL
h200:1234:1290 [0] NCCL INFO NCCL_ALGO set by environment to Ring
h200:1234:1290 [0] NCCL INFO NCCL_PROTO set by environment to Simple
h200:1234:1290 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0.1
h200:1234:1290 [0] NCCL INFO NCCL_IB_PASSWORD set by environment to hunter2
h200:1234:1290 [0] NCCL INFO ncclCommInitRankConfig comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1 - Init COMPLETE
"""


# -- log parsing ---------------------------------------------------------------------------------

def test_parse_log_reads_what_nccl_set_and_init_complete():
    confirmed, complete = nccl_confirm.parse_log(NCCL_LOG)
    assert complete
    assert confirmed["NCCL_NVLS_ENABLE"] == "0"  # integer lines end with a period
    assert confirmed["NCCL_PROTO"] == "LL"  # the first line NCCL printed wins
    assert confirmed["NCCL_ALGO"] == "Ring"
    assert confirmed["NCCL_SOCKET_IFNAME"] == "eth0.1"  # a dot inside a string value stays
    assert "NCCL version" not in " ".join(confirmed)
    confirmed, complete = nccl_confirm.parse_log(NCCL_LOG.replace("Init COMPLETE", "Init START"))
    assert not complete and "NCCL_ALGO" in confirmed


@pytest.mark.parametrize("raw,want", [("0.", "0"), ("-1.", "-1"), ("LL", "LL"), ("1.5", "1.5"),
                                      ("eth0.", "eth0."), ("  Ring  ", "Ring")])
def test_clean_value(raw, want):
    assert nccl_confirm.clean_value(raw) == want


def test_expand_debug_file_like_nccl():
    assert nccl_confirm.expand_debug_file("/d/nccl.%h.%p.log", 42, "hostA") == "/d/nccl.hostA.42.log"
    assert nccl_confirm.expand_debug_file("/d/100%x.log", 42, "h") == "/d/100%x.log"


@pytest.mark.parametrize("env,want", [
    ({}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV", "NCCL_DEBUG_FILE": "/p/nccl.%p.log"}),
    ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV",
                              "NCCL_DEBUG_FILE": "/p/nccl.%p.log"}),
    ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_DEBUG_FILE": "/mine.%p"},
     {"NCCL_DEBUG_SUBSYS": "COLL,INIT,ENV"}),
    ({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "ALL", "NCCL_DEBUG_FILE": "/mine"}, {}),
    ({"NCCL_DEBUG_SUBSYS": "^INIT,ENV", "NCCL_DEBUG_FILE": "/mine"}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}),
    ({"NCCL_DEBUG_SUBSYS": "^COLL,ENV", "NCCL_DEBUG_FILE": "/mine"}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^COLL"}),
])
def test_debug_plan_keeps_the_users_own_settings(env, want):
    changes, pattern = nccl_confirm.debug_plan(env, "/p")
    assert changes == want
    assert pattern == env.get("NCCL_DEBUG_FILE", "/p/nccl.%p.log")


# -- the confirmer, with a fake NCCL log written by the test ----------------------------------------

def _confirmer(tmp_path, environ):
    sent = []
    c = nccl_confirm.Confirmer(ALLOW, lambda attrs, when: sent.append(attrs), directory=str(tmp_path),
                               environ=environ)
    return c, sent


def test_confirmer_attributes_late_variable_present_but_not_confirmed(tmp_path):
    environ = {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0", "NCCL_IB_PASSWORD": "hunter2", "PATH": "/bin"}
    c, sent = _confirmer(tmp_path, environ)
    changes = c.arm()
    assert set(changes) == {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}
    assert environ["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl.%p.log")
    assert c.path == str(tmp_path / ("nccl.%d.log" % os.getpid()))
    log_text = "\n".join(ln for ln in NCCL_LOG.splitlines() if "NCCL_PROTO" not in ln)
    (tmp_path / ("nccl.%d.log" % os.getpid())).write_text(log_text)
    environ["NCCL_PROTO"] = "LL"  # set by the worker after NCCL init
    t0 = time.monotonic()
    since = c.poll_once(now=t0)
    assert since == t0 and not sent  # grace period: NCCL may still be reading variables
    c.poll_once(now=t0 + c.GRACE_S + 0.01, complete_since=since)
    assert len(sent) == 1
    a = sent[0]
    assert a["sgl_probe.snapshot_point"] == "nccl_confirm"
    assert a["sgl_probe.nccl.status"] == "init_complete"
    assert a["env.NCCL_PROTO"] == "LL" and "nccl.confirmed.NCCL_PROTO" not in a
    assert "NCCL_PROTO" in a["sgl_probe.nccl.not_confirmed"]
    assert a["nccl.confirmed.NCCL_ALGO"] == "Ring" and a["nccl.confirmed.NCCL_NVLS_ENABLE"] == "0"
    assert "NCCL_ALGO" in a["sgl_probe.nccl.confirmed"]
    # The probe's own debug settings are not shown as the user's env, but are listed.
    assert not any(k.startswith("env.NCCL_DEBUG") for k in a)
    assert "NCCL_DEBUG=INFO" in a["sgl_probe.nccl.set_by_probe"]
    # Secret-looking names: never a value, confirmed or not.
    assert "nccl.confirmed.NCCL_IB_PASSWORD" not in a and "hunter2" not in json.dumps(a)
    assert a["sgl_probe.nccl.confirmed_withheld"] == ["NCCL_IB_PASSWORD"]
    assert a["sgl_probe.nccl.debug_file"] == c.path
    assert c.finish() is False and len(sent) == 1  # once only


def test_confirmer_reports_value_mismatch_and_no_log(tmp_path):
    environ = {"NCCL_PROTO": "ll"}
    c, sent = _confirmer(tmp_path, environ)
    c.arm()
    c._armed_at -= c.TIMEOUT_S + 1
    c.poll_once()
    assert sent[0]["sgl_probe.nccl.status"] == "no_log"  # NCCL never initialised after arming
    c2, sent2 = _confirmer(tmp_path / "x", {"NCCL_PROTO": "ll"})
    os.makedirs(tmp_path / "x")
    c2.arm()
    open(c2.path, "w").write("x [0] NCCL INFO NCCL_PROTO set by environment to LL\n")
    c2.finish()
    assert sent2[0]["sgl_probe.nccl.status"] == "incomplete"
    assert sent2[0]["sgl_probe.nccl.value_differs"] == ["NCCL_PROTO"]


def test_confirmer_in_forked_child_does_not_emit(tmp_path):
    c, sent = _confirmer(tmp_path, {})
    c.arm()
    c.pid = -1  # as if this object were inherited through fork
    assert c.finish() is False and not sent


# -- the probe's nccl_init hook in confirm mode, through the real wrappers and exporter -------------

def _unset(monkeypatch, key: str) -> None:
    """Unset now and restore the original (set or unset) at teardown, whoever changes it meanwhile."""
    monkeypatch.setenv(key, "x")
    monkeypatch.delenv(key)


def fake_init_process_group(backend=None, **kwargs):
    """Stands in for torch.distributed.init_process_group: NCCL writes its log during init."""
    path = nccl_confirm.expand_debug_file(os.environ["NCCL_DEBUG_FILE"], os.getpid())
    with open(path, "w") as fh:
        fh.write(NCCL_LOG.replace("NCCL_PROTO set by environment to Simple", ""))
    return "ok"


def test_probe_confirm_mode_end_to_end(monkeypatch):
    for key in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "SGL_PROBE_RUN_ID", "OTEL_SERVICE_NAME"):
        _unset(monkeypatch, key)  # the probe sets NCCL_DEBUG*: restored after the test
    monkeypatch.setattr(nccl_confirm.Confirmer, "GRACE_S", 0.1)
    monkeypatch.setattr(nccl_confirm.Confirmer, "POLL_S", 0.05)
    mod = sys.modules[__name__]
    table = (Target("nccl_init", ("nccl_init",), mod.__name__, "fake_init_process_group", "nccl_init"),)
    with OTLPReceiver() as rcv:
        for k, v in {**rcv.env("grpc"), "SGL_PROBE_NCCL_CONFIRM": "1", "SGL_PROBE_SUMMARY_S": "0",
                     "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "OTEL_BSP_SCHEDULE_DELAY": "50"}.items():
            monkeypatch.setenv(k, v)
        probe = Probe(config.load(), targets=table)
        probe.instrumentor.instrument()
        try:
            assert mod.fake_init_process_group("nccl") == "ok"
            assert os.environ["NCCL_DEBUG"] == "INFO"
            assert probe.nccl_confirmer.done.wait(10)
            probe.pipeline.flush()
            spans = rcv.wait_for(lambda s: sum(x.name == "sgl_probe.env_snapshot" for x in s) >= 3, timeout=10)
        finally:
            probe.instrumentor.uninstrument()
            probe.pipeline.shutdown()
    snaps = {s.attributes["sgl_probe.snapshot_point"]: s.attributes for s in spans
             if s.name == "sgl_probe.env_snapshot"}
    init, conf = snaps["nccl_init"], snaps["nccl_confirm"]
    assert init["env.NCCL_PROTO"] == "LL" and "env.NCCL_DEBUG" not in init  # taken before arming
    assert init["sgl_probe.nccl.debug_file"] == conf["sgl_probe.nccl.debug_file"]
    assert conf["nccl.confirmed.NCCL_PROTO"] == "LL" and conf["nccl.confirmed.NCCL_ALGO"] == "Ring"
    assert conf["sgl_probe.nccl.status"] == "init_complete"
    assert "env.NCCL_DEBUG" not in conf and "env.NCCL_DEBUG_FILE" not in conf


def test_confirm_mode_is_off_by_default(monkeypatch):
    _unset(monkeypatch, "SGL_PROBE_NCCL_CONFIRM")
    _unset(monkeypatch, "NCCL_DEBUG")
    mod = sys.modules[__name__]
    table = (Target("nccl_init", ("nccl_init",), mod.__name__, "fake_init_process_group", "nccl_init"),)
    monkeypatch.setenv("NCCL_DEBUG_FILE", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache",
                                                       "nccl-off.%p.log"))
    os.makedirs(os.path.join(os.path.dirname(__file__), "..", ".pytest_cache"), exist_ok=True)
    probe = Probe(config.load({"SGL_PROBE_SUMMARY_S": "0"}), targets=table)
    probe.instrumentor.instrument()
    try:
        mod.fake_init_process_group("nccl")
        assert probe.nccl_confirmer is None and "NCCL_DEBUG" not in os.environ
    finally:
        probe.instrumentor.uninstrument()
        if probe.pipeline is not None:
            probe.pipeline.shutdown()


# -- CUDA timer bookkeeping against a stand-in torch (logic only) ------------------------------------

class _FakeTorch:
    """Just enough of torch.cuda / torch._C for CudaTimer: events carry a fake GPU time in ms."""

    def __init__(self):
        fake = self
        self.capturing = False
        self.gpu_ms = 0.0  # how far the fake GPU has got
        self.queued_ms = 0.0  # where newly recorded events land (>= gpu_ms: work still queued)
        self.records = []
        self.current = (3, 0, 1)  # (stream id, device index, device type)
        self.handles = weakref.WeakValueDictionary()  # by raw handle; an event nothing else holds dies
        self.torch_elapsed_calls = 0

        class Event:
            created = 0

            def __init__(self, enable_timing=False):
                Event.created += 1
                self.t = None
                self.cuda_event = id(self)  # the raw handle torch exposes
                fake.handles[id(self)] = self

            def record(self, stream=None):
                fake._record(self, stream)

            def query(self):
                return self.t is not None and self.t <= fake.gpu_ms

            def elapsed_time(self, other):
                fake.torch_elapsed_calls += 1
                return other.t - self.t

        class Stream:
            def __init__(self, stream_id=0, device_index=0, device_type=1):
                self.key = (stream_id, device_index, device_type)
                self.device_index = device_index

            def query(self):  # idle once the fake GPU has reached everything queued
                return fake.queued_ms <= fake.gpu_ms

            def __eq__(self, other):
                return isinstance(other, Stream) and other.key == self.key

            __hash__ = object.__hash__

        class Base:
            record = Event.record
            query = Event.query
            elapsed_time = Event.elapsed_time

        class C:
            _CudaEventBase = Base

            @staticmethod
            def _cuda_isCurrentStreamCapturing():
                return fake.capturing

            @staticmethod
            def _cuda_getCurrentStream(idx):
                assert idx == -1
                return fake.current

        class Cuda:
            pass

        Cuda.Event, Cuda.Stream = Event, Stream
        Cuda.current_stream = staticmethod(lambda device=None: Stream(*fake.current))
        Cuda.is_current_stream_capturing = staticmethod(lambda: fake.capturing)
        self.cuda, self._C, self.Event = Cuda, C, Event

    def _record(self, ev, stream):
        assert stream is not None, "records must name their stream"
        assert not self.capturing, "a timing event recorded during capture breaks the capture"
        ev.t = max(self.gpu_ms, self.queued_ms)
        self.records.append((ev, stream.key))


class _FakeCudart:
    """The runtime's ``cudaEventElapsedTime`` as a real C function pointer (ctypes calls it as it
    calls libcudart's), reading the fake events by their handles; ``skew`` and ``error`` make it
    disagree with torch or refuse."""

    def __init__(self, ft: _FakeTorch) -> None:
        import ctypes

        self.calls, self.skew, self.error = 0, 0.0, 0
        self.on_call = None  # called at every call (tests see when the reads happen)

        def elapsed(out, a, b):
            self.calls += 1
            if self.on_call is not None:
                self.on_call()
            if self.error:
                return self.error
            out[0] = ft.handles[b].t - ft.handles[a].t + self.skew
            return 0

        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)
        self.cudaEventElapsedTime = proto(elapsed)


def _runtime_timer(skew: float = 0.0, error: int = 0, keep_gil: bool = False):
    from sgl_probe.timing import CudaTimer

    ft = _FakeTorch()
    timer = CudaTimer(ft)
    timer.relax_capture_mode = False
    timer.elapsed_keeps_gil = keep_gil
    rt = _FakeCudart(ft)
    rt.skew, rt.error = skew, error
    timer._prepared.elapsed = timer.checked_elapsed(rt)  # as _prepare_thread does on the drain thread
    return ft, timer, rt


def _phases(ft, timer, n: int, now: int = 10**12):
    """``n`` phases of 0.5 ms each (times a float32 holds exactly), back to back on an idle GPU."""
    out = []
    for i in range(n):
        tok = timer.start(now + i * 1000)
        ft.queued_ms = ft.gpu_ms + 0.5
        end = timer.stop(tok, now + i * 1000 + 1)
        ft.gpu_ms = ft.queued_ms
        out.append((tok, end))
    return out


@pytest.mark.parametrize("keep_gil", [False, True])
def test_drain_reads_intervals_through_the_runtime_once_they_agree_with_torch(keep_gil):
    from sgl_probe.timing import CudaTimer

    ft, timer, rt = _runtime_timer(keep_gil=keep_gil)
    checks = CudaTimer._ELAPSED_CHECKS
    phases = _phases(ft, timer, checks + 10)
    got = [timer.interval(tok, end) for tok, end in phases]
    ref_ft = _FakeTorch()  # the same phases through torch's elapsed time alone
    ref = CudaTimer(ref_ft)
    ref._offset = timer._offset
    assert got == [ref.interval(tok, end) for tok, end in _phases(ref_ft, ref, checks + 10)]
    # The checked intervals asked both; after them the runtime alone answered.
    assert rt.calls == len(phases) and ft.torch_elapsed_calls == checks
    assert timer.elapsed_source == ("cuda_runtime_gil" if keep_gil else "cuda_runtime")
    # A plain thread (tests, benchmarks calling drain()) never set up the runtime: torch's.
    import threading

    seen = []
    t = threading.Thread(target=lambda: seen.append(timer.interval(*phases[-1])[1]))  # its end: the
    t.start()  # start depends on the phase mapped before it
    t.join()
    assert seen == [got[-1][1]] and ft.torch_elapsed_calls == checks + 1


@pytest.mark.parametrize("skew, error, said", [(0.25, 0, "where torch reads"), (0.0, 600, "failed (error 600)")])
def test_drain_goes_back_to_torchs_elapsed_time_when_the_runtime_disagrees_or_refuses(caplog, skew, error, said):
    from sgl_probe.timing import CudaTimer

    ft, timer, rt = _runtime_timer(skew, error)
    phases = _phases(ft, timer, 5)
    with caplog.at_level("INFO", logger="sgl_probe"):
        got = [timer.interval(tok, end) for tok, end in phases]
    ref_ft = _FakeTorch()  # torch's answers, never the skewed ones
    ref = CudaTimer(ref_ft)
    ref._offset = timer._offset
    assert got == [ref.interval(tok, end) for tok, end in _phases(ref_ft, ref, 5)]
    assert rt.calls == 1 and ft.torch_elapsed_calls == 5 and timer.elapsed_source == "torch"
    assert [r.getMessage() for r in caplog.records if "cudaEventElapsedTime" in r.getMessage()] == [
        next(r.getMessage() for r in caplog.records if said in r.getMessage())]


def test_drain_goes_back_to_torchs_elapsed_time_when_events_have_no_handle(caplog):
    ft, timer, rt = _runtime_timer()
    phases = _phases(ft, timer, 3)
    for ev in ft.handles.values():
        del ev.cuda_event  # a torch without the attribute
    with caplog.at_level("INFO", logger="sgl_probe"):
        got = [timer.interval(tok, end) for tok, end in phases]
    assert len(got) == 3 and rt.calls == 0 and ft.torch_elapsed_calls == 3
    assert sum("raised AttributeError" in r.getMessage() for r in caplog.records) == 1


def _counting_timer():
    """A CudaTimer over the stand-in torch whose driver calls (event query, elapsed time) count."""
    from sgl_probe.timing import CudaTimer

    ft = _FakeTorch()
    calls = {"query": 0, "elapsed": 0}
    base = ft._C._CudaEventBase
    query, elapsed = base.query, base.elapsed_time

    def counted_query(ev):
        calls["query"] += 1
        return query(ev)

    def counted_elapsed(a, b):
        calls["elapsed"] += 1
        return elapsed(a, b)

    base.query, base.elapsed_time = counted_query, counted_elapsed
    timer = CudaTimer(ft)
    timer.relax_capture_mode = False
    return ft, timer, calls


def _busy_phases(ft, timer, n, now=10**12, gpu_from=0.0):
    """``n`` back-to-back phases, the i-th ending at ``gpu_from + 1 + i`` ms of GPU time, the GPU
    behind the host: shared boundaries."""
    toks = []
    for i in range(n):
        ft.queued_ms = gpu_from + 1.0 + i
        tok = timer.start(now + 2 * i)
        toks.append((tok, timer.stop(tok, now + 2 * i + 1)))
    return toks


def test_ready_prefix_finds_the_completed_prefix_in_few_queries():
    ft, timer, calls = _counting_timer()
    toks = _busy_phases(ft, timer, 40)
    ends = [e for _, e in toks]
    truth = lambda: sum(1 for e in ends if e[0].query())  # noqa: E731 (uncounted: the fake's own)
    for gpu_ms in (0.0, 0.5, 7.2, 23.0, 39.9, 1000.0):
        ft.gpu_ms = gpu_ms
        calls["query"] = 0
        got = timer.ready_prefix(ends)
        assert got == truth(), gpu_ms
        # everything done: one query; otherwise the newest plus a binary search
        assert calls["query"] <= (1 if got == len(ends) else 1 + 6)
    assert timer.ready_prefix([]) == 0


def test_ready_prefix_asks_each_end_when_the_ends_are_on_several_streams():
    ft, timer, calls = _counting_timer()
    a = _busy_phases(ft, timer, 3)
    ft.current = (9, 0, 1)
    b = _busy_phases(ft, timer, 3, now=10**12 + 100, gpu_from=10.0)
    ends = [e for _, e in a + b]
    ft.gpu_ms = 12.0  # the first stream's three done, the second stream's first two
    calls["query"] = 0
    assert timer.ready_prefix(ends) == 5 and calls["query"] == 6


# -- benchmark helpers ----------------------------------------------------------------------------

def _bench():
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if here not in sys.path:
        sys.path.insert(0, here)
    import gpu_common

    return gpu_common


def test_rotation_balances_positions():
    gc = _bench()
    variants = ["a", "b", "c", "d"]
    counts = {(v, pos): 0 for v in variants for pos in range(4)}
    nxt = {v: 0 for v in variants}  # how often v directly precedes b: no fixed neighbour
    for i in range(16):
        order = gc.rotation(variants, i)
        assert sorted(order) == variants
        for pos, v in enumerate(order):
            counts[(v, pos)] += 1
        for x, y in zip(order, order[1:]):
            if y == "b":
                nxt[x] += 1
    assert set(counts.values()) == {4}
    assert sum(1 for v in nxt.values() if v) >= 2


def test_bootstrap_interval_brackets_the_median():
    gc = _bench()
    vals = [1.0 + 0.001 * ((i * 37) % 11) for i in range(150)]
    med, lo, hi = gc.bootstrap_median_ci(vals)
    assert lo <= med <= hi and hi - lo < 0.01
    s = gc.summarize_ratios({"u": [1.0, 2.0, 1.0], "p": [1.01, 2.02, 1.01]}, "u")
    assert abs(s["p"]["median_ratio"] - 1.01) < 1e-9 and s["p"]["n_pairs"] == 3


def test_kernel_event_parser(tmp_path):
    _bench()
    import gpu_bench_accuracy as gpu_bench

    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "ts": 10.0, "dur": 5.0, "name": "k1"},
        {"ph": "X", "cat": "cpu_op", "ts": 1.0, "dur": 50.0, "name": "aten::mm"},
        {"ph": "X", "cat": "gpu_memset", "ts": 2.0, "dur": 1.0, "name": "m"},
        {"ph": "i", "cat": "kernel", "ts": 3.0, "name": "marker"},
    ]}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace))
    assert gpu_bench._kernel_events(str(p)) == [(2.0, 1.0), (10.0, 5.0)]


def test_loop_step_quantiles_and_p99_ratio():
    _bench()
    import gpu_bench_loops as loops

    steps = [0.001] * 98 + [0.003, 0.010]  # seconds; p99 is sorted[int(0.99 n)]
    assert loops.step_quantiles(steps) == pytest.approx([1.0, 10.0])
    assert loops.step_quantiles(steps[:99]) == pytest.approx([1.0, 3.0])
    assert loops.step_quantiles([]) is None
    assert loops.p99_ratio(steps, [0.002] * 100) == pytest.approx(5.0)
    assert loops.p99_ratio([], steps) is None and loops.p99_ratio(steps, [0.0]) is None


def test_loop_steps_after_each_blocks_first():
    _bench()
    import gpu_bench_loops as loops

    two_blocks = [9.0, 1.0, 1.0, 8.0, 2.0, 2.0]  # blocks of 3; each starts slow
    assert loops.after_first(two_blocks, 3) == [1.0, 1.0, 2.0, 2.0]
    assert loops.after_first([], 3) == []


def test_the_summary_judges_all_cpu_charged_on_graph_loops_against_its_own_target(capsys):
    """All CPU charged on a graph loop is met up to 1.02 (issue 11's target for it); the other
    ratios of a graph loop keep 1.005, and an eager loop's 1.01."""
    _bench()
    import gpu_bench

    def ratio(med, hi):
        return {"median_ratio": med, "ci95": [med - 0.001, hi], "n_pairs": 10}

    loops = {name: {"step_ms_events": 2.0, "ratios_vs_untimed": {
        "probe": ratio(1.004, 1.0049), "probe_hot": ratio(1.004, 1.006), "probe_charged": ratio(1.014, 1.0151)}}
        for name in ("graph_2ms", "eager_2ms")}
    gpu_bench.print_table({"loops": loops})
    graph, eager = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("graph_2ms", "eager_2ms"))]
    assert "full export in-block 1.0040 [1.0030, 1.0049] met" in graph
    assert "hot path 1.0040 [1.0030, 1.0060] MISSED" in graph
    assert "all CPU charged 1.0140 [1.0130, 1.0151] met" in graph
    assert "hot path 1.0040 [1.0030, 1.0060] met" in eager
    assert "all CPU charged 1.0140 [1.0130, 1.0151] MISSED" in eager


def test_the_bench_meta_names_the_hosts_cpu(tmp_path):
    """gpu_bench's meta carries the host CPU's model (the probe's host-side µs follow it)."""
    _bench()
    import gpu_bench

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t: x\n")
    assert gpu_bench._cpu_model(str(info)) == "Some CPU @ 2.0GHz"
    info.write_text("processor\t: 0\n")
    assert gpu_bench._cpu_model(str(info)) is None
    assert gpu_bench._cpu_model(str(tmp_path / "absent")) is None


def test_the_timers_runtime_read_keeps_the_gil_by_default():
    """The drain's read holds the GIL (a release per chunk handed it to the scheduler thread and
    cost the drain a cold wake-up to get it back); the source it reports says so."""
    import ctypes

    from sgl_probe.timing import CudaTimer

    ft = _FakeTorch()
    timer = CudaTimer(ft)
    timer.relax_capture_mode = False
    rt = _FakeCudart(ft)
    timer._prepared.elapsed = timer.checked_elapsed(rt)  # as _prepare_thread does on the drain thread
    for tok, end in _phases(ft, timer, CudaTimer._ELAPSED_CHECKS + 1):
        timer.interval(tok, end)
    assert timer.elapsed_source == "cuda_runtime_gil"
    assert timer._prepared.elapsed.entry._flags_ & ctypes._FUNCFLAG_PYTHONAPI


def test_the_runtime_read_keeps_the_gil_only_when_asked():
    """ctypes releases the GIL around a call unless the prototype says otherwise (PYFUNCTYPE);
    both reads call the library's own entry point."""
    import ctypes

    from sgl_probe.timing import runtime_elapsed

    rt = _FakeCudart(_FakeTorch())
    released = runtime_elapsed(rt, None)
    kept = runtime_elapsed(rt, None, keep_gil=True)
    pyapi = ctypes._FUNCFLAG_PYTHONAPI
    assert not released.entry._flags_ & pyapi and kept.entry._flags_ & pyapi
    address = ctypes.cast(rt.cudaEventElapsedTime, ctypes.c_void_p).value
    assert ctypes.cast(kept.entry, ctypes.c_void_p).value == address
