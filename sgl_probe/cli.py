"""``sgl-probe``: ``doctor`` (which targets resolve in the installed SGLang, and its run
fingerprint), ``run`` (any command with the probe active through PYTHONPATH, like
``opentelemetry-instrument``), ``report`` (phase table, speculative verdict, stragglers,
Jaeger/Perfetto files from spans) and ``diff`` (what differs between two runs)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence


def startup_dir() -> str:
    """The directory holding the PYTHONPATH ``sitecustomize.py``: ``_sgl_probe_startup/`` beside
    the installed startup module, else a source checkout's ``sitecustomize/``."""
    import importlib.util

    spec = importlib.util.find_spec("_sgl_probe_arm")
    if spec is not None and spec.origin:
        installed = os.path.join(os.path.dirname(spec.origin), "_sgl_probe_startup")
        if os.path.isfile(os.path.join(installed, "sitecustomize.py")):
            return installed
    package = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(package), "sitecustomize")


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        import _sgl_probe_arm
    except ImportError:  # used from a source tree without the startup module: nothing is armed
        pass
    else:
        _sgl_probe_arm.disarm()  # inspect SGLang without instrumenting this process
    from sgl_probe.activate import sglang_version
    from sgl_probe.instrument import check_targets

    from sgl_probe import config, envsnap

    # Before SGLang is imported: it sets variables of its own (e.g. CUDA_CACHE_PATH) at import.
    launcher, _ = envsnap.snapshot(config.load().env_allow)
    version = sglang_version()
    if version is None:
        msg = "sglang is not installed in this Python (%s)" % sys.executable
        if args.json:
            print(json.dumps({"sglang_version": None, "targets": [], "error": msg}))
        else:
            print("sgl-probe doctor: " + msg)
        return 2
    rows = check_targets(version=version)
    missing = [r for r in rows if r["expected"] and not r["resolved"]]
    from sgl_probe import fingerprint

    # What a server launched from this shell records, less its command line.
    fp = fingerprint.collect(argv=(), launcher_env=launcher, full=args.full, import_torch=True)
    if args.json:
        print(json.dumps({"sglang_version": version, "targets": rows, "fingerprint": fp}, indent=1))
    else:
        print(f"sgl-probe doctor: SGLang {version} ({sys.executable})")
        width = max(len(r["target"]) for r in rows) if rows else 10
        for r in rows:
            state = "resolved" if r["resolved"] else "MISSING"
            note = "" if r["expected"] else "  (not expected in this version)"
            print(f"  {r['phase']:<13} {r['target']:<{width}}  {state}{note}")
            if r.get("error"):
                print(f"  {'':<13} ! {r['error']}")
        print(f"{len(rows) - len(missing)} resolved, {len(missing)} missing")
        from sgl_probe.fingerprint import text_lines

        print("fingerprint (what a server started from this shell records; see `sgl-probe diff`):")
        for line in text_lines(fp):
            print("  " + line)
    return 1 if missing else 0



def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("sgl-probe run: give a command, e.g. sgl-probe run -- python -m sglang.launch_server ...",
              file=sys.stderr)
        return 2
    from sgl_probe import config, envsnap
    from sgl_probe.activate import ensure_run_id

    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = startup_dir() + (os.pathsep + path if path else "")
    ensure_run_id(env)
    envsnap.record_launcher_env(config.load(env).env_allow, env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"sgl-probe run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


def cmd_report(args: argparse.Namespace) -> int:
    from sgl_probe.report.command import run as run_report

    return run_report(args)


def cmd_diff(args: argparse.Namespace) -> int:
    from sgl_probe.report.diff import run as run_diff

    return run_diff(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="sgl-probe", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    doc = sub.add_parser("doctor", help="show which SGLang targets resolve in this environment, and its run fingerprint")
    doc.add_argument("--json", action="store_true", help="print JSON instead of a table")
    doc.add_argument("--full", action="store_true",
                     help="hash every SGLang file against its wheel's RECORD (default: only files "
                          "changed since install, told by size and inode change time)")
    doc.set_defaults(func=cmd_doctor)
    run = sub.add_parser("run", help="run a command with the probe active (PYTHONPATH sitecustomize)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(func=cmd_run)
    rep = sub.add_parser(
        "report", help="summarise spans: phase table, spec-decoding verdict, stragglers, Jaeger/Perfetto files, plots",
        description="Summarise sgl-probe spans: per-phase table (x cuda_graph, batch size, rank), the "
                    "speculative-decoding break-even verdict, same-step stragglers, env snapshots; optionally "
                    "Jaeger JSON, Perfetto and PNG files. Exit status: 0 report printed (input problems, if any, "
                    "named on stderr); 2 nothing to report, bad usage or a file that cannot be written; 3 --plot "
                    "without matplotlib.")
    from sgl_probe.report.options import add_arguments  # argparse only; the report code loads in cmd_report

    add_arguments(rep)
    rep.set_defaults(func=cmd_report)
    dif = sub.add_parser(
        "diff", help="what differs between two runs: env per rank, patched SGLang files, server args, versions, GPUs",
        description="Compare the run fingerprints and env snapshots of two runs (trace folders, OTLP/JSON or "
                    "Jaeger JSON files). Exit status: 0 no difference, 1 differences, 2 an input without "
                    "sgl-probe env or fingerprint spans.")
    from sgl_probe.report.options import add_diff_arguments

    add_diff_arguments(dif)
    dif.set_defaults(func=cmd_diff)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
