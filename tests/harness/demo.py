"""``python3 -m tests.harness demo``: the main job, end to end, on a CPU machine.

Builds the harness if missing, installs sgl-probe from its wheel into the SGLang 0.5.23 venv and
starts two real servers side by side on the tiny random Llama: a plain one and one with
speculative decoding (EAGLE-3 with the harness's copy draft, as ``tests/test_spec_eagle.py``
runs it). The launcher's environment has ``NCCL_PROTO=LL NCCL_ALGO=Ring``. Both get the same
requests, one server at a time; then the demo prints what the probe saw:

1. per phase and server: draft / verify / draft-extend next to plain decode, the graph flag and
   the reason SGLang ran no graph (``sglang.no_graph_reason``);
2. the env snapshot check: each scheduler process had the launcher's ``NCCL_*`` when it started
   and when its first communicator was created;
3. the probe's own summary line from each server log;
4. ``sgl-probe report EAGLE --baseline PLAIN``: the phase table and the speculative-decoding verdict.

The servers write their spans to ``SGL_PROBE_TRACE_DIR`` folders (no collector needed). Only the
standard library is used here; the report runs with the venv's ``sgl-probe``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from .eagle import eagle_args, ensure_eagle_models
from .server import SGLangServer
from .venv import HARNESS_DIR, ensure_venv
from .wheel import build_wheel, install_wheel

VERSION = "0.5.23"
LAUNCHER_ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
PROMPTS = ["hello world the quick", "the cat sat on the mat and", "one two three four five six seven"]
NEW_TOKENS = 32
# float32: greedy speculative output equals plain output exactly (see tests/harness/eagle.py).
COMMON_ARGS = ("--dtype", "float32", "--disable-radix-cache")
EAGLE = {"topk": 1, "num_steps": 2, "num_draft_tokens": 3}
PHASE_ORDER = ("extend", "decode", "draft", "verify", "draft_extend")


def _value(v: dict):
    """An OTLP/JSON AnyValue as a Python value."""
    if not v:
        return None
    kind, raw = next(iter(v.items()))
    if kind == "arrayValue":
        return [_value(x) for x in raw.get("values", ())]
    if kind == "intValue":
        return int(raw)
    return raw


def read_trace_dir(path: Path) -> list[dict]:
    """Every span of the folder's OTLP/JSON-lines files, with ``attrs`` decoded."""
    spans = []
    for f in sorted(path.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for sp in ss.get("spans", ()):
                        sp["attrs"] = {kv["key"]: _value(kv["value"]) for kv in sp.get("attributes", ())}
                        spans.append(sp)
    return spans


def wait_until_written(path: Path, quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
    """The probe exports from a background thread: wait until its files stop growing."""
    deadline = time.monotonic() + limit_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        size = sum(f.stat().st_size for f in path.glob("*.jsonl"))
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.25)


def phase_rows(name: str, spans: list[dict]) -> list[str]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for sp in spans:
        a = sp["attrs"]
        if a.get("sglang.phase") in PHASE_ORDER:
            groups[(a["sglang.phase"], a.get("sglang.cuda_graph"))].append(a)
    rows = []
    for (phase, graph), attrs in sorted(groups.items(), key=lambda kv: PHASE_ORDER.index(kv[0][0])):
        ms = sorted(float(a["sgl_probe.duration_ms"]) for a in attrs)
        reasons = Counter(a.get("sglang.no_graph_reason") for a in attrs if not a.get("sglang.cuda_graph"))
        reason = ", ".join(f"{r}" for r, _ in reasons.most_common(2) if r) or "-"
        accept = [a["sglang.spec.accept_length"] for a in attrs if "sglang.spec.accept_length" in a]
        extra = f"accept length {statistics.fmean(accept):.2f}" if accept else ""
        rows.append(f"  {name:<7}{phase:<14}{'yes' if graph else 'no':<7}{reason:<20}{len(ms):>6}"
                    f"{statistics.fmean(ms):>10.2f}{statistics.median(ms):>9.2f}  {extra}")
    return rows


def env_check(name: str, spans: list[dict]) -> tuple[list[str], bool]:
    """One line per scheduler process and snapshot point: did it have the launcher's NCCL_*?"""
    lines, ok = [], True
    snaps = [sp["attrs"] for sp in spans if sp["name"] == "sgl_probe.env_snapshot"]
    seen = defaultdict(set)
    for a in sorted(snaps, key=lambda a: (a.get("sglang.tp_rank", -1), a["sgl_probe.snapshot_point"])):
        point = a["sgl_probe.snapshot_point"]
        seen[a.get("sglang.tp_rank")].add(point)
        got = {k: a.get(f"env.{k}") for k in LAUNCHER_ENV}
        good = got == LAUNCHER_ENV
        ok &= good
        changed = a.get("sgl_probe.env.differs_from_launcher") or []
        lines.append(f"  {name:<7}tp_rank {a.get('sglang.tp_rank')}  {point:<14}"
                     + " ".join(f"{k}={v}" for k, v in got.items())
                     + ("  ok" if good else "  DIFFERENT from the launcher")
                     + (f"   (SGLang changed: {', '.join(changed)})" if changed and point == "nccl_init" else ""))
    for rank, points in sorted(seen.items(), key=lambda kv: kv[0] or 0):
        if not {"process_start", "nccl_init"} <= points:
            ok = False
            lines.append(f"  {name:<7}tp_rank {rank}  MISSING snapshot(s): {sorted({'process_start', 'nccl_init'} - points)}")
    if not snaps:
        ok = False
        lines.append(f"  {name:<7}no env snapshot arrived")
    return lines, ok


def send_load(server: SGLangServer) -> float:
    t0 = time.monotonic()
    for prompt in PROMPTS:
        server.generate(prompt, NEW_TOKENS)
    server.generate_many(PROMPTS, NEW_TOKENS)
    return time.monotonic() - t0


def start_all(servers: list[SGLangServer]) -> None:
    """Start the servers at once (startup is mostly single-threaded imports and loading)."""
    errors: list[BaseException] = []

    def start(server: SGLangServer) -> None:
        try:
            server.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for s in servers:
            s.stop()
        raise errors[0]


def main() -> int:
    t0 = time.monotonic()
    venv = ensure_venv(VERSION)
    install_wheel(venv, build_wheel(HARNESS_DIR / "demo-wheel"))
    target, draft = ensure_eagle_models(venv)
    out = HARNESS_DIR / "demo-traces" / time.strftime("%Y%m%d-%H%M%S")
    print(f"[demo] harness ready after {time.monotonic() - t0:.0f}s (SGLang {VERSION} venv, tiny Llama, "
          f"EAGLE-3 copy draft); traces in {out}", flush=True)
    servers = {}
    for name, args in (("plain", COMMON_ARGS), ("eagle3", (*COMMON_ARGS, *eagle_args(draft, **EAGLE)))):
        env = {**LAUNCHER_ENV, "SGL_PROBE_SUMMARY_S": "2", "SGL_PROBE_TRACE_DIR": str(out / name),
               "SGL_PROBE_RUN_ID": None, "SGL_PROBE_LAUNCHER_ENV": None}
        servers[name] = SGLangServer(venv, target, env=env, extra_args=args, log_path=out / f"{name}.log")
    t1 = time.monotonic()
    print("[demo] starting both servers: sglang.launch_server (plain) and the same with "
          f"--speculative-algorithm EAGLE3 (topk {EAGLE['topk']}, {EAGLE['num_steps']} steps, "
          f"{EAGLE['num_draft_tokens']} draft tokens)", flush=True)
    start_all(list(servers.values()))
    try:
        print(f"[demo] both healthy after {time.monotonic() - t1:.0f}s; sending the same requests to each, "
              f"one server at a time ({len(PROMPTS)} alone, then {len(PROMPTS)} batched, {NEW_TOKENS} tokens)",
              flush=True)
        for name, server in servers.items():
            seconds = send_load(server)
            print(f"[demo]   {name}: {seconds:.1f}s", flush=True)
        time.sleep(2.5)  # one more summary period
        for name in servers:
            wait_until_written(out / name)
        logs = {name: s.log_text() for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    spans = {name: read_trace_dir(out / name) for name in servers}

    print("\n[demo] 1. per phase: speculative decoding's draft / verify / draft_extend next to plain decode")
    print(f"  {'server':<7}{'phase':<14}{'graph':<7}{'why no graph':<20}{'count':>6}{'mean ms':>10}{'p50 ms':>9}")
    for name in servers:
        for row in phase_rows(name, spans[name]):
            print(row)
    print("  (the CPU engine runs no CUDA graph: the harness starts SGLang with --disable-cuda-graph; on a GPU "
          "the same column shows which steps ran eagerly and why)")

    print(f"\n[demo] 2. env snapshots: the launcher set {' '.join(f'{k}={v}' for k, v in LAUNCHER_ENV.items())}")
    all_ok = True
    for name in servers:
        lines, ok = env_check(name, spans[name])
        all_ok &= ok
        print("\n".join(lines))
    print("  => every scheduler process had the launcher's values" if all_ok
          else "  => NOT every scheduler process had the launcher's values")

    print("\n[demo] 3. the probe's summary line in each server log (the last one)")
    for name, log in logs.items():
        found = [line.split("] ", 1)[-1] for line in log.splitlines() if "sgl-probe summary" in line]
        print(f"  {name}: {found[-1] if found else '(none)'}")

    cmd = [str(venv / "bin" / "sgl-probe"), "report", str(out / "eagle3"), "--baseline", str(out / "plain")]
    print(f"\n[demo] 4. $ sgl-probe report {out / 'eagle3'} --baseline {out / 'plain'}", flush=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGL_PROBE", "OTEL_"))}
    report = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    print(report.stdout.rstrip())
    if report.returncode != 0:
        print(f"[demo] sgl-probe report exited {report.returncode}: {report.stderr.strip()[-2000:]}")
    print(f"\n[demo] done in {time.monotonic() - t0:.0f}s")
    return 0 if all_ok and report.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
