"""gpu_bench section capture: graph-capture safety, each case in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gpu_common as gc
from gpu_bench_env import log


def section_capture(timeout_s: float) -> dict:
    out = {}
    script = os.path.join(gc.HERE, "gpu_capture_check.py")
    for case in ("phase_in_capture", "timing_event_in_capture_control", "drain_during_capture",
                 "drain_during_capture_unrelaxed_control"):
        try:
            p = subprocess.run([sys.executable, script, case], capture_output=True, text=True, timeout=timeout_s)
            line = [x for x in p.stdout.splitlines() if x.startswith("{")]
            out[case] = json.loads(line[-1]) if line else {"rc": p.returncode, "stderr_tail": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            out[case] = {"error": "timeout"}
        log("capture %s: %s" % (case, out[case]))
    return out
