"""Small pure functions: configuration, env snapshots, the target table, timers."""

from __future__ import annotations

import json
import logging

import pytest

from sgl_probe import config, envsnap, no_graph, readers, targets
from sgl_probe.timing import CpuTimer, make_timer


def test_config_defaults():
    cfg = config.load({})
    assert cfg.enabled and cfg.timer == "auto" and cfg.summary_s == 30.0 and cfg.trace_dir is None
    assert cfg.problems == ()


@pytest.mark.parametrize("name,value,accepted", [
    ("SGL_PROBE_TIMER", "gpu", "auto, cuda, cpu"),
    ("SGL_PROBE_SUMMARY_S", "-3", "seconds >= 0"),
    ("SGL_PROBE_SUMMARY_S", "soon", "seconds >= 0"),
    ("SGL_PROBE", "maybe", "0/false/no/off"),
    ("SGL_PROBE_MAX_PENDING", "0", "integer > 0"),
    ("SGL_PROBE_ENV_ALLOW", "A B", "PREFIX*"),
])
def test_bad_values_give_one_clear_line_and_defaults(name, value, accepted, caplog):
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        logging.getLogger("sgl_probe").propagate = True
        cfg = config.load({name: value})
    assert len(cfg.problems) == 1
    line = cfg.problems[0]
    assert name in line and repr(value) in line and accepted in line
    assert cfg == config.Config()  # every field back at its default
    assert any(line == r.getMessage() for r in caplog.records)


def test_env_allow_adds_names_and_prefixes():
    cfg = config.load({"SGL_PROBE_ENV_ALLOW": "MY_VAR, HF_*"})
    env = {"MY_VAR": "1", "MY_VARX": "2", "HF_HOME": "/h", "HF_TOKEN": "t", "NCCL_ALGO": "Ring", "HOME": "/r"}
    values, withheld = envsnap.snapshot(cfg.env_allow, env)
    assert values == {"HF_HOME": "/h", "MY_VAR": "1", "NCCL_ALGO": "Ring"}
    assert withheld == ["HF_TOKEN"]


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_API_KEY", "NCCL_IB_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                                  "SGLANG_AUTH_HEADER", "CUDA_CREDENTIALS"])
def test_secret_names_never_captured_even_if_allowed(name):
    values, withheld = envsnap.snapshot(("",), {name: "v"})  # "" allows every name
    assert values == {} and withheld == [name]


def test_snapshot_diff_against_launcher():
    launch = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    env = {"NCCL_PROTO": "Simple", "CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_ALGO": "Ring",
           envsnap.LAUNCHER_ENV_VAR: json.dumps({**launch, "HF_TOKEN": "smuggled"})}
    attrs = envsnap.snapshot_attributes("nccl_init", config.DEFAULT_ENV_ALLOW, env)
    assert attrs["sgl_probe.snapshot_point"] == "nccl_init"
    assert attrs["env.NCCL_PROTO"] == "Simple"
    assert attrs["sgl_probe.env.differs_from_launcher"] == ["CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_PROTO"]
    assert attrs["launcher_env.NCCL_PROTO"] == "LL"
    assert "smuggled" not in json.dumps(attrs)


def test_record_launcher_env_only_once():
    env = {"NCCL_PROTO": "LL", "HF_TOKEN": "x"}
    envsnap.record_launcher_env(config.DEFAULT_ENV_ALLOW, env)
    first = env[envsnap.LAUNCHER_ENV_VAR]
    assert json.loads(first) == {"NCCL_PROTO": "LL"}
    env["NCCL_PROTO"] = "Simple"
    envsnap.record_launcher_env(config.DEFAULT_ENV_ALLOW, env)
    assert env[envsnap.LAUNCHER_ENV_VAR] == first


def test_version_ranges():
    assert targets.parse_version("0.5.8.post1") == (0, 5, 8)
    assert targets.parse_version("0.5.23rc1") == (0, 5, 23)
    v1 = next(t for t in targets.TARGETS if t.qualname == "EAGLEWorker.verify")
    assert v1.expected_in("0.5.9") and not v1.expected_in("0.5.23") and v1.expected_in(None)


def test_table_is_consistent():
    names = [t.name for t in targets.TARGETS]
    assert len(names) == len(set(names))
    covered = {p for t in targets.TARGETS if t.role == "phase" for p in t.phases}
    assert covered == set(targets.PHASES)
    for t in targets.TARGETS:
        assert t.role in targets.ROLES
        if t.role == "phase":
            assert t.reader in readers.ENTER
            assert t.runner in no_graph.BY_RUNNER, t.name


def test_forward_reader_never_files_verify_as_extend():
    class Mode:
        def __init__(self, name):
            self.name = name

    class B:
        def __init__(self, mode, bs):
            self.forward_mode = Mode(mode)
            self.seq_lens = [0] * bs
            self.extend_num_tokens = 17

    t = next(t for t in targets.TARGETS if t.reader == "forward")
    spec = {"num_draft_tokens": 4}
    assert readers.forward(t, (B("TARGET_VERIFY", 2),), {}, spec).phase == "verify"
    f = readers.forward(t, (None,), {"forward_batch": B("EXTEND", 2), "is_verify": True}, spec)
    assert (f.phase, f.mode, f.num_tokens) == ("verify", "TARGET_VERIFY", 8)
    f = readers.forward(t, (B("EXTEND", 2),), {}, spec)
    assert (f.phase, f.num_tokens) == ("extend", 17)
    assert readers.forward(t, (B("IDLE", 0),), {}, spec).phase is None


@pytest.mark.parametrize("args,kwargs,want", [
    ((4, 4), {}, (4, 2.0)),  # 0.5.9: bs, accepted drafts (bonus excluded)
    ((4, 4, 8), {}, (4, 2.0)),  # 0.5.23: bs, correct drafts, accepted tokens (bonus included)
    ((2,), {"num_correct_drafts": 1, "num_accept_tokens": 3}, (2, 1.5)),
    ((0, 0), {}, None),
])
def test_accept_length_matches_sglang_definition(args, kwargs, want):
    assert readers.accept_length(args, kwargs) == want


def test_cpu_timer_and_auto_choice():
    t = CpuTimer()
    s = t.start(1_000)
    e = t.stop(s, 3_000)
    a, b = t.interval(s, e)
    assert b - a == 2_000 and t.ready(s, e)
    # auto picks CUDA only where this process already put work on a CUDA device; this one has not.
    assert make_timer("auto", logging.getLogger("x")).kind == "cpu"
    assert make_timer("cpu", logging.getLogger("x")).kind == "cpu"


def test_cuda_timer_asked_for_without_cuda_says_so(caplog, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("no torch here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with caplog.at_level(logging.WARNING, logger="x"):
        assert make_timer("cuda", logging.getLogger("x")).kind == "cpu"
    assert any("SGL_PROBE_TIMER=cuda" in r.getMessage() for r in caplog.records)
