"""The benchmark side of ``sitecustomize.py`` in this folder (benchmark-only): find a server's
scheduler processes and pause or resume the probe's recording in them."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _group(pgid: int):
    """(pid, /proc stat fields after the command name, command line) of each process of group
    ``pgid``. The command name (stat field 2) may hold spaces, so the fields are split after it:
    the group is field 5, index 2 here."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path("/proc", entry, "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:
                continue
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        yield int(entry), fields, cmdline


def role_of(title: bytes, cmdline: bytes) -> str:
    """``scheduler``, ``exporter`` (the probe's exporter process) or ``other`` (launcher,
    tokenizer, detokenizer), from a process's title (first argv entry) and whole command line."""
    if title.startswith(b"sglang::scheduler"):
        return "scheduler"
    if b"sgl_probe.exporter_main" in cmdline:
        return "exporter"
    return "other"


def _role(cmdline: bytes) -> str:
    return role_of(cmdline.split(b"\0")[0], cmdline)


def scheduler_pids(pgid: int) -> list[int]:
    """Processes of process group ``pgid`` that SGLang titled ``sglang::scheduler...``."""
    return sorted(pid for pid, _, cmdline in _group(pgid) if _role(cmdline) == "scheduler")


def group_cpu_s(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) the processes of group ``pgid`` have used, summed by
    :func:`role_of`. Differences of two calls give what each role spent in between."""
    out = {"scheduler": 0.0, "exporter": 0.0, "other": 0.0}
    for _, fields, cmdline in _group(pgid):
        out[_role(cmdline)] += _stat_cpu_s(fields)
    return out


def _stat_cpu_s(fields: list) -> float:
    """User + system CPU seconds from a /proc ``stat`` line's fields after the command name."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_times(pid: int) -> dict[int, tuple[float, float, int, int]]:
    """Per thread of ``pid``: (CPU seconds, seconds runnable but waiting for a CPU, voluntary and
    involuntary context switches). A thread of a CPU-bound process that sleeps instead (switches
    voluntarily) is waiting on something: for a scheduler thread that only ever blocks on the
    GPU, the GIL is what another thread of its process can make it wait for. CPU time is the
    kernel's schedstat (ns) where it keeps one, else the stat ticks (no runqueue time then)."""
    out: dict[int, tuple[float, float, int, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for entry in tids:
        task = Path("/proc", str(pid), "task", entry)
        try:
            run_ns, wait_ns, _ = (int(x) for x in (task / "schedstat").read_text().split())
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            status = (task / "status").read_text()
        except (OSError, ValueError):
            continue
        cpu = run_ns / 1e9 if run_ns else _stat_cpu_s(fields)
        switches = {k: int(v) for k, _, v in (line.partition(":") for line in status.splitlines())
                    if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")}
        out[int(entry)] = (cpu, wait_ns / 1e9, switches.get("voluntary_ctxt_switches", 0),
                           switches.get("nonvoluntary_ctxt_switches", 0))
    return out


def thread_use(before: dict, after: dict, pid: int, seconds: float) -> dict[str, float]:
    """What :func:`thread_times` says happened in between, per second of ``seconds``: the main
    thread's (SGLang's scheduler loop) share on a CPU, waiting for one and asleep (the rest), its
    switches per second, and the CPU of every other thread together and of the busiest one."""
    def delta(tid: int) -> tuple:
        a, b = before.get(tid), after.get(tid)
        return tuple(y - x for x, y in zip(a, b)) if a and b else (0.0, 0.0, 0, 0)

    main = delta(pid)
    others = [delta(t)[0] for t in after if t != pid]
    return {"main_cpu": main[0] / seconds, "main_runq": main[1] / seconds,
            "main_asleep": max(0.0, 1.0 - (main[0] + main[1]) / seconds),
            "main_vcsw_per_s": main[2] / seconds, "main_ivcsw_per_s": main[3] / seconds,
            "others_cpu": sum(others) / seconds, "busiest_other_cpu": max(others, default=0.0) / seconds}


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format (``0-3,8,10-11``)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def siblings(cpu: int, sysfs: Path = Path("/sys/devices/system/cpu")) -> set[int]:
    """The logical CPUs of ``cpu``'s physical core, itself included (itself alone where the
    kernel does not say)."""
    try:
        return parse_cpu_list((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()) or {cpu}
    except (OSError, ValueError):
        return {cpu}


def scheduler_core(cpus: set[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> set[int]:
    """CPUs to give a scheduler process to itself: the first physical core of ``cpus`` whose
    logical CPUs all lie in ``cpus`` and leave some for the rest, or two CPUs where a core has
    only one (the drain thread gets a CPU beside the scheduler thread either way)."""
    order = sorted(cpus)
    for cpu in order:
        core = siblings(cpu, sysfs)
        if len(core) > 1 and core <= cpus and cpus - core:
            return core
    return set(order[:2]) if len(order) > 2 else set(order[:1])


def pin_scheduler(pgid: int, cpus: set[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> dict:
    """Every thread of group ``pgid``'s scheduler processes onto :func:`scheduler_core`, every
    other thread of the group onto the rest of ``cpus``. A launch-bound scheduler is on-CPU all
    the time, and what it gets done depends on what shares its physical core: this makes that
    the same for every server measured. Threads started later inherit their creator's CPUs."""
    core = scheduler_core(cpus, sysfs)
    rest = (cpus - core) or cpus
    pinned = {"scheduler": 0, "other": 0}
    for pid, _, cmdline in _group(pgid):
        role = "scheduler" if _role(cmdline) == "scheduler" else "other"
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, core if role == "scheduler" else rest)
                pinned[role] += 1
            except OSError:
                pass
    return {"scheduler_cpus": sorted(core), "other_cpus": sorted(rest), "threads": pinned}


def state(folder: Path, pid: int) -> str | None:
    try:
        return (folder / str(pid)).read_text()
    except OSError:
        return None


def gc_stats(folder: Path, pid: int) -> dict | None:
    """The process's garbage collections at its latest flip (``sitecustomize``): ``count`` and
    ``seconds`` per generation and the wall time ``t``; None before the first flip."""
    try:
        return json.loads((folder / f"{pid}.gc").read_text())
    except (OSError, ValueError):
        return None


def own_time(g0: dict | None, g1: dict | None, steps: float | None = None) -> dict | None:
    """The probe's own time between two flips (``SGL_BENCH_SELF_TIME``; :func:`gc_stats` of each):
    ``probe_self`` µs per scheduler step, ``hooked_calls`` per step, ``probe_self:<target>`` for
    each wrapper called in between, ``timer_call:<name>`` µs and ``timer_calls:<name>`` calls per
    step for each of the CUDA timer's driver-facing calls (part of ``probe_self``), and
    ``section:<name>`` / ``sections:<name>`` likewise for the C wrappers' sections where the
    extension was built with them (``SGL_PROBE_SECTION_TIMES``), and ``drain:<name>`` /
    ``drains:<name>`` for the drain thread's stretches between two GIL hand-overs (``hold``,
    ``hold_cpu``, ``hold_over_<N>us``: µs and stretches per step), and ``pmu:<name>`` the scheduler
    thread's hardware counts per step (``SGL_BENCH_PMU``). Steps as the
    shim counted them, else ``steps`` (e.g. from the token rate); None without totals or steps."""
    a, b = (g0 or {}).get("self_ns"), (g1 or {}).get("self_ns")
    if not a or not b:
        return None
    n = (b[3] - a[3] if len(a) > 3 and len(b) > 3 else 0) or steps
    if not n or n <= 0:
        return None
    out = {"probe_self": ((b[0] - a[0]) - (b[1] - a[1])) / n / 1e3, "hooked_calls": (b[2] - a[2]) / n}
    before = (g0 or {}).get("self_by_target") or {}
    for name, (o1, i1, calls) in ((g1 or {}).get("self_by_target") or {}).items():
        o0, i0, c0 = before.get(name, (0, 0, 0))
        if calls > c0:
            out["probe_self:" + name] = ((o1 - o0) - (i1 - i0)) / n / 1e3
    for field, key in (("self_timer_calls", "timer_call"), ("self_sections", "section"), ("self_drain", "drain")):
        before = (g0 or {}).get(field) or {}
        for name, (ns1, c1) in ((g1 or {}).get(field) or {}).items():
            ns0, c0 = before.get(name, (0, 0))
            if c1 > c0:
                out[f"{key}:{name}"] = (ns1 - ns0) / n / 1e3
                out[f"{key}s:{name}"] = (c1 - c0) / n
    before = (g0 or {}).get("self_pmu") or {}
    for name, (v1, f1) in ((g1 or {}).get("self_pmu") or {}).items():
        v0, f0 = before.get(name, (None, 0))
        if v0 is not None and f1 > f0:
            out["pmu:" + name] = (v1 - v0) / n  # counts per step, not µs
    return out


def set_recording(pids: list[int], recording: bool, folder: Path, timeout: float = 10.0) -> None:
    """Flip every scheduler whose reported state differs, then wait until all report it."""
    want = "recording" if recording else "paused"
    for pid in pids:
        now = state(folder, pid)
        if now == "no-probe":
            continue
        # Never flipped yet means recording (the probe starts armed).
        if (now or "recording") != want:
            os.kill(pid, signal.SIGUSR2)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        states = {pid: state(folder, pid) for pid in pids}
        if all(s in (want, "no-probe") or (s is None and recording) for s in states.values()):
            return
        time.sleep(0.02)
    raise TimeoutError(f"schedulers did not report {want!r}: {states}")
