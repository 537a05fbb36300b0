"""NCCL variables in spawned TP-style workers, as the probe sees them and as NCCL confirms them.

    python3 benchmarks/gpu_nccl.py [--out DIR]      (needs >= 2 GPUs; uses all it finds)

The launcher sets NCCL_PROTO=LL and NCCL_ALGO=Ring (and keeps NVLink multicast off:
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), then starts one
worker per GPU with ``multiprocessing`` spawn, as SGLang starts its schedulers. Each worker builds
the probe (the real table's ``torch.distributed.init_process_group`` row plus the benchmark's
scheduler rows), constructs its scheduler (identity -> ``process_start`` snapshot), initialises
NCCL (``nccl_init`` snapshot; with SGL_PROBE_NCCL_CONFIRM=1 NCCL's own log goes to a probe-owned
file), runs probed steps on its GPU and times a 4 KB all-reduce. Spans go to a real OTLP receiver
in a child process.

Scenarios:
  launcher_env  the launcher's NCCL_PROTO/NCCL_ALGO reach every worker and NCCL confirms them
  late_env      nothing in the launcher; each worker sets NCCL_PROTO=LL only after NCCL init:
                present in the env, not confirmed by NCCL
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import gpu_common as gc

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def log(msg: str) -> None:
    print("[gpu_nccl %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def _fake_nccl_log(path: str, scenario: str) -> None:
    """--smoke only (no NCCL on a CPU box): write what NCCL 2.28 writes, so the probe's side of
    the confirm mode runs end to end."""
    lines = ["host:%d:%d [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0." % (os.getpid(), os.getpid())]
    if scenario == "launcher_env":
        lines += ["host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
                  "host:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL"]
    lines.append("host:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 2 - Init COMPLETE")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def worker(rank: int, world: int, scenario: str, smoke: bool, q, go) -> None:
    # The worker's own stdout/stderr go to files the launcher inspects ("does NCCL flood them?").
    out_dir = os.environ["GPU_NCCL_STDIO_DIR"]
    fd = os.open(os.path.join(out_dir, "%s.rank%d.stdio" % (scenario, rank)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    res: dict = {"rank": rank, "pid": os.getpid()}
    try:
        import torch
        import torch.distributed as dist

        from sgl_probe.targets import TARGETS

        dev = torch.device("cpu") if smoke else torch.device("cuda", rank)
        if not smoke:
            torch.cuda.set_device(rank)
        sync = (lambda: None) if smoke else torch.cuda.synchronize
        tag = "nccl_%s" % scenario
        H, L = 1024, 16
        dt = torch.float32 if smoke else torch.bfloat16
        Ws = [torch.randn(H, H, device=dev, dtype=dt) * 0.02 for _ in range(L)]
        x = torch.randn(3, H, device=dev, dtype=dt)

        def eager():
            y = x
            for W in Ws:
                y = torch.nn.functional.silu(y @ W)
            return y

        cls = gc.make_variant(tag, eager, None)
        nccl_rows = tuple(t for t in TARGETS if t.module == "torch.distributed")
        probe = gc.make_probe(tag, {k: v for k, v in os.environ.items()
                                    if k.startswith(("OTEL_", "SGL_PROBE_"))},
                              targets=nccl_rows + gc.bench_table(tag))
        res["env_before_init"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        sched = cls(None, tp_rank=rank, gpu_id=rank)  # identity: ranks -> process_start snapshot
        if smoke:
            dist.init_process_group("gloo", rank=rank, world_size=world)
            if probe.nccl_confirmer is not None:
                _fake_nccl_log(probe.nccl_confirmer.path, scenario)
        else:
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
        t = torch.ones(1024, device=dev)  # 4 KB
        dist.all_reduce(t)
        sync()
        res["allreduce_sum_ok"] = bool(t[0].item() == world)
        if scenario == "late_env":
            os.environ["NCCL_PROTO"] = "LL"  # after NCCL init: NCCL never reads it
        for _ in range(5):
            dist.all_reduce(t)
        lat = []
        for _ in range(5):
            sync()
            t0 = time.perf_counter()
            if smoke:
                for _ in range(20):
                    dist.all_reduce(t)
                lat.append((time.perf_counter() - t0) / 20 * 1e6)
                continue
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(200):
                dist.all_reduce(t)
            b.record()
            torch.cuda.synchronize()
            lat.append(a.elapsed_time(b) / 200 * 1e3)
        res["allreduce_4KB_us_median"] = statistics.median(lat)
        batch = gc.Batch(gc.ForwardMode.TARGET_VERIFY, 3)
        first = probe.recorder.step_count + 1
        for _ in range(20):
            sched.run_batch(batch)
            dist.all_reduce(t)
        sync()
        res["steps"] = [first, probe.recorder.step_count]
        res["timer"] = getattr(probe.recorder.timer, "kind", None)
        conf = probe.nccl_confirmer
        if conf is not None:
            res["confirm_done"] = conf.done.wait(20)
            res["nccl_log"] = conf.path
            try:
                text = open(conf.path, errors="replace").read()
                res["nccl_log_bytes"] = len(text)
                res["nccl_log_set_lines"] = [ln.split("NCCL INFO ", 1)[-1] for ln in text.splitlines()
                                             if "set by environment" in ln]
            except OSError as exc:
                res["nccl_log_error"] = str(exc)
        probe.pipeline.flush()
    except Exception:
        res["error"] = traceback.format_exc()[-3000:]
    q.put(res)
    go.wait(120)  # stay alive (contexts held) until the launcher has looked at nvidia-smi
    try:
        import torch.distributed as dist

        dist.destroy_process_group()
    except Exception:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nvidia_smi_apps() -> list:
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
    except Exception as exc:
        return [{"error": repr(exc)}]
    bus_to_idx = {}
    for line in gpus.strip().splitlines():
        idx, bus = [x.strip() for x in line.split(",")]
        bus_to_idx[bus] = int(idx)
    out = []
    for line in apps.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3:
            out.append({"pid": int(parts[0]) if parts[0].isdigit() else parts[0],
                        "gpu": bus_to_idx.get(parts[1], parts[1]), "used_memory": parts[2]})
    return out


def run_scenario(scenario: str, world: int, rcv: gc.ReceiverProcess, stdio_dir: str, smoke: bool) -> dict:
    import torch.multiprocessing as mp

    from sgl_probe import config, envsnap
    from sgl_probe.activate import ensure_run_id

    saved = dict(os.environ)
    try:
        for k in list(os.environ):
            if k.startswith(("NCCL_", "SGL_PROBE_")) and k not in NO_MULTICAST:
                os.environ.pop(k)
        os.environ.update(NO_MULTICAST)
        os.environ.update(rcv.env())
        os.environ.update({"SGL_PROBE_NCCL_CONFIRM": "1", "SGL_PROBE_SUMMARY_S": "0", "SGL_PROBE_DRAIN_S": "0.05",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                           "GPU_NCCL_STDIO_DIR": stdio_dir})
        if scenario == "launcher_env":
            os.environ.update({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
        os.environ.pop(envsnap.LAUNCHER_ENV_VAR, None)
        # What SGLang's launcher process does once it imports sglang (and the probe activates):
        # one run id for every worker, and the launch environment to diff the workers against.
        ensure_run_id()
        envsnap.record_launcher_env(config.load().env_allow)
        ctx = mp.get_context("spawn")
        q, go = ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=worker, args=(r, world, scenario, smoke, q, go)) for r in range(world)]
        for p in procs:
            p.start()
        results = []
        for _ in procs:
            results.append(q.get(timeout=300))
        apps = [] if smoke else nvidia_smi_apps()
        go.set()
        for p in procs:
            p.join(60)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    results.sort(key=lambda r: r["rank"])
    for r in results:
        path = os.path.join(stdio_dir, "%s.rank%d.stdio" % (scenario, r["rank"]))
        try:
            text = open(path, errors="replace").read()
        except OSError:
            text = ""
        r["stdio_bytes"] = len(text)
        r["stdio_nccl_info_lines"] = sum("NCCL INFO" in ln for ln in text.splitlines())
        r["stdio_tail"] = text[-600:]
        mine = [a for a in apps if a.get("pid") == r["pid"]]
        r["gpus_with_context"] = sorted({a["gpu"] for a in mine})
    return {"workers": results, "nvidia_smi_apps": apps}


def check(scenario: str, res: dict, spans: list) -> dict:
    out: dict = {"per_rank": []}
    ok = True
    step_traces: dict = {}
    for w in res["workers"]:
        pid, rank = w["pid"], w["rank"]
        env_spans = {s["attributes"].get("sgl_probe.snapshot_point"): s["attributes"] for s in spans
                     if s["pid"] == pid and s["name"] == "sgl_probe.env_snapshot"}
        start, init, conf = env_spans.get("process_start", {}), env_spans.get("nccl_init", {}), \
            env_spans.get("nccl_confirm", {})
        row = {"rank": rank, "pid": pid, "error": w.get("error"),
               "snapshots": sorted(k for k in env_spans if k),
               "process_start.env.NCCL_PROTO": start.get("env.NCCL_PROTO"),
               "nccl_init.env.NCCL_PROTO": init.get("env.NCCL_PROTO"),
               "nccl_init.env.NCCL_ALGO": init.get("env.NCCL_ALGO"),
               "nccl_confirm.env.NCCL_PROTO": conf.get("env.NCCL_PROTO"),
               "nccl.confirmed": {k[len("nccl.confirmed."):]: v for k, v in conf.items()
                                  if k.startswith("nccl.confirmed.")},
               "nccl.not_confirmed": conf.get("sgl_probe.nccl.not_confirmed"),
               "nccl.status": conf.get("sgl_probe.nccl.status"),
               "nccl.set_by_probe": conf.get("sgl_probe.nccl.set_by_probe"),
               "confirm_env_has_probe_debug_vars": any(k.startswith("env.NCCL_DEBUG") for k in conf),
               "differs_from_launcher": conf.get("sgl_probe.env.differs_from_launcher"),
               "tp_rank_attr": init.get("sglang.tp_rank"),
               "stdio_nccl_info_lines": w.get("stdio_nccl_info_lines"),
               "allreduce_4KB_us_median": w.get("allreduce_4KB_us_median"),
               "gpus_with_context": w.get("gpus_with_context")}
        if scenario == "launcher_env":
            good = (row["nccl_init.env.NCCL_PROTO"] == "LL" and row["nccl_init.env.NCCL_ALGO"] == "Ring"
                    and row["nccl.confirmed"].get("NCCL_PROTO") == "LL"
                    and row["nccl.confirmed"].get("NCCL_ALGO") == "Ring")
        else:
            good = (row["nccl_init.env.NCCL_PROTO"] is None and row["nccl_confirm.env.NCCL_PROTO"] == "LL"
                    and "NCCL_PROTO" not in row["nccl.confirmed"]
                    and "NCCL_PROTO" in (row["nccl.not_confirmed"] or []))
        good = good and w.get("error") is None and row["stdio_nccl_info_lines"] == 0 \
            and not row["confirm_env_has_probe_debug_vars"] and row["nccl.status"] == "init_complete"
        row["pass"] = good
        ok = ok and good
        out["per_rank"].append(row)
        lo, hi = w.get("steps", [0, -1])
        for s in spans:
            if s["pid"] == pid and s["name"] == "sglang.step" and lo <= s["attributes"]["sglang.step_index"] <= hi:
                step_traces.setdefault(s["attributes"]["sglang.step_index"], set()).add((rank, s["trace_id"]))
    ranks = {w["rank"] for w in res["workers"]}
    shared = [len({t for _, t in v}) == 1 and {r for r, _ in v} == ranks for v in step_traces.values()]
    out["steps_with_all_ranks_one_trace_id"] = sum(shared)
    out["steps_seen"] = len(step_traces)
    out["pass"] = ok and bool(shared) and all(shared)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.gettempdir())
    ap.add_argument("--smoke", action="store_true", help="2 CPU workers, gloo, a fake NCCL log: checks the logic")
    args = ap.parse_args()
    import torch

    world = 2 if args.smoke else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    path = os.path.join(args.out, "gpu_nccl.json")
    result: dict = {"meta": {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                             "versions": gc.versions(), "world": world,
                             "smoke": args.smoke,
                             "nccl": None if args.smoke or not world else ".".join(map(str, torch.cuda.nccl.version())),
                             "devices": ["cpu"] * world if args.smoke else
                             [torch.cuda.get_device_name(i) for i in range(world)]}}
    if world < 2:
        result["skipped"] = "needs >= 2 GPUs, found %d" % world
        json.dump(result, open(path, "w"), indent=1)
        log(result["skipped"])
        return
    stdio_dir = tempfile.mkdtemp(prefix="gpu_nccl_stdio_")
    rcv = gc.ReceiverProcess(os.path.join(tempfile.gettempdir(), "gpu_nccl_spans_%d.jsonl" % os.getpid()))
    try:
        for scenario in ("launcher_env", "late_env"):
            t0 = time.perf_counter()
            try:
                res = run_scenario(scenario, world, rcv, stdio_dir, args.smoke)
                time.sleep(0.5)
                res["check"] = check(scenario, res, rcv.spans())
            except Exception:
                res = {"error": traceback.format_exc()[-3000:]}
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            result[scenario] = res
            json.dump(result, open(path, "w"), indent=1, default=str)
            log("%s: %s" % (scenario, json.dumps(res.get("check", res.get("error")), default=str)[:3000]))
    finally:
        rcv.close()
        json.dump(result, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
