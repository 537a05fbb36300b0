"""Per-span readers and the argument checks shared by the testing API's queries."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

from sgl_probe.testing import names
from sgl_probe.testing.receiver import ReceivedSpan

RunFilter = Union[None, str, Mapping[str, str]]
Ranks = Optional[Iterable[int]]
Points = Union[None, str, Iterable[str]]
Phases = Union[None, str, Iterable[str]]


def run_id_of(run: RunFilter) -> Optional[str]:
    """``run_id=`` takes the run id or the env dict that ``Collector.env()`` returned."""
    if run is None:
        return None
    if isinstance(run, str):
        return run
    if isinstance(run, Mapping):
        value = run.get(names.RUN_ID_VAR)
        if not value:
            raise ValueError(f"run_id: the mapping given has no {names.RUN_ID_VAR} (pass the dict that "
                             "Collector.env()/launch_env() returned, or the run id itself)")
        return str(value)
    raise TypeError(f"run_id must be a run id string or the env mapping holding {names.RUN_ID_VAR}, "
                    f"not {type(run).__name__}")


def rank_set(ranks: Ranks) -> Optional[frozenset]:
    if ranks is None:
        return None
    if isinstance(ranks, (int, str, bytes)):
        raise TypeError(f"ranks must be an iterable of tp ranks such as range(2), not {ranks!r}")
    return frozenset(int(r) for r in ranks)


def snapshot_points(at: Points) -> Optional[tuple[str, ...]]:
    if at is None:
        return None
    points = (at,) if isinstance(at, str) else tuple(at)
    for p in points:
        if p not in names.SNAPSHOT_POINTS:
            raise ValueError(f"unknown snapshot point {p!r}; the probe sends {', '.join(names.SNAPSHOT_POINTS)}")
    return points


def phase_span_names(phase: Phases) -> frozenset:
    """Span names for ``phase``: one name or several, with or without the ``sglang.`` prefix."""
    if phase is None:
        wanted: Iterable[str] = names.PHASES
    elif isinstance(phase, str):
        wanted = (phase,)
    else:
        wanted = tuple(phase)
    out = set()
    for name in wanted:
        short = name[len(names.PHASE_SPAN_PREFIX):] if name.startswith(names.PHASE_SPAN_PREFIX) else name
        if short not in names.PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(names.PHASES)}")
        out.add(names.PHASE_SPAN_PREFIX + short)
    return frozenset(out)


def pid_of(span: ReceivedSpan) -> Optional[int]:
    pid = span.resource.get("process.pid")
    return pid if isinstance(pid, int) else None


def rank_of(span: ReceivedSpan, key: str = names.TP_RANK) -> Optional[int]:
    value = span.attributes.get(key, span.resource.get(key))
    return value if isinstance(value, int) else None


def span_run_id(span: ReceivedSpan) -> Optional[str]:
    value = span.resource.get(names.RUN_ID)
    return value if isinstance(value, str) else None


def in_run(spans: Iterable[ReceivedSpan], run: RunFilter) -> list[ReceivedSpan]:
    run_id = run_id_of(run)
    return [s for s in spans if run_id is None or span_run_id(s) == run_id]


def confirmed_in(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """``nccl.confirmed.<VAR>`` attributes as VAR -> value."""
    prefix = names.CONFIRMED_PREFIX
    return {k[len(prefix):]: v for k, v in attributes.items() if k.startswith(prefix)}


def process_label(pid: Optional[int], tp_rank: Optional[int], dp_rank: Optional[int] = None,
                  pp_rank: Optional[int] = None) -> str:
    """``tp_rank 1 (pid 27585)``, the way failure messages name a scheduler process."""
    head = "tp_rank ?" if tp_rank is None else f"tp_rank {tp_rank}"
    extra = [f"pid {pid if pid is not None else '?'}"]
    if dp_rank:
        extra.append(f"dp_rank {dp_rank}")
    if pp_rank:
        extra.append(f"pp_rank {pp_rank}")
    return f"{head} ({', '.join(extra)})"
