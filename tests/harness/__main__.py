"""``python -m tests.harness build [VERSION ...]``: prebuild venvs and the tiny model.
``python -m tests.harness demo``: the main job (see demo.py).

Run from the repo root. Defaults to every known version. The model is always
built with the 0.5.23 venv (see model.py), so that venv is built too.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .model import ensure_tiny_model
from .venv import HARNESS_DIR, VERSIONS, ensure_venv

MODEL_BUILDER_VERSION = "0.5.23"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.harness")
    sub = ap.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser("build", help="build the harness venvs and the tiny model")
    # no argparse `choices`: with nargs="*" it rejects the empty default on 3.11
    build.add_argument("versions", nargs="*", default=list(VERSIONS),
                       help=f"sglang versions (default: all of {', '.join(VERSIONS)})")
    sub.add_parser("demo", help="plain and EAGLE-3 SGLang servers side by side with the probe: phases, graph flag, env check, report verdict")
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from .demo import main as demo_main

        return demo_main()
    unknown = [v for v in args.versions if v not in VERSIONS]
    if unknown:
        ap.error(f"unknown version(s) {unknown}; known: {', '.join(VERSIONS)}")

    print(f"harness dir: {HARNESS_DIR}")
    t_all = time.monotonic()
    versions = list(dict.fromkeys([MODEL_BUILDER_VERSION, *args.versions]))

    def build_one(version: str) -> None:
        t0 = time.monotonic()
        venv = ensure_venv(version)
        print(f"venv {version}: {venv} ({time.monotonic() - t0:.0f}s)", flush=True)

    # Side by side: each build waits on downloads much of its time (~1.5 min saved on a
    # fresh 2-core CI machine); each venv has its own lock and log.
    with ThreadPoolExecutor(max_workers=len(versions)) as pool:
        for done in [pool.submit(build_one, v) for v in versions]:
            done.result()
    t0 = time.monotonic()
    model = ensure_tiny_model(HARNESS_DIR / f"venv-{MODEL_BUILDER_VERSION}")
    print(f"model: {model} ({time.monotonic() - t0:.0f}s)")
    print(f"total: {time.monotonic() - t_all:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
