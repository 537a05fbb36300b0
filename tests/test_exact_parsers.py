"""Every ``SGL_PROBE_*`` setting with good and bad values, and NCCL's "set by environment" lines
with the variable names NCCL really prints (digits included), with exact expectations."""

from __future__ import annotations

import logging

import pytest

from sgl_probe import config, contract, envsnap, nccl_confirm

DEFAULTS = config.Config()

# Setting -> (bad values, the accepted values its line must name). Every setting config.load reads.
BAD = {
    contract.ENV_ENABLE: (["maybe", "2", "enabled", "-1"], "1/true/yes/on or 0/false/no/off"),
    contract.ENV_TIMER: (["gpu", "cuda:0", "autos", "c pu"], "auto, cuda, cpu"),
    contract.ENV_GPU_EVERY_MS: (["-1", "often", "inf", "nan", "10ms"],
                                "a number of milliseconds >= 0 (0 times every step on the GPU)"),
    contract.ENV_SUMMARY_S: (["-3", "soon", "-0.5", "inf", "nan", "1e400", "3s"],
                             "a number of seconds >= 0 (0 turns the summary line off)"),
    contract.ENV_ALLOW: (["A B", "FOO*BAR", "**", "A-B", "MY.VAR", "X,Y$"],
                         "comma-separated variable names or PREFIX* patterns"),
    contract.ENV_MAX_PENDING: (["0", "-5", "1.5", "lots", "1e3", "inf"], "an integer > 0"),
    contract.ENV_DRAIN_S: (["0", "-1", "0.0", "never", "inf", "nan"], "a number of seconds > 0"),
    contract.ENV_IDLE_FLUSH_S: (["0", "-2", "soon", "inf"], "a number of seconds > 0"),
    contract.ENV_NCCL_CONFIRM: (["please", "2", "y"], "1/true/yes/on or 0/false/no/off"),
    contract.ENV_METRICS: (["on", "prometheus", "0"], "auto, off"),
}
FIELD = {contract.ENV_ENABLE: "enabled", contract.ENV_TIMER: "timer", contract.ENV_SUMMARY_S: "summary_s",
         contract.ENV_ALLOW: "env_allow", contract.ENV_MAX_PENDING: "max_pending",
         contract.ENV_DRAIN_S: "drain_interval_s", contract.ENV_NCCL_CONFIRM: "nccl_confirm",
         contract.ENV_IDLE_FLUSH_S: "idle_flush_s",
         contract.ENV_METRICS: "metrics", contract.ENV_GPU_EVERY_MS: "gpu_every_ms",
         contract.ENV_TRACE_DIR: "trace_dir"}


@pytest.fixture
def warnings(caplog):
    logger = logging.getLogger("sgl_probe")
    old = logger.propagate
    logger.propagate = True
    with caplog.at_level(logging.WARNING, logger="sgl_probe"):
        yield caplog
    logger.propagate = old


def test_every_setting_the_loader_reads_is_covered():
    settings = {v for k, v in vars(contract).items() if k.startswith("ENV_") and isinstance(v, str)
                and v.startswith("SGL_PROBE")}
    # The run id is any string, chosen by the user or the launcher; the trace dir any path (an
    # unusable one is reported when the exporter opens it).
    assert settings - set(BAD) == {contract.ENV_RUN_ID, contract.ENV_TRACE_DIR}
    assert set(FIELD) == set(BAD) | {contract.ENV_TRACE_DIR}


@pytest.mark.parametrize("name,value,accepted", [
    (name, value, accepted) for name, (values, accepted) in BAD.items() for value in values])
def test_bad_value_one_line_naming_variable_and_accepted_values(name, value, accepted, warnings):
    cfg = config.load({name: value})
    want = f"sgl-probe: ignoring {name}={value!r}: accepted values are {accepted}; " \
           f"using {getattr(DEFAULTS, FIELD[name])!r}"
    assert cfg.problems == (want,)
    assert [r.getMessage() for r in warnings.records] == [want]
    assert all(r.levelno == logging.WARNING for r in warnings.records)
    assert cfg == DEFAULTS


def test_all_bad_at_once_one_line_each_in_order_and_nothing_else(warnings):
    env = {name: values[0] for name, (values, _) in BAD.items()}
    cfg = config.load(env)
    assert cfg == DEFAULTS
    assert [line.split("=", 1)[0].rsplit(" ", 1)[1] for line in cfg.problems] == list(BAD)
    assert len(warnings.records) == len(BAD)


def test_a_bad_value_leaves_the_other_settings_as_given():
    cfg = config.load({contract.ENV_TIMER: "gpu", contract.ENV_MAX_PENDING: "16",
                       contract.ENV_DRAIN_S: "0.5", contract.ENV_ENABLE: "off"})
    assert (cfg.timer, cfg.max_pending, cfg.drain_interval_s, cfg.enabled) == ("auto", 16, 0.5, False)
    assert len(cfg.problems) == 1


@pytest.mark.parametrize("name,raw,want", [
    (contract.ENV_ENABLE, " 0 ", False), (contract.ENV_ENABLE, "FALSE", False),
    (contract.ENV_ENABLE, "No", False), (contract.ENV_ENABLE, "off", False),
    (contract.ENV_ENABLE, "1", True), (contract.ENV_ENABLE, "TRUE", True), (contract.ENV_ENABLE, "yes", True),
    (contract.ENV_ENABLE, "On", True),
    (contract.ENV_NCCL_CONFIRM, "1", True), (contract.ENV_NCCL_CONFIRM, "on", True),
    (contract.ENV_NCCL_CONFIRM, "no", False),
    (contract.ENV_TIMER, " CUDA ", "cuda"), (contract.ENV_TIMER, "cpu", "cpu"), (contract.ENV_TIMER, "Auto", "auto"),
    (contract.ENV_SUMMARY_S, "0", 0.0), (contract.ENV_SUMMARY_S, "2.5", 2.5), (contract.ENV_SUMMARY_S, "1e-3", 0.001),
    (contract.ENV_MAX_PENDING, "1", 1), (contract.ENV_MAX_PENDING, " 64 ", 64),
    (contract.ENV_DRAIN_S, "0.01", 0.01), (contract.ENV_DRAIN_S, "3", 3.0),
    (contract.ENV_IDLE_FLUSH_S, "0.25", 0.25), (contract.ENV_IDLE_FLUSH_S, "3600", 3600.0),
    (contract.ENV_TRACE_DIR, "/tmp/t r", "/tmp/t r"),
    (contract.ENV_METRICS, " OFF", "off"), (contract.ENV_METRICS, "auto", "auto"),
])
def test_good_values_are_taken_without_a_word(name, raw, want, warnings):
    cfg = config.load({name: raw})
    assert getattr(cfg, FIELD[name]) == want and type(getattr(cfg, FIELD[name])) is type(want)
    assert cfg.problems == () and warnings.records == []


@pytest.mark.parametrize("name", list(FIELD))
@pytest.mark.parametrize("raw", ["", "   ", "\t"])
def test_empty_values_mean_the_default_silently(name, raw, warnings):
    cfg = config.load({name: raw})
    assert cfg == DEFAULTS and cfg.problems == () and warnings.records == []


def test_defaults():
    cfg = config.load({})
    assert (cfg.enabled, cfg.timer, cfg.trace_dir, cfg.summary_s, cfg.env_allow, cfg.max_pending,
            cfg.drain_interval_s, cfg.nccl_confirm, cfg.metrics, cfg.idle_flush_s) == (
        True, "auto", None, 30.0, contract.DEFAULT_ENV_ALLOW, 8192, 1.0, False, "auto", 1.0)


def test_reads_the_process_environment_when_given_none(monkeypatch):
    monkeypatch.setenv(contract.ENV_MAX_PENDING, "7")
    assert config.load().max_pending == 7


@pytest.mark.parametrize("raw,extra", [
    ("MY_VAR", ("MY_VAR=",)),
    ("HF_*", ("HF_",)),
    ("A, B ;C*", ("A=", "B=", "C")),
    (",,X9,", ("X9=",)),
    ("*", ("",)),  # the empty prefix: every name (secret-looking ones are still withheld)
])
def test_env_allow_patterns(raw, extra):
    assert config.load({contract.ENV_ALLOW: raw}).env_allow == contract.DEFAULT_ENV_ALLOW + extra


def test_allow_star_still_withholds_secrets_and_skips_the_probes_own():
    allow = config.load({contract.ENV_ALLOW: "*"}).env_allow
    values, withheld = envsnap.snapshot(allow, {"HOME": "/r", "HF_TOKEN": "t", "SGL_PROBE_TIMER": "cpu",
                                                "SGLANG_PROBE_X": "1", "SGLANG_PORT": "1"})
    assert values == {"HOME": "/r", "SGLANG_PORT": "1"} and withheld == ["HF_TOKEN"]


# -- NCCL's "set by environment" lines ---------------------------------------------------------------

# NCCL 2.2x prints each parameter it read as ``<NAME> set by environment to <value>``; integer
# parameters end with a period. Names with digits are common (the seed's NCCL_P2P_LEVEL).
DIGIT_LOG = """\
n1:77:77 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL
n1:77:77 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.
n1:77:77 [0] NCCL INFO NCCL_P2P_NET_CHUNKSIZE set by environment to 131072.
n1:77:77 [0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to PHB
n1:77:77 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0:1,mlx5_1:1
n1:77:77 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to -1.
n1:77:77 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0.  
n1:77:77 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS
n1:77:77 [0] NCCL INFO MY_NCCL_X set by environment to 1.
n1:77:77 [0] NCCL INFO XNCCL_ALGO set by environment to Tree
n1:77:77 [0] NCCL INFO NCCL_proto set by environment to LL
n1:77:77 [0] NCCL INFO NCCL_ALGO set by environment to
n1:77:77 [0] NCCL INFO comm 0x1 rank 0 nranks 8 - Init COMPLETE
"""


def test_digit_bearing_names_are_parsed_exactly():
    confirmed, complete = nccl_confirm.parse_log(DIGIT_LOG)
    assert complete is True
    assert confirmed == {
        "NCCL_P2P_LEVEL": "NVL",              # the first line NCCL printed wins
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_P2P_NET_CHUNKSIZE": "131072",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_HCA": "mlx5_0:1,mlx5_1:1",
        "NCCL_NVLS_ENABLE": "-1",
        "NCCL_SOCKET_IFNAME": "eth0.",        # a string value keeps its trailing dot
    }


def test_no_init_complete_without_the_line():
    confirmed, complete = nccl_confirm.parse_log(DIGIT_LOG.replace("Init COMPLETE", "Init STARTED"))
    assert complete is False and confirmed["NCCL_IB_GID_INDEX"] == "3"
    assert nccl_confirm.parse_log("") == ({}, False)
    assert nccl_confirm.parse_log("xInit COMPLETE")[1] is False


@pytest.mark.parametrize("raw,want", [
    ("3.", "3"), ("-12.", "-12"), ("131072.", "131072"), (" 0. ", "0"), ("3.5", "3.5"), ("3..", "3.."),
    ("-.", "-."), (".", "."), ("a1.", "a1."), ("12", "12"), ("", "")])
def test_clean_value_only_strips_an_integers_period(raw, want):
    assert nccl_confirm.clean_value(raw) == want


def test_digit_names_flow_into_the_confirm_span():
    environ = {"NCCL_P2P_LEVEL": "NVL", "NCCL_IB_GID_INDEX": "5", "NCCL_P2P_DISABLE": "1",
               "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/d/f"}
    confirmed, _ = nccl_confirm.parse_log(DIGIT_LOG)
    attrs = nccl_confirm.confirm_attributes(
        confirmed, contract.DEFAULT_ENV_ALLOW, environ, {"NCCL_DEBUG_FILE": "/d/f"},
        {"NCCL_DEBUG_FILE": None}, "/d/f", "init_complete")
    assert attrs["nccl.confirmed.NCCL_P2P_LEVEL"] == "NVL"
    assert attrs["nccl.confirmed.NCCL_IB_GID_INDEX"] == "3"
    assert attrs["sgl_probe.nccl.confirmed"] == sorted(confirmed)
    assert attrs["sgl_probe.nccl.not_confirmed"] == ["NCCL_P2P_DISABLE"]  # NCCL_DEBUG*: the probe's
    assert attrs["sgl_probe.nccl.value_differs"] == ["NCCL_IB_GID_INDEX"]
    assert attrs["sgl_probe.nccl.set_by_probe"] == ["NCCL_DEBUG_FILE=/d/f"]
    assert "env.NCCL_DEBUG_FILE" not in attrs and attrs["env.NCCL_DEBUG"] == "INFO"
    assert attrs["sgl_probe.nccl.status"] == "init_complete" and attrs["sgl_probe.nccl.debug_file"] == "/d/f"
    assert "sgl_probe.nccl.confirmed_withheld" not in attrs


def test_a_variable_the_probe_replaced_shows_the_users_value():
    environ = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,INIT,ENV"}
    attrs = nccl_confirm.confirm_attributes(
        {}, contract.DEFAULT_ENV_ALLOW, environ, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,INIT,ENV"},
        {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "COLL"}, "/p", "no_log")
    assert attrs["env.NCCL_DEBUG"] == "WARN" and attrs["env.NCCL_DEBUG_SUBSYS"] == "COLL"
    assert environ["NCCL_DEBUG"] == "INFO"  # the process's own env is left as NCCL needs it
    assert attrs["sgl_probe.nccl.not_confirmed"] == [] and attrs["sgl_probe.nccl.confirmed"] == []


@pytest.mark.parametrize("env,want", [
    ({"NCCL_DEBUG": " trace ", "NCCL_DEBUG_SUBSYS": "init,env", "NCCL_DEBUG_FILE": "/f"}, {}),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", "NCCL_DEBUG_FILE": "/f"}, {"NCCL_DEBUG_SUBSYS": "ENV,INIT"}),
    ({"NCCL_DEBUG": "VERSION", "NCCL_DEBUG_SUBSYS": "^", "NCCL_DEBUG_FILE": " "},
     {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL", "NCCL_DEBUG_FILE": "/p/nccl.%p.log"}),
    ({"NCCL_DEBUG_SUBSYS": "^ init , COLL", "NCCL_DEBUG_FILE": "/f"},
     {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^ COLL"}),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "   ", "NCCL_DEBUG_FILE": "/f"}, {"NCCL_DEBUG_SUBSYS": "INIT,ENV"}),
])
def test_debug_plan_edges(env, want):
    assert nccl_confirm.debug_plan(env, "/p")[0] == want


@pytest.mark.parametrize("pattern,want", [
    ("%h-%p", "hh-9"), ("%%p", "%9"), ("x%", "x%"), ("%", "%"), ("%q%p", "%q9"), ("", "")])
def test_expand_debug_file_edges(pattern, want):
    assert nccl_confirm.expand_debug_file(pattern, 9, "hh") == want


def test_expand_debug_file_uses_this_host_by_default():
    import socket

    assert nccl_confirm.expand_debug_file("%h", 1) == socket.gethostname()


@pytest.mark.parametrize("subsys,want", [
    ("^COLL,NET,ENV", "^COLL,NET"),   # an exclusion list keeps its other entries, in order
    ("^INIT,COLL,,NET", "^COLL,NET"),
])
def test_debug_plan_exclusion_lists(subsys, want):
    assert nccl_confirm.debug_plan({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": subsys,
                                    "NCCL_DEBUG_FILE": "/f"}, "/p")[0] == {"NCCL_DEBUG_SUBSYS": want}


@pytest.mark.parametrize("pattern", ["%X", "%H", "%P", "%x%"])
def test_expand_debug_file_leaves_other_escapes(pattern):
    assert nccl_confirm.expand_debug_file(pattern, 9, "hh") == pattern


def test_a_setting_the_probe_added_and_the_user_then_removed():
    # The probe set NCCL_DEBUG_FILE (the user had none) and it is gone from the env by now.
    attrs = nccl_confirm.confirm_attributes({}, contract.DEFAULT_ENV_ALLOW, {"NCCL_ALGO": "Ring"},
                                            {"NCCL_DEBUG_FILE": "/d/f"}, {"NCCL_DEBUG_FILE": None}, "/d/f", "x")
    assert attrs["env.NCCL_ALGO"] == "Ring" and attrs["sgl_probe.nccl.not_confirmed"] == ["NCCL_ALGO"]


# -- the confirmer's life cycle ---------------------------------------------------------------------

COMPLETE_LOG = "h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL\nh:1:1 [0] NCCL INFO x Init COMPLETE\n"


def confirmer(tmp_path, environ=None):
    sent = []
    c = nccl_confirm.Confirmer(contract.DEFAULT_ENV_ALLOW, lambda attrs, when: sent.append((attrs, when)),
                               directory=str(tmp_path), environ={} if environ is None else environ)
    return c, sent


def test_unarmed_confirmer_reports_no_log(tmp_path):
    c, sent = confirmer(tmp_path)
    assert (c.changes, c.original, c.path) == ({}, {}, "")
    assert c.read() == ({}, False, False)
    assert c.finish() is True and c.finish() is False
    attrs, when = sent[0]
    assert attrs["sgl_probe.nccl.status"] == "no_log" and attrs["sgl_probe.nccl.set_by_probe"] == []
    assert attrs["sgl_probe.nccl.debug_file"] == ""
    import time

    assert isinstance(when, int) and abs(when - time.time_ns()) < 60 * 10**9


@pytest.mark.parametrize("text,status", [(COMPLETE_LOG, "init_complete"),
                                         ("h NCCL INFO NCCL_ALGO set by environment to Ring\n", "incomplete")])
def test_finish_at_exit_says_how_far_nccl_got(tmp_path, text, status):
    c, sent = confirmer(tmp_path)
    c.arm()
    with open(c.path, "wb") as fh:
        fh.write(text.encode() + b"\xff\xfe junk\n")  # undecodable bytes must not stop the read
    c._at_exit()
    assert len(sent) == 1 and sent[0][0]["sgl_probe.nccl.status"] == status
    assert c.done.is_set()


def test_arm_says_where_the_debug_output_goes(tmp_path, caplog):
    import os

    c, _ = confirmer(tmp_path)
    logger = logging.getLogger("sgl_probe")
    old, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="sgl_probe"):
            c.arm()
    finally:
        logger.propagate = old
    assert [r.getMessage() for r in caplog.records] == [
        f"sgl-probe: SGL_PROBE_NCCL_CONFIRM: NCCL debug output of pid {os.getpid()} goes to "
        f"{tmp_path}/nccl.{os.getpid()}.log"]


def test_arm_without_a_directory_makes_a_private_one():
    import os
    import shutil

    c = nccl_confirm.Confirmer(contract.DEFAULT_ENV_ALLOW, lambda a, w: None, environ={})
    c.arm()
    try:
        assert os.path.basename(c.directory).startswith("sgl-probe-nccl-")
        assert os.stat(c.directory).st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(c.directory)


def test_poll_boundaries(tmp_path):
    c, sent = confirmer(tmp_path)
    c.arm()
    t0 = c._armed_at = 1000.0  # a round clock, so the boundaries are exact
    assert c.poll_once(now=t0 + c.TIMEOUT_S - 0.001) is None and sent == []
    c.poll_once(now=t0 + c.TIMEOUT_S)  # exactly the timeout, no file: no_log
    assert sent[0][0]["sgl_probe.nccl.status"] == "no_log"
    c, sent = confirmer(tmp_path / "b")
    (tmp_path / "b").mkdir()
    c.arm()
    open(c.path, "w").write("h NCCL INFO NCCL_ALGO set by environment to Ring\n")
    c._armed_at = 1000.0
    c.poll_once(now=1000.0 + c.TIMEOUT_S)  # a log without Init COMPLETE: timeout
    assert sent[0][0]["sgl_probe.nccl.status"] == "timeout"
    c, sent = confirmer(tmp_path / "c")
    (tmp_path / "c").mkdir()
    c.arm()
    open(c.path, "w").write(COMPLETE_LOG)
    since = c.poll_once(now=100.0)
    assert since == 100.0 and c.poll_once(now=100.0 + c.GRACE_S - 0.001, complete_since=since) == since
    assert sent == []
    c.poll_once(now=100.0 + c.GRACE_S, complete_since=since)  # exactly the grace period
    assert sent[0][0]["sgl_probe.nccl.status"] == "init_complete"
    assert sent[0][0]["nccl.confirmed.NCCL_P2P_LEVEL"] == "NVL"


def test_watcher_thread_emits_once_after_the_grace_period(tmp_path):
    c, sent = confirmer(tmp_path)
    c.POLL_S, c.GRACE_S = 0.01, 0.05
    c.arm()
    open(c.path, "w").write(COMPLETE_LOG)
    c.start()
    try:
        assert c._thread.daemon is True and c._thread.name == "sgl-probe-nccl-confirm"
        assert c.done.wait(10)
        c._thread.join(10)
        assert not c._thread.is_alive()
    finally:
        import atexit

        atexit.unregister(c._at_exit)
    assert len(sent) == 1 and sent[0][0]["sgl_probe.nccl.status"] == "init_complete"


def test_watcher_stops_quietly_on_its_own_error(tmp_path, caplog):
    c, sent = confirmer(tmp_path)
    c.POLL_S = 0.01
    c.arm()

    def boom(**kw):
        raise OSError("disk gone")

    c.poll_once = boom
    logger = logging.getLogger("sgl_probe")
    old, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.WARNING, logger="sgl_probe"):
            c.start()
            c._thread.join(10)
    finally:
        logger.propagate = old
        import atexit

        atexit.unregister(c._at_exit)
    assert not c._thread.is_alive() and sent == []
    assert [r.getMessage() for r in caplog.records] == ["sgl-probe: NCCL confirm watcher: OSError('disk gone')"]


# -- secrets inside values and command lines ---------------------------------------------------------

@pytest.mark.parametrize("value,want", [
    ("hf_Aabcdefghij", "<redacted>"),            # the first character after hf_ counts
    ("hf_transfer_enabled", "hf_transfer_enabled"),
    ("secret://host/path", "secret://host/path"),  # a URL scheme is not a key
    ("password=//not-a-url", "password=<redacted>"),
    ("token: abc", "token: <redacted>"),
])
def test_redact_value_edges(value, want):
    from sgl_probe.redact import redact_value

    assert redact_value(value) == want


def test_redact_value_passes_non_strings_through():
    from sgl_probe.redact import redact_value

    assert redact_value(None) is None and redact_value(3) == 3 and redact_value("") == ""


@pytest.mark.parametrize("argv,want", [
    (["--hf-token=abc def"], ["--hf-token=<redacted>"]),      # the whole value, spaces and all
    (["--x", "key", "value"], ["--x", "key", "value"]),      # a bare word is not a flag
    (["--api-key", "--next"], ["--api-key", "--next"]),      # a flag right after: nothing to hide
    (["--api-key", "s3cr3t", "--port", "1"], ["--api-key", "<redacted>", "--port", "1"]),
    (["-5", "--API-KEY", "-x"], ["-5", "--API-KEY", "<redacted>"]),
])
def test_redact_args_edges(argv, want):
    from sgl_probe.redact import redact_args

    assert redact_args(argv) == want


# -- env snapshots -----------------------------------------------------------------------------------

def test_snapshot_exact():
    env = {"NCCL_ALGO": "Ring", "CUDA_VISIBLE_DEVICES": "0,1", "HF_HOME": "/h", "NCCL_IB_PASSWORD": "p",
           "SGL_PROBE_TIMER": "cpu", "SGLANG_PROBE_X": "1", "SGLANG_URL": "http://u:pw@h/x", "MY_VAR": "v",
           "MY_VARIANT": "w"}
    values, withheld = envsnap.snapshot(contract.DEFAULT_ENV_ALLOW + ("MY_VAR=",), env)
    assert list(values) == ["CUDA_VISIBLE_DEVICES", "MY_VAR", "NCCL_ALGO", "SGLANG_URL"]  # sorted
    assert values["SGLANG_URL"] == "http://u:<redacted>@h/x" and values["MY_VAR"] == "v"
    assert withheld == ["NCCL_IB_PASSWORD"]


def test_snapshot_reads_the_process_env_by_default(monkeypatch):
    monkeypatch.setenv("NCCL_TEST_ONLY_VAR", "x")
    assert envsnap.snapshot(("NCCL_TEST_ONLY",))[0] == {"NCCL_TEST_ONLY_VAR": "x"}
    assert envsnap.launcher_env() == envsnap.launcher_env(dict(__import__("os").environ))


def test_launcher_env_recorded_once_unless_replaced():
    import json

    env = {"NCCL_ALGO": "Ring", "HOME": "/r", "NCCL_IB_PASSWORD": "p"}
    envsnap.record_launcher_env(contract.DEFAULT_ENV_ALLOW, env)
    assert json.loads(env[envsnap.LAUNCHER_ENV_VAR]) == {"NCCL_ALGO": "Ring"}
    assert env[envsnap.LAUNCHER_ENV_VAR] == '{"NCCL_ALGO":"Ring"}'  # compact: it travels in the env
    env["NCCL_ALGO"] = "Tree"
    envsnap.record_launcher_env(contract.DEFAULT_ENV_ALLOW, env)
    assert envsnap.launcher_env(env) == {"NCCL_ALGO": "Ring"}
    envsnap.record_launcher_env(contract.DEFAULT_ENV_ALLOW, env, replace=True)
    assert envsnap.launcher_env(env) == {"NCCL_ALGO": "Tree"}


@pytest.mark.parametrize("raw,want", [
    (None, None), ("", None), ("not json", None), ("[1, 2]", None), ('"x"', None),
    ('{"NCCL_A": 1, "HF_TOKEN": "t", "U": "https://a:b@h"}', {"NCCL_A": "1", "U": "https://a:<redacted>@h"}),
])
def test_launcher_env_parsing(raw, want):
    env = {} if raw is None else {envsnap.LAUNCHER_ENV_VAR: raw}
    assert envsnap.launcher_env(env) == want


def test_snapshot_attributes_exact():
    import json

    env = {"NCCL_ALGO": "Tree", "NCCL_NEW": "1", "NCCL_IB_PASSWORD": "p",
           envsnap.LAUNCHER_ENV_VAR: json.dumps({"NCCL_ALGO": "Ring", "NCCL_GONE": "x"})}
    attrs = envsnap.snapshot_attributes("process_start", contract.DEFAULT_ENV_ALLOW, env)
    assert attrs == {
        "sgl_probe.snapshot_point": "process_start",
        "env.NCCL_ALGO": "Tree", "env.NCCL_NEW": "1",
        "sgl_probe.env.names": ["NCCL_ALGO", "NCCL_NEW"],
        "sgl_probe.env.withheld": ["NCCL_IB_PASSWORD"],
        "sgl_probe.env.differs_from_launcher": ["NCCL_ALGO", "NCCL_GONE", "NCCL_NEW"],
        "launcher_env.NCCL_ALGO": "Ring", "launcher_env.NCCL_GONE": "x",
    }
    plain = envsnap.snapshot_attributes("nccl_init", contract.DEFAULT_ENV_ALLOW, {"NCCL_ALGO": "Ring"})
    assert plain == {"sgl_probe.snapshot_point": "nccl_init", "env.NCCL_ALGO": "Ring",
                     "sgl_probe.env.names": ["NCCL_ALGO"]}
    assert envsnap.diff({"A": "1", "B": "2"}, {"A": "1", "B": "3", "C": "4"}) == ["B", "C"]


@pytest.mark.parametrize("name,allowed", [
    ("NCCL_ALGO", True), ("SGL_PROBE_ENV_ALLOW", False), ("SGLANG_PROBE_RUN_ID", False), ("SGLANG_X", True),
    ("MY_VAR", True), ("MY_VAR2", False), ("NCCLX", False), ("HOME", False),
])
def test_is_allowed(name, allowed):
    assert envsnap.is_allowed(name, contract.DEFAULT_ENV_ALLOW + ("MY_VAR=",)) is allowed
