"""Secrets in values, not only in names: every shape redacted exactly, ordinary values untouched,
and the env snapshot exports only redacted values."""

from __future__ import annotations

import json

import pytest

from sgl_probe import envsnap
from sgl_probe.contract import DEFAULT_ENV_ALLOW
from sgl_probe.redact import REDACTED as R, redact_args, redact_value, secret_word

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")


@pytest.mark.parametrize("value, expected", [
    ("https://bob:hunter2@example.com/simple", f"https://bob:{R}@example.com/simple"),
    ("postgres://svc:p%40ss@db:5432/x", f"postgres://svc:{R}@db:5432/x"),
    ("hf_PLANTEDSECRET0001", R),
    ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", R),
    ("sk-PLANTEDSECRET0002", R),
    ("sk-proj-abcdEFGH1234ijklMNOP5678", R),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", R),
    ("gho_abcdefghijklmnopqrstuvwxyz0123456789", R),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", R),
    (JWT, R),
    ("Bearer " + JWT, "Bearer " + R),
    ("AKIAIOSFODNN7EXAMPLE", R),
    ("ASIAIOSFODNN7EXAMPLE", R),
    ("xoxb-1234567890-abcdefghij", R),
    ("https://h/p?x=1&api_key=abc123&b=2", f"https://h/p?x=1&api_key={R}&b=2"),
    ("https://h/p?access_token=abc&sig=zzz", f"https://h/p?access_token={R}&sig={R}"),
    ("host=db user=me password=hunter2", f"host=db user=me password={R}"),
    ('{"api_key": "xyz", "model": "m"}', f'{{"api_key": "{R}", "model": "m"}}'),
    ("Server=x;Password=hunter2;Db=y", f"Server=x;Password={R};Db=y"),
    ("a hf_PLANTEDSECRET0001 and sk-PLANTEDSECRET0002 here", f"a {R} and {R} here"),
])
def test_secret_shapes_are_redacted_exactly(value, expected):
    assert redact_value(value) == expected
    assert redact_value(expected) == expected  # idempotent


@pytest.mark.parametrize("value", [
    "LL", "Ring", "0", "1", "^docker0,lo", "eth0", "/usr/local/cuda", "/root/.cache/sglang/nv",
    "http://localhost:4317", "https://example.com:8443/v1/traces", "expandable_segments:True",
    "max_split_size_mb:512,garbage_collection_threshold:0.6", "0,1,2,3", "hf_transfer", "sk-learn",
    "max_total_tokens=2048", "tokenizer_mode=auto", "key_value_cache", "TORCH_CUDA_ARCH_LIST=9.0",
    "eyJ", "a.b.c", "AKIA", "monkey=1", "passthrough=1", "user@example.com", "git@github.com:org/repo.git",
])
def test_ordinary_values_are_untouched(value):
    assert redact_value(value) == value


def test_server_args_redacted_by_flag_name_and_by_value():
    argv = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--api-key", "abc",
            "--admin-api-key=zz", "--max-total-tokens", "2048", "--tokenizer-path", "/tok", "--hf-token",
            "hf_x", "--port", "30000", "--ssl-keyfile-password", "pw", "--dist-init-addr",
            "https://u:pw@h:5000", "--json-model-override-args", '{"api_key": "k1"}', "--enable-metrics",
            "--mem-fraction-static", "-1"]
    assert redact_args(argv) == [
        "/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--api-key", R,
        f"--admin-api-key={R}", "--max-total-tokens", "2048", "--tokenizer-path", "/tok", "--hf-token", R,
        "--port", "30000", "--ssl-keyfile-password", R, "--dist-init-addr", f"https://u:{R}@h:5000",
        "--json-model-override-args", f'{{"api_key": "{R}"}}', "--enable-metrics",
        "--mem-fraction-static", "-1"]


def test_secret_flag_without_value_does_not_hide_the_next_flag():
    assert redact_args(["--api-key", "--port", "1"]) == ["--api-key", "--port", "1"]


@pytest.mark.parametrize("name, secret", [
    ("--api-key", True), ("--admin-api-key", True), ("--hf-token", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("--max-total-tokens", False), ("--tokenizer-path", False), ("--skip-tokenizer-init", False),
    ("--ssl-keyfile", False), ("--keep-mm-feature-on-device", False),
])
def test_secret_word(name, secret):
    assert secret_word(name) is secret


def test_env_snapshot_exports_values_redacted():
    environ = {"NCCL_PROTO": "LL", "NCCL_SOCKET_IFNAME": "eth0",
               "SGLANG_MODEL_URL": "https://bob:hunter2@models.example.com/llama",
               "TORCH_HUB_URL": "hf_PLANTEDSECRET0001", "CUDA_VISIBLE_DEVICES": "0,1",
               "SGLANG_API_TOKEN": "sk-PLANTEDSECRET0002"}
    launcher = dict(environ, NCCL_PROTO="Simple")
    envsnap.record_launcher_env(DEFAULT_ENV_ALLOW, launcher)
    environ[envsnap.LAUNCHER_ENV_VAR] = launcher[envsnap.LAUNCHER_ENV_VAR]
    attrs = envsnap.snapshot_attributes("process_start", DEFAULT_ENV_ALLOW, environ)
    assert attrs["env.SGLANG_MODEL_URL"] == f"https://bob:{R}@models.example.com/llama"
    assert attrs["env.TORCH_HUB_URL"] == R
    assert attrs["env.NCCL_PROTO"] == "LL" and attrs["env.CUDA_VISIBLE_DEVICES"] == "0,1"
    assert attrs["sgl_probe.env.withheld"] == ["SGLANG_API_TOKEN"]
    assert attrs["sgl_probe.env.differs_from_launcher"] == ["NCCL_PROTO"]
    assert attrs["launcher_env.NCCL_PROTO"] == "Simple"
    blob = json.dumps(attrs) + environ[envsnap.LAUNCHER_ENV_VAR]
    for secret in ("hunter2", "PLANTEDSECRET0001", "PLANTEDSECRET0002"):
        assert secret not in blob


def test_hand_written_launcher_env_is_redacted_on_read():
    env = {envsnap.LAUNCHER_ENV_VAR: json.dumps({"NCCL_X": "https://a:b@c", "MY_KEY": "v", "NCCL_Y": "1"})}
    assert envsnap.launcher_env(env) == {"NCCL_X": f"https://a:{R}@c", "NCCL_Y": "1"}


def test_values_nccl_reports_are_redacted_like_the_env():
    from sgl_probe.nccl_confirm import confirm_attributes

    url = "https://bob:hunter2@ib.example/x"
    environ = {"NCCL_NET_PLUGIN_URL": url, "NCCL_PROTO": "LL"}
    attrs = confirm_attributes({"NCCL_NET_PLUGIN_URL": url, "NCCL_PROTO": "Simple"}, DEFAULT_ENV_ALLOW, environ,
                               {}, {}, "/tmp/nccl.log", "init_complete")
    assert attrs["nccl.confirmed.NCCL_NET_PLUGIN_URL"] == f"https://bob:{R}@ib.example/x"
    assert attrs["env.NCCL_NET_PLUGIN_URL"] == f"https://bob:{R}@ib.example/x"
    assert attrs["sgl_probe.nccl.value_differs"] == ["NCCL_PROTO"]  # the redacted URL matches itself
    assert "hunter2" not in json.dumps(attrs)
