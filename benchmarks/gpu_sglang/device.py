"""Real SGLang 0.5.23 on the GPU machine, with and without sgl-probe: ``run.sh SUITE...`` calls this
after installing what ``build.py`` carried. Suites:

- ``correct``: the tiny real-weight Llama, plain and EAGLE-3 (copy draft, float32), each with the
  probe on and off (four servers at once, CUDA graphs on, decode graphs up to batch 8). Greedy
  outputs on vs off, every span's graph flag vs SGLang's ``cuda graph:`` log line, verify accept
  length vs SGLang's ``accept len``, span counts vs SGLang's pass counters, and the phase times
  against the torch profiler's kernels of the same steps (SGLang's ``/start_profile``).
- ``seed``: the 32B-class config (dummy weights): baseline with graphs, EAGLE-3 with the verify
  eager (``--disable-cuda-graph``, the seed case) and with graphs; ``sgl-probe report`` verdicts.
- ``overhead``: output tok/s of the tiny Llama at 16 concurrent requests (launch-bound: the
  probe's worst case) without the probe, with it exporting every step (OTLP/gRPC + trace dir), with
  a reference build of the probe (``build.py --ref``) the same way, and with SGLang's own
  observability instead; launches alternate (all started together, then each measured alone
  while the others are stopped with SIGSTOP).
- ``full``: ``correct`` and ``overhead`` with one shared startup.
- ``overhead_ab``: the tiny Llama at 16 concurrent requests with the probe recording vs paused
  in alternating windows of the same server (``benchmarks/probe_pause/``), plus an A/A control.
- ``seed_overhead``: output tok/s of the 32B-class config at batch 1 and 8, with and without the
  probe (every step exported), ``--launches`` pairs of launches.

Results: ``$OUT/gpu_sglang_<suite>.json`` plus logs. Environment: see ``run.sh``.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import analysis  # noqa: E402
from probe_pause import control as pause  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: Where every child that imports sgl_probe runs. ``python -m`` and ``-c`` put the working
#: directory first on sys.path, before PYTHONPATH; run from the checkout, a server imported the
#: checkout's ``sgl_probe/`` whatever wheel its PYTHONPATH named (the probe arms from the wheel's
#: startup folder but imports the package only once sglang is imported). Until 2026-12-03 every
#: ``ref`` server ran this checkout's probe, not the reference wheel. PYTHONSAFEPATH (3.11+) drops
#: that entry; the neutral directory covers older interpreters.
CHILD_CWD = Path("/tmp/gpu_sglang_cwd")


def child_env(env: dict) -> dict:
    """``env`` for a child that must import sgl_probe from its PYTHONPATH only (see CHILD_CWD)."""
    CHILD_CWD.mkdir(parents=True, exist_ok=True)
    return {**env, "PYTHONSAFEPATH": "1"}


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
T0 = time.time()
# Servers run on one fixed set of cores, the load generator and the OTLP receiver each on cores of
# their own: launches measured one after another see the same CPUs, and a receiver busy decoding
# one configuration's spans cannot slow the client measuring it.
_CPUS = sorted(os.sched_getaffinity(0))
_N = len(_CPUS)
SERVER_CPUS = set(_CPUS[:max(1, _N * 5 // 8)])
CLIENT_CPUS = set(_CPUS[_N * 5 // 8:_N * 13 // 16]) or set(_CPUS)
RECEIVER_CPUS = set(_CPUS[_N * 13 // 16:]) or set(_CPUS)
DEADLINE = [float("inf")]  # seconds after T0 by which measuring stops (results still written)


def late() -> bool:
    return time.time() - T0 > DEADLINE[0]


def log(msg: str) -> None:
    print(f"[+{time.time() - T0:5.0f}s] {msg}", flush=True)


class Server:
    """One ``sglang.launch_server`` in its own process group."""

    def __init__(self, name: str, port: int, args: list[str], *, probe: Optional[str], out: Path,
                 env: Optional[dict] = None, pausable: bool = False) -> None:
        """``probe``: the folder an sgl-probe wheel was installed to (None: no probe at all).
        ``pausable``: the benchmark-only pause switch (benchmarks/probe_pause/) on the path."""
        self.name, self.port, self.args, self.probe = name, port, args, probe
        self.out = out
        self.trace_dir = Path("/tmp/traces") / name
        self.log_path = out / f"{name}.log"
        self.env = dict(os.environ)
        site = os.environ["GPU_BENCH_SITE"]
        if probe:
            shutil.rmtree(self.trace_dir, ignore_errors=True)
            self.trace_dir.mkdir(parents=True)
            # The wheel's own PYTHONPATH startup folder arms the probe (as `sgl-probe run` does);
            # older builds kept it inside the package.
            startup = next((d for d in (Path(probe) / "_sgl_probe_startup", Path(probe) / "sgl_probe" / "_startup")
                            if (d / "sitecustomize.py").is_file()), Path(REPO) / "sitecustomize")
            shim = f"{pause.HERE}:" if pausable else ""
            self.env.update(PYTHONPATH=f"{startup}:{shim}{probe}:{site}",
                            SGL_PROBE="1", SGL_PROBE_TRACE_DIR=str(self.trace_dir), SGL_PROBE_SUMMARY_S="5")
        else:
            self.env.update(PYTHONPATH=f"{pause.HERE}:{site}" if pausable else site)
            self.env.pop("SGL_PROBE_TRACE_DIR", None)
        self.pause_dir = Path("/tmp/pause") / name
        if pausable:
            shutil.rmtree(self.pause_dir, ignore_errors=True)
            self.pause_dir.mkdir(parents=True)
            self.env["SGL_BENCH_PAUSE_DIR"] = str(self.pause_dir)
        self.env.update(env or {})
        self.proc: Optional[subprocess.Popen] = None
        self.stopped = False

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        fh = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "sglang.launch_server", *self.args, "--host", "127.0.0.1",
               "--port", str(self.port)]
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        self.proc = self.spawn(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, SERVER_CPUS))
        self.t_start = time.time()
        return self

    def spawn(self, cmd: list[str], **kw) -> subprocess.Popen:
        """``cmd`` as this server's process: its environment, and its probe from its own folder."""
        return subprocess.Popen(cmd, env=child_env(self.env), cwd=CHILD_CWD, **kw)

    def wait_ready(self, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                log(f"{self.name}: exited rc={self.proc.returncode}")
                return False
            try:
                with OPENER.open(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.ready_s = time.time() - self.t_start
                        log(f"{self.name}: ready after {self.ready_s:.0f}s")
                        return True
            except Exception:
                pass
            time.sleep(1)
        log(f"{self.name}: not ready after {timeout:.0f}s")
        return False

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.stopped:
            return
        self.stopped = True
        self.resume()
        # A paused server's last steps are still on their way to its exporter process, which
        # flushes once the link is quiet: SGLang's shutdown SIGKILLs it (kill_process_tree).
        time.sleep(2.0)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        # Give what is left of the group (the probe's exporter writing out its queue) a few
        # seconds before killing it: a run's span count is judged afterwards.
        end = time.time() + 8
        while time.time() < end:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        self.signal(signal.SIGKILL)

    def get(self, path: str, timeout: float = 30) -> str:
        with OPENER.open(self.base + path, timeout=timeout) as r:
            return r.read().decode()

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with OPENER.open(req, timeout=timeout) as r:
            raw = r.read().decode()
        try:
            return json.loads(raw)
        except ValueError:
            return {"raw": raw}

    def generate(self, text: str, n: int, ignore_eos: bool = False) -> dict:
        out = self.post("/generate", {"text": text, "sampling_params": {
            "temperature": 0, "max_new_tokens": n, "ignore_eos": ignore_eos}})
        meta = out.get("meta_info", {})
        return {"text": out.get("text"), "ids": out.get("output_ids"),
                "tokens": meta.get("completion_tokens")}

    def stream(self, text: str, n: int):
        """A streamed greedy request of ``n`` tokens: (arrival time, line) of each ``data:`` line."""
        body = {"text": text, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                  "ignore_eos": True}}
        req = urllib.request.Request(self.base + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with OPENER.open(req, timeout=300) as r:
            for line in r:
                if line.startswith(b"data:"):
                    yield time.perf_counter(), line

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def concurrent(fn, items: list) -> list:
    res: list = [None] * len(items)

    def run(i: int) -> None:
        try:
            res[i] = fn(items[i])
        except Exception as exc:  # a failed request is a result, not a crash of the suite
            res[i] = {"error": repr(exc)}

    ths = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return res


def base_args(model: Path, *, mem: float, max_bs: int, extra: tuple = (), level: str = "info",
              max_tokens: Optional[int] = None) -> list[str]:
    """``mem`` is SGLang's fraction of the memory free at its start that it may keep: several
    tiny servers start at once, so each keeps a large margin and caps its KV pool instead
    (``max_tokens``); otherwise a server started a moment later sees the earlier ones' pools
    appear during its memory check and refuses to start."""
    cap = ["--max-total-tokens", str(max_tokens)] if max_tokens else []
    return [*cap, "--model-path", str(model), "--attention-backend", "triton", "--sampling-backend", "pytorch",
            "--disable-custom-all-reduce", "--mem-fraction-static", str(mem),
            "--cuda-graph-max-bs-decode", str(max_bs), "--cuda-graph-bs-prefill", "16", "32", "64",
            "--random-seed", "0", "--log-level", level, *extra]


def eagle_args(draft: Path, *, dummy: bool = False) -> list[str]:
    a = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
         "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    if dummy:
        a += ["--speculative-draft-load-format", "dummy"]
    return a


def wait_spans(trace_dir: Path, settle_s: float = 3.0) -> list[dict]:
    """The drain exports every 0.2 s and the batch processor every few seconds: wait until the
    trace files stop growing."""
    last, same_since = -1, time.time()
    end = time.time() + 30
    while time.time() < end:
        size = sum(p.stat().st_size for p in trace_dir.glob("*.jsonl"))
        if size != last:
            last, same_since = size, time.time()
        elif time.time() - same_since > settle_s:
            break
        time.sleep(0.5)
    return analysis.read_spans(str(trace_dir))


def probe_cli(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=f"{os.environ['GPU_BENCH_PROBE']}:{os.environ['GPU_BENCH_SITE']}")
    proc = subprocess.run([sys.executable, "-m", "sgl_probe.cli", *args], env=child_env(env), cwd=CHILD_CWD,
                          capture_output=True, text=True, timeout=180)
    return proc.stdout + (f"\n[stderr]\n{proc.stderr[-3000:]}" if proc.returncode else "")


PROMPTS = ["hello world the quick", "once upon a time there was", "the scheduler worker tensor",
           "a b c d e f", "speculative decoding is", "graphs and kernels"]


def correctness_load(srv: Server) -> dict:
    """The same greedy requests for every server: batch 1, batch 6, and batch 12 (above the
    largest captured decode batch, 8, so some decode steps must run without a graph)."""
    seq = [srv.generate(p, 32) for p in PROMPTS[:3]]
    six = concurrent(lambda i: srv.generate(PROMPTS[i % 6] + f" {i}", 48), list(range(6)))
    twelve = concurrent(lambda i: srv.generate(PROMPTS[i % 6] + f" number {i}", 24, True), list(range(12)))
    return {"sequential": seq, "six": six, "twelve": twelve}


def outputs_of(load: dict) -> list:
    return [(r or {}).get("ids") or (r or {}).get("text") for part in ("sequential", "six", "twelve")
            for r in load[part]]


def profile(srv: Server, name: str, out: Path, steps: int = 60) -> dict:
    """Phase times against the profiler's kernels of the same ``steps`` steps inside the running
    server."""
    pdir = Path("/tmp/prof") / name
    shutil.rmtree(pdir, ignore_errors=True)
    pdir.mkdir(parents=True)
    before = time.time_ns()
    try:
        srv.post("/start_profile", {"output_dir": str(pdir), "num_steps": steps, "activities": ["GPU"]}, timeout=60)
    except Exception as exc:
        return {"error": f"start_profile: {exc!r}"}
    concurrent(lambda i: srv.generate(PROMPTS[i % 6] + f" profiled {i}", 40, True), list(range(4)))
    srv.generate("profiled single", 40, True)
    deadline = time.time() + 60
    files: list = []
    while time.time() < deadline and not files:
        time.sleep(1)
        files = sorted(pdir.rglob("*.trace.json*"))
    if not files:
        return {"error": "no profiler trace written"}
    log(f"{name}: profiler trace after {(time.time_ns() - before) / 1e9:.0f}s")
    time.sleep(2)
    trace = analysis.load_trace(str(files[0]))
    kernels = analysis.read_kernels(trace)
    spans = [s for s in wait_spans(srv.trace_dir) if s["start"] >= before]
    res = analysis.profiler_ratio(spans, kernels)
    log(f"{name}: {len(kernels)} kernels judged, {(time.time_ns() - before) / 1e9:.0f}s after the start")
    res["graph_launches"] = analysis.graph_launches(trace)
    res["kernels"] = len(kernels)
    res["trace_file"] = files[0].name
    return res


def correctness_servers(carry: Path, out: Path) -> dict:
    tiny, draft = carry / "models/tiny-llama4-h256", carry / "models/tiny-llama4-h256-eagle3"
    if not draft.is_dir():
        raise ValueError(f"{draft} is not in the carried folder (build.py --no-draft left it out): "
                         "build.py without --no-draft for the correctness suites")
    common = ["--decode-log-interval", "1", "--enable-metrics", "--dtype", "float32"]
    plain = base_args(tiny, mem=0.5, max_bs=8, extra=tuple(common), max_tokens=65536)
    spec = plain + eagle_args(draft)
    probe = os.environ["GPU_BENCH_PROBE"]
    return {"plain_on": Server("plain_on", 30010, plain, probe=probe, out=out),
            "plain_off": Server("plain_off", 30011, plain, probe=None, out=out),
            "eagle_on": Server("eagle_on", 30012, spec, probe=probe, out=out),
            "eagle_off": Server("eagle_off", 30013, spec, probe=None, out=out),
            # every phase without a graph, for a reason SGLang's flag gives
            "plain_nograph": Server("plain_nograph", 30014, plain + ["--disable-cuda-graph"], probe=probe, out=out)}


def correctness_run(servers: dict, ready: dict, out: Path) -> dict:
    """Loads, profiles and metrics of the four servers, each alone (the others paused)."""
    result: dict = {"servers": {}, "loads": {}}
    live = [s for n, s in servers.items() if ready[n]]
    for s in live:
        s.pause()
    for n, s in servers.items():
        if not ready[n]:
            continue
        s.resume()
        time.sleep(0.5)
        try:
            result["loads"][n] = correctness_load(s)
            if s.probe:
                result["servers"].setdefault(n, {})["profiler"] = profile(s, n, out)
            result["servers"].setdefault(n, {})["metrics"] = s.get("/metrics")
        except Exception as exc:
            result["servers"].setdefault(n, {})["error"] = repr(exc)
        time.sleep(6)  # one more summary line, spans exported
        s.pause()
    result["ready"] = {n: getattr(s, "ready_s", None) for n, s in servers.items()}
    return result


def suite_correct(carry: Path, out: Path) -> dict:
    servers = correctness_servers(carry, out)
    try:
        # The first server compiles SGLang's JIT kernels into the shared cache; the rest reuse them.
        first = servers["eagle_on"].start()
        ok_first = first.wait_ready(300)
        for s in servers.values():
            if s is not first:
                s.start()
        ready = {n: (s is first and ok_first) or (s is not first and s.wait_ready(240)) for n, s in servers.items()}
        result = correctness_run(servers, ready, out)
    finally:
        for s in servers.values():
            s.stop()
    return judge_correctness(servers, result, out)


def judge_correctness(servers: dict, result: dict, out: Path) -> dict:
    res: dict = {"ready_s": result.get("ready")}
    loads = result.get("loads", {})
    res["greedy_identical"] = {
        "plain": "plain_on" in loads and "plain_off" in loads and outputs_of(loads["plain_on"]) == outputs_of(loads["plain_off"]),
        "eagle": "eagle_on" in loads and "eagle_off" in loads and outputs_of(loads["eagle_on"]) == outputs_of(loads["eagle_off"]),
        "eagle_vs_plain": "eagle_on" in loads and "plain_off" in loads and outputs_of(loads["eagle_on"]) == outputs_of(loads["plain_off"]),
        "no_graph_vs_graph": "plain_nograph" in loads and "plain_off" in loads and outputs_of(loads["plain_nograph"]) == outputs_of(loads["plain_off"]),
    }
    for n, specmode in (("plain_on", False), ("eagle_on", True), ("plain_nograph", False)):
        s = servers[n]
        if n not in result["loads"]:
            continue
        spans = analysis.read_spans(str(s.trace_dir))
        lines = analysis.parse_batch_lines(s.log_text())
        info = result["servers"].get(n, {})
        row = {"span_names": {k: sum(1 for x in spans if x["name"] == k) for k in sorted({x["name"] for x in spans})},
               "graph_flag": analysis.graph_agreement(spans, lines, specmode),
               "counts": analysis.count_agreement(spans, analysis.metric_counts(info.get("metrics", "")), specmode),
               "profiler": info.get("profiler"),
               "summary_lines": [ln for ln in s.log_text().splitlines() if "sgl-probe summary" in ln][-3:],
               "probe_errors": [ln for ln in s.log_text().splitlines() if "sgl-probe" in ln and ("error" in ln.lower() or "disabl" in ln.lower())][:10],
               "no_graph_reasons": {}, "start_kinds": {}}
        for x in spans:
            a = x["attrs"]
            if x["name"].startswith("sglang.") and x["name"] != "sglang.step":
                ph = x["name"][7:]
                if a.get("sglang.cuda_graph") is False:
                    bs = a.get("sglang.batch_size") or 0
                    key = f"{ph}:bs{'>8' if bs > 8 else '<=8'}:{a.get('sglang.no_graph_reason')}"
                    row["no_graph_reasons"][key] = row["no_graph_reasons"].get(key, 0) + 1
                key = f"{ph}:{a.get('sgl_probe.start')}"
                row["start_kinds"][key] = row["start_kinds"].get(key, 0) + 1
        if specmode:
            row["accept_length"] = analysis.accept_agreement(spans, lines)
        for ph in ("decode", "extend", "draft", "verify", "draft_extend"):
            p50 = analysis.phase_p50(spans, ph)
            if p50 is not None:
                row.setdefault("p50_ms", {})[ph] = p50
        res[n] = row
        (out / f"{n}_report.txt").write_text(probe_cli("report", str(s.trace_dir)))
    res["doctor"] = probe_cli("doctor", "--json")
    return res


#: The seed case's servers, in the order they run.
SEED_SERVERS = ("baseline", "eagle_eager", "eagle_graph")


def suite_seed(carry: Path, out: Path, profiled: bool = False, servers: tuple = SEED_SERVERS,
               save=lambda res: None) -> dict:
    """The seed case: graph decode, EAGLE-3 with the verify eager and in a graph, on the 32B-class
    config. ``profiled``: each server's phases also against the torch profiler's kernels
    (:func:`profile`): ~20 ms graph phases, where the profiler's own delay of each graph launch
    (~0.2 ms, run h200-5) is ~1 % of the phase rather than the tiny model's 30-70 %. ``servers``:
    which of :data:`SEED_SERVERS` run (each takes ~3 minutes with the profiler); ``save`` gets
    the result after each server, so a call cut short keeps what it measured."""
    big, draft = carry / "models/seed32b", carry / "models/seed32b-eagle3"
    common = ("--load-format", "dummy", "--decode-log-interval", "20", "--context-length", "2048")
    runs = {"baseline": base_args(big, mem=0.8, max_bs=8, extra=common),
            "eagle_eager": base_args(big, mem=0.8, max_bs=8, extra=common) + eagle_args(draft, dummy=True)
            + ["--disable-cuda-graph"],
            "eagle_graph": base_args(big, mem=0.8, max_bs=8, extra=common) + eagle_args(draft, dummy=True)}
    res: dict = {}
    for name, args in runs.items():
        if name not in servers:
            continue
        if late():
            log(f"deadline: seed_{name} not run")
            break
        s = Server(f"seed_{name}", 30020, args, probe=os.environ["GPU_BENCH_PROBE"], out=out).start()
        prof = None
        try:
            if not s.wait_ready(330):
                res[name] = {"error": "not ready", "log_tail": s.log_text()[-3000:]}
                continue
            for i in range(3):  # batch 1
                s.generate(f"{PROMPTS[i]} seed", 64, True)
            concurrent(lambda i: s.generate(PROMPTS[i % 6] + f" batch {i}", 48, True), list(range(8)))
            time.sleep(6)
            if profiled:
                prof = profile(s, f"seed_{name}", out, steps=24)
        finally:
            s.stop()
        spans = wait_spans(s.trace_dir)
        res[name] = {"ready_s": getattr(s, "ready_s", None), "profiler": prof,
                     "p50_ms": {ph: analysis.phase_p50(spans, ph) for ph in ("decode", "extend", "draft", "verify", "draft_extend")},
                     "graph_share": {ph: (lambda v: sum(v) / len(v) if v else None)(
                         [x["attrs"].get("sglang.cuda_graph") is True for x in analysis.phase_spans(spans, ph)])
                         for ph in ("decode", "draft", "verify", "draft_extend")},
                     "summary_lines": [ln for ln in s.log_text().splitlines() if "sgl-probe summary" in ln][-2:]}
        save(res)
    base = Path("/tmp/traces/seed_baseline")
    for name in ("eagle_eager", "eagle_graph"):
        if name not in res or not base.is_dir():
            continue
        txt = probe_cli("report", f"/tmp/traces/seed_{name}", "--baseline", str(base))
        (out / f"seed_report_{name}.txt").write_text(txt)
        res.setdefault(name, {})["report_tail"] = txt[-2500:]
        js = probe_cli("report", f"/tmp/traces/seed_{name}", "--baseline", str(base), "--json")
        try:
            res[name]["report_json"] = json.loads(js)
        except ValueError:
            res[name]["report_json_error"] = js[-1500:]
    return res


def throughput(srv: Server, conc: int, tokens: int, rounds: int, min_s: float = 12.0) -> dict:
    """Warm-up, then ``rounds`` rounds of ``conc`` concurrent greedy requests; one request per
    round streams, and its chunk gaps are the step times (p99)."""
    concurrent(lambda i: srv.generate(f"warm up {i}", 16, True), list(range(conc)))
    rates, gaps = [], []

    def streamed(text: str) -> None:
        last = None
        for now, _line in srv.stream(text, tokens):
            if last is not None:
                gaps.append(now - last)
            last = now

    start = time.perf_counter()
    rnd = 0
    # At least ``rounds`` rounds and ``min_s`` seconds: a window much longer than the span
    # exporters' batching delay, so their work lands inside it.
    while rnd < rounds or time.perf_counter() - start < min_s:
        rnd += 1
        t = time.perf_counter()
        outs = concurrent(lambda i: (streamed(f"request {rnd} {i} stream") or {"tokens": tokens}) if i == 0
                          else srv.generate(f"request {rnd} {i} the quick brown fox", tokens, True),
                          list(range(conc)))
        dt = time.perf_counter() - t
        rates.append(sum((o or {}).get("tokens") or 0 for o in outs) / dt)
    return {"tok_s": rates, "gaps": gaps}


def alternate(servers: list, conc: int, tokens: int, rounds: int, min_s: float = 12.0) -> dict:
    """Each server measured alone, in the given (alternating) order, the others stopped."""
    for s in servers:
        s.pause()
    res: dict = {}
    for s in servers:
        if late():
            log(f"deadline: {s.name} and later launches not measured")
            break
        s.resume()
        time.sleep(1.0)
        try:
            res[s.name] = throughput(s, conc, tokens, rounds, min_s)
        except Exception as exc:
            res[s.name] = {"error": repr(exc)}
        s.pause()
        log(f"{s.name}: {[round(x) for x in res[s.name].get('tok_s', [])]}")
    return res


def judge(res: dict, configs: list[str]) -> dict:
    per = {c: [statistics.median(v["tok_s"]) for k, v in res.items() if k.rsplit("_", 1)[0] == c and v.get("tok_s")]
           for c in configs}
    gaps = {c: [g for k, v in res.items() if k.rsplit("_", 1)[0] == c for g in v.get("gaps", [])] for c in configs}
    out = {"tok_s_per_launch": per}
    p99_off = analysis.percentile(gaps[configs[0]], 0.99)
    for c in configs[1:]:
        r = analysis.bootstrap_ratio(per[configs[0]], per[c])
        r["slowdown_off_over_on"] = 1 / r["median_ratio"] if r.get("median_ratio") else None
        p99 = analysis.percentile(gaps[c], 0.99)
        r["p99_step_ratio"] = p99 / p99_off if p99 and p99_off else None
        out[c] = r
    return out


def receiver(path: str) -> tuple[subprocess.Popen, str]:
    """A real OTLP/gRPC receiver in its own process on localhost (benchmarks/gpu_receiver.py),
    writing what it receives to ``path``; returns it and its ``host:port``."""
    env = dict(os.environ, PYTHONPATH=f"{os.environ['GPU_BENCH_PROBE']}:{os.environ['GPU_BENCH_SITE']}", SGL_PROBE="0")
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks/gpu_receiver.py"), path], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, RECEIVER_CPUS))
    endpoint = proc.stdout.readline().strip()
    return proc, endpoint.replace("http://", "")


#: Span batches leave every 0.2 s (the SDK default is 5 s), for the probe and SGLang's own tracing
#: alike, so the export work of a step falls inside the window that measures it.
BSP_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


def otlp_env(endpoint: str) -> dict:
    """A probe server's env for exporting every step to the benchmark's receiver."""
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://{endpoint}", "OTEL_EXPORTER_OTLP_INSECURE": "true",
            **BSP_ENV}


def decode_spans(srv: Server) -> int:
    return sum(1 for x in analysis.read_spans(str(srv.trace_dir)) if x["name"] == "sglang.decode")


def overhead_servers(carry: Path, out: Path, launches: int, endpoint: str) -> list:
    """``launches`` servers per configuration: no probe; the probe exporting every step over
    OTLP/gRPC and to a trace dir; the reference probe build the same way (when carried); SGLang's
    own observability (metrics with its device timer, request tracing to the same receiver)."""
    tiny = carry / "models/tiny-llama4-h256"
    plain = base_args(tiny, mem=0.5, max_bs=16, level="warning", max_tokens=65536)
    otlp = otlp_env(endpoint)
    configs = [("off", plain, None, {}), ("probe", plain, kind_wheel("probe"), otlp)]
    try:
        configs.append(("probe_ref", plain, kind_wheel("ref"), otlp))
    except ValueError:  # no reference carried: this suite runs without it
        pass
    configs.append(("sglang_obs", plain + ["--enable-metrics", "--enable-trace", "--otlp-traces-endpoint", endpoint],
                    None, {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", **BSP_ENV}))
    servers, port = [], 30100
    for i in range(launches):
        for name, args, probe, env in configs:
            servers.append(Server(f"{name}_{i}", port, args, probe=probe, out=out, env=env))
            port += 1
    return servers


def overhead_run(servers: list, ready: list, launches: int, received: str) -> dict:
    order = []
    for i in range(launches):  # the configurations in turn, the order reversed every other launch
        group = [s for s in ready if s.name.endswith(f"_{i}")]
        order += group if i % 2 == 0 else group[::-1]
    raw = alternate(order, conc=16, tokens=128, rounds=3, min_s=10.0)
    configs = list(dict.fromkeys(s.name.rsplit("_", 1)[0] for s in servers))
    verdict = judge(raw, configs)
    return {"raw": raw, "verdict": verdict}


def count_exported(verdict: dict, servers: list, received: str) -> None:
    """After the servers and the receiver stopped (the exporters flush on stop): decode spans
    written to each trace dir, and what reached the receiver over OTLP."""
    verdict["decode_spans_in_trace_dirs"] = {s.name: decode_spans(s) for s in servers if s.probe}
    verdict["received_spans"] = _received_names(received)


def suite_full(carry: Path, out: Path, launches: int, correct: bool = True) -> dict:
    """Correctness and overhead servers start together (startup is most of a call's time), then
    each is measured alone while the others are stopped (SIGSTOP)."""
    received = str(out / "received.jsonl")
    corr = correctness_servers(carry, out) if correct else {}  # refuses before anything starts
    rec, endpoint = receiver(received)
    over = overhead_servers(carry, out, launches, endpoint)
    res: dict = {}
    every = [*corr.values(), *over]
    try:
        # The first server compiles SGLang's JIT kernels into the shared cache; the rest reuse them.
        first = every[0].start()
        first_ok = first.wait_ready(360)
        for s in every[1:]:
            s.start()
        ready_all = {s.name: (first_ok if s is first else s.wait_ready(300)) for s in every}
        log(f"{sum(ready_all.values())}/{len(ready_all)} servers ready")
        for s in [*corr.values(), *over]:
            if ready_all[s.name]:
                s.pause()
        if corr:
            result = correctness_run(corr, {n: ready_all[n] for n in corr}, out)
            concurrent(lambda s: s.stop(), list(corr.values()))
            res["correct"] = judge_correctness(corr, result, out)
        res["overhead"] = overhead_run(over, [s for s in over if ready_all[s.name]], launches, received)
    finally:
        concurrent(lambda s: s.stop(), every)  # in parallel: a call's time is short
        rec.stdin.close()
        rec.wait(30)
    if "overhead" in res:
        count_exported(res["overhead"]["verdict"], over, received)
    return res


class SteadyLoad:
    """``conc`` workers, each sending its next greedy request as soon as its last one returns:
    no round barrier. (A round of ``conc`` requests sent together ends with its slowest one, so
    how the requests happen to arrive decides the round's time: on the launch-bound tiny server
    ~0.3 s rounds ranged 2,215-9,090 tok/s.) Each request's host interval and token count are
    kept; the tokens of a time window are each request's tokens spread evenly over its interval.
    Worker 0 streams, and its chunk gaps (with their times) are the step times; each chunk's
    token count, summed over its requests, is :meth:`stream_rate`'s clock of the server's steps."""

    def __init__(self, srv: Server, conc: int, tokens: int) -> None:
        self.srv, self.conc, self.tokens = srv, conc, tokens
        self.done: list = []  # (t0, t1, tokens)
        self.gaps: list = []  # (t, gap)
        # Worker 0's chunks: arrival times and its tokens so far, over all its requests.
        self.stream_t: list = [float("-inf")]
        self.stream_n: list = [0]
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(conc)]

    def _one(self, i: int, n: int) -> int:
        if i:
            return self.srv.generate(f"steady {i} {n} the quick brown fox", self.tokens, True).get("tokens") or 0
        last, chunks, base = None, 0, self.stream_n[-1]
        for now, line in self.srv.stream(f"steady {n} stream", self.tokens):
            if line.startswith(b"data: [DONE]"):
                continue
            if last is not None:
                self.gaps.append((now, now - last))
            last, chunks = now, chunks + 1
            self.stream_n.append(base + chunk_tokens(line, chunks))
            self.stream_t.append(now)
        return self.tokens if chunks else 0

    def _worker(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            t0 = time.perf_counter()
            try:
                got = self._one(i, n)
            except Exception:
                self.errors += 1
                time.sleep(0.05)
                continue
            self.done.append((t0, time.perf_counter(), got))

    def start(self) -> "SteadyLoad":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=300)

    def rate(self, t0: float, t1: float) -> float:
        """Output tokens per second inside [t0, t1]."""
        return window_tokens(self.done, t0, t1) / (t1 - t0)

    def stream_rate(self, t0: float, t1: float) -> float:
        """Worker 0's tokens per second inside [t0, t1], from its chunks' arrival times: every
        decode step gives its request one token, so this counts the server's steps in the window
        itself. :meth:`rate` spreads each request's tokens over its whole interval, and a request
        running across a flip lends the window some of the other state's speed (:func:`stream_tokens`)."""
        return stream_tokens(self.stream_t, self.stream_n, t0, t1) / (t1 - t0)

    def gaps_in(self, spans: list) -> list:
        return [g for t, g in self.gaps if any(a <= t <= b for a, b in spans)]


class GpuClocks:
    """The GPU's SM clock every 100 ms from ``nvidia-smi`` (read only; the clocks are left as
    they are). On the tiny launch-bound server the GPU idles between short kernels and its clock
    wanders, which is a candidate for the windows' large spread in throughput; each window's
    median clock lets :func:`analysis.clock_adjusted_ratio` take it out of the pairs."""

    def __init__(self, path: str = "/tmp/gpu_clocks.csv") -> None:
        self.path = path
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "GpuClocks":
        try:
            with open(self.path, "w") as fh:  # the child keeps its own descriptor
                self.proc = subprocess.Popen(
                    ["nvidia-smi", "--query-gpu=timestamp,clocks.sm", "--format=csv,noheader,nounits", "-lms", "100"],
                    stdout=fh, stderr=subprocess.DEVNULL)
        except OSError as exc:
            log(f"no GPU clock samples: {exc!r}")
        return self

    def stop(self) -> list:
        if self.proc is None:
            return []
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        try:
            return analysis.parse_smi(Path(self.path).read_text())
        except OSError:
            return []


def window_tokens(done: list, t0: float, t1: float) -> float:
    """Tokens produced in [t0, t1] by requests (start, end, tokens), each request's tokens
    spread evenly over its interval."""
    total = 0.0
    for a, b, n in done:
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo and b > a:
            total += n * (hi - lo) / (b - a)
    return total


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


def chunk_tokens(line: bytes, chunks: int) -> int:
    """The request's tokens so far at one streamed ``data:`` line: its ``completion_tokens``, or
    the chunks so far where a server leaves that out."""
    m = _COMPLETION_TOKENS.search(line)
    return int(m.group(1)) if m else chunks


def stream_tokens(times: list, totals: list, t0: float, t1: float) -> int:
    """Tokens that arrived in (t0, t1]: ``totals[i]`` tokens had arrived by ``times[i]`` (in time
    order, starting before any window). Unlike :func:`window_tokens`, nothing from outside the
    window is counted, so a window right after a flip measures that state alone (spreading
    1,024-token requests of ~2 s reads ~0.77 of a speed difference between alternating 4.2 s
    states; tests/test_gpu_sglang_build.py)."""
    return totals[bisect.bisect_right(times, t1) - 1] - totals[bisect.bisect_right(times, t0) - 1]


def measure_window(meters: list, window_s: float) -> tuple[float, float, list[dict]]:
    """One window of ``window_s``: its start and end (``perf_counter``), and per meter
    ``(cpu_s, main_pid)`` the cores each role kept busy (``cpu_s()``: CPU seconds by role so far;
    the exporter's share says whether its CPU can be what the recording windows lose) and what the
    scheduler process's threads did (asleep more while recording means waiting on the probe's
    threads for the GIL)."""
    c0 = [cpu_s() for cpu_s, _ in meters]
    th0 = [pause.thread_times(pid) for _, pid in meters]
    t0 = time.perf_counter()
    time.sleep(window_s)
    c1 = [cpu_s() for cpu_s, _ in meters]
    th1 = [pause.thread_times(pid) for _, pid in meters]
    t1 = time.perf_counter()
    return t0, t1, [{**{k: (b[k] - a[k]) / (t1 - t0) for k in b}, "threads": pause.thread_use(x, y, pid, t1 - t0)}
                    for a, b, x, y, (_, pid) in zip(c0, c1, th0, th1, meters)]


def ab_windows(srv: Server, pairs: int, conc: int, tokens: int, window_s: float, pin: bool = False,
               hog: Optional[subprocess.Popen] = None, first_apart: bool = False) -> dict:
    """One server, the probe recording and paused in alternating windows (ABBA), each window
    ``window_s`` of a steady load of ``conc`` concurrent requests (:class:`SteadyLoad`, running
    through every window: a flip does not drain the server); adjacent windows form a pair.
    ``pin``: the scheduler process gets a physical core of the server CPUs to itself
    (:func:`probe_pause.control.pin_scheduler`), the same one for every server. ``hog``: a
    stopped :mod:`cpu_hog` process, run during the "recording" windows only. ``first_apart``: one
    more pair first, reported as ``first_pair`` and not judged: the first server measured after
    start-up compiles SGLang's kernels for new prefill shapes in it (one prefill of 1.8 s on the
    32B-class config, h200-14), which is warm-up, not the probe."""
    pids = pause.scheduler_pids(srv.proc.pid)
    if not pids:
        return {"error": "no sglang::scheduler process"}
    pinned = pause.pin_scheduler(srv.proc.pid, SERVER_CPUS) if pin else None
    load = SteadyLoad(srv, conc, tokens).start()
    clocks = GpuClocks().start()
    time.sleep(2.0)  # warm-up
    spans: list = []  # (recording, t0, t1)
    epoch = time.time() - time.perf_counter()  # perf_counter -> the clock samples' epoch seconds
    cpu = []

    def cpu_s() -> dict:
        """CPU seconds by role so far (the hog's own too, when there is one)."""
        got = pause.group_cpu_s(srv.proc.pid)
        if hog is not None:
            got["hog"] = pause.group_cpu_s(hog.pid)["other"]
        return got

    try:
        for i in range(pairs + first_apart):
            if late():
                break
            for recording in ((True, False) if i % 2 == 0 else (False, True)):
                pause.set_recording(pids, recording, srv.pause_dir)
                if hog is not None:
                    os.kill(hog.pid, signal.SIGCONT if recording else signal.SIGSTOP)
                time.sleep(0.2)  # requests in flight finish their step under the new state
                t0, t1, (use,) = measure_window([(cpu_s, pids[0])], window_s)
                spans.append((recording, t0, t1))
                cpu.append({"recording": recording, **use})
    finally:
        if hog is not None:
            os.kill(hog.pid, signal.SIGSTOP)
        samples = clocks.stop()
        load.stop()
        pause.set_recording(pids, True, srv.pause_dir)
    head, spans, cpu = first_pair_apart(spans, cpu, first_apart)
    first = None
    if head:
        first = {("recording" if r else "paused"): load.rate(t0, t1) for r, t0, t1 in head[0]}
        first["cores_busy"] = head[1]
        log(f"{srv.name} first pair (not judged): recording {first['recording']:.0f} "
            f"paused {first['paused']:.0f} tok/s")
    rec, paused = [], []
    clk: dict = {True: [], False: []}
    for j in range(0, len(spans) - 1, 2):
        got = {r: load.rate(t0, t1) for r, t0, t1 in spans[j:j + 2]}
        for r, t0, t1 in spans[j:j + 2]:
            clk[r].append(analysis.window_clock(samples, t0 + epoch, t1 + epoch))
        rec.append(got[True])
        paused.append(got[False])
        log(f"{srv.name} pair {j // 2}: recording {got[True]:.0f} paused {got[False]:.0f} tok/s "
            f"ratio {got[True] / got[False]:.4f}")
    gaps = {r: load.gaps_in([(a, b) for s, a, b in spans if s is r]) for r in (True, False)}
    return {"recording": rec, "paused": paused, "first_pair": first, "schedulers": len(pids), "cores_busy": cpu,
            "sm_clock_mhz": {"recording": clk[True], "paused": clk[False]}, "load": "steady",
            "requests": len(load.done), "request_errors": load.errors, "pinned": pinned,
            "gaps_s": {"recording": gaps[True], "paused": gaps[False]}, "p99_step_ms": _p99_ms(gaps[True], gaps[False])}


def first_pair_apart(windows: list, cpu: list, apart: bool, per_window: int = 1) -> tuple[Optional[tuple], list, list]:
    """``windows`` and ``cpu`` (``per_window`` entries per window) without their first pair when
    ``apart``, and that pair's ``(windows, cpu)``, or None."""
    if not apart or len(windows) < 2:
        return None, windows, cpu
    n = 2 * per_window
    return (windows[:2], cpu[:n]), windows[2:], cpu[n:]


def _p99_ms(recording: list, paused: list) -> dict:
    p99 = {k: analysis.percentile(g, 0.99) for k, g in (("recording", recording), ("paused", paused))}
    return {k: v and v * 1e3 for k, v in p99.items()}


def merge_windows(a: Optional[dict], b: dict) -> dict:
    """Two ``ab_windows`` passes over one server as one: pairs, per-window CPU, requests and the
    streamed step gaps joined, the p99 taken over both."""
    if not a or "recording" not in a:
        return b
    if "recording" not in b:
        return a
    out = dict(a)
    for key in ("recording", "paused", "cores_busy"):
        out[key] = a[key] + b[key]
    ca, cb = a.get("sm_clock_mhz"), b.get("sm_clock_mhz")
    if ca or cb:
        out["sm_clock_mhz"] = {k: ((ca or {}).get(k) or [None] * len(a[k])) + ((cb or {}).get(k) or [None] * len(b[k]))
                               for k in ("recording", "paused")}
    out["requests"] = a["requests"] + b["requests"]
    out["request_errors"] = a["request_errors"] + b["request_errors"]
    out["first_pair"] = a.get("first_pair") or b.get("first_pair")
    out["gaps_s"] = {k: a["gaps_s"][k] + b["gaps_s"][k] for k in ("recording", "paused")}
    out["p99_step_ms"] = _p99_ms(out["gaps_s"]["recording"], out["gaps_s"]["paused"])
    return out


def ab_judge(windows: dict) -> dict:
    """Paired ratios (recording / paused) per server and over all pairs, bootstrap intervals."""
    out: dict = {"per_server": {}}
    every = []
    clocked: list = [[], [], [], []]  # recording, paused rates and clocks of every pair
    for name, w in windows.items():
        r = analysis.pair_ratios(w)
        if not r:
            continue
        every += r
        out["per_server"][name] = analysis.bootstrap_ratio([1.0] * len(r), r)
        clk = w.get("sm_clock_mhz")
        if clk:
            cols = (w["recording"], w["paused"], clk["recording"], clk["paused"])
            out["per_server"][name]["clock_adjusted"] = analysis.clock_adjusted_ratio(*cols)
            for acc, col in zip(clocked, cols):
                acc += col
        p99 = w.get("p99_step_ms") or {}
        if p99.get("recording") and p99.get("paused"):
            out["per_server"][name]["p99_step_ratio"] = p99["recording"] / p99["paused"]
    if every:
        out["all_pairs"] = analysis.bootstrap_ratio([1.0] * len(every), every)
        out["all_pairs"]["pairs"] = len(every)
        if clocked[0]:
            out["all_pairs"]["clock_adjusted"] = analysis.clock_adjusted_ratio(*clocked)
    return out


#: overhead_ab's probe servers by what they export: every step to OTLP/gRPC and a trace dir, to
#: OTLP only, nothing (the summary line only; CUDA events and the drain as usual). An empty
#: SGL_PROBE_TRACE_DIR means none. ``cputimer``: OTLP and trace dir with SGL_PROBE_TIMER=cpu, i.e.
#: no CUDA event at all; with ``none`` it splits what recording costs between the GPU events and
#: the export. ``drop``: the queue to the drain holds one step, so nearly every step is recorded
#: (CUDA events included) and dropped at once: the hot path alone, nothing resolved or exported.
#: ``gil``: as ``probe``, the drain reading GPU times without releasing the GIL (the pause shim
#: switches ``CudaTimer.elapsed_keeps_gil`` on at its first flip, before any window; the release's
#: default since h100-5, so the kind is for the revisions before). ``self``: as
#: ``probe``, with the pause shim timing the probe's per-step wrappers from inside (its own time
#: on the scheduler thread per step, recording and paused: ``probe_self`` in the summary);
#: ``selfcpu`` the same with the CPU timer (no CUDA call on the hot path: what is left is Python);
#: ``selfdrop`` and ``selfgil`` as ``self`` with ``drop``'s queue (no drain thread calling CUDA
#: while the hot path does) and ``gil``'s read (the drain's CUDA calls never overlap the hot path's).
#: ``self2ev``: as ``self``, every phase recording a start event as well as its end (the pause
#: shim's ``SGL_BENCH_START_EVENTS``). ``selfref``: as ``self``, with the reference wheel's probe.
#: ``selfyield``: as ``self``, the drain handing the GIL over after 50 µs of work and checking
#: every 4 steps (the shim's ``SGL_BENCH_DRAIN_YIELD_US``, ``SGL_BENCH_DRAIN_CHUNK``; the
#: release: 500 µs, 64). ``selfbatch``: as ``self``, the drain taking 64 steps between two checks
#: of its budget and reading their GPU times without releasing the GIL (``gil``'s read): fewer
#: hand-overs, each stretch one hold (what releases since h100-5 do by default: the kind is for
#: the revisions before). ``selfdrain``: as ``self``, the drain passing every
#: ``GPU_BENCH_DRAIN_S`` seconds (``SGL_PROBE_DRAIN_S``; 0.1 unless set; the release: 1): whether
#: steps the drain reads sooner, from caches SGLang has not yet evicted them from, cost less
#: than the extra GIL hand-overs of more passes. ``selfchunk``: as ``self``, the drain taking 512 steps
#: between two checks of its 2 ms stretch budget (the release: 64, 500 µs): fewer of the drain's own
#: Python calls around each chunk and fewer hand-overs, each stretch longer. ``selfsampled``: as
#: ``self``, a ratio sampler keeping ``GPU_BENCH_SAMPLE_RATE`` of the steps (0.1 unless set) and the
#: slow ones (``OTEL_TRACES_SAMPLER=traceidratio``): what a sampled server's probe costs.
#: ``selfnodrain``: as ``self``, the drain passing every ``GPU_BENCH_NODRAIN_S`` seconds (30 unless
#: set), the queue sized for the steps pending in between and the event pool filled for them at
#: the first flip (the shim's ``SGL_BENCH_POOL_MAX``): the windows between two passes
#: record, time and queue every step with no drain thread taking the GIL, what a drain that never
#: takes it would leave (the pairs a pass falls in are outliers; the median is the others). Its
#: exporter processes' span queues hold a second's spans, so each pass drops most (counted): the
#: kind measures the scheduler, not the export. ``selfall``: as ``self``, every step timed on the
#: GPU (``SGL_PROBE_GPU_EVERY_MS=0``, the releases before the steps' sampling); ``self`` runs the
#: release's default (runs of four consecutive steps timed on the GPU, one run in 4k steps, k steps
#: within 40 ms; within 10 ms in the wheels up to h100-32's). ``selflone``: as ``self``, each
#: sampled step timed alone (the pause shim's ``SGL_BENCH_GPU_RUN=1``, the release before: one
#: step in k, each with a start event of its own).
#: ``selfsparse``: as ``self``, the GPU timing a sparser sample, ``SGL_PROBE_GPU_EVERY_MS`` =
#: ``GPU_BENCH_EVERY_MS`` (40 unless set): at ~2 ms steps one run of four in 64 steps instead of
#: 16 at 10 ms, ~0.08 GPU records a step against ~0.33. Run h100-32 (wheels whose default was 10)
#: measured it beside ``self`` and made 40 the default; the kind names the setting explicitly, so
#: that ``GPU_BENCH_EVERY_MS`` compares any other with the wheel's default.
AB_EXPORTS = ("probe", "otlp", "none", "cputimer", "ref", "hog", "drop", "gil", "self", "selfcpu",
              "selfdrop", "selfgil", "self2ev", "selfref", "selfyield", "selfbatch", "selfdrain", "selfchunk",
              "selfsampled", "selfnodrain", "selfall", "selflone", "selfnone", "selfsparse")


def kind_wheel(kind: str) -> Optional[str]:
    """The folder holding the probe a server of ``kind`` (of :data:`AB_EXPORTS`) runs: the
    reference wheel's for ``ref`` and ``selfref``, none for ``hog``, this wheel's otherwise. ValueError where that
    wheel is not installed, so a suite refuses before it starts anything."""
    if kind == "hog":
        return None
    folder = os.environ.get("GPU_BENCH_PROBE_REF" if kind in ("ref", "selfref") else "GPU_BENCH_PROBE", "")
    if not folder or not Path(folder).is_dir():
        raise ValueError(f"--ab-exports {kind}: no probe wheel installed for it (build.py; build.py --ref REV for ref)")
    return folder


def ab_env(kind: str, endpoint: str) -> dict:
    """The server env of one of :data:`AB_EXPORTS`."""
    otlp = otlp_env(endpoint)
    return {"probe": otlp, "otlp": {**otlp, "SGL_PROBE_TRACE_DIR": "", "OTEL_SERVICE_NAME": "sglang-otlp-only"},
            "none": {"SGL_PROBE_TRACE_DIR": ""},
            "cputimer": {**otlp, "SGL_PROBE_TIMER": "cpu", "OTEL_SERVICE_NAME": "sglang-cputimer"},
            "ref": {**otlp, "OTEL_SERVICE_NAME": "sglang-ref"}, "hog": {},
            "drop": {**otlp, "SGL_PROBE_MAX_PENDING": "1", "OTEL_SERVICE_NAME": "sglang-drop"},
            "gil": {**otlp, "SGL_BENCH_KEEP_GIL": "1", "OTEL_SERVICE_NAME": "sglang-gil"},
            "self": {**otlp, "SGL_BENCH_SELF_TIME": "1", "OTEL_SERVICE_NAME": "sglang-self"},
            "selfcpu": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_TIMER": "cpu", "OTEL_SERVICE_NAME": "sglang-selfcpu"},
            "selfall": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_GPU_EVERY_MS": "0",
                        "OTEL_SERVICE_NAME": "sglang-selfall"},
            # Recording and draining as ``self``, nothing exported: no exporter process.
            "selfnone": {"SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_TRACE_DIR": ""},
            "selfsparse": {**otlp, "SGL_BENCH_SELF_TIME": "1",
                           "SGL_PROBE_GPU_EVERY_MS": os.environ.get("GPU_BENCH_EVERY_MS", "40"),
                           "OTEL_SERVICE_NAME": "sglang-selfsparse"},
            "selflone": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_GPU_RUN": "1",
                         "OTEL_SERVICE_NAME": "sglang-selflone"},
            "selfdrop": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_MAX_PENDING": "1",
                         "OTEL_SERVICE_NAME": "sglang-selfdrop"},
            "selfgil": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_KEEP_GIL": "1",
                        "OTEL_SERVICE_NAME": "sglang-selfgil"},
            "self2ev": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_START_EVENTS": "1",
                        "OTEL_SERVICE_NAME": "sglang-self2ev"},
            "selfref": {**otlp, "SGL_BENCH_SELF_TIME": "1", "OTEL_SERVICE_NAME": "sglang-selfref"},
            "selfyield": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_YIELD_US": "50",
                          "SGL_BENCH_DRAIN_CHUNK": "4", "OTEL_SERVICE_NAME": "sglang-selfyield"},
            "selfbatch": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_CHUNK": "64", "SGL_BENCH_KEEP_GIL": "1",
                          "OTEL_SERVICE_NAME": "sglang-selfbatch"},
            "selfdrain": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_DRAIN_S": os.environ.get("GPU_BENCH_DRAIN_S", "0.1"),
                          "OTEL_SERVICE_NAME": "sglang-selfdrain"},
            "selfchunk": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_BENCH_DRAIN_CHUNK": "512",
                          "SGL_BENCH_DRAIN_YIELD_US": "2000", "OTEL_SERVICE_NAME": "sglang-selfchunk"},
            "selfnodrain": {**otlp, "SGL_BENCH_SELF_TIME": "1", "SGL_PROBE_DRAIN_S": os.environ.get("GPU_BENCH_NODRAIN_S", "30"),
                            "SGL_PROBE_MAX_PENDING": "65536", "SGL_BENCH_POOL_MAX": "65536",
                            "OTEL_SERVICE_NAME": "sglang-selfnodrain"},
            "selfsampled": {**otlp, "SGL_BENCH_SELF_TIME": "1", "OTEL_TRACES_SAMPLER": "traceidratio",
                            "OTEL_TRACES_SAMPLER_ARG": os.environ.get("GPU_BENCH_SAMPLE_RATE", "0.1"),
                            "OTEL_SERVICE_NAME": "sglang-selfsampled"}}[kind]


def suite_overhead_ab(carry: Path, out: Path, launches: int, pairs: int = 12, window_s: float = 3.0,
                      exports: tuple = ("probe",), model: str = "tiny", conc: int = 16, pin: bool = False,
                      aa: bool = True, reverse: bool = False, hog_cores: float = 0.18) -> dict:
    """The tiny Llama at ``conc`` (16) concurrent requests, with the probe recording vs paused in
    alternating windows of the same server (no launch-to-launch spread): ``launches`` servers
    exporting every step to OTLP and a trace dir, one server per other entry of ``exports``
    (which splits the cost between the outputs), and one without the probe flipped the same way
    (A/A control); two passes over the servers, the second in reverse order, so that no kind is
    only ever measured first. ``model="seed32b"``: the 32B-class config instead (two of its servers fit the
    GPU: ``--launches 1`` and the probe output only, or ``aa=False`` and two entries of
    ``exports``). ``ref``: the probe's outputs (OTLP and a trace dir) from the wheel of ``build.py
    --ref REV``, so two revisions are measured in one call. ``pin``: see :func:`ab_windows`.
    ``reverse``: the probe servers start (and take ports) in the reverse order, the last of
    ``exports`` first, so no kind is always the first server up. ``hog``: a server without the
    probe, with :mod:`cpu_hog` using ``hog_cores`` beside it in its "recording" windows (what
    the exporter process's CPU alone would cost)."""
    unknown = set(exports) - set(AB_EXPORTS)
    if unknown:
        raise ValueError(f"--ab-exports: {sorted(unknown)} not in {AB_EXPORTS}")
    wheels = {kind: kind_wheel(kind) for kind in ("probe", *exports)}
    received = str(out / "received_ab.jsonl")
    rec, endpoint = receiver(received)
    if model == "seed32b":
        plain = base_args(carry / "models/seed32b", mem=0.985, max_bs=8, level="warning", max_tokens=4096,
                          extra=("--load-format", "dummy", "--context-length", "2048"))
    else:
        plain = base_args(carry / "models/tiny-llama4-h256", mem=0.5, max_bs=16, level="warning", max_tokens=65536)
    env = {kind: ab_env(kind, endpoint) for kind in AB_EXPORTS}
    names = [f"ab_probe_{i}" for i in range(launches)] + [f"ab_{e}_0" for e in exports if e != "probe"]
    if reverse:
        names.reverse()
    kinds = [name.split("_")[1] for name in names]
    servers = [Server(name, 30300 + i, plain, out=out, env=env[kind], pausable=True,
                      probe=wheels[kind])
               for i, (name, kind) in enumerate(zip(names, kinds))]
    hogs: dict = {}
    if aa:
        servers.append(Server("ab_aa_0", 30399, plain, probe=None, out=out, pausable=True))
    windows: dict = {}
    try:
        for s in servers:  # SGLang's JIT kernels come from the carried cache
            s.start()
        ok = {s.name: s.wait_ready(360 if model == "tiny" else 420) for s in servers}
        live = [s for s in servers if ok[s.name]]
        for s in live:
            s.pause()
            if s.name.startswith("ab_hog_"):
                hogs[s.name] = subprocess.Popen(
                    [sys.executable, str(HERE / "cpu_hog.py"), str(hog_cores)], start_new_session=True,
                    stdin=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, SERVER_CPUS))
                os.kill(hogs[s.name].pid, signal.SIGSTOP)
        # Two passes, the second in the reverse order, half the pairs each: every kind of server
        # is measured both early and late in the call (the first server measured after startup
        # has shown slower first windows than the rest). Each server's first pair of the call is
        # kept apart (``first_pair``): its first recording window is not the steady state.
        first = (pairs + 1) // 2
        for order, n_pairs in ((live, first), (live[::-1], pairs - first)):
            for s in order:
                if n_pairs <= 0 or late():
                    break
                s.resume()
                time.sleep(1.0)
                windows[s.name] = merge_windows(windows.get(s.name),
                                                ab_windows(s, n_pairs, conc, 128, window_s, pin, hogs.get(s.name),
                                                           first_apart=s.name not in windows))
                s.pause()
                log(f"{s.name}: {ab_judge({s.name: windows[s.name]}).get('all_pairs')}")
    finally:
        for h in hogs.values():
            h.kill()
            h.wait()
        concurrent(lambda s: s.stop(), servers)
        rec.stdin.close()
        rec.wait(30)
    for w in windows.values():  # the p99 is kept; the raw gaps would be most of the file
        w.pop("gaps_s", None)
    verdict = {e: ab_judge({k: v for k, v in windows.items() if k.startswith(f"ab_{e}_")})
               for e in AB_EXPORTS if any(k.startswith(f"ab_{e}_") for k in windows)}
    if aa:
        verdict["aa_control"] = ab_judge({k: v for k, v in windows.items() if k.startswith("ab_aa")})
    count_exported(verdict, servers, received)
    return {"model": model, "conc": conc, "windows": windows, "verdict": verdict}


def ab_cross_windows(a: Server, b: Server, pairs: int, conc: int, tokens: int, window_s: float,
                     settle_s: float = 1.2, flip: bool = True, first_apart: bool = False) -> dict:
    """Two probe servers of one wheel, both under a steady load at once; in each window one
    records and the other is paused, the next window the other way round (ABBA over pairs).

    The host's speed wanders by more than the effect measured (single-server pairs of 3 s windows
    on the tiny model ranged 0.66-1.42). Whatever slows both servers in a window cancels in
    ``(a_X / b_X) / (a_Y / b_Y)`` (X: a records, Y: b records), which is the recording/paused
    factor squared; so is each server's own speed. What does not cancel is anything that slows
    only one server's CPUs, and the coupling of two servers on one GPU: a server that records
    and slows leaves the other a little more GPU, which makes the estimate err towards a larger
    cost, never a smaller one.

    ``settle_s`` after each flip before a window opens: the drain resolves and exports a second's
    steps at a time (SGL_PROBE_DRAIN_S), so the first second after a server stops recording still
    exports what it recorded before. ``flip=False``: the control; both servers stay paused and the
    windows are labelled as if they flipped, which shows the estimator's own spread and bias.
    ``first_apart``: one more pair first, reported as ``first_pair`` and not judged (warm-up: see
    :func:`ab_windows`)."""
    pids = {s.name: pause.scheduler_pids(s.proc.pid) for s in (a, b)}
    if not all(pids.values()):
        return {"error": "no sglang::scheduler process"}
    meters = [(lambda s=s: pause.group_cpu_s(s.proc.pid), pids[s.name][0]) for s in (a, b)]
    loads = {s.name: SteadyLoad(s, conc, tokens).start() for s in (a, b)}
    time.sleep(3.0)  # warm-up, both loads running
    windows: list = []  # (a records?, t0, t1)
    cpu: list = []
    try:
        for i in range(pairs + first_apart):
            if late():
                break
            for a_records in ((True, False) if i % 2 == 0 else (False, True)):
                pause.set_recording(pids[a.name], a_records and flip, a.pause_dir)
                pause.set_recording(pids[b.name], not a_records and flip, b.pause_dir)
                gcs = [pause.gc_stats(s.pause_dir, pids[s.name][0]) for s in (a, b)]
                time.sleep(settle_s)
                t0, t1, uses = measure_window(meters, window_s)
                windows.append((a_records, t0, t1))
                for s, use, g in zip((a, b), uses, gcs):
                    cpu.append({"server": s.name, "recording": flip and a_records == (s is a), **use,
                                "gc_at_flip": g})
    finally:
        for s in (a, b):
            loads[s.name].stop()
            pause.set_recording(pids[s.name], True, s.pause_dir)
    rates = [{"a_records": r, "a": loads[a.name].rate(t0, t1), "b": loads[b.name].rate(t0, t1),
              "a_stream": loads[a.name].stream_rate(t0, t1), "b_stream": loads[b.name].stream_rate(t0, t1)}
             for r, t0, t1 in windows]
    head, rates, cpu = first_pair_apart(rates, cpu, first_apart, per_window=2)
    first = head and {"windows": head[0], "cores_busy": head[1], "ratio": (cross_ratios(head[0]) or [None])[0]}
    if first:
        log(f"cross first pair (not judged): -> {first['ratio']}")
    for i, (x, y) in enumerate(cross_pairs(rates)):
        log(f"cross pair {i}: a {x['a']:.0f}/{y['a']:.0f} b {x['b']:.0f}/{y['b']:.0f} tok/s "
            f"-> {(cross_ratios([x, y]) or [0])[0]:.4f}, streamed {(cross_ratios([x, y], STREAM) or [0])[0]:.4f}")
    return {"servers": [a.name, b.name], "flip": flip, "settle_s": settle_s, "windows": rates, "first_pair": first,
            "cores_busy": cpu,
            "load": "steady, both servers",
            "requests": {n: len(l.done) for n, l in loads.items()}, "request_errors": {n: l.errors for n, l in loads.items()}}


def cross_pairs(rates: list) -> list[tuple[dict, dict]]:
    """Adjacent windows of :func:`ab_cross_windows` as (X, Y): X the one where a recorded."""
    return [(rates[j], rates[j + 1]) if rates[j]["a_records"] else (rates[j + 1], rates[j])
            for j in range(0, len(rates) - 1, 2)]


# Which of a window's rates the cross estimator reads: ``REQUESTS``, every request's tokens spread
# over its interval (:meth:`SteadyLoad.rate`, the calls up to r133); ``STREAM``, worker 0's tokens as
# they arrived (:meth:`SteadyLoad.stream_rate`, the calls after), which the other state does not leak into.
REQUESTS, STREAM = "", "_stream"


def cross_ratios(rates: list, by: str = REQUESTS) -> list[float]:
    """Recording/paused per pair of :func:`ab_cross_windows`' windows: the square root of
    ``(a_X / b_X) / (a_Y / b_Y)``, from the rates ``by`` names (none for windows without them)."""
    out = []
    a, b = "a" + by, "b" + by
    for x, y in cross_pairs(rates):
        if x.get(b) and y.get(a) and x.get(a) and y.get(b):
            out.append(((x[a] / x[b]) / (y[a] / y[b])) ** 0.5)
    return out


def over_control(res: dict, by: str = REQUESTS) -> Optional[dict]:
    """The cross pairs' median over the control pairs' (``res["control"]``), resampling both,
    which takes out what the estimator reads with nothing recorded on that host; None without
    both."""
    r = cross_ratios(res.get("windows") or [], by)
    control = cross_ratios((res.get("control") or {}).get("windows") or [], by)
    return analysis.bootstrap_ratio(control, r) if r and control else None


def cross_judge(res: dict) -> dict:
    """The cross estimator from both kinds of rate (``cross``: requests spread, ``cross_stream``:
    as streamed, the one to judge by where a call has it), and each server's own recording/paused
    pairs from the same windows (what a one-server A/B would have read) for comparison of spread;
    :func:`over_control` where the call ran a control."""
    rates = res.get("windows") or []
    out: dict = {}
    for by in (REQUESTS, STREAM):
        r = cross_ratios(rates, by)
        out["cross" + by] = dict(analysis.bootstrap_ratio([1.0] * len(r), r), pairs=len(r)) if r else None
        judged = over_control(res, by)
        if judged is not None:
            out["over_control" + by] = judged
    for side, records in (("a", True), ("b", False)):
        own = []
        for x, y in cross_pairs(rates):
            rec, paused = (x, y) if records else (y, x)
            if paused[side]:
                own.append(rec[side] / paused[side])
        out[f"one_server_{side}"] = analysis.bootstrap_ratio([1.0] * len(own), own) if own else None
    return out


def suite_overhead_cross(carry: Path, out: Path, pairs: int, window_s: float, conc: int = 16,
                         control_pairs: int = 0, exports: tuple = ("probe",), tokens: int = 128) -> dict:
    """The tiny Llama, two probe servers per entry of ``exports`` (of :data:`AB_EXPORTS` with a
    probe: ``probe``, this wheel exporting every step over OTLP/gRPC and to a trace dir; ``none``,
    nothing exported, the CUDA events and the drain as usual; ...), all started at once, then
    each kind's two measured by :func:`ab_cross_windows` while every other server is stopped
    (SIGSTOP), followed by ``control_pairs`` pairs of its control (neither records). Returns
    ``{kind: result}``. ``tokens`` per request: with 128, a request starts every ~8 steps and the
    batch's size and mix keep changing, which moves a 3 s window's rate by ~6 % on its own,
    differently on each server (r31); longer requests keep the batch steady."""
    kinds = tuple(k for k in AB_EXPORTS if k != "hog")  # the kinds with a probe
    for export in exports:
        if export not in kinds:
            raise ValueError(f"overhead_cross: --ab-exports {export!r} is not one of {kinds}")
    wheels = {export: kind_wheel(export) for export in exports}
    received = str(out / "received_cross.jsonl")
    rec, endpoint = receiver(received)
    plain = base_args(carry / "models/tiny-llama4-h256", mem=0.5, max_bs=16, level="warning", max_tokens=65536)
    pairs_of = {export: [Server(f"cross_{i}" if len(exports) == 1 else f"cross_{export}_{i}", 30350 + 2 * k + i,
                                plain, out=out, env=ab_env(export, endpoint), pausable=True, probe=wheels[export])
                         for i in range(2)]
                for k, export in enumerate(exports)}
    servers = [s for pair in pairs_of.values() for s in pair]
    results: dict = {export: {} for export in exports}
    try:
        for s in servers:
            s.start()
        ok = {s.name: s.wait_ready(420) for s in servers}
        for s in servers:
            s.pause()
        for export, (a, b) in pairs_of.items():
            if not (ok[a.name] and ok[b.name]):
                results[export] = {"error": "a server did not come up"}
                continue
            if late():
                break
            a.resume()
            b.resume()
            time.sleep(1.0)
            res = results[export] = ab_cross_windows(a, b, pairs, conc, tokens, window_s, first_apart=True)
            if control_pairs:
                res["control"] = ab_cross_windows(a, b, control_pairs, conc, tokens, window_s, flip=False)
            a.pause()
            b.pause()
    finally:
        concurrent(lambda s: s.stop(), servers)
        rec.stdin.close()
        rec.wait(30)
    got = _received_names(received)  # one receiver for all kinds; each has its own service name
    for export, res in results.items():
        res["export"], res["tokens"] = export, tokens
        res["verdict"] = cross_judge(res)
        if "control" in res:
            res["verdict"]["control"] = cross_judge(res["control"])
        res["verdict"]["decode_spans_in_trace_dirs"] = {s.name: decode_spans(s) for s in pairs_of[export]}
        res["verdict"]["received_spans"] = got
    return results


def suite_seed_overhead(carry: Path, out: Path, pairs: int, first: int = 0, obs: bool = False) -> dict:
    """The 32B-class config (GPU-bound, ~19 ms per decode step) with and without the probe, at
    batch 1 and batch 8: ``pairs`` launches of each, a pair at a time (two fit one H200 with a
    capped KV pool), each server measured alone while the other is stopped, the order swapped
    every pair. The probe exports every step (OTLP/gRPC to a receiver process and a trace dir).
    ``first``: the first pair's number, so that calls can add pairs to an earlier call's
    (``summarize.py`` judges them together). ``obs``: SGLang's own observability (metrics with its
    device timer, request tracing to the same receiver), the alternative a user would pick, in
    the same alternation: pairs 2-3 of every four run it instead of the probe (see
    :func:`second_server`)."""
    received = str(out / "received_seed.jsonl")
    rec, endpoint = receiver(received)
    big = carry / "models/seed32b"
    # Both servers may measure free memory before either loads: a small slack, a capped pool.
    args = base_args(big, mem=0.985, max_bs=8, level="warning", max_tokens=4096,
                     extra=("--load-format", "dummy", "--context-length", "2048"))
    otlp = otlp_env(endpoint)
    raw: dict = {}
    spans: dict = {}
    try:
        for i in range(first, first + pairs):
            if late():
                log(f"deadline: pairs {i}.. not run")
                break
            off = Server(f"seedoff_{i}", 30200 + 2 * i, args, probe=None, out=out)
            if second_server(i, obs) == "obs":
                on = Server(f"seedobs_{i}", 30201 + 2 * i, args + ["--enable-metrics", "--enable-trace",
                                                                   "--otlp-traces-endpoint", endpoint],
                            probe=None, out=out, env={"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", **BSP_ENV})
            else:
                on = Server(f"seedon_{i}", 30201 + 2 * i, args, probe=os.environ["GPU_BENCH_PROBE"], out=out,
                            env=otlp)
            try:
                on.start(), off.start()
                ok = {s.name: s.wait_ready(330) for s in (on, off)}
                live = [s for s in ((off, on) if i % 2 == 0 else (on, off)) if ok[s.name]]
                for s in live:
                    s.pause()
                for s in live:
                    s.resume()
                    time.sleep(1.0)
                    for bs in (1, 8):
                        key = f"{s.name.rsplit('_', 1)[0]}_bs{bs}_{i}"
                        try:
                            raw[key] = throughput(s, bs, 128, rounds=3, min_s=8.0)
                        except Exception as exc:
                            raw[key] = {"error": repr(exc)}
                        log(f"{key}: {[round(x, 1) for x in raw[key].get('tok_s', [])]}")
                    s.pause()
            finally:
                for s in (on, off):
                    s.stop()
            if on.probe:
                spans[on.name] = decode_spans(on)
    finally:
        rec.stdin.close()
        rec.wait(30)
    verdict = seed_verdict(raw)
    verdict["decode_spans_in_trace_dirs"] = spans
    verdict["received_spans"] = _received_names(received)
    return {"raw": raw, "verdict": verdict}


def second_server(pair: int, obs: bool) -> str:
    """What the second server of a seed_overhead pair runs: the probe, or with ``obs`` SGLang's
    own observability in pairs 2-3 of every four. Pairs alternate which server is measured first
    (even: the no-probe one), so each kind gets both orders."""
    return "obs" if obs and (pair // 2) % 2 == 1 else "probe"


def seed_verdict(raw: dict) -> dict:
    """Per batch size: the probe's and SGLang's own observability's launches (where run) against
    the no-probe launches of the same alternation."""
    out = {}
    for bs in (1, 8):
        rows = {k: v for k, v in raw.items() if f"_bs{bs}_" in k}
        configs = [f"seedoff_bs{bs}"] + [c for c in (f"seedon_bs{bs}", f"seedobs_bs{bs}")
                                         if any(k.rsplit("_", 1)[0] == c for k in rows)]
        out[f"bs{bs}"] = judge(rows, configs)
    return out


def _received_names(path: str) -> dict:
    names: dict = {}
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                d = json.loads(line)
                key = f"{d.get('service')}:{d['name']}"
                names[key] = names.get(key, 0) + 1
        os.remove(path)
    return names


def pack(out: Path, suite: str) -> None:
    """Logs, span files and profiler traces in one archive (few files come back per call)."""
    import tarfile

    with tarfile.open(out / f"raw_{suite}.tgz", "w:gz") as tf:
        for p in sorted(out.glob("*.log")) + sorted(out.glob("*_report*.txt")):
            tf.add(p, arcname=f"logs/{p.name}")
            p.unlink()
        for root in (Path("/tmp/traces"), Path("/tmp/prof")):
            if root.is_dir():
                tf.add(root, arcname=root.name)
    shutil.rmtree("/tmp/traces", ignore_errors=True)
    shutil.rmtree("/tmp/prof", ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("suites", nargs="+", choices=["correct", "seed", "overhead", "full", "seed_overhead",
                                                  "overhead_ab", "overhead_cross"])
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--tag", default="run")
    ap.add_argument("--pairs", type=int, default=12, help="overhead_ab: window pairs per server")
    ap.add_argument("--window-s", type=float, default=3.0, help="overhead_ab: seconds per window")
    ap.add_argument("--first-pair", type=int, default=0, help="seed_overhead: number of the first pair")
    ap.add_argument("--sglang-obs", action="store_true",
                    help="seed_overhead: SGLang's own observability instead of the probe in pairs 2-3 of every 4")
    ap.add_argument("--ab-exports", default="probe",
                    help="overhead_ab: comma-separated from %s (one server each beyond --launches)" % (AB_EXPORTS,))
    ap.add_argument("--tokens", type=int, default=128, help="overhead_cross: output tokens per request")
    ap.add_argument("--control-pairs", type=int, default=0,
                    help="overhead_cross: pairs of the control (neither server records) after the pairs")
    ap.add_argument("--ab-model", choices=["tiny", "seed32b"], default="tiny", help="overhead_ab: which model")
    ap.add_argument("--ab-conc", type=int, default=16, help="overhead_ab: concurrent requests")
    ap.add_argument("--no-aa", action="store_true", help="overhead_ab: no A/A control server")
    ap.add_argument("--hog-cores", type=float, default=0.18,
                    help="overhead_ab: CPU of the hog server's stand-in exporter load (cpu_hog.py)")
    ap.add_argument("--ab-reverse", action="store_true", help="overhead_ab: start the probe servers in reverse order")
    ap.add_argument("--seed-profile", action="store_true",
                    help="seed: each server's phases against the torch profiler's kernels too")
    ap.add_argument("--seed-servers", default=",".join(SEED_SERVERS),
                    help="seed: comma-separated from %s" % (SEED_SERVERS,))
    ap.add_argument("--pin-scheduler", action="store_true",
                    help="overhead_ab: give each measured scheduler process a physical core to itself")
    ap.add_argument("--deadline-s", type=float, default=float("inf"),
                    help="stop measuring after this many seconds, keeping what was measured")
    args = ap.parse_args(argv)
    DEADLINE[0] = args.deadline_s
    os.sched_setaffinity(0, CLIENT_CPUS)  # the load generator; servers and their children get SERVER_CPUS
    args.out.mkdir(parents=True, exist_ok=True)
    for suite in args.suites:
        log(f"suite {suite}")
        t = time.time()
        path = args.out / f"gpu_sglang_{args.tag}_{suite}.json"

        def save(res: dict) -> None:
            path.write_text(json.dumps(dict(res, partial=True), indent=1, default=str))

        try:
            if suite == "correct":
                res = suite_correct(args.carry, args.out)
            elif suite == "seed":
                servers = tuple(args.seed_servers.split(","))
                if not set(servers) <= set(SEED_SERVERS):
                    ap.error(f"--seed-servers: from {SEED_SERVERS}")
                res = suite_seed(args.carry, args.out, args.seed_profile, servers, save)
            elif suite == "overhead_ab":
                res = suite_overhead_ab(args.carry, args.out, args.launches, args.pairs, args.window_s,
                                        tuple(args.ab_exports.split(",")), args.ab_model, args.ab_conc,
                                        args.pin_scheduler, not args.no_aa, args.ab_reverse, args.hog_cores)
            elif suite == "overhead_cross":
                by_kind = suite_overhead_cross(args.carry, args.out, args.pairs, args.window_s, args.ab_conc,
                                               args.control_pairs, tuple(args.ab_exports.split(",")), args.tokens)
                # One file per kind, each tagged with it when there are several.
                for kind, res in list(by_kind.items())[:-1]:
                    res["wall_s"] = round(time.time() - t, 1)
                    (args.out / f"gpu_sglang_{args.tag}_{kind}_{suite}.json").write_text(
                        json.dumps(res, indent=1, default=str))
                kind, res = list(by_kind.items())[-1]
                if len(by_kind) > 1:
                    path = args.out / f"gpu_sglang_{args.tag}_{kind}_{suite}.json"
            elif suite == "seed_overhead":
                res = suite_seed_overhead(args.carry, args.out, args.launches, args.first_pair, args.sglang_obs)
            elif suite == "overhead":
                res = suite_full(args.carry, args.out, args.launches, correct=False)
            else:
                res = suite_full(args.carry, args.out, args.launches)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            res = {"error": repr(exc)}
        res["wall_s"] = round(time.time() - t, 1)
        pack(args.out, suite)
        path.write_text(json.dumps(res, indent=1, default=str))
        log(f"suite {suite} done in {res['wall_s']}s -> {path.name}")
        brief = {k: v for k, v in res.items() if k not in ("doctor",)}
        print(json.dumps(brief, default=str)[:6000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
