"""Tokens/s of a real SGLang 0.5.23 CPU server with the probe on vs off, interleaved.

Both servers run at once (same venv, same tiny model, tp 1). An idle SGLang scheduler busy-polls
a whole core, so the server not being measured is frozen (SIGSTOP to its process group) and
thawed (SIGCONT) for its own block. Each pair runs one load block on each, order flipped every
pair; the printed number is the median of the paired ratios (probe-on / probe-off tokens/s) with
a bootstrap 95 % interval. Target >= 0.99. The probe-on server runs with its defaults (summary
line every 30 s, no collector).

    python3 benchmarks/cpu_server_overhead.py [--pairs 30] [--launches 1] [--json FILE]

Two server processes started side by side can differ by several percent for reasons of their own
(measured up to ~9 % between identical code paths), which one launch's interval does not show;
``--launches N`` restarts the pair N times, alternating which starts first, and bootstraps over
launches.

``--in-process`` measures inside one server instead: the probe exports every step (to a trace dir,
through the exporter process) and is paused and resumed in alternating load blocks of the same
scheduler (``benchmarks/probe_pause/``, benchmark-only), so no launch-to-launch spread enters the
ratio (recording / paused); ``--aa`` then flips a server without the probe, the method's control.
``--self-time`` adds the probe's own time per scheduler step, timed inside the server by the pause
shim (``SGL_BENCH_SELF_TIME``): its per-step wrappers from outside minus the SGLang functions they
call, per segment between two flips (ABBA runs two blocks of one state in a row), recording and paused.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.harness.model import ensure_tiny_model  # noqa: E402
from tests.harness.server import SGLangServer  # noqa: E402
from tests.harness.venv import HARNESS_DIR, ensure_venv  # noqa: E402
from gpu_common import bootstrap_median_ci  # noqa: E402  (stdlib only)
from tests.harness.wheel import build_wheel, install_wheel  # noqa: E402
from probe_pause.control import HERE as PAUSE_DIR, gc_stats, own_time, scheduler_pids, set_recording  # noqa: E402

PROMPTS = ["hello world the quick", "once upon a time there", "brown fox jumps over lazy",
           "speculative decoding scheduler", "tensor parallel request", "the tiny random model said",
           "gpu cpu token model", "sglang worker tensor"]


def _signal(server: SGLangServer, sig: int) -> None:
    os.killpg(server.proc.pid, sig)  # the launcher runs in its own session: pgid == pid


def rate(server: SGLangServer, new_tokens: int) -> float:
    """Tokens/s of one load block (the prompts at once)."""
    t0 = time.perf_counter()
    out = server.generate_many(PROMPTS, new_tokens)
    return sum(r["meta_info"]["completion_tokens"] for r in out) / (time.perf_counter() - t0)


def block(server: SGLangServer, other: SGLangServer, new_tokens: int) -> float:
    _signal(other, signal.SIGSTOP)
    _signal(server, signal.SIGCONT)
    time.sleep(0.2)
    return rate(server, new_tokens)


def self_table(flips: list) -> dict:
    """The probe's own µs per step in each segment between two flips, by the segment's state:
    median and 95 % interval over segments, and recording minus paused (medians); ``by_target``:
    each wrapper's own µs per step (medians over segments), recording and paused."""
    own: dict = {True: [], False: []}
    by: dict = {}
    for (state, g0), (_, g1) in zip(flips, flips[1:]):
        got = own_time(g0, g1)
        if got is None:
            continue
        own[state].append(got["probe_self"])
        for key, us in got.items():
            if key.startswith("probe_self:"):
                by.setdefault(key.split(":", 1)[1], {True: [], False: []})[state].append(us)
    out: dict = {}
    for state, name in ((True, "recording"), (False, "paused")):
        if own[state]:
            med, lo, hi = bootstrap_median_ci(own[state])
            out[name] = {"median": med, "ci95": [lo, hi], "segments": len(own[state])}
    if own[True] and own[False]:
        out["recording_minus_paused"] = out["recording"]["median"] - out["paused"]["median"]
    # Wrappers this load never called (another version's or another role's) are not in ``by``.
    out["by_target"] = {name: {("recording" if st else "paused"): statistics.median(v) for st, v in got.items() if v}
                        for name, got in by.items()}
    return out


def in_process(venv, model, aa: bool, pairs: int, tokens: int, export: bool = True,
               self_time: bool = False) -> tuple[list, list, list, dict]:
    """One server, the probe recording and paused in alternating blocks (ABBA order)."""
    import tempfile

    states, traces = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    env = {"SGL_PROBE": "0" if aa else "1", "PYTHONPATH": str(PAUSE_DIR), "SGL_BENCH_PAUSE_DIR": str(states)}
    if self_time:
        env["SGL_BENCH_SELF_TIME"] = "1"
    if export:
        env["SGL_PROBE_TRACE_DIR"] = str(traces)
    srv = SGLangServer(venv, model, env=env, extra_args=("--dtype", "float32", "--disable-radix-cache"))
    with srv:
        pids = scheduler_pids(srv.proc.pid)
        if not pids:
            raise RuntimeError("no sglang::scheduler process found")
        for _ in range(2):
            rate(srv, tokens)
        ratios, on, off = [], [], []
        flips: list = []  # (state after the flip, the shim's totals at it): segments of one state
        state = None
        for i in range(pairs):
            got = {}
            for recording in ((True, False) if i % 2 == 0 else (False, True)):
                set_recording(pids, recording, states)
                if recording != state:
                    state = recording
                    flips.append((recording, gc_stats(states, pids[0])))
                time.sleep(0.3)  # the drain and exporter catch up with the previous block
                got[recording] = rate(srv, tokens)
            on.append(got[True])
            off.append(got[False])
            ratios.append(got[True] / got[False])
        set_recording(pids, not state, states)  # closes the last segment
        flips.append((not state, gc_stats(states, pids[0])))
        set_recording(pids, True, states)
    extra = {"schedulers": len(pids), "export": "trace_dir" if export else "none (summary line)",
             "trace_bytes": sum(f.stat().st_size for f in traces.glob("*.jsonl"))}
    if self_time:
        extra["probe_self_us_per_step"] = self_table(flips)
    return ratios, on, off, extra


def one_launch(venv, model, aa: bool, pairs: int, tokens: int, probe_first: bool) -> tuple[list, list, list]:
    """Two fresh servers; ``probe_first`` decides which one starts first."""
    common = ("--dtype", "float32", "--disable-radix-cache")
    on = SGLangServer(venv, model, env={"SGL_PROBE": "0" if aa else "1"}, extra_args=common)
    off = SGLangServer(venv, model, env={"SGL_PROBE": "0"}, extra_args=common)
    first, second = (on, off) if probe_first else (off, on)
    with first, second:
        try:
            for _ in range(2):  # warm up both
                block(on, off, tokens)
                block(off, on, tokens)
            ratios, tps_on, tps_off = [], [], []
            for i in range(pairs):
                if i % 2:
                    a, b = block(on, off, tokens), block(off, on, tokens)
                else:
                    b, a = block(off, on, tokens), block(on, off, tokens)
                tps_on.append(a)
                tps_off.append(b)
                ratios.append(a / b)
        finally:
            for server in (on, off):  # stop() must find them running
                _signal(server, signal.SIGCONT)
    return ratios, tps_on, tps_off


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=30, help="load-block pairs per launch")
    ap.add_argument("--launches", type=int, default=1,
                    help="fresh server pairs, start order alternating; with more than one, the "
                         "interval is a bootstrap over launches (see BENCHMARKS.md for why)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--aa", action="store_true",
                    help="A/A control: both servers without the probe, to see the method's own bias")
    ap.add_argument("--in-process", action="store_true",
                    help="one server, the probe recording / paused in alternating blocks (see above)")
    ap.add_argument("--no-export", action="store_true",
                    help="with --in-process: no trace dir, the summary line only")
    ap.add_argument("--self-time", action="store_true",
                    help="with --in-process: also the probe's own time per step, timed inside the server")
    args = ap.parse_args()
    venv = ensure_venv("0.5.23")
    install_wheel(venv, build_wheel(HARNESS_DIR / "bench-wheel"))
    model = ensure_tiny_model(venv)
    if args.in_process:
        ratios, tps_on, tps_off, extra = in_process(venv, model, args.aa, args.pairs, args.tokens,
                                                   export=not args.no_export, self_time=args.self_time)
        med, lo, hi = bootstrap_median_ci(ratios)
        out = {"mode": "in_process", "pairs": args.pairs, "tokens_per_request": args.tokens,
               "requests_per_block": len(PROMPTS), "tps_recording_median": statistics.median(tps_on),
               "tps_paused_median": statistics.median(tps_off), "ratio_median": med, "ratio_ci95": [lo, hi],
               "ratios": ratios, "aa_control": args.aa, "sglang": "0.5.23", "tp": 1,
               "date": time.strftime("%Y-%m-%d"), **extra}
        print(f"tokens/s recording {out['tps_recording_median']:.0f}, paused {out['tps_paused_median']:.0f}; "
              f"paired ratio {med:.4f} (95% CI {lo:.4f}-{hi:.4f}; target >= 0.99)")
        if "probe_self_us_per_step" in extra:
            print("probe's own time per step (µs):", json.dumps(extra["probe_self_us_per_step"]))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        return 0
    ratios, tps_on, tps_off, per_launch = [], [], [], []
    for k in range(args.launches):
        r, a, b = one_launch(venv, model, args.aa, args.pairs, args.tokens, probe_first=k % 2 == 0)
        ratios += r
        tps_on += a
        tps_off += b
        per_launch.append(statistics.median(r))
        print(f"launch {k + 1}/{args.launches} ({'probe' if k % 2 == 0 else 'no-probe'} server started "
              f"first): on/off {per_launch[-1]:.4f}", flush=True)
    # One launch: the pairs are the sample. Several: the launches are (a whole server pair's speed
    # is a random effect of its own, larger than the pairs' spread), so resample launches.
    _, lo, hi = bootstrap_median_ci(per_launch if args.launches > 1 else ratios)
    out = {"pairs": args.pairs, "launches": args.launches, "tokens_per_request": args.tokens,
           "requests_per_block": len(PROMPTS),
           "tps_on_median": statistics.median(tps_on), "tps_off_median": statistics.median(tps_off),
           "ratio_median": statistics.median(per_launch if args.launches > 1 else ratios),
           "ratio_ci95": [lo, hi], "per_launch_ratio": per_launch, "target": 0.99,
           "sglang": "0.5.23", "tp": 1, "aa_control": args.aa, "date": time.strftime("%Y-%m-%d")}
    print(f"tokens/s probe on {out['tps_on_median']:.0f}, off {out['tps_off_median']:.0f}; paired ratio "
          f"on/off {out['ratio_median']:.4f} (95% CI {lo:.4f}-{hi:.4f}; target >= 0.99)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
