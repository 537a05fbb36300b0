"""What arrived from an SGLang server running sgl-probe: env snapshots, phase spans, NCCL confirmations.

:class:`Collector` is what the ``sgl_probe_collector`` fixture hands out: an in-process OTLP
receiver (gRPC and HTTP/protobuf on free loopback ports, see :mod:`sgl_probe.testing.receiver`),
the environment to launch a server with, and waiting/query helpers over the spans of the span
contract (docs/span-contract.md). The query functions also work on any list of
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
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

from sgl_probe.testing import fields, names
from sgl_probe.testing.queries import env_snapshots, nccl_confirmations, phase_spans
from sgl_probe.testing.receiver import OTLPReceiver, ReceivedSpan
from sgl_probe.testing.snapshots import EnvSnapshots

__all__ = ["Collector", "ServerExited"]

#: A launch environment must not inherit these from the test process: a run id or a recorded
#: launcher env left there (e.g. because the test process itself imported sglang) would make the
#: new server claim another run's identity and another process's launch environment.
_STALE_PROBE_VARS = (names.RUN_ID_VAR, names.LAUNCHER_ENV_VAR)
#: OTEL settings that would send the spans elsewhere, drop them, or reshape them.
_STALE_OTEL_PREFIXES = ("OTEL_EXPORTER_OTLP_", "OTEL_TRACES_", "OTEL_BSP_")
_STALE_OTEL_VARS = ("OTEL_SDK_DISABLED",)


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
        env[names.RUN_ID_VAR] = run_id or self.new_run_id()
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

    def spans(self, name: Optional[str] = None, *, run_id: fields.RunFilter = None) -> list[ReceivedSpan]:
        return fields.in_run(self._receiver.spans(name), run_id)

    def clear(self) -> None:
        """Forget every span and rejected-payload line received so far."""
        self._receiver.clear()

    def env_snapshots(self, *, at: fields.Points = None, ranks: fields.Ranks = None,
                      run_id: fields.RunFilter = None) -> EnvSnapshots:
        return env_snapshots(self._receiver.spans(), at=at, ranks=ranks, run_id=run_id)

    def phase_spans(self, phase: fields.Phases = None, *, ranks: fields.Ranks = None,
                    run_id: fields.RunFilter = None, cuda_graph: Optional[bool] = None,
                    since_ns: Optional[int] = None) -> list[ReceivedSpan]:
        return phase_spans(self._receiver.spans(), phase, ranks=ranks, run_id=run_id,
                           cuda_graph=cuda_graph, since_ns=since_ns)

    def step_spans(self, *, ranks: fields.Ranks = None, run_id: fields.RunFilter = None) -> list[ReceivedSpan]:
        wanted = fields.rank_set(ranks)
        return sorted((s for s in self.spans(names.STEP_SPAN, run_id=run_id)
                       if wanted is None or fields.rank_of(s) in wanted), key=lambda s: s.start_ns)

    def nccl_confirmations(self, *, ranks: fields.Ranks = None, run_id: fields.RunFilter = None,
                           ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
        return nccl_confirmations(self._receiver.spans(), ranks=ranks, run_id=run_id)

    # -- waiting -----------------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 120.0, *,
                 process: Any = None, what: str = "the condition", run_id: fields.RunFilter = None,
                 ) -> list[ReceivedSpan]:
        """Block until ``predicate(spans)`` holds (spans of ``run_id`` only, when given).

        ``process`` (anything with ``poll()``, e.g. the server's ``Popen``) ends the wait early
        with :class:`ServerExited` when it exits first. On timeout, ``TimeoutError`` says what did
        arrive and what might be wrong."""
        run = fields.run_id_of(run_id)
        deadline = time.monotonic() + timeout

        def check(spans: list[ReceivedSpan]) -> bool:
            return predicate(fields.in_run(spans, run))

        while True:
            remaining = deadline - time.monotonic()
            try:
                spans = self._receiver.wait_for(check, timeout=max(0.0, min(remaining, 0.5)))
                return fields.in_run(spans, run)
            except TimeoutError:
                pass
            if process is not None:
                rc = process.poll()
                if rc is not None:
                    # One last look: the final export may have landed while the process exited.
                    spans = self._receiver.spans()
                    if check(spans):
                        return fields.in_run(spans, run)
                    raise ServerExited(f"sgl-probe collector: the server process exited (rc={rc}) before "
                                       f"{what}; {self.describe(run_id=run)}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sgl-probe collector: still waiting for {what} after {timeout:g}s; "
                                   f"{self.describe(run_id=run)}")

    def wait_for_env_snapshots(self, ranks: Iterable[int], *, at: Union[str, Iterable[str]] = "nccl_init",
                               timeout: float = 300.0, run_id: fields.RunFilter = None, process: Any = None,
                               processes: Optional[int] = None) -> EnvSnapshots:
        """Wait until every tp rank in ``ranks`` has sent its snapshot at ``at`` (one point or
        several), and each such process its ``process_start`` snapshot too (it is always sent
        first; the assertion uses it to tell where a variable changed). ``processes``: also wait
        for that many distinct processes (dp / pp deployments have several per tp rank).
        Returns every snapshot of the run, all points included."""
        wanted = fields.rank_set(ranks)
        if not wanted:
            raise ValueError("ranks: give the tp ranks to wait for, e.g. range(tp_size)")
        points = fields.snapshot_points(at) or ()

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
                             count: int = 1, timeout: float = 120.0, run_id: fields.RunFilter = None,
                             process: Any = None, since_ns: Optional[int] = None) -> list[ReceivedSpan]:
        """Wait until every rank in ``ranks`` has at least ``count`` spans of ``phase`` (each
        phase, when several are given); returns the matching spans of those ranks."""
        wanted = fields.rank_set(ranks)
        if not wanted:
            raise ValueError("ranks: give the tp ranks to wait for, e.g. range(tp_size)")
        span_names = sorted(fields.phase_span_names(phase))

        def ready(spans: list[ReceivedSpan]) -> bool:
            got = Counter((s.name, fields.rank_of(s)) for s in phase_spans(spans, span_names, ranks=wanted, since_ns=since_ns))
            return all(got[(n, r)] >= count for n in span_names for r in wanted)

        self.wait_for(ready, timeout, process=process, run_id=run_id,
                      what=f"{count} x {'/'.join(span_names)} span(s) from each of tp ranks {sorted(wanted)}")
        return self.phase_spans(span_names, ranks=wanted, run_id=run_id, since_ns=since_ns)

    def wait_for_nccl_confirmations(self, names: Iterable[str], *, ranks: Iterable[int],
                                    timeout: float = 120.0, run_id: fields.RunFilter = None, process: Any = None,
                                    ) -> dict[tuple[Optional[int], Optional[int]], dict[str, Any]]:
        """Wait until every rank in ``ranks`` carries ``nccl.confirmed.<NAME>`` for every name
        (the probe attaches them only with ``SGL_PROBE_NCCL_CONFIRM=1`` and a real NCCL)."""
        wanted = fields.rank_set(ranks)
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

    def describe(self, *, run_id: fields.RunFilter = None) -> str:
        """What has arrived (per span name, per process), rejected payloads, and likely causes."""
        run = fields.run_id_of(run_id)
        everything = self._receiver.spans()
        spans = fields.in_run(everything, run)
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
