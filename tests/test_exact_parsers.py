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
    contract.ENV_SUMMARY_S: (["-3", "soon", "-0.5", "inf", "nan", "1e400", "3s"],
                             "a number of seconds >= 0 (0 turns the summary line off)"),
    contract.ENV_ALLOW: (["A B", "FOO*BAR", "**", "A-B", "MY.VAR", "X,Y$"],
                         "comma-separated variable names or PREFIX* patterns"),
    contract.ENV_MAX_PENDING: (["0", "-5", "1.5", "lots", "1e3", "inf"], "an integer > 0"),
    contract.ENV_DRAIN_S: (["0", "-1", "0.0", "never", "inf", "nan"], "a number of seconds > 0"),
    contract.ENV_NCCL_CONFIRM: (["please", "2", "y"], "1/true/yes/on or 0/false/no/off"),
    contract.ENV_METRICS: (["on", "prometheus", "0"], "auto, off"),
}
FIELD = {contract.ENV_ENABLE: "enabled", contract.ENV_TIMER: "timer", contract.ENV_SUMMARY_S: "summary_s",
         contract.ENV_ALLOW: "env_allow", contract.ENV_MAX_PENDING: "max_pending",
         contract.ENV_DRAIN_S: "drain_interval_s", contract.ENV_NCCL_CONFIRM: "nccl_confirm",
         contract.ENV_METRICS: "metrics",
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
            cfg.drain_interval_s, cfg.nccl_confirm, cfg.metrics) == (
        True, "auto", None, 30.0, contract.DEFAULT_ENV_ALLOW, 8192, 0.2, False, "auto")


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
