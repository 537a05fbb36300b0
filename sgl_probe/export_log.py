"""The exporter process's log: one line per kind of trouble, not one per batch.

While a collector is down, OpenTelemetry's OTLP exporters log every retry and every failed batch
(two lines every few seconds, for as long as the outage lasts) and the exporter process's stderr
is the server's log. Here the first line of each kind (logger, level and message template, so
lines that differ only in the retry delay or the error details are one kind) goes through; the
repeats within :data:`EVERY_S` are counted, and the next one after that says how many were left
out. The probe's own lines pass untouched: they already say things once.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable

#: Seconds between two lines of the same kind.
EVERY_S = 60.0

#: The loggers whose repeats are thinned (the SDK's exporters and batch processor).
NOISY = ("opentelemetry",)


class RepeatFilter(logging.Filter):
    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._kinds: dict[tuple, list] = {}  # kind -> [time of the last line let through, left out since]

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        seen = self._kinds.get(kind)
        if seen is None:
            if len(self._kinds) >= 256:  # message templates are few; never grow without bound
                self._kinds.clear()
            self._kinds[kind] = [now, 0]
            return True
        if now - seen[0] < self.every_s:
            seen[1] += 1
            return False
        if seen[1]:
            record.msg = "%s [%d more like this in the last %.0f s]" % (record.msg, seen[1], now - seen[0])
        seen[0], seen[1] = now, 0
        return True


def install(formatter: logging.Formatter, every_s: float = EVERY_S) -> None:
    """The SDK's loggers to stderr in the probe's format, thinned."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(RepeatFilter(every_s))
    for name in NOISY:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False
