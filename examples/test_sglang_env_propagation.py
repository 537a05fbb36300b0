"""Did the launcher's NCCL settings reach every SGLang scheduler process?  (copy me)

Runs with pytest wherever sgl-probe is installed (its pytest plugin provides the
``sgl_probe_collector`` fixture); the server's Python needs SGLang and sgl-probe. The fixture
below launches ``sglang.launch_server`` with ``NCCL_PROTO=LL`` and the collector's OTEL_*
variables; the first test fails, naming the rank and the variable, when any scheduler process
did not have the value when its first communicator was created. Settings (environment):

  SGLANG_PYTHON    Python of the SGLang environment           (default: the one running pytest)
  MODEL_PATH       model to serve                             (default: Qwen/Qwen2.5-0.5B-Instruct)
  TP_SIZE          tensor-parallel size                       (default: 2)
  SERVER_ARGS      more launch_server arguments (shell words), e.g. the speculative flags
  SERVER_LAUNCHER  command that starts SGLang                 (default: $SGLANG_PYTHON -m sglang.launch_server)
  SERVER_STARTUP_S seconds to wait for /health                (default: 900)

    pytest -q test_sglang_env_propagation.py
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from sgl_probe.testing import assert_env_propagated, free_port

EXPECTED = {"NCCL_PROTO": "LL"}  # what the launcher sets; every scheduler must see it at NCCL init
TP = int(os.environ.get("TP_SIZE", "2"))
PYTHON = os.environ.get("SGLANG_PYTHON", sys.executable)
LAUNCHER = shlex.split(os.environ.get("SERVER_LAUNCHER", "")) or [PYTHON, "-m", "sglang.launch_server"]
MODEL = os.environ.get("MODEL_PATH", "Qwen/Qwen2.5-0.5B-Instruct")
ARGS = shlex.split(os.environ.get("SERVER_ARGS", ""))
STARTUP_S = float(os.environ.get("SERVER_STARTUP_S", "900"))
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, run_id: str, log: str) -> None:
        self.proc, self.url, self.run_id, self.log = proc, url, run_id, log

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with rc={self.proc.returncode}; log: {self.log}")
            # SGLang logs a failed bind of its HTTP port and then waits, never healthy.
            with open(self.log, "rb") as fh:
                if b"address already in use" in fh.read():
                    raise RuntimeError(f"the server's port was taken before it could bind it; log: {self.log}")
            try:
                with NO_PROXY.open(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not healthy after {timeout:.0f}s; log: {self.log}")

    def generate(self, text: str, max_new_tokens: int = 8) -> dict:
        body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens,
                                                             "temperature": 0}}).encode()
        req = urllib.request.Request(self.url + "/generate", data=body,
                                     headers={"Content-Type": "application/json"})
        with NO_PROXY.open(req, timeout=300) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the launcher and the workers it spawned
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def sglang_server(sgl_probe_collector, tmp_path_factory):
    port = free_port()
    # This process's env, minus stale OTEL_*/probe settings, plus the collector's OTEL_* (and a
    # fresh run id), plus the variables under test.
    env = sgl_probe_collector.launch_env(EXPECTED)
    log = tmp_path_factory.mktemp("sglang") / "server.log"
    cmd = [*LAUNCHER, "--model-path", MODEL, "--tp", str(TP), "--host", "127.0.0.1", "--port", str(port), *ARGS]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", env["SGL_PROBE_RUN_ID"], str(log))
    try:
        server.wait_healthy(STARTUP_S)
        yield server
    finally:
        server.stop()


def test_launcher_env_reaches_every_scheduler(sgl_probe_collector, sglang_server):
    snapshots = sgl_probe_collector.wait_for_env_snapshots(
        ranks=range(TP), at="nccl_init", run_id=sglang_server.run_id, process=sglang_server.proc, timeout=120)
    for snap in snapshots.at("nccl_init").values():
        print(f"{snap.label}: NCCL_PROTO={snap.value('NCCL_PROTO')!r} "
              f"(differs from launcher: {', '.join(snap.differs_from_launcher or ()) or 'nothing'})")
    assert_env_propagated(snapshots, EXPECTED, ranks=range(TP), at="nccl_init")


def test_every_rank_times_prefill_and_decode(sgl_probe_collector, sglang_server):
    t0 = time.time_ns()
    sglang_server.generate("The capital of France is", max_new_tokens=8)
    spans = sgl_probe_collector.wait_for_phase_spans(
        ["extend", "decode"], ranks=range(TP), run_id=sglang_server.run_id, since_ns=t0,
        process=sglang_server.proc, timeout=120)
    for s in spans:
        a = s.attributes
        assert a["sgl_probe.duration_ms"] > 0 and isinstance(a["sglang.cuda_graph"], bool)
    print(f"{len(spans)} phase spans; extend/decode per rank:",
          {r: sum(s.attributes["sglang.tp_rank"] == r for s in spans) for r in range(TP)})
