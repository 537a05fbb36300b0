"""Run a real, unpatched ``sglang.launch_server`` on CPU for end-to-end tests.

Stdlib only: runs under the test runner's Python; the server runs in a harness
venv (see ``venv.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sgl_probe.testing.ports import free_port  # noqa: F401 (the harness's servers and their users take it from here)

from .venv import HARNESS_DIR, venv_python

# An empty ProxyHandler: an http_proxy in the environment must never see
# requests to the local server.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def cpu_bind_spec(tp: int, cpus: Sequence[int] | None = None) -> str:
    """Value for SGLANG_CPU_OMP_THREADS_BIND: one ``|``-separated CPU set per TP rank.

    Needed for tp > 1 because sglang otherwise binds one rank per NUMA node and
    asserts ``world_size <= n_numa_nodes`` (1 here). With fewer CPUs than ranks,
    ranks share CPUs (round-robin) rather than failing.
    """
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if tp <= len(cpus):
        per, extra = divmod(len(cpus), tp)
        groups, start = [], 0
        for rank in range(tp):
            n = per + (1 if rank < extra else 0)
            groups.append(cpus[start:start + n])
            start += n
    else:
        groups = [[cpus[rank % len(cpus)]] for rank in range(tp)]

    def fmt(group: list[int]) -> str:
        if len(group) > 1 and group[-1] - group[0] == len(group) - 1:
            return f"{group[0]}-{group[-1]}"
        return ",".join(map(str, group))

    return "|".join(fmt(g) for g in groups)


def output_ids(response: Mapping[str, Any]) -> list[int]:
    """Generated token ids of one /generate response (prompt ids excluded)."""
    return list(response["output_ids"])


def _pgid_alive(pgid: int) -> bool:
    """True while any non-zombie process is in the group.

    ``killpg(pgid, 0)`` is not enough: zombies still count as members, and
    orphaned sglang children may be reaped late (or never) by PID 1 here.
    """
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # field 2 (comm) may contain spaces; fields after ')' are positional
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


#: The CPU settings every harness server runs with (SGLangServer; tests that launch SGLang their
#: own way take them too).
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # without it model construction imports vllm
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    # stop() signals the whole group: 0.5.23's launcher takes a scheduler's SIGTERM for a crash and
    # sleeps 5 s before its py-spy / CUDA coredump diagnostics unless both are off
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
}


class SGLangServer:
    """A ``sglang.launch_server`` subprocess on CPU with the torch_native backend.

    Use as a context manager (``__enter__`` starts and waits for /health,
    ``__exit__`` stops) or call ``start()``/``stop()``.

    Environment: ``base_env`` (default ``os.environ.copy()``; minus
    ``SGL_PROBE_HARNESS_DIR``), then the CPU settings (:data:`CPU_ENV`, and for
    tp > 1 ``SGLANG_CPU_OMP_THREADS_BIND``), then ``env`` on top; a ``None`` value
    in ``env`` removes the variable, so a test may deliberately drop a default.

    Numerics: with the checkpoint's bf16, tp=2 (gloo all-reduce) can pick a
    different greedy token than tp=1 where the random model's top logits
    nearly tie. Pass ``extra_args=("--dtype", "float32")`` when a test compares
    ids across tp sizes; tp=1 bf16 already matches HF transformers and 0.5.9.
    """

    def __init__(
        self,
        venv: Path,
        model: Path,
        *,
        tp: int = 1,
        port: int | None = None,
        env: Mapping[str, str | None] | None = None,
        base_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
        startup_timeout: float = 420,
    ) -> None:
        self.venv = Path(venv)
        self.model = Path(model)
        self.tp = tp
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        if log_path is None:
            log_path = HARNESS_DIR / "logs" / f"sglang-{time.strftime('%Y%m%d-%H%M%S')}-{self.port}.log"
        self.log_path = Path(log_path)
        self.startup_seconds: float | None = None

        full_env = dict(os.environ if base_env is None else base_env)
        # harness-internal; sglang copies every SGL_* variable to SGLANG_* (with
        # a deprecation warning), which would only add noise to worker envs
        full_env.pop("SGL_PROBE_HARNESS_DIR", None)
        full_env.update(CPU_ENV)
        if tp > 1:
            full_env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_bind_spec(tp)
        for key, value in (env or {}).items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = value
        self.env = full_env

        self.cmd = [
            str(venv_python(self.venv)), "-m", "sglang.launch_server",
            "--model-path", str(self.model),
            "--device", "cpu",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--tp", str(tp),
            "--attention-backend", "torch_native",
            "--disable-cuda-graph",
            # the KV pool is sized from these; tiny keeps startup fast and RAM low
            "--mem-fraction-static", "0.1",
            "--max-total-tokens", "2048",
            *extra_args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh: Any = None
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> "SGLangServer":
        if self.proc is not None:
            raise RuntimeError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "wb")
        t0 = time.monotonic()
        # own session/process group: stop() can signal the schedulers and
        # detokenizer sglang spawns, not just the launcher
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=self._log_fh, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.startup_timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError(
                    f"sglang server exited with rc={rc} before becoming healthy "
                    f"(log {self.log_path}); last lines:\n{self.log_tail()}"
                )
            if self._health_ok():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sglang server not healthy after {self.startup_timeout:.0f}s "
                    f"(log {self.log_path}); last lines:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _health_ok(self) -> bool:
        try:
            with _OPENER.open(self.base_url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            # refused while booting; 503 (HTTPError) until the warmup request finished
            return False

    def stop(self) -> int | None:
        """Terminate the whole process group; returns the launcher's exit code.

        Idempotent. sglang's launcher answers SIGTERM by SIGKILLing its own
        process tree, so the code is usually -9; stopping takes ~1 s.
        """
        proc = self.proc
        if proc is None:
            return None
        if not self._stopped:
            self._stopped = True
            pgid = proc.pid  # == pgid thanks to start_new_session
            if proc.poll() is None or _pgid_alive(pgid):  # launcher may have died, leaving children
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGTERM)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    proc.poll()  # reap the launcher, or it stays a group member as a zombie
                    if not _pgid_alive(pgid):
                        break
                    time.sleep(0.2)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pgid, signal.SIGKILL)
            proc.wait()
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
        return proc.returncode

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- logs ----------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def wait_for_log(self, done: Callable[[str], bool], timeout: float = 30, settle_s: float = 0.0) -> str:
        """The log once ``done(log)`` holds (or at ``timeout``: the caller's assertions say what
        is missing), read again ``settle_s`` later. The probe's lines come from background threads
        on their own schedule, which a busy machine delays: a fixed sleep is a flaky test."""
        deadline = time.monotonic() + timeout
        while not done(self.log_text()) and time.monotonic() < deadline:
            time.sleep(0.25)
        if settle_s:
            time.sleep(settle_s)
        return self.log_text()

    # -- requests ------------------------------------------------------------

    def request_text(self, path: str, timeout: float = 60) -> str:
        """GET a non-JSON endpoint (``/metrics``)."""
        with _OPENER.open(self.base_url + path, timeout=timeout) as r:
            return r.read().decode()

    def request(self, path: str, payload: Any | None = None, timeout: float = 120) -> Any:
        """GET (payload None) or POST JSON to the server; returns decoded JSON."""
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with _OPENER.open(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            raise RuntimeError(f"{path} -> HTTP {e.code}: {body[:2000]}") from None

    def generate(self, text: str, max_new_tokens: int = 8, temperature: float = 0.0,
                 timeout: float = 120, **sampling: Any) -> dict[str, Any]:
        """POST /generate; returns the server's JSON unchanged.

        ``sampling`` adds further sampling_params (e.g. ``ignore_eos=True``).
        Shape returned by both 0.5.23 and 0.5.9 for a single text::

            {"text": str,                # decoded completion only (no prompt)
             "output_ids": [int, ...],   # completion token ids only; see output_ids()
             "meta_info": {
                 "id": str,              # request id (hex)
                 "finish_reason": {"type": "length", "length": 8},  # or {"type": "stop", ...}
                 "prompt_tokens": int, "completion_tokens": int, "cached_tokens": int,
                 "cached_tokens_details": None, "weight_version": "default",
                 "e2e_latency": float, "response_sent_to_client_ts": float,
                 # 0.5.23 only: "num_retractions", "reasoning_tokens",
                 #   "weight_versions": [{"version", "start", "end"}], "dp_rank"
                 # 0.5.9 only: "total_retractions"
             }}
        """
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature, **sampling}
        return self.request("/generate", {"text": text, "sampling_params": params}, timeout=timeout)

    def generate_many(self, texts: Sequence[str], max_new_tokens: int = 8, concurrent: bool = True,
                      temperature: float = 0.0, timeout: float = 120) -> list[dict[str, Any]]:
        """One /generate per text; results in input order.

        With ``concurrent`` all requests are released together from separate
        threads so the scheduler sees them at once and batches them.
        """
        if not concurrent:
            return [self.generate(t, max_new_tokens, temperature, timeout) for t in texts]
        results: list[Any] = [None] * len(texts)
        barrier = threading.Barrier(len(texts))

        def worker(i: int, text: str) -> None:
            barrier.wait()
            try:
                results[i] = self.generate(text, max_new_tokens, temperature, timeout)
            except BaseException as e:  # re-raised in the caller's thread
                results[i] = e

        threads = [threading.Thread(target=worker, args=(i, t), daemon=True) for i, t in enumerate(texts)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results
