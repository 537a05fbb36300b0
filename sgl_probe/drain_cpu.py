"""Where the drain thread runs (``SGL_PROBE_DRAIN_CPU``).

``any``: where the OS puts it. ``scheduler``: before each pass, on the CPU the recording thread
(SGLang's scheduler thread) last ran on. Under the GIL the two threads run Python one at a time
anyway, so sharing a CPU costs the scheduler no parallelism it had; what it can save is the
hand-over between two CPUs (waking an idle CPU, or an idle vCPU through the hypervisor, each time
the GIL changes hands) and reading the step records out of another core's caches. Linux only;
anywhere this cannot work it logs one line and stays off.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

log = logging.getLogger("sgl_probe")

#: ``/proc/.../stat``: field 39, "processor", counted from the first field after the command name.
_PROCESSOR = 39 - 3


def last_cpu(tid: int) -> int:
    """The CPU thread ``tid`` of this process last ran on."""
    with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
        data = fh.read()
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    return int(data[data.rindex(b")") + 2:].split()[_PROCESSOR])


class FollowScheduler:
    """Called on the drain thread before each pass with the recording thread's native id."""

    def __init__(self) -> None:
        self.cpu: Optional[int] = None
        self.home: Optional[set] = None  # the drain thread's own mask, put back if this turns off
        self.enabled = hasattr(os, "sched_setaffinity")
        if not self.enabled:
            log.warning("sgl-probe: SGL_PROBE_DRAIN_CPU=scheduler needs Linux; the drain thread runs anywhere")

    def __call__(self, tid: Optional[int]) -> None:
        if not self.enabled or tid is None:
            return
        try:
            if self.home is None:
                self.home = os.sched_getaffinity(0)
            cpu = last_cpu(tid)
            if cpu != self.cpu:
                # Only a CPU the scheduler thread may use itself (its own mask, which SGLang or the
                # operator may have narrowed after this thread started).
                if cpu in os.sched_getaffinity(tid):
                    os.sched_setaffinity(0, {cpu})
                    self.cpu = cpu
        except Exception as exc:
            self.enabled = False
            log.warning("sgl-probe: SGL_PROBE_DRAIN_CPU=scheduler turned off: %r", exc)
            try:
                if self.home:
                    os.sched_setaffinity(0, self.home)
            except Exception:
                pass
