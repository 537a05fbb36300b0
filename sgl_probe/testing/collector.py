"""What arrived from an SGLang server running sgl-probe: env snapshots, phase spans, NCCL confirmations.

:class:`Collector` is what the ``sgl_probe_collector`` fixture hands out: an in-process OTLP
receiver (gRPC and HTTP/protobuf on free loopback ports, see :mod:`sgl_probe.testing.receiver`),
the environment to launch a server with, and waiting/query helpers over the spans of the span
contract (README, "The span contract"). The query functions also work on any list of
:class:`~sgl_probe.testing.receiver.ReceivedSpan` (``env_snapshots(spans)``, ``phase_spans(spans)``,
``nccl_confirmations(spans)``).

    env = collector.launch_env({"NCCL_PROTO": "LL"})
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", ...], env=env)
    snaps = collector.wait_for_env_snapshots(ranks=range(2), at="nccl_init", run_id=env, process=proc)
    assert_env_propagated(snaps, {"NCCL_PROTO": "LL"}, ranks=range(2), at="nccl_init")
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan

__all__ = [
    "Collector",
    "EnvSnapshot",
    "EnvSnapshots",
    "SNAPSHOT_SPAN",
    "SNAPSHOT_POINTS",
    "PHASES",
    "env_snapshots",
    "phase_spans",
    "nccl_confirmations",
    "ServerExited",
    "UNKNOWN",
]

#: Span names and attribute keys of the span contract (README); kept literal here so that this
#: module reads spans exactly as a user's Jaeger query would.
SNAPSHOT_SPAN = "sgl_probe.env_snapshot"
#: ``nccl_confirm``: the extra snapshot sent with ``SGL_PROBE_NCCL_CONFIRM=1`` once NCCL has logged
#: what it read (it carries the ``nccl.confirmed.<VAR>`` attributes).
SNAPSHOT_POINTS = ("process_start", "nccl_init", "nccl_confirm")
PHASES = ("decode", "extend", "draft", "verify", "draft_extend")
STEP_SPAN = "sglang.step"
CONFIRMED_PREFIX = "nccl.confirmed."
RUN_ID_VAR = "SGL_PROBE_RUN_ID"
LAUNCHER_ENV_VAR = "SGL_PROBE_LAUNCHER_ENV"

#: A launch environment must not inherit these from the test process: a run id or a recorded
#: launcher env left there (e.g. because the test process itself imported sglang) would make the
#: new server claim another run's identity and another process's launch environment.
_STALE_PROBE_VARS = (RUN_ID_VAR, LAUNCHER_ENV_VAR)
#: OTEL settings that would send the spans elsewhere, drop them, or reshape them.
_STALE_OTEL_PREFIXES = ("OTEL_EXPORTER_OTLP_", "OTEL_TRACES_", "OTEL_BSP_")
_STALE_OTEL_VARS = ("OTEL_SDK_DISABLED",)

RunFilter = Union[None, str, Mapping[str, str]]
Ranks = Optional[Iterable[int]]


class _Unknown:
    """The launcher's value of a variable when the snapshot carries no launcher information."""

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:
        return False


UNKNOWN = _Unknown()


def _run_id_of(run: RunFilter) -> Optional[str]:
    if run is None:
        return None
    if isinstance(run, str):
        return run
    if isinstance(run, Mapping):
        value = run.get(RUN_ID_VAR)
        if not value:
            raise ValueError(f"run_id: the mapping given has no {RUN_ID_VAR} (pass the dict that "
                             "Collector.env()/launch_env() returned, or the run id itself)")
        return str(value)
    raise TypeError(f"run_id must be a run id string or the env mapping holding {RUN_ID_VAR}, "
                    f"not {type(run).__name__}")


def _rank_set(ranks: Ranks) -> Optional[frozenset]:
    if ranks is None:
        return None
    if isinstance(ranks, (int, str, bytes)):
        raise TypeError(f"ranks must be an iterable of tp ranks such as range(2), not {ranks!r}")
    return frozenset(int(r) for r in ranks)


def _points(at: Union[None, str, Iterable[str]]) -> Optional[tuple[str, ...]]:
    if at is None:
        return None
    points = (at,) if isinstance(at, str) else tuple(at)
    for p in points:
        if p not in SNAPSHOT_POINTS:
            raise ValueError(f"unknown snapshot point {p!r}; the probe sends {', '.join(SNAPSHOT_POINTS)}")
    return points


def _pid(span: ReceivedSpan) -> Optional[int]:
    pid = span.resource.get("process.pid")
    return pid if isinstance(pid, int) else None


def _rank(span: ReceivedSpan, key: str = "sglang.tp_rank") -> Optional[int]:
    value = span.attributes.get(key, span.resource.get(key))
    return value if isinstance(value, int) else None


def _span_run_id(span: ReceivedSpan) -> Optional[str]:
    value = span.resource.get("sgl_probe.run_id")
    return value if isinstance(value, str) else None


def _in_run(spans: Iterable[ReceivedSpan], run: RunFilter) -> list[ReceivedSpan]:
    run_id = _run_id_of(run)
    return [s for s in spans if run_id is None or _span_run_id(s) == run_id]


def _confirmed_in(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k[len(CONFIRMED_PREFIX):]: v for k, v in attributes.items() if k.startswith(CONFIRMED_PREFIX)}


def _process_label(pid: Optional[int], tp_rank: Optional[int], dp_rank: Optional[int] = None,
                   pp_rank: Optional[int] = None) -> str:
    head = "tp_rank ?" if tp_rank is None else f"tp_rank {tp_rank}"
    extra = [f"pid {pid if pid is not None else '?'}"]
    if dp_rank:
        extra.append(f"dp_rank {dp_rank}")
    if pp_rank:
        extra.append(f"pp_rank {pp_rank}")
    return f"{head} ({', '.join(extra)})"


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
        return _process_label(self.pid, self.tp_rank, self.dp_rank, self.pp_rank)

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
        differs = a.get("sgl_probe.env.differs_from_launcher")
        merged = dict(confirmed or {})
        merged.update(_confirmed_in(a))
        return cls(
            pid=_pid(span),
            tp_rank=_rank(span),
            dp_rank=_rank(span, "sglang.dp_rank"),
            pp_rank=_rank(span, "sglang.pp_rank"),
            point=str(a.get("sgl_probe.snapshot_point")),
            env={k[len("env."):]: str(v) for k, v in a.items() if k.startswith("env.")},
            differs_from_launcher=None if differs is None else tuple(str(n) for n in differs),
            launcher_env={k[len("launcher_env."):]: str(v) for k, v in a.items()
                          if k.startswith("launcher_env.")},
            withheld=tuple(str(n) for n in a.get("sgl_probe.env.withheld") or ()),
            run_id=_span_run_id(span),
            service_name=span.resource.get("service.name"),
            trigger=a.get("sgl_probe.snapshot_trigger"),
            dist_backend=a.get("sgl_probe.dist_backend"),
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
        points = _points(point) or ()
        return EnvSnapshots(s for s in self.values() if s.point in points)

    def for_ranks(self, ranks: Ranks) -> "EnvSnapshots":
        wanted = _rank_set(ranks)
        return EnvSnapshots(s for s in self.values() if wanted is None or s.tp_rank in wanted)

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


# -- queries on any span list ---------------------------------------------------------------------


def nccl_confirmations(spans: Iterable[ReceivedSpan], *, ranks: Ranks = None, run_id: RunFilter = None,
                       ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
    """``nccl.confirmed.<VAR>`` attributes per ``(pid, tp_rank)``, from any span or span event.

    Read generically: whichever span of a process carries them (its ``nccl_init`` snapshot or a
    span of its own), they are merged per process; the value is what the probe attached.
    """
    wanted = _rank_set(ranks)
    out: dict[tuple[Optional[int], Optional[int]], dict[str, Any]] = {}
    for span in sorted(_in_run(spans, run_id), key=lambda s: s.start_ns):
        found = _confirmed_in(span.attributes)
        for event in span.events:
            found.update(_confirmed_in(event.get("attributes") or {}))
        if not found:
            continue
        rank = _rank(span)
        if wanted is not None and rank not in wanted:
            continue
        out.setdefault((_pid(span), rank), {}).update(found)
    return out


def env_snapshots(spans: Iterable[ReceivedSpan], *, at: Union[None, str, Iterable[str]] = None,
                  ranks: Ranks = None, run_id: RunFilter = None) -> EnvSnapshots:
    """Decode every ``sgl_probe.env_snapshot`` span (optionally of one point, ranks or run)."""
    spans = _in_run(spans, run_id)
    points = _points(at)
    wanted = _rank_set(ranks)
    confirmed_by_pid: dict[Optional[int], dict[str, Any]] = defaultdict(dict)
    for (pid, _rank_), values in nccl_confirmations(spans).items():
        confirmed_by_pid[pid].update(values)
    snaps = []
    for span in spans:
        if span.name != SNAPSHOT_SPAN:
            continue
        snap = EnvSnapshot.from_span(span, confirmed_by_pid.get(_pid(span)))
        if points is not None and snap.point not in points:
            continue
        if wanted is not None and snap.tp_rank not in wanted:
            continue
        snaps.append(snap)
    return EnvSnapshots(snaps)


def _phase_names(phase: Union[None, str, Iterable[str]]) -> frozenset:
    if phase is None:
        names: Iterable[str] = PHASES
    elif isinstance(phase, str):
        names = (phase,)
    else:
        names = tuple(phase)
    out = set()
    for name in names:
        short = name[len("sglang."):] if name.startswith("sglang.") else name
        if short not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
        out.add("sglang." + short)
    return frozenset(out)


def phase_spans(spans: Iterable[ReceivedSpan], phase: Union[None, str, Iterable[str]] = None, *,
                ranks: Ranks = None, run_id: RunFilter = None, cuda_graph: Optional[bool] = None,
                since_ns: Optional[int] = None) -> list[ReceivedSpan]:
    """Phase spans (``sglang.decode``, ``.extend``, ``.draft``, ``.verify``, ``.draft_extend``).

    ``phase`` takes a name with or without the ``sglang.`` prefix, or several; ``cuda_graph``
    keeps only spans whose ``sglang.cuda_graph`` is that value; ``since_ns`` drops spans that
    started earlier (e.g. startup warmup, when given the time the load began)."""
    names = _phase_names(phase)
    wanted = _rank_set(ranks)
    out = []
    for s in _in_run(spans, run_id):
        if s.name not in names:
            continue
        if wanted is not None and _rank(s) not in wanted:
            continue
        if cuda_graph is not None and s.attributes.get("sglang.cuda_graph") is not cuda_graph:
            continue
        if since_ns is not None and s.start_ns < since_ns:
            continue
        out.append(s)
    return sorted(out, key=lambda s: s.start_ns)


# -- the collector ---------------------------------------------------------------------------------


class ServerExited(RuntimeError):
    """The server process a wait was tied to (``process=``) exited before the condition held."""


class Collector:
    """An OTLP receiver for sgl-probe's spans plus the helpers to launch against it and query it.

    One collector serves a whole test session: every ``env()``/``launch_env()`` call starts a new
    *run* (a fresh ``SGL_PROBE_RUN_ID``), and every query takes ``run_id=`` (the run id, or the
    env dict itself) to look at one server's spans only. Without it, queries see everything.
    """

    def __init__(self, host: str = "127.0.0.1", grpc_port: int = 0, http_port: int = 0,
                 *, receiver: Optional[OTLPReceiver] = None) -> None:
        self._receiver = receiver or OTLPReceiver(host, grpc_port, http_port)
        self.run_ids: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "Collector":
        self._receiver.start()
        return self

    def stop(self) -> None:
        self._receiver.stop()

    def __enter__(self) -> "Collector":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def receiver(self) -> OTLPReceiver:
        return self._receiver

    @property
    def grpc_endpoint(self) -> str:
        return self._receiver.grpc_endpoint

    @property
    def http_endpoint(self) -> str:
        return self._receiver.http_endpoint

    @property
    def errors(self) -> list[str]:
        """One line per payload the receiver rejected (malformed, wrong path or content type)."""
        return list(self._receiver.errors)

    # -- where to send -----------------------------------------------------------------------

    def new_run_id(self) -> str:
        run_id = "test-%s-%s" % (time.strftime("%Y%m%dT%H%M%S"), uuid.uuid4().hex[:8])
        self.run_ids.append(run_id)
        return run_id

    def env(self, protocol: str = "grpc", *, run_id: Optional[str] = None,
            schedule_delay_ms: Optional[int] = 200) -> dict[str, str]:
        """The variables to add to a server's environment so its spans come here.

        ``protocol`` is ``"grpc"`` or ``"http/protobuf"``. Also sets ``SGL_PROBE_RUN_ID`` (fresh
        unless given: a new run) and ``OTEL_BSP_SCHEDULE_DELAY`` (spans arrive within ~0.2 s
        instead of the SDK's 5 s; ``None`` keeps the default)."""
        env = dict(self._receiver.env(protocol))
        env[RUN_ID_VAR] = run_id or self.new_run_id()
        if run_id and run_id not in self.run_ids:
            self.run_ids.append(run_id)
        if schedule_delay_ms is not None:
            env["OTEL_BSP_SCHEDULE_DELAY"] = str(int(schedule_delay_ms))
        return env

    def launch_env(self, extra: Optional[Mapping[str, Optional[str]]] = None, *, protocol: str = "grpc",
                   base: Optional[Mapping[str, str]] = None, run_id: Optional[str] = None,
                   schedule_delay_ms: Optional[int] = 200) -> dict[str, str]:
        """A complete environment for ``subprocess.Popen(..., env=...)``.

        ``base`` (default: this process's environment) without the settings that would misroute
        the spans or fake the launcher (inherited ``OTEL_EXPORTER_OTLP_*``, ``OTEL_TRACES_*``,
        ``OTEL_BSP_*``, ``OTEL_SDK_DISABLED``, ``SGL_PROBE_RUN_ID``, ``SGL_PROBE_LAUNCHER_ENV``),
        then :meth:`env`, then ``extra`` (a ``None`` value removes a variable)."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in _STALE_PROBE_VARS and k not in _STALE_OTEL_VARS
               and not k.startswith(_STALE_OTEL_PREFIXES)}
        env.update(self.env(protocol, run_id=run_id, schedule_delay_ms=schedule_delay_ms))
        for key, value in (extra or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    # -- what arrived ------------------------------------------------------------------------

    def spans(self, name: Optional[str] = None, *, run_id: RunFilter = None) -> list[ReceivedSpan]:
        return _in_run(self._receiver.spans(name), run_id)

    def clear(self) -> None:
        """Forget every span and rejected-payload line received so far."""
        self._receiver.clear()

    def env_snapshots(self, *, at: Union[None, str, Iterable[str]] = None, ranks: Ranks = None,
                      run_id: RunFilter = None) -> EnvSnapshots:
        return env_snapshots(self._receiver.spans(), at=at, ranks=ranks, run_id=run_id)

    def phase_spans(self, phase: Union[None, str, Iterable[str]] = None, *, ranks: Ranks = None,
                    run_id: RunFilter = None, cuda_graph: Optional[bool] = None,
                    since_ns: Optional[int] = None) -> list[ReceivedSpan]:
        return phase_spans(self._receiver.spans(), phase, ranks=ranks, run_id=run_id,
                           cuda_graph=cuda_graph, since_ns=since_ns)

    def step_spans(self, *, ranks: Ranks = None, run_id: RunFilter = None) -> list[ReceivedSpan]:
        wanted = _rank_set(ranks)
        return sorted((s for s in self.spans(STEP_SPAN, run_id=run_id)
                       if wanted is None or _rank(s) in wanted), key=lambda s: s.start_ns)

    def nccl_confirmations(self, *, ranks: Ranks = None, run_id: RunFilter = None,
                           ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
        return nccl_confirmations(self._receiver.spans(), ranks=ranks, run_id=run_id)

    # -- waiting -----------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 120.0, *,
                 process: Any = None, what: str = "the condition", run_id: RunFilter = None,
                 ) -> list[ReceivedSpan]:
        """Block until ``predicate(spans)`` holds (spans of ``run_id`` only, when given).

        ``process`` (anything with ``poll()``, e.g. the server's ``Popen``) ends the wait early
        with :class:`ServerExited` when it exits first. On timeout, ``TimeoutError`` says what did
        arrive and what might be wrong."""
        run = _run_id_of(run_id)
        deadline = time.monotonic() + timeout

        def check(spans: list[ReceivedSpan]) -> bool:
            return predicate(_in_run(spans, run))

        while True:
            remaining = deadline - time.monotonic()
            try:
                spans = self._receiver.wait_for(check, timeout=max(0.0, min(remaining, 0.5)))
                return _in_run(spans, run)
            except TimeoutError:
                pass
            if process is not None:
                rc = process.poll()
                if rc is not None:
                    # One last look: the final export may have landed while the process exited.
                    spans = self._receiver.spans()
                    if check(spans):
                        return _in_run(spans, run)
                    raise ServerExited(f"sgl-probe collector: the server process exited (rc={rc}) before "
                                       f"{what}; {self.describe(run_id=run)}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sgl-probe collector: still waiting for {what} after {timeout:g}s; "
                                   f"{self.describe(run_id=run)}")

    def wait_for_env_snapshots(self, ranks: Iterable[int], *, at: Union[str, Iterable[str]] = "nccl_init",
                               timeout: float = 300.0, run_id: RunFilter = None, process: Any = None,
                               processes: Optional[int] = None) -> EnvSnapshots:
        """Wait until every tp rank in ``ranks`` has sent its snapshot at ``at`` (one point or
        several), and each such process its ``process_start`` snapshot too (it is always sent
        first; the assertion uses it to tell where a variable changed). ``processes``: also wait
        for that many distinct processes (dp / pp deployments have several per tp rank).
        Returns every snapshot of the run, all points included."""
        wanted = _rank_set(ranks)
        if not wanted:
            raise ValueError("ranks: give the tp ranks to wait for, e.g. range(tp_size)")
        points = _points(at) or ()

        def ready(spans: list[ReceivedSpan]) -> bool:
            snaps = env_snapshots(spans)
            for point in points:
                got = [s for s in snaps.values() if s.point == point and s.tp_rank in wanted]
                if {s.tp_rank for s in got} != wanted:
                    return False
                if processes is not None and len({s.pid for s in got}) < processes:
                    return False
                if any(snaps.get_snapshot(s.pid, "process_start") is None for s in got):
                    return False
            return True

        what = (f"env snapshots at {'/'.join(points)} from tp ranks {sorted(wanted)}"
                + (f" ({processes} processes)" if processes else ""))
        spans = self.wait_for(ready, timeout, process=process, what=what, run_id=run_id)
        return env_snapshots(spans)

    def wait_for_phase_spans(self, phase: Union[str, Iterable[str]], *, ranks: Iterable[int],
                             count: int = 1, timeout: float = 120.0, run_id: RunFilter = None,
                             process: Any = None, since_ns: Optional[int] = None) -> list[ReceivedSpan]:
        """Wait until every rank in ``ranks`` has at least ``count`` spans of ``phase`` (each
        phase, when several are given); returns the matching spans of those ranks."""
        wanted = _rank_set(ranks)
        if not wanted:
            raise ValueError("ranks: give the tp ranks to wait for, e.g. range(tp_size)")
        names = sorted(_phase_names(phase))

        def ready(spans: list[ReceivedSpan]) -> bool:
            got = Counter((s.name, _rank(s)) for s in phase_spans(spans, names, ranks=wanted, since_ns=since_ns))
            return all(got[(n, r)] >= count for n in names for r in wanted)

        self.wait_for(ready, timeout, process=process, run_id=run_id,
                      what=f"{count} x {'/'.join(names)} span(s) from each of tp ranks {sorted(wanted)}")
        return self.phase_spans(names, ranks=wanted, run_id=run_id, since_ns=since_ns)

    def wait_for_nccl_confirmations(self, names: Iterable[str], *, ranks: Iterable[int],
                                    timeout: float = 120.0, run_id: RunFilter = None, process: Any = None,
                                    ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
        """Wait until every rank in ``ranks`` carries ``nccl.confirmed.<NAME>`` for every name
        (the probe attaches them only with ``SGL_PROBE_NCCL_CONFIRM=1`` and a real NCCL)."""
        wanted = _rank_set(ranks)
        names = tuple(names)

        def ready(spans: list[ReceivedSpan]) -> bool:
            conf = nccl_confirmations(spans, ranks=wanted)
            per_rank: dict[Optional[int], set] = defaultdict(set)
            for (_pid_, rank), values in conf.items():
                per_rank[rank].update(values)
            return all(set(names) <= per_rank.get(r, set()) for r in wanted or ())

        self.wait_for(ready, timeout, process=process, run_id=run_id,
                      what=f"nccl.confirmed.{{{','.join(names)}}} from tp ranks {sorted(wanted or ())}")
        return self.nccl_confirmations(ranks=wanted, run_id=run_id)

    # -- diagnostics -------------------------------------------------------------------------

    def describe(self, *, run_id: RunFilter = None) -> str:
        """What has arrived (per span name, per process), rejected payloads, and likely causes."""
        run = _run_id_of(run_id)
        everything = self._receiver.spans()
        spans = _in_run(everything, run)
        counts = Counter(s.name for s in spans)
        text = f"received {len(spans)} span(s)"
        if run is not None:
            text += f" of run {run}"
            others = len(everything) - len(spans)
            if others:
                text += f" (and {others} of other runs)"
        if counts:
            text += ": " + ", ".join(f"{name} x{n}" for name, n in counts.most_common())
        snaps = env_snapshots(spans)
        if snaps:
            text += f"; env snapshots: {snaps.describe()}"
        errors = self._receiver.errors
        if errors:
            text += f"; {len(errors)} rejected payload(s), last: {errors[-1]}"
        if not spans:
            text += ("; nothing arrived: is sgl-probe installed in the server's Python (`sgl-probe "
                     "doctor`), SGL_PROBE not 0, and the server started with this collector's env "
                     f"(gRPC {self.grpc_endpoint}, HTTP {self.http_endpoint})?")
        return text

    def __repr__(self) -> str:
        try:
            where = f"grpc={self.grpc_endpoint} http={self.http_endpoint}"
        except RuntimeError:
            where = "not started"
        return f"<sgl_probe Collector {where} spans={len(self._receiver.spans())}>"

    def __iter__(self) -> Iterator[ReceivedSpan]:
        return iter(self._receiver.spans())

