"""Env snapshots as the testing API hands them out: one ``sgl_probe.env_snapshot`` span, decoded."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from sgl_probe.testing import fields, names
from sgl_probe.testing.receiver import ReceivedSpan

__all__ = ["EnvSnapshot", "EnvSnapshots", "UNKNOWN"]


class _Unknown:
    """The launcher's value of a variable when the snapshot carries no launcher information."""

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:
        return False


UNKNOWN = _Unknown()


def _strip(attributes: Mapping[str, Any], prefix: str) -> dict[str, str]:
    return {k[len(prefix):]: str(v) for k, v in attributes.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class EnvSnapshot:
    """One ``sgl_probe.env_snapshot`` span, decoded.

    ``env`` holds every captured variable (``env.<NAME>`` attributes); a name missing from it was
    unset in that process, or not on the probe's allow-list (``NCCL_*``, ``CUDA_*``, ``TORCH_*``,
    ``SGLANG_*``, ``OMP_*``, ``PYTORCH_*`` and ``SGL_PROBE_ENV_ALLOW``). ``differs_from_launcher`` is
    None when the snapshot carries no launcher information at all (the launching process did not
    run sgl-probe); ``launcher_env`` holds the launcher's value of each differing name it had.
    """

    pid: Optional[int]
    tp_rank: Optional[int]
    point: str
    env: dict[str, str]
    differs_from_launcher: Optional[tuple[str, ...]]
    launcher_env: dict[str, str]
    withheld: tuple[str, ...] = ()
    dp_rank: Optional[int] = None
    pp_rank: Optional[int] = None
    run_id: Optional[str] = None
    service_name: Optional[str] = None
    trigger: Optional[str] = None
    dist_backend: Optional[str] = None
    #: ``nccl.confirmed.<VAR>`` attributes of this process (from any of its spans), VAR -> value.
    nccl_confirmed: dict[str, Any] = field(default_factory=dict)
    time_ns: int = 0
    span: Optional[ReceivedSpan] = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[Optional[int], Optional[int], str]:
        return (self.pid, self.tp_rank, self.point)

    @property
    def label(self) -> str:
        return fields.process_label(self.pid, self.tp_rank, self.dp_rank, self.pp_rank)

    def value(self, name: str) -> Optional[str]:
        """The variable's value in this process at this point; None when unset (or not captured)."""
        return self.env.get(name)

    def launcher_value(self, name: str) -> Union[None, str, _Unknown]:
        """The launcher's value (None: unset there), or ``UNKNOWN`` without launcher information."""
        if self.differs_from_launcher is None:
            return UNKNOWN
        if name in self.differs_from_launcher:
            return self.launcher_env.get(name)
        return self.env.get(name)  # not listed as different: the launcher had the same

    @classmethod
    def from_span(cls, span: ReceivedSpan, confirmed: Optional[Mapping[str, Any]] = None) -> "EnvSnapshot":
        a = span.attributes
        differs = a.get(names.ENV_DIFFERS)
        merged = dict(confirmed or {})
        merged.update(fields.confirmed_in(a))
        return cls(
            pid=fields.pid_of(span),
            tp_rank=fields.rank_of(span),
            dp_rank=fields.rank_of(span, names.DP_RANK),
            pp_rank=fields.rank_of(span, names.PP_RANK),
            point=str(a.get(names.SNAPSHOT_POINT)),
            env=_strip(a, names.ENV_PREFIX),
            differs_from_launcher=None if differs is None else tuple(str(n) for n in differs),
            launcher_env=_strip(a, names.LAUNCHER_ENV_PREFIX),
            withheld=tuple(str(n) for n in a.get(names.ENV_WITHHELD) or ()),
            run_id=fields.span_run_id(span),
            service_name=span.resource.get("service.name"),
            trigger=a.get(names.SNAPSHOT_TRIGGER),
            dist_backend=a.get(names.DIST_BACKEND),
            nccl_confirmed=merged,
            time_ns=span.start_ns,
            span=span,
        )


class EnvSnapshots(dict):
    """Env snapshots keyed by ``(pid, tp_rank, point)``; the latest one wins for a repeated key."""

    def __init__(self, snapshots: Iterable[EnvSnapshot] = ()) -> None:
        super().__init__()
        for snap in sorted(snapshots, key=lambda s: s.time_ns):
            self[snap.key] = snap

    def at(self, point: Union[str, Iterable[str]]) -> "EnvSnapshots":
        points = fields.snapshot_points(point) or ()
        return EnvSnapshots(s for s in self.values() if s.point in points)

    def for_rank(self, tp_rank: int) -> list[EnvSnapshot]:
        return sorted((s for s in self.values() if s.tp_rank == tp_rank), key=lambda s: (s.pid or 0, s.point))

    def ranks(self) -> list[int]:
        return sorted({s.tp_rank for s in self.values() if s.tp_rank is not None})

    def pids(self) -> list[int]:
        return sorted({s.pid for s in self.values() if s.pid is not None})

    def get_snapshot(self, pid: Optional[int], point: str) -> Optional[EnvSnapshot]:
        """The snapshot of process ``pid`` at ``point`` (whatever rank it reported)."""
        found = [s for s in self.values() if s.pid == pid and s.point == point]
        return found[-1] if found else None

    def describe(self) -> str:
        """One line per process: which points arrived."""
        by_proc: dict[tuple, list[str]] = defaultdict(list)
        labels = {}
        for s in self.values():
            by_proc[(s.pid, s.tp_rank)].append(s.point)
            labels[(s.pid, s.tp_rank)] = s.label
        if not by_proc:
            return "no env snapshot"
        return "; ".join(f"{labels[k]}: {', '.join(sorted(v))}"
                         for k, v in sorted(by_proc.items(), key=lambda kv: (kv[0][1] is None, kv[0][1], kv[0][0] or 0)))
