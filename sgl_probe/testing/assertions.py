"""``assert_env_propagated``: did the launcher's variables reach every SGLang scheduler process?

Built only on what the probe exports (docs/span-contract.md, env-snapshot attributes): each scheduler process
sends its environment at ``process_start`` (as it was spawned) and at ``nccl_init`` (just before its
first communicator, when NCCL reads its variables), each with the names whose value differs from
the launcher (``sgl_probe.env.differs_from_launcher``) and the launcher's value
(``launcher_env.<NAME>``). Comparing the two points of one process tells *where* a variable
changed: already at spawn (so the launching process changed it after ``import sglang``, which is
where SGLang applies its own env defaults) or inside the worker before NCCL init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Union

from sgl_probe.testing import fields, names
from sgl_probe.testing.queries import env_snapshots
from sgl_probe.testing.receiver import ReceivedSpan
from sgl_probe.testing.snapshots import UNKNOWN, EnvSnapshot, EnvSnapshots

__all__ = ["assert_env_propagated", "env_propagation_problems", "EnvPropagationError", "EnvProblem"]


def _show(value: Any) -> str:
    if value is UNKNOWN:
        return "unknown"
    return "unset" if value is None else repr(value)


@dataclass(frozen=True)
class EnvProblem:
    """One variable of one process that is not as expected (or a process that sent nothing).

    ``kind``: ``missing_snapshot`` (no snapshot from that rank at that point), ``differs``,
    ``withheld`` (secret-looking name: the probe never exports its value), ``not_confirmed`` /
    ``confirmed_differs`` (with ``nccl_confirmed=True``: NCCL's own log line is missing or says
    otherwise). ``changed_before_spawn``: True when the process already started with the wrong
    value while the launcher had another (the launching process changed it before spawning);
    False when it started as the launcher had it (it changed inside the process), or when the
    launcher never had the expected value; None when that cannot be told.
    """

    kind: str
    point: str
    tp_rank: Optional[int]
    pid: Optional[int] = None
    name: Optional[str] = None
    expected: Optional[str] = None
    actual: Optional[str] = None
    launcher: Any = UNKNOWN
    start_value: Any = UNKNOWN
    changed_before_spawn: Optional[bool] = None
    dp_rank: Optional[int] = None
    pp_rank: Optional[int] = None
    detail: str = ""

    @property
    def process(self) -> str:
        return fields.process_label(self.pid, self.tp_rank, self.dp_rank, self.pp_rank)

    def describe(self) -> str:
        where = f"{self.process} at {self.point}"
        if self.kind == "missing_snapshot":
            return f"tp_rank {self.tp_rank}: no env snapshot at {self.point} arrived{self.detail}"
        if self.kind == "withheld":
            return (f"{where}: {self.name} cannot be compared: its name looks secret, so the probe "
                    "exports only that it is set (sgl_probe.env.withheld)")
        if self.kind in ("not_confirmed", "confirmed_differs"):
            if self.kind == "not_confirmed":
                return (f"{where}: {self.name}={self.expected!r} is in the environment but NCCL did not "
                        f"confirm reading it (no nccl.confirmed.{self.name}){self.detail}")
            return (f"{where}: {self.name}={self.expected!r} is in the environment but NCCL reported "
                    f"{self.actual!r} (nccl.confirmed.{self.name})")
        text = (f"{where}: {self.name} is {_show(self.actual)}, expected {_show(self.expected)}; "
                f"launcher had {_show(self.launcher)}; rewritten before spawning: ")
        if self.launcher is UNKNOWN:
            text += ("unknown (this snapshot carries no launcher env: sgl-probe was not active in the "
                     "process that launched SGLang)")
        elif self.launcher == self.actual:
            text += "no (nothing changed it: the launcher itself never had the expected value)"
        elif self.changed_before_spawn is None:
            text += "unknown (no process_start snapshot from this process)"
        elif self.changed_before_spawn:
            spawned = ("without it" if self.start_value is None
                       else f"with {_show(self.start_value)}")
            text += (f"yes (the process was spawned {spawned}: it was changed in SGLang's launching "
                     "process after `import sglang`, by SGLang's own env setup or other code running "
                     "there)")
        else:
            text += (f"no (the process was spawned with the launcher's {_show(self.start_value)}; it "
                     f"changed inside the process before {self.point})")
        if self.actual is None and not self.name.startswith(names.DEFAULT_ENV_PREFIXES):
            text += (f"; note: {self.name} is not on the probe's default allow-list, so it is only "
                     "captured when listed in SGL_PROBE_ENV_ALLOW")
        return text


class EnvPropagationError(AssertionError):
    """Raised by :func:`assert_env_propagated`; ``problems`` holds the structured findings."""

    def __init__(self, message: str, problems: list[EnvProblem], checked: list[EnvSnapshot]) -> None:
        super().__init__(message)
        self.problems = problems
        self.checked = checked


def _as_snapshots(snapshots: Any) -> EnvSnapshots:
    if isinstance(snapshots, EnvSnapshots):
        return snapshots
    if hasattr(snapshots, "env_snapshots") and callable(snapshots.env_snapshots):  # a Collector
        return snapshots.env_snapshots()
    items = list(snapshots.values() if isinstance(snapshots, Mapping) else snapshots)
    if all(isinstance(i, ReceivedSpan) for i in items):
        return env_snapshots(items)
    if all(isinstance(i, EnvSnapshot) for i in items):
        return EnvSnapshots(items)
    raise TypeError("snapshots: pass what Collector.wait_for_env_snapshots()/env_snapshots() returned, "
                    "the collector itself, or a list of received spans")


def env_propagation_problems(snapshots: Any, expected: Mapping[str, Optional[str]], *,
                             ranks: Optional[Iterable[int]] = None,
                             at: Union[str, Iterable[str]] = "nccl_init",
                             nccl_confirmed: bool = False) -> tuple[list[EnvProblem], list[EnvSnapshot]]:
    """The checks of :func:`assert_env_propagated`, returned instead of raised:
    ``(problems, snapshots checked)``."""
    if not expected:
        raise ValueError("expected: give the variables to check, e.g. {'NCCL_PROTO': 'LL'}")
    snaps = _as_snapshots(snapshots)
    wanted = fields.rank_set(ranks)
    points = fields.snapshot_points(at) or ()
    problems: list[EnvProblem] = []
    checked: list[EnvSnapshot] = []
    for point in points:
        selected = sorted((s for s in snaps.values()
                           if s.point == point and (wanted is None or s.tp_rank in wanted)),
                          key=lambda s: (s.tp_rank is None, s.tp_rank or 0, s.pid or 0))
        seen_ranks = {s.tp_rank for s in selected}
        missing = sorted(wanted - seen_ranks) if wanted is not None else []
        if wanted is None and not selected:
            problems.append(EnvProblem("missing_snapshot", point, None,
                                       detail=f" from any process ({snaps.describe()})"))
        for rank in missing:
            problems.append(EnvProblem("missing_snapshot", point, rank,
                                       detail=f" (received: {snaps.describe()})"))
        for snap in selected:
            checked.append(snap)
            start = snaps.get_snapshot(snap.pid, "process_start")
            common = dict(point=point, tp_rank=snap.tp_rank, pid=snap.pid, dp_rank=snap.dp_rank,
                          pp_rank=snap.pp_rank)
            for name, want in expected.items():
                want = None if want is None else str(want)
                if name in snap.withheld:
                    problems.append(EnvProblem("withheld", name=name, expected=want, **common))
                    continue
                actual = snap.value(name)
                if actual != want:
                    launcher = snap.launcher_value(name)
                    start_value: Any = UNKNOWN if start is None else start.value(name)
                    before: Optional[bool] = None
                    if launcher is not UNKNOWN and launcher != actual and start is not None:
                        before = start_value != launcher
                    elif launcher is not UNKNOWN and launcher == actual:
                        before = False
                    problems.append(EnvProblem("differs", name=name, expected=want, actual=actual,
                                               launcher=launcher, start_value=start_value,
                                               changed_before_spawn=before, **common))
                    continue
                if nccl_confirmed and name.startswith("NCCL_") and want is not None:
                    confirmed = snap.nccl_confirmed.get(name)
                    if confirmed is None:
                        detail = ("; this process sent no nccl.confirmed.* attribute at all (is "
                                  "SGL_PROBE_NCCL_CONFIRM=1 set, and does it use NCCL rather than gloo?)"
                                  if not snap.nccl_confirmed else "")
                        problems.append(EnvProblem("not_confirmed", name=name, expected=want,
                                                   detail=detail, **common))
                    elif str(confirmed) != want:
                        problems.append(EnvProblem("confirmed_differs", name=name, expected=want,
                                                   actual=str(confirmed), **common))
    return problems, checked


def assert_env_propagated(snapshots: Any, expected: Mapping[str, Optional[str]], *,
                          ranks: Optional[Iterable[int]] = None,
                          at: Union[str, Iterable[str]] = "nccl_init",
                          nccl_confirmed: bool = False) -> list[EnvSnapshot]:
    """Assert that every scheduler process of ``ranks`` had ``expected`` in its environment ``at``
    the given snapshot point(s) (``"nccl_init"``, ``"process_start"`` or both).

    ``expected`` maps names to values (``None``: must be unset). ``ranks``: the tp ranks that
    must have reported (default: whatever reported). ``nccl_confirmed=True`` also requires NCCL's
    own confirmation (``nccl.confirmed.<VAR>``) for every ``NCCL_*`` name. Raises
    :class:`EnvPropagationError` (an ``AssertionError``) naming each process, variable, the value
    there and in the launcher, and whether it was rewritten before spawning; returns the
    snapshots checked.
    """
    __tracebackhide__ = True  # pytest shows the caller's line and the message, not this frame
    problems, checked = env_propagation_problems(snapshots, expected, ranks=ranks, at=at,
                                                 nccl_confirmed=nccl_confirmed)
    if not problems:
        return checked
    points = "/".join(fields.snapshot_points(at) or ())
    bad = {(p.pid, p.tp_rank) for p in problems}
    total = {(s.pid, s.tp_rank) for s in checked} | bad
    want = ", ".join(f"{k}={_show(None if v is None else str(v))}" for k, v in expected.items())
    lines = [f"environment not propagated at {points} ({want}): {len(problems)} problem(s) in "
             f"{len(bad)} of {len(total)} scheduler process(es)"]
    lines += ["  " + p.describe() for p in problems]
    ok = sorted({s.label for s in checked if (s.pid, s.tp_rank) not in bad})
    if ok:
        lines.append("  as expected: " + "; ".join(ok))
    raise EnvPropagationError("\n".join(lines), problems, checked)
