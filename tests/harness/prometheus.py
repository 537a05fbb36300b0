"""A real Prometheus server for tests: Debian's ``prometheus`` package, installed on first use.

Stdlib only. ``ensure_prometheus()`` returns the binary (installing the package with apt-get when
it is missing and this machine can) or raises ``PrometheusUnavailable`` saying why not;
``Prometheus`` runs one on loopback that scrapes the given targets every second.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from .server import free_port
from .venv import HARNESS_DIR, file_lock

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusUnavailable(RuntimeError):
    pass


def ensure_prometheus() -> Path:
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    apt = shutil.which("apt-get")
    if apt is None:
        raise PrometheusUnavailable("no `prometheus` on PATH and no apt-get to install Debian's package")
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None or subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode:
            raise PrometheusUnavailable("no `prometheus` on PATH; installing it needs root "
                                        "(run `apt-get install -y prometheus`)")
        sudo = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    HARNESS_DIR.mkdir(parents=True, exist_ok=True)
    with file_lock(HARNESS_DIR / "prometheus-apt.lock"):
        if not shutil.which("prometheus"):
            install = [*sudo, apt, "install", "-y", "--no-install-recommends", "prometheus"]
            out = subprocess.run(install, capture_output=True, text=True, env=env)
            if out.returncode:  # a fresh machine may have no package lists yet
                subprocess.run([*sudo, apt, "update"], capture_output=True, env=env)
                out = subprocess.run(install, capture_output=True, text=True, env=env)
            if out.returncode:
                raise PrometheusUnavailable(f"`apt-get install prometheus` failed: {out.stderr.strip()[-500:]}")
    found = shutil.which("prometheus")
    if not found:
        raise PrometheusUnavailable("the prometheus package installed no `prometheus` on PATH")
    return Path(found)


class Prometheus:
    """``prometheus`` on 127.0.0.1, scraping ``targets`` ("host:port") every second."""

    def __init__(self, binary: Path, targets: Sequence[str], workdir: Path, job: str = "sglang") -> None:
        self.binary = binary
        self.targets = list(targets)
        self.workdir = Path(workdir)
        self.job = job
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self._log: Any = None

    def start(self) -> "Prometheus":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": self.job, "metrics_path": "/metrics",
                                "static_configs": [{"targets": self.targets}]}],
        }))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited rc={self.proc.returncode}: {self.log_tail()}")
            try:
                with _OPENER.open(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"prometheus not ready after 60 s: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with _OPENER.open(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant vector: ``[{"metric": {labels}, "value": [ts, "str"]}, ...]``."""
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr: str, predicate: Callable[[list[dict]], bool], timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                targets = self.api("targets")["activeTargets"]
                health = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in targets]
                raise TimeoutError(f"prometheus: {expr!r} -> {result} after {timeout:g}s; targets {health}")
            time.sleep(0.5)
