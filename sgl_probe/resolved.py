"""The one shape of a finished, resolved step: what the span builder, the summary line and the
metrics are all fed.

A step is resolved once its timers have completed (GPU events queried, intervals mapped to the
wall clock); from then on nothing needs the timer, the recorder or CUDA, so a resolved step can be
handed to another thread or process as plain data (tuples of ints, floats, strings).
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class ResolvedPhase(NamedTuple):
    phase: str                      # contract.PHASES
    start_ns: int                   # wall clock (epoch ns) of the measured interval
    end_ns: int
    graph: bool                     # a CUDA (or CPU) graph ran
    mode: Optional[str]             # SGLang ForwardMode name
    batch_size: Optional[int]
    num_tokens: Optional[int]
    host_ms: float                  # host (launch) time of the call
    target: str                     # the wrapped SGLang function
    accept_length: Optional[float] = None   # verify only
    start_kind: Optional[str] = None        # contract.START_VALUES, None for the cpu timer
    no_graph_reason: Optional[str] = None   # contract.NO_GRAPH_REASONS, only when graph is False
    error: Optional[str] = None             # "ExceptionType: message" when the call raised
    graph_ms: Optional[float] = None        # from the first CUDA graph launch to the end (contract.GRAPH_MS)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


class ResolvedStep(NamedTuple):
    index: int
    start_ns: int                   # wall clock: earliest of the host call and its phases
    end_ns: int
    mode: Optional[str]
    batch_size: Optional[int]
    num_tokens: Optional[int]
    host_ms: float
    timer: str                      # contract.TIMER_VALUES: "cuda" | "cpu" | "host" (an untimed step)
    phases: tuple                   # tuple[ResolvedPhase, ...]
    error: Optional[str] = None


#: Where a step row keeps its phases (``ResolvedStep.phases``).
PHASES = ResolvedStep._fields.index("phases")
TIMER = ResolvedStep._fields.index("timer")


def to_row(step: ResolvedStep) -> tuple:
    """The plain form :func:`from_row` reads back: what the drain makes of a step (benchmarks and
    tests feed named steps to the code that takes rows)."""
    return tuple(step[:PHASES]) + (tuple(map(tuple, step[PHASES])),) + tuple(step[PHASES + 1:])


def from_row(row: tuple) -> ResolvedStep:
    """A step as the drain thread resolves it and the link carries it (plain tuples in these
    fields' order, its phases too: they pickle in C, where these classes would each cost a
    Python call) back into the named form."""
    if type(row) is ResolvedStep:
        return row
    phases = tuple(map(ResolvedPhase._make, row[PHASES]))
    return ResolvedStep._make(row[:PHASES] + (phases,) + row[PHASES + 1:])
