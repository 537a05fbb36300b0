"""The first drop of each cause, said once in the server log with the setting that changes it.

The summary line counts every span and step the probe could not deliver, by cause
(``dropped=N (otlp=... pending=...)``), but a count does not say what to do. The SDK's own "queue
is full" line never fires here: the probe hands its batch processors only what fits and counts the
rest. So the first time a cause's count moves, the drain thread logs one line naming that cause's
settings; later drops of the same cause are only counted. (``link``, the exporter process not
taking what the server sends, is said where it happens, beside that process's other lines, in
:mod:`sgl_probe.exporter_process`.)
"""

from __future__ import annotations

from typing import Mapping

from sgl_probe import contract as C
from sgl_probe.sinks import ROOM_WAIT_S

_QUEUE = "OTEL_BSP_MAX_QUEUE_SIZE"

#: cause (a key of ``Pipeline.dropped_by``) -> the line, formatted with the configuration.
HINTS = {
    "pending": ("sgl-probe: steps dropped: more than {max_pending_env}={max_pending} steps waited for the drain "
                "thread, which passes every {drain_env}={drain_s:g} s (pending= on the summary line counts them "
                "from now on). Raise {max_pending_env} above the steps the server runs between two passes, or "
                "lower {drain_env}. Said once."),
    "otlp": ("sgl-probe: spans not delivered over OTLP (otlp= on the summary line counts them from now on): the "
             "collector refused them or was unreachable (OpenTelemetry's own lines say which), or it took them "
             "more slowly than the server made them and their queue stayed full (" + _QUEUE + " spans; a drain "
             "pass, {drain_env}={drain_s:g} s of steps, waits up to {room_wait_s:g} s a message for room in it). A "
             "larger " + _QUEUE + " rides out longer outages; sampling (OTEL_TRACES_SAMPLER) lowers the load. "
             "Said once."),
    "trace_dir": ("sgl-probe: spans not written to the trace dir (trace_dir= on the summary line counts them from "
                  "now on): a file could not be written (a line above says why), or the file system took them "
                  "more slowly than the server made them and their queue stayed full (" + _QUEUE + " spans; a "
                  "drain pass, {drain_env}={drain_s:g} s of steps, waits up to {room_wait_s:g} s a message for "
                  "room in it). Said once."),
}


class DropHints:
    """Which causes have been said; :meth:`new_lines` gives the lines for those seen first now."""

    def __init__(self, max_pending: int, drain_s: float) -> None:
        self._fields = {"max_pending": max_pending, "drain_s": drain_s, "room_wait_s": ROOM_WAIT_S,
                        "max_pending_env": C.ENV_MAX_PENDING, "drain_env": C.ENV_DRAIN_S}
        self._said: set[str] = set()

    def new_lines(self, dropped_by: Mapping[str, int]) -> list[str]:
        lines = []
        for cause, n in dropped_by.items():
            if n > 0 and cause not in self._said and cause in HINTS:
                self._said.add(cause)
                lines.append(HINTS[cause].format(**self._fields))
        return lines
