"""docker/: what can be checked without a Docker engine (none runs on these machines).

Checked here: the compose file and the Collector config parse and reference the right ports,
aliases, variables and span names; the Dockerfile copies everything the package build needs
(the copied subset really builds a wheel) and installs with the README's install line; and, where
a compose client is installed, ``docker compose config`` (or v1 ``docker-compose config``) accepts
both profiles offline. Not run: building the image, pulling any image, starting any container.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
COLLECTOR = DOCKER / "otel-collector.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
README = ROOT / "README.md"
DOCKER_DOC = ROOT / "docs" / "docker.md"
PROFILES = ("jaeger", "collector")


def _load_yaml_files(paths: list[Path]) -> list:
    """PyYAML from this Python, else from a small cached venv (PyYAML is not a test dependency)."""
    try:
        import yaml

        return [yaml.safe_load(p.read_text()) for p in paths]
    except ImportError:
        pass
    import json

    from tests.harness.venv import HARNESS_DIR, file_lock
    from tests.harness.wheel import fresh_venv, pip_install

    venv = HARNESS_DIR / "venv-yaml"
    with file_lock(HARNESS_DIR / "venv-yaml.lock"):
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            fresh_venv(venv, None)
            pip_install(venv, "pyyaml")
            (venv / ".complete").write_text("pyyaml\n")
    code = "import json, sys, yaml; print(json.dumps([yaml.safe_load(open(p)) for p in sys.argv[1:]]))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code, *map(str, paths)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def docs() -> dict:
    compose, collector = _load_yaml_files([COMPOSE, COLLECTOR])
    return {"compose": compose, "collector": collector}


_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(text: str, env: dict) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` (the only forms docker/compose.yaml uses)."""
    return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), text)


def enabled(compose: dict, profile: str) -> dict:
    return {name: svc for name, svc in compose["services"].items()
            if not svc.get("profiles") or profile in svc["profiles"]}


def published(svc: dict, env: dict | None = None) -> dict[int, int]:
    out = {}
    for spec in svc.get("ports", []):
        host, container = interpolate(str(spec), env or {}).split(":")[-2:]
        out[int(host)] = int(container)
    return out


def aliases(svc: dict) -> list:
    return ((svc.get("networks") or {}).get("default") or {}).get("aliases") or []


def test_profiles_ports_and_where_sglang_sends(docs):
    compose = docs["compose"]
    services = compose["services"]
    assert "profiles" not in services["sglang"]  # runs alone on the other nodes, and in both profiles
    assert services["jaeger"]["profiles"] == ["jaeger"]
    assert services["otel-collector"]["profiles"] == services["jaeger-backend"]["profiles"] == ["collector"]
    for name in ("jaeger", "jaeger-backend"):
        assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", interpolate(services[name]["image"], {}))  # v2
    assert interpolate(services["otel-collector"]["image"], {}).startswith("otel/opentelemetry-collector-contrib:")
    assert published(services["jaeger"]) == {16686: 16686, 4317: 4317, 4318: 4318}
    assert published(services["jaeger-backend"]) == {16686: 16686}
    assert published(services["otel-collector"])[4317] == 4317 and published(services["otel-collector"])[4318] == 4318

    env = services["sglang"]["environment"]
    endpoint = interpolate(env["OTEL_EXPORTER_OTLP_ENDPOINT"], {})
    assert endpoint == "http://otlp:4317" and env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert interpolate(env["OTEL_EXPORTER_OTLP_ENDPOINT"], {"OTLP_ENDPOINT": "http://head:4317"}) == "http://head:4317"
    for profile in PROFILES:
        on = enabled(compose, profile)
        # One OTLP receiver answers to "otlp" in each profile, and no host port is taken twice.
        receivers = [name for name, svc in on.items() if "otlp" in aliases(svc)]
        assert receivers == (["jaeger"] if profile == "jaeger" else ["otel-collector"]), profile
        ports = [p for svc in on.values() for p in published(svc)]
        assert len(ports) == len(set(ports)), (profile, ports)
        assert 16686 in ports and 4317 in ports and 4318 in ports
    # Pass-through names (no value) reach the container from the shell only when set there.
    for name in ("NCCL_PROTO", "NCCL_ALGO", "SGL_PROBE_RUN_ID", "HF_TOKEN"):
        assert name in env and env[name] is None


def test_sglang_service_gpu_model_and_spec_flags_are_variables(docs):
    svc = docs["compose"]["services"]["sglang"]
    device = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert interpolate(str(device["count"]), {}) == "all"
    assert interpolate(str(device["count"]), {"GPU_COUNT": "2"}) == "2"
    cmd = interpolate(svc["command"], {"MODEL_PATH": "/models/llama", "TP": "2",
                                       "SPEC_ARGS": "--speculative-algorithm EAGLE3 --speculative-num-steps 3"})
    assert cmd.split() == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--tp", "2",
                           "--host", "0.0.0.0", "--port", "30000", "--enable-metrics", "--speculative-algorithm", "EAGLE3",
                           "--speculative-num-steps", "3"]
    assert "--model-path Qwen/Qwen2.5-0.5B-Instruct --tp 1" in " ".join(interpolate(svc["command"], {}).split())
    build = svc["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert set(build["args"]) == {"SGLANG_VERSION"} and re.search(r"ARG SGLANG_VERSION=", DOCKERFILE.read_text())
    assert svc["ipc"] == "host"
    assert "/health" in " ".join(svc["healthcheck"]["test"])


def test_collector_config_batches_and_keeps_every_slow_step(docs):
    cfg, compose = docs["collector"], docs["compose"]
    grpc, http = cfg["receivers"]["otlp"]["protocols"]["grpc"], cfg["receivers"]["otlp"]["protocols"]["http"]
    assert (grpc["endpoint"], http["endpoint"]) == ("0.0.0.0:4317", "0.0.0.0:4318")
    pipeline = cfg["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"]
    assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
    assert "tail_sampling" in pipeline["processors"]
    for name in pipeline["processors"] + pipeline["exporters"]:
        assert name in {**cfg["processors"], **cfg["exporters"]}, name
    policies = {p["name"]: p for p in cfg["processors"]["tail_sampling"]["policies"]}
    slow = policies["slow-step"]["ottl_condition"]["span"][0]
    assert "${env:SLOW_STEP_MS}" in slow  # the names it tests: test_names_docker_and_its_doc_use_...
    assert policies["slow-trace"]["latency"]["threshold_ms"] == "${env:SLOW_STEP_MS}"
    assert policies["errors"]["status_code"]["status_codes"] == ["ERROR"]
    # Every ${env:X} of the config is set by the compose service that mounts it.
    svc = compose["services"]["otel-collector"]
    used = set(re.findall(r"\$\{env:(\w+)\}", COLLECTOR.read_text()))
    assert used == set(svc["environment"]), used
    mount = next(v for v in svc["volumes"] if v.startswith("./otel-collector.yaml:"))
    assert mount.split(":")[1] in svc["command"][0]
    host, port = interpolate(svc["environment"]["JAEGER_OTLP"], {}).split(":")
    assert host in enabled(compose, "collector") and port == "4317"
    assert cfg["exporters"]["otlp/jaeger"]["endpoint"] == "${env:JAEGER_OTLP}"


def test_names_docker_and_its_doc_use_are_the_span_contract(docs):
    """The collector config, compose file and docs/docker.md name spans, attributes and settings
    the way sgl_probe/contract.py (what the probe emits) does."""
    from sgl_probe import contract

    policies = {p["name"]: p for p in docs["collector"]["processors"]["tail_sampling"]["policies"]}
    slow = policies["slow-step"]["ottl_condition"]["span"][0]
    assert f'attributes["{contract.DURATION_MS}"] >= ${{env:SLOW_STEP_MS}}' in slow
    snapshots = policies["env-snapshots"]["string_attribute"]
    assert snapshots["key"] == contract.SNAPSHOT_POINT
    assert {"process_start", "nccl_init"} <= set(snapshots["values"]) <= set(contract.SNAPSHOT_POINTS)
    assert contract.ENV_RUN_ID in docs["compose"]["services"]["sglang"]["environment"]
    section = DOCKER_DOC.read_text()
    for needle in (contract.phase_span("verify"), contract.phase_span("decode"), f"{contract.CUDA_GRAPH}=false",
                   f"{contract.CUDA_GRAPH}=true", contract.ENV_SPAN, f"{contract.SNAPSHOT_POINT}=nccl_init",
                   contract.DURATION_MS, contract.ENV_RUN_ID, "--profile collector", "--profile jaeger",
                   "OTEL_EXPORTER_OTLP_ENDPOINT", "not run"):
        assert needle in section, needle


def test_dockerfile_installs_with_the_readme_line_and_copies_what_the_build_needs(tmp_path):
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG SGLANG_TAG=v\$\{SGLANG_VERSION\}$", text, re.M)
    assert re.search(r"^FROM \$\{SGLANG_IMAGE\}:\$\{SGLANG_TAG\}$", text, re.M)
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang$", text, re.M)
    # README "Install": `pip install sgl-probe   # from a checkout: pip install .`; the image runs
    # that line on the checkout copied to /opt/sgl-probe.
    install = README.read_text().split("## Install", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    m = re.search(r"from a checkout: (pip install) \.$", install, re.M)
    assert m, install
    runs = re.findall(r"^RUN (pip install .*)$", text, re.M)
    assert runs == [f"{m.group(1)} /opt/sgl-probe"], runs
    # The COPY lines bring what pyproject's build needs: the package, the force-included startup
    # files, the readme; and the .dockerignore lets exactly those through.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    hook = wheel.get("hooks", {}).get("custom")  # the build hook compiling the C hot path
    needed = {"pyproject.toml", project["project"]["readme"], *wheel["packages"],
              *(src.split("/")[0] for src in wheel["force-include"]),
              *([hook.get("path", "hatch_build.py")] if hook is not None else [])}
    copied = {src for line in re.findall(r"^COPY (.+) /opt/sgl-probe/?\S*$", text, re.M) for src in line.split()}
    assert copied == needed, (copied, needed)
    ignore = [line for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    assert ignore[0] == "*" and {line[1:] for line in ignore if line.startswith("!")} == needed
    # And that subset really builds: a wheel from only the copied files, with the startup hook.
    ctx = tmp_path / "opt" / "sgl-probe"
    ctx.mkdir(parents=True)
    for name in needed:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            shutil.copy(src, ctx / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "w"), str(ctx)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import zipfile

    whl = next((tmp_path / "w").glob("sgl_probe-*.whl"))
    names = zipfile.ZipFile(whl).namelist()
    assert "sgl_probe.pth" in names and "sgl_probe/testing/plugin.py" in names


def _compose_client() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_client_accepts_both_profiles(profile, tmp_path):
    client = _compose_client()
    if client is None:
        pytest.skip("no compose client here (neither `docker compose` nor `docker-compose`): parsed with "
                    "PyYAML only (the tests above)")
    compose = COMPOSE
    if client == ["docker-compose"]:
        # Compose v1 (Debian's 1.29) predates the top-level `name:`; everything else it checks.
        compose = tmp_path / "compose.yaml"
        compose.write_text(re.sub(r"^name: .*\n", "", COMPOSE.read_text(), flags=re.M))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    env.update(MODEL_PATH="/models/tiny", TP="2", SPEC_ARGS="--speculative-algorithm EAGLE3", NCCL_PROTO="LL",
               HOME=str(tmp_path), DOCKER_CONFIG=str(tmp_path / ".docker"))
    out = subprocess.run([*client, "-f", str(compose), "--project-directory", str(DOCKER), "--profile", profile,
                          "config"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rendered = out.stdout
    assert "--model-path /models/tiny" in rendered and "--tp 2" in rendered
    assert "--speculative-algorithm EAGLE3" in rendered
    assert re.search(r"NCCL_PROTO: '?LL'?", rendered)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT: http://otlp:4317" in rendered
    assert "otel-collector.yaml:/etc/otelcol-contrib/config.yaml" in rendered
