"""``python3 -m tests.harness demo``: the main job, end to end, on this CPU machine.

Builds the harness if missing, installs sgl-probe from its wheel into the SGLang 0.5.23 venv,
launches a real server (tiny random Llama, tp 2) with ``NCCL_PROTO=LL`` in the launcher's env,
sends load, then prints the probe's own summary lines from the server log and a per-phase table
read back from the ``SGL_PROBE_TRACE_DIR`` files. Only the standard library is used here.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from .model import ensure_tiny_model
from .server import SGLangServer
from .venv import HARNESS_DIR, ensure_venv
from .wheel import build_wheel, install_wheel

PROMPTS = ["hello world the quick", "once upon a time there", "brown fox jumps over lazy",
           "speculative decoding scheduler", "tensor parallel request", "the tiny random model said"]


def read_trace_dir(path: Path) -> list[dict]:
    spans = []
    for f in sorted(path.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for sp in ss.get("spans", ()):
                        attrs = {}
                        for kv in sp.get("attributes", ()):
                            val = kv["value"]
                            attrs[kv["key"]] = next(iter(val.values())) if val else None
                        sp["attrs"] = attrs
                        spans.append(sp)
    return spans


def phase_table(spans: list[dict]) -> str:
    groups: dict[tuple, list[float]] = defaultdict(list)
    for sp in spans:
        name = sp["name"]
        if not name.startswith("sglang.") or name == "sglang.step":
            continue
        a = sp["attrs"]
        key = (name[len("sglang."):], a.get("sglang.cuda_graph"), a.get("sglang.tp_rank"))
        groups[key].append(float(a["sgl_probe.duration_ms"]))
    rows = [f"{'phase':<13}{'graph':<7}{'rank':<6}{'count':>7}{'mean ms':>10}{'p50 ms':>9}{'p90 ms':>9}"]
    for (phase, graph, rank), vals in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), str(kv[0][2]))):
        vals.sort()
        p90 = vals[min(len(vals) - 1, int(round(0.9 * (len(vals) - 1))))]
        rows.append(f"{phase:<13}{str(graph):<7}{str(rank):<6}{len(vals):>7}{statistics.fmean(vals):>10.3f}"
                    f"{statistics.median(vals):>9.3f}{p90:>9.3f}")
    return "\n".join(rows)


def main(tp: int = 2, new_tokens: int = 32) -> int:
    t0 = time.monotonic()
    venv = ensure_venv("0.5.23")
    print(f"[demo] SGLang 0.5.23 venv ready: {venv}", flush=True)
    install_wheel(venv, build_wheel(HARNESS_DIR / "demo-wheel"))
    model = ensure_tiny_model(venv)
    trace_dir = HARNESS_DIR / "demo-traces" / time.strftime("%Y%m%d-%H%M%S")
    env = {"NCCL_PROTO": "LL", "SGL_PROBE_SUMMARY_S": "3", "SGL_PROBE_TRACE_DIR": str(trace_dir),
           "SGL_PROBE_RUN_ID": None, "SGL_PROBE_LAUNCHER_ENV": None}
    print(f"[demo] launching sglang.launch_server --tp {tp} with the probe (harness ready after "
          f"{time.monotonic() - t0:.0f}s)", flush=True)
    with SGLangServer(venv, model, tp=tp, env=env, extra_args=("--dtype", "float32")) as server:
        print(f"[demo] server healthy after {server.startup_seconds:.0f}s; sending load", flush=True)
        for text in PROMPTS[:2]:
            server.generate(text, new_tokens, ignore_eos=True)
        server.generate_many(PROMPTS, new_tokens)
        server.generate_many(PROMPTS[:3], new_tokens)
        time.sleep(4)  # one more summary period
        log = server.log_text()
    print("\n[demo] the probe's summary lines from the server log (no collector needed):")
    for line in log.splitlines():
        if "sgl-probe summary" in line:
            print("  " + line)
    spans = read_trace_dir(trace_dir)
    print(f"\n[demo] {len(spans)} spans in {trace_dir}; per phase, graph flag and TP rank:")
    print(phase_table(spans))
    print("\n[demo] env snapshots (NCCL_PROTO as each scheduler saw it):")
    for sp in spans:
        if sp["name"] == "sgl_probe.env_snapshot":
            a = sp["attrs"]
            changed = a.get("sgl_probe.env.differs_from_launcher")
            changed = [v.get("stringValue") for v in changed["values"]] if isinstance(changed, dict) else changed
            print(f"  tp_rank={a.get('sglang.tp_rank')} point={a['sgl_probe.snapshot_point']:<14}"
                  f"NCCL_PROTO={a.get('env.NCCL_PROTO')}  changed since launch: {changed}")
    print(f"\n[demo] done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
