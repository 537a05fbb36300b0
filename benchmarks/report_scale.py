"""`sgl-probe report` over a large trace dir: wall time and peak memory (target: 1 000 000 spans in
under 30 s on a 2-core machine, streaming).

The trace dir is what a 4-rank EAGLE-3 server with ``SGL_PROBE_TRACE_DIR`` would leave: one
``sgl-probe-<pid>.jsonl`` per rank, written by the probe's own span builder
(``spans.build_step_spans`` / ``build_env_span``) and exporter (``JsonLinesExporter``, 512 spans
per line like the BatchSpanProcessor), from synthetic step records: mostly spec steps (draft with
a graph, verify without one in 97 % of steps, draft-extend), some plain graph-decode steps and
prefills, a slow rank, env snapshots. Generation is not timed and is cached (``--dir``).

    python3 benchmarks/report_scale.py [--spans 1000000] [--ranks 4] [--dir DIR]
                                        [--json benchmarks/results/report_scale.json]
                                        [--compare OTHER_CHECKOUT] [--repeat N]

``--compare`` times another checkout's report on the same trace dir, alternating with this one
(the order flips every round), and prints this / other ratios of wall and CPU time;
``--aggregate-only SPANS`` times only the aggregation, the part two checkouts usually differ in
(reading and parsing JSON is most of a report's time, and most of its noise on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 512  # the BatchSpanProcessor's default max export batch
RUN_ID = "bench-report-scale"
#: Mean ms per call (GPU-like numbers from the motivating case).
MEANS = {"decode": 12.1, "extend": 45.0, "draft": 4.0, "verify": 29.0, "draft_extend": 2.0}


class _Timer:
    """Hands the span builder synthetic intervals (a CUDA-timer-shaped object)."""
    kind = "cuda"

    def interval_kind(self, start, end):
        return start, end, None

    def wall(self, host_ns):
        return host_ns


def _rank_file(trace_dir: str, rank: int, n_spans: int, seed: int) -> int:
    from sgl_probe import config, envsnap, spans as spans_mod
    from sgl_probe.drain import resolve_step
    from sgl_probe.sinks import JsonLinesExporter, make_resource
    from sgl_probe.readers import Facts
    from sgl_probe.recorder import PhaseRecord, StepRecord

    rng = random.Random(seed * 1000 + rank)
    ident = {"tp_rank": rank, "dp_rank": 0, "pp_rank": 0}
    spec = {"algorithm": "EAGLE3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    resource = make_resource(ident, RUN_ID, "0.5.23")
    exporter = JsonLinesExporter(os.path.join(trace_dir, f"sgl-probe-{4000 + rank}.jsonl"))
    timer = _Timer()
    now = 1_795_000_000_000_000_000
    env = {"NCCL_PROTO": "LL", "NCCL_IB_HCA": f"mlx5_{rank}", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    buf = [spans_mod.build_env_span(envsnap.snapshot_attributes(point, config.DEFAULT_ENV_ALLOW, env),
                                    now, RUN_ID, ident, resource) for point in ("process_start", "nccl_init")]
    written = 0
    step = 0
    slow = 1.12 if rank == 3 else 1.0  # rank 3 is the straggler

    def phase(name: str, mode: str, bs: int, t0: int, graph: bool, accept=None) -> PhaseRecord:
        ms = MEANS[name] * rng.lognormvariate(0, 0.08) * (slow if name == "verify" else 1.0)
        if name == "verify" and graph:
            ms = MEANS["decode"] * 1.1 * rng.lognormvariate(0, 0.05)
        ph = PhaseRecord(Facts(name, mode, bs, bs * 4), "bench:" + name, t0, t0)
        ph.t_end = t0 + int(ms * 1e6)
        ph.host1 = t0 + int(0.3e6)
        ph.graph = graph
        ph.accept_length = accept
        return ph

    while written + len(buf) < n_spans:
        step += 1
        bs = rng.choice((1, 2, 4, 8, 16))
        kind = "prefill" if step % 50 == 1 else "decode" if step % 10 == 0 else "spec"
        st = StepRecord(step, Facts("step", "EXTEND" if kind == "prefill" else "DECODE", bs, bs), now)
        t = now + int(0.2e6)
        if kind == "prefill":
            chain = [("extend", "EXTEND", False, None), ("draft_extend", "DRAFT_EXTEND_V2", False, None)]
        elif kind == "decode":
            chain = [("decode", "DECODE", True, None)]
        else:
            chain = [("draft", "DECODE", True, None),
                     ("verify", "TARGET_VERIFY", rng.random() < 0.03, round(rng.gauss(2.0, 0.4) * bs) / bs),
                     ("draft_extend", "DRAFT_EXTEND_V2", True, None)]
        for name, mode, graph, accept in chain:
            ph = phase(name, mode, bs, t, graph, max(1.0, accept) if accept is not None else None)
            st.phases.append(ph)
            t = ph.t_end + int(0.05e6)
        st.host1 = t + int(0.1e6)
        now = st.host1 + int(0.5e6)
        buf += spans_mod.build_step_spans(resolve_step(st, timer), RUN_ID, ident, spec, resource)
        if len(buf) >= BATCH:
            exporter.export(buf[:BATCH])
            written += BATCH
            buf = buf[BATCH:]
    if buf:
        exporter.export(buf)
        written += len(buf)
    return written


def generate(trace_dir: str, n_spans: int, ranks: int = 4, seed: int = 0, workers: int | None = None) -> int:
    """Write about ``n_spans`` spans (whole steps, so a few more) over ``ranks`` rank files."""
    os.makedirs(trace_dir, exist_ok=True)
    per_rank = [n_spans // ranks + (1 if r < n_spans % ranks else 0) for r in range(ranks)]
    workers = workers or min(ranks, os.cpu_count() or 1)
    if workers <= 1:
        return sum(_rank_file(trace_dir, r, n, seed) for r, n in enumerate(per_rank))
    with ProcessPoolExecutor(workers) as pool:
        return sum(pool.map(_rank_file, [trace_dir] * ranks, range(ranks), per_rank, [seed] * ranks))


def _tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and its descendants (from /proc)."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
            with open(f"/proc/{name}/status") as fh:
                status = fh.read()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss[pid] = int(line.split()[1])
    total = 0
    for pid, kib in rss.items():
        p = pid
        while p and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += kib
    return total


def time_report(trace_dir: str, *extra: str, root: Path = ROOT) -> dict:
    """Run ``sgl-probe report`` as a user would (a fresh process): wall time, CPU time and the
    peak RSS of exactly that process (``wait4``). ``root``: the checkout whose code runs."""
    cmd = [sys.executable, "-m", "sgl_probe.cli", "report", trace_dir, *extra]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=str(root))
        peak_tree = [0]
        done = threading.Event()

        def sample() -> None:  # the report and its reader processes together
            while not done.wait(0.1):
                peak_tree[0] = max(peak_tree[0], _tree_rss_kib(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        done.set()
        sampler.join()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"cmd": " ".join(cmd[2:]), "rc": proc.returncode, "wall_s": round(wall, 2),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
                "peak_tree_rss_mib": round(peak_tree[0] / 1024, 1),
                "stdout": out.read().decode(), "stderr": err.read().decode()}


_AGGREGATE_ONLY = """
import itertools, sys, time
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.model import Problems
from sgl_probe.report.sources import read_sources
spans = list(itertools.islice(read_sources([sys.argv[1]], Problems()), int(sys.argv[2])))
best = None
for _ in range(int(sys.argv[3])):
    agg = Aggregator()
    t0 = time.process_time()
    for s in spans:
        agg.add(s)
    agg.finish()
    dt = time.process_time() - t0
    best = dt if best is None else min(best, dt)
print(best)
"""


def aggregate_only(trace_dir: str, n_spans: int, rounds: int, other: Path) -> dict:
    """The part of a report the two checkouts differ in, alone: the first ``n_spans`` spans are
    read into memory (not timed), then aggregated and finished (CPU time, best of 3 in each
    process); fresh processes of this and the other checkout alternate ``rounds`` times."""
    import statistics

    pairs = []
    for rnd in range(rounds):
        got = {}
        order = [("this", ROOT), ("other", other)]
        for which, root in (order if rnd % 2 == 0 else order[::-1]):
            out = subprocess.run([sys.executable, "-c", _AGGREGATE_ONLY, trace_dir, str(n_spans), "3"],
                                 capture_output=True, text=True, cwd=str(root), check=True)
            got[which] = float(out.stdout.split()[-1])
        pairs.append(got)
        print(f"aggregate {n_spans:,} spans: this {got['this']:.2f} s, other {got['other']:.2f} s, "
              f"ratio {got['this'] / got['other']:.3f}", flush=True)
    ratio = statistics.median(p["this"] / p["other"] for p in pairs)
    print(f"aggregate only, this / other, median over {rounds} pairs: {ratio:.3f}")
    return {"spans": n_spans, "pairs": pairs, "median_ratio": ratio}


def dir_stats(trace_dir: str) -> dict:
    files = [os.path.join(trace_dir, n) for n in os.listdir(trace_dir) if n.endswith(".jsonl")]
    return {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--dir", help="trace dir to use (generated there if it holds no .jsonl yet; kept)")
    ap.add_argument("--json", help="write the numbers here, e.g. benchmarks/results/report_scale.json")
    ap.add_argument("--repeat", type=int, default=1, help="time the report this many times")
    ap.add_argument("--compare", help="another sgl-probe checkout: time its report side by side")
    ap.add_argument("--aggregate-only", type=int, metavar="SPANS",
                    help="with --compare: time only the aggregation of the first SPANS spans of the first file")
    args = ap.parse_args()
    other = Path(args.compare).resolve() if args.compare else None
    tmp = None
    trace_dir = args.dir
    if trace_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sgl-probe-report-scale-")
        trace_dir = tmp.name
    generated = None
    if not any(n.endswith(".jsonl") for n in os.listdir(trace_dir)) if os.path.isdir(trace_dir) else True:
        t0 = time.perf_counter()
        n = generate(trace_dir, args.spans, args.ranks)
        generated = {"spans": n, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"generated {n:,} spans in {generated['seconds']} s into {trace_dir}", flush=True)
    if args.aggregate_only:
        if other is None:
            raise SystemExit("--aggregate-only needs --compare OTHER_CHECKOUT")
        first = sorted(n for n in os.listdir(trace_dir) if n.endswith(".jsonl"))[0]
        res = aggregate_only(os.path.join(trace_dir, first), args.aggregate_only, max(2, args.repeat), other)
        if args.json:
            Path(args.json).write_text(json.dumps({"aggregate_only": res, "other": str(other)}, indent=1) + "\n")
        return 0
    stats = dir_stats(trace_dir)
    print(f"trace dir: {stats['files']} files, {stats['bytes'] / 2**20:,.0f} MiB", flush=True)
    runs = []
    compared = []
    for rnd in range(args.repeat):
        for extra in ((), ("--by-rank",), ("--json",)):
            roots = [("this", ROOT)] + ([("other", other)] if other else [])
            pair = {}
            for which, root in (roots if rnd % 2 == 0 else roots[::-1]):
                load_before = os.getloadavg()[0]
                r = time_report(trace_dir, *extra, root=root)
                r["code"] = which
                r["loadavg_1m_before"] = round(load_before, 2)
                r["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
                if r["rc"] != 0:
                    print(r["stderr"], file=sys.stderr)
                    raise SystemExit(f"report failed ({r['rc']}): {r['cmd']} ({which}: {root})")
                pair[which] = r
                if which == "this":
                    runs.append({k: v for k, v in r.items() if k not in ("stdout", "stderr")})
                print(f"[{which}] {r['cmd']}: wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s (all processes), "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB (largest process), {r['peak_tree_rss_mib']:.0f} MiB "
                      f"(all together, sampled); load average {r['loadavg_1m_before']} -> "
                      f"{r['loadavg_1m_after']}", flush=True)
                if extra == () and which == "this" and rnd == 0:
                    print(r["stdout"])
                if extra == ("--json",) and which == "this":
                    spans = json.loads(r["stdout"])["input"]["spans"]
            if other:
                t, o = pair["this"], pair["other"]
                c = {"args": " ".join(extra), "this_wall_s": t["wall_s"], "other_wall_s": o["wall_s"],
                     "this_cpu_s": t["cpu_s"], "other_cpu_s": o["cpu_s"],
                     "wall_ratio": round(t["wall_s"] / o["wall_s"], 3), "cpu_ratio": round(t["cpu_s"] / o["cpu_s"], 3)}
                compared.append(c)
                print(f"  this / other: wall {c['wall_ratio']:.3f}, cpu {c['cpu_ratio']:.3f}", flush=True)
    result = {"spans": spans, "ranks": args.ranks, "trace_dir_bytes": stats["bytes"], "generated": generated,
              "runs": runs, "worst_wall_s": max(r["wall_s"] for r in runs),
              "worst_peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
              "worst_peak_tree_rss_mib": max(r["peak_tree_rss_mib"] for r in runs), "target_wall_s": 30,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "date": time.strftime("%Y-%m-%d")}
    if compared:
        import statistics

        result["compare"] = {"other": str(other), "rounds": compared,
                             "median_wall_ratio": statistics.median(c["wall_ratio"] for c in compared),
                             "median_cpu_ratio": statistics.median(c["cpu_ratio"] for c in compared)}
        print(f"this / other ({other}), median over {len(compared)} pairs: wall "
              f"{result['compare']['median_wall_ratio']:.3f}, cpu {result['compare']['median_cpu_ratio']:.3f}")
    print(f"{spans:,} spans: worst wall {result['worst_wall_s']:.1f} s (target < 30 s), "
          f"worst peak RSS {result['worst_peak_rss_mib']:.0f} MiB per process, "
          f"{result['worst_peak_tree_rss_mib']:.0f} MiB all processes")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    if tmp is not None:
        tmp.cleanup()
    return 0 if result["worst_wall_s"] < 30 else 1


if __name__ == "__main__":
    sys.exit(main())
