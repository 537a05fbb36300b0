"""Soak: a real SGLang 0.5.23 CPU server with the probe, under steady load for N minutes.

    python3 benchmarks/soak.py --minutes 20 [--tp 1] [--json benchmarks/results/soak.json]

The probe comes from the checkout's wheel (installed into a private directory put first on the
server's PYTHONPATH, so a concurrent reinstall of the harness venv cannot swap the code under
test) and exports over OTLP/gRPC to a real receiver on a socket; the spans are counted and
forgotten as they arrive. A client loop sends two concurrent greedy requests at a time for the whole run, in rounds
paced to start one every ``--round-s`` seconds, so the rate stays the same whether the machine is
busy or idle (the spans waiting in the exporter's queue, and the memory they take, follow the
rate). Every ``--sample-s`` seconds each process of the server (every
scheduler, the launcher, the detokenizer, and a probe exporter process if there is one) is
sampled from /proc: resident memory, open file descriptors, threads.

Pass criteria (each printed and written to the JSON):

* memory: for every scheduler (and probe exporter process), the median RSS of the last three
  samples minus the median of the first three after warm-up is below ``--rss-bound-mb`` (5 MB);
* file descriptors and threads: the same difference is at most ``--fd-slack`` / ``--thread-slack``
  (2): a leak per request or per export batch would grow by hundreds over the run;
* every step exported: once the load stops, the receiver holds one extend or decode span for each
  forward pass SGLang itself counted (``sglang:cuda_graph_passes_total``, per rank and mode),
  and no summary line reports dropped spans.

Exit status 0 only when every criterion holds. Not part of the default test run (it takes the
minutes it is given); ``tests/test_soak.py`` checks the analysis on recorded samples.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sgl_probe.testing.receiver import OTLPReceiver  # noqa: E402
from tests.harness.model import ensure_tiny_model  # noqa: E402
from tests.harness.server import SGLangServer  # noqa: E402
from tests.harness.venv import ensure_venv  # noqa: E402
from tests.harness.wheel import build_wheel, install_wheel  # noqa: E402

VERSION = "0.5.23"
PROMPTS = ["hello world the quick", "once upon a time there", "brown fox jumps over lazy",
           "speculative decoding scheduler", "tensor parallel request", "the tiny random model said"]
ARGS = ("--disable-radix-cache", "--dtype", "float32", "--enable-metrics",
        "--enable-metrics-for-all-schedulers")
PASSES = re.compile(r'sglang:cuda_graph_passes_total\{(.*)\} ([0-9.e+]+)$')


def tally(receiver: OTLPReceiver, counts: collections.Counter) -> None:
    """Count what arrived and let the receiver forget it (hours of spans)."""
    for s in receiver.take():
        counts[(s.attributes.get("sglang.tp_rank"), s.name, s.attributes.get("sglang.cuda_graph"))] += 1


def proc_sample(pid: int) -> dict[str, Any] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"pid": pid, "cmd": cmd.replace(str(ROOT) + "/", "")[:120], "rss_kb": int(fields["VmRSS"].split()[0]),
            "threads": int(fields["Threads"]), "fds": fds}


def group_pids(pgid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(entry.name))
    return sorted(out)


def role(cmd: str) -> str:
    if "scheduler" in cmd:
        return "scheduler"
    if "sgl_probe" in cmd or "sgl-probe" in cmd:
        return "probe_exporter"
    if "detokenizer" in cmd:
        return "detokenizer"
    return "other"


def analyse(samples: list[dict], warmup_s: float, rss_bound_mb: float, fd_slack: int,
            thread_slack: int) -> dict[str, Any]:
    """Per watched process: growth from the first three samples after warm-up to the last three
    (medians, so one allocator hiccup at either end does not decide). ``samples`` is the list
    written to the JSON: ``{"t": seconds, "procs": [proc_sample(...) + "role"]}``."""
    after = [s for s in samples if s["t"] >= warmup_s]
    series: dict[int, dict[str, Any]] = {}
    for s in after:
        for p in s["procs"]:
            if p["role"] in ("scheduler", "probe_exporter"):
                d = series.setdefault(p["pid"], {"role": p["role"], "cmd": p["cmd"], "rss_kb": [], "fds": [],
                                                 "threads": []})
                for key in ("rss_kb", "fds", "threads"):
                    d[key].append(p[key])
    out: dict[str, Any] = {"processes": [], "ok": bool(series)}
    for pid, d in sorted(series.items()):
        if len(d["rss_kb"]) < 6:
            out["ok"] = False
            out["processes"].append({"pid": pid, "role": d["role"], "error": "fewer than 6 samples after warm-up"})
            continue

        def growth(key: str) -> float:
            return statistics.median(d[key][-3:]) - statistics.median(d[key][:3])

        rss_mb = growth("rss_kb") / 1024
        row = {"pid": pid, "role": d["role"], "cmd": d["cmd"], "samples": len(d["rss_kb"]),
               "rss_mb_start": round(statistics.median(d["rss_kb"][:3]) / 1024, 2),
               "rss_mb_growth": round(rss_mb, 2), "rss_mb_max_minus_min": round(
                   (max(d["rss_kb"]) - min(d["rss_kb"])) / 1024, 2),
               "fds_start": d["fds"][0], "fds_growth": growth("fds"), "fds_range": [min(d["fds"]), max(d["fds"])],
               "threads_start": d["threads"][0], "threads_growth": growth("threads"),
               "threads_range": [min(d["threads"]), max(d["threads"])]}
        row["ok"] = rss_mb < rss_bound_mb and row["fds_growth"] <= fd_slack and row["threads_growth"] <= thread_slack
        out["ok"] = out["ok"] and row["ok"]
        out["processes"].append(row)
    return out


def sglang_passes(metrics: str) -> dict[tuple[int, str], float]:
    counted: dict[tuple[int, str], float] = collections.defaultdict(float)
    for line in metrics.splitlines():
        m = PASSES.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            counted[(int(labels["tp_rank"]), labels["mode"])] += float(m.group(2))
    return dict(counted)


def exported_vs_counted(counts: collections.Counter, passes: dict) -> dict[str, Any]:
    rows = []
    for (rank, mode), n in sorted(passes.items()):
        name = "sglang.decode" if mode.startswith("decode") else "sglang.extend"
        seen = counts.get((rank, name, mode.endswith("cuda_graph")), 0)
        rows.append({"tp_rank": rank, "mode": mode, "sglang_counted": int(n), "spans_received": seen})
    return {"rows": rows, "ok": bool(rows) and all(r["sglang_counted"] == r["spans_received"] for r in rows)}


def private_probe(wheel: Path, venv: Path) -> Path:
    """The wheel unpacked into a directory of its own, first on the server's PYTHONPATH."""
    target = Path(tempfile.mkdtemp(prefix="sgl-probe-soak-"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--warmup-minutes", type=float, default=None,
                    help="left out of the growth figures (default: 15%% of the run, at least 1)")
    ap.add_argument("--sample-s", type=float, default=20.0)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--round-s", type=float, default=3.0,
                    help="one round of requests starts every this many seconds (later when a round takes longer)")
    ap.add_argument("--rss-bound-mb", type=float, default=5.0)
    ap.add_argument("--fd-slack", type=int, default=2)
    ap.add_argument("--thread-slack", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    duration = args.minutes * 60
    warmup = (args.warmup_minutes * 60 if args.warmup_minutes is not None else max(60.0, 0.15 * duration))

    venv = ensure_venv(VERSION)
    wheel = build_wheel()
    install_wheel(venv, wheel)  # the startup hook (.pth) in the venv itself
    overlay = private_probe(wheel, venv)
    model = ensure_tiny_model(venv)
    log_path = Path(tempfile.mkdtemp(prefix="sgl-probe-soak-log-")) / "server.log"

    samples: list[dict] = []
    stats = {"rounds": 0, "late_rounds": 0, "requests": 0, "tokens": 0, "errors": []}
    counts: collections.Counter = collections.Counter()
    with OTLPReceiver() as receiver:
        env = {**receiver.env("grpc"), "SGL_PROBE": "1", "SGL_PROBE_SUMMARY_S": "10",
               "PYTHONPATH": str(overlay) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with SGLangServer(venv, model, tp=args.tp, env=env, extra_args=ARGS, log_path=log_path) as server:
            pgid = server.proc.pid
            stop = threading.Event()

            def load() -> None:
                i = 0
                next_round = time.monotonic()
                while not stop.is_set():
                    texts = [PROMPTS[i % len(PROMPTS)], PROMPTS[(i + 1) % len(PROMPTS)]]
                    i += 1
                    try:
                        out = server.generate_many(texts, args.new_tokens)
                        stats["requests"] += len(out)
                        stats["tokens"] += sum(r["meta_info"]["completion_tokens"] for r in out)
                    except Exception as exc:  # noted; the run goes on
                        stats["errors"].append(repr(exc)[:300])
                    stats["rounds"] += 1
                    next_round += args.round_s
                    wait = next_round - time.monotonic()
                    if wait < 0:
                        stats["late_rounds"] += 1
                        next_round = time.monotonic()
                    stop.wait(max(wait, 0.0))

            loader = threading.Thread(target=load, name="soak-load", daemon=True)
            t0 = time.monotonic()
            loader.start()
            next_sample = 0.0
            while True:
                now = time.monotonic() - t0
                if now >= next_sample:
                    procs = []
                    for pid in group_pids(pgid):
                        p = proc_sample(pid)
                        if p is not None:
                            p["role"] = role(p["cmd"])
                            procs.append(p)
                    tally(receiver, counts)
                    samples.append({"t": round(now, 1), "requests": stats["requests"], "procs": procs})
                    sched = [p for p in procs if p["role"] == "scheduler"]
                    print(f"[soak] t={now / 60:5.1f} min requests={stats['requests']} " + " ".join(
                        f"sched{p['pid']}: rss={p['rss_kb'] / 1024:.1f}MB fds={p['fds']} thr={p['threads']}"
                        for p in sched), flush=True)
                    next_sample += args.sample_s
                if now >= duration:
                    break
                time.sleep(min(1.0, max(0.0, next_sample - now)))
            stop.set()
            loader.join(timeout=300)

            # Every pass SGLang counted must arrive as a span once the exporters have flushed
            # (OTEL_BSP_SCHEDULE_DELAY is 5 s by default).
            deadline = time.monotonic() + 90
            while True:
                passes = sglang_passes(server.request_text("/metrics"))
                tally(receiver, counts)
                export = exported_vs_counted(counts, passes)
                if export["ok"] or time.monotonic() > deadline:
                    break
                time.sleep(2)
            time.sleep(11)  # one more summary window
            log = server.log_text()
        summaries = [ln for ln in log.splitlines() if "sgl-probe summary" in ln]
        dropped = [ln for ln in summaries if "dropped=" in ln]
        probe_problems = [ln for ln in log.splitlines() if "sgl-probe" in ln and "summary" not in ln
                          and ("warning" in ln.lower() or "error" in ln.lower() or "fail" in ln.lower())]
        receiver_errors = list(receiver.errors)

    memory = analyse(samples, warmup, args.rss_bound_mb, args.fd_slack, args.thread_slack)
    result = {
        "what": "real SGLang %s CPU server (tp %d, tiny Llama) with sgl-probe exporting over OTLP/gRPC, "
                "steady load" % (VERSION, args.tp),
        "command": "python3 benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "minutes": args.minutes, "warmup_s": warmup, "sample_s": args.sample_s,
        "bounds": {"rss_mb_growth_lt": args.rss_bound_mb, "fds_growth_le": args.fd_slack,
                   "threads_growth_le": args.thread_slack},
        "load": {k: (v if k != "errors" else v[:20]) for k, v in stats.items()} | {"error_count": len(stats["errors"])},
        "memory_fds_threads": memory,
        "every_step_exported": export,
        "spans_received_by_name": dict(collections.Counter(
            name for (_, name, _), n in counts.items() for _ in range(n))),
        "summary_lines": len(summaries), "summary_lines_with_dropped": dropped[:5],
        "probe_warnings": probe_problems[:20], "receiver_errors": receiver_errors[:20],
        "last_summary_line": summaries[-1] if summaries else None,
        "server_log": str(log_path),
        "samples": samples,
    }
    result["ok"] = bool(memory["ok"] and export["ok"] and not dropped and not stats["errors"]
                        and summaries and not receiver_errors)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    for row in memory["processes"]:
        print(f"[soak] {row.get('role')} pid {row['pid']}: " + (row.get("error") or (
            f"rss {row['rss_mb_start']} MB, growth {row['rss_mb_growth']:+.2f} MB (bound < {args.rss_bound_mb}); "
            f"fds {row['fds_start']} growth {row['fds_growth']:+g}; threads {row['threads_start']} "
            f"growth {row['threads_growth']:+g} -> {'ok' if row['ok'] else 'FAIL'}")))
    for row in export["rows"]:
        print(f"[soak] tp_rank {row['tp_rank']} {row['mode']}: SGLang counted {row['sglang_counted']}, "
              f"spans received {row['spans_received']}")
    print(f"[soak] requests {stats['requests']} ({len(stats['errors'])} errors), summary lines {len(summaries)}, "
          f"with dropped= {len(dropped)}, receiver errors {len(receiver_errors)} -> {'PASS' if result['ok'] else 'FAIL'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
