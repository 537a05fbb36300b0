"""``SGL_PROBE_*`` settings, validated once per process.

A bad value never stops the server: it costs one log line that names the variable and the
accepted values, and the default is used instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from sgl_probe import hotpath
from sgl_probe.contract import DEFAULT_ENV_ALLOW, ENV_GPU_EVERY_MS

log = logging.getLogger("sgl_probe")

T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    enabled: bool = True
    timer: str = "auto"  # auto | cuda | cpu
    # The CUDA timer times about one step per this many ms on the GPU (runs of four steps, see
    # timing.CudaTimer; 0: every step); the steps between keep host times (timer "host"). 40 rather
    # than 10: on a launch-bound server (~2.6 ms steps) the timer's calls took ~5 µs of the
    # scheduler thread per step at 10 and ~1.4 at 40 (BENCHMARKS.md, h100-32); steps longer than
    # 20 ms are still all timed, 10-20 ms steps half of them.
    gpu_every_ms: float = 40.0
    hotpath: str = "auto"  # auto | c | python (sgl_probe.hotpath)
    trace_dir: str | None = None
    summary_s: float = 30.0
    env_allow: tuple[str, ...] = DEFAULT_ENV_ALLOW
    max_pending: int = 8192
    drain_interval_s: float = 1.0
    idle_flush_s: float = 1.0  # the exporter process's quiet-link flush
    nccl_confirm: bool = False
    metrics: str = "auto"  # auto (what SGLang's --enable-metrics / OTEL_* ask for) | off
    problems: tuple[str, ...] = field(default=(), compare=False)


def _parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        low = raw.strip().lower()
        if low not in choices:
            raise ValueError
        return low

    return parse


def _parse_nonneg_float(raw: str) -> float:
    val = float(raw)
    if not val >= 0 or val == float("inf"):
        raise ValueError
    return val


def _parse_pos_float(raw: str) -> float:
    val = _parse_nonneg_float(raw)
    if val == 0:
        raise ValueError
    return val


def _parse_pos_int(raw: str) -> int:
    val = int(raw)
    if val <= 0:
        raise ValueError
    return val


def _parse_allow(raw: str) -> tuple[str, ...]:
    extra = []
    for item in raw.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        if not all(c.isalnum() or c in "_*" for c in item) or "*" in item[:-1]:
            raise ValueError
        # "FOO*" is a prefix; a bare name matches exactly (stored with a trailing "=").
        extra.append(item[:-1] if item.endswith("*") else item + "=")
    return DEFAULT_ENV_ALLOW + tuple(extra)


def load(environ: Mapping[str, str] | None = None) -> Config:
    """Read the configuration; every problem is logged once and replaced by the default."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    defaults = Config()

    def get(name: str, parse: Callable[[str], T], default: T, accepted: str) -> T:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            return parse(raw)
        except (ValueError, TypeError):
            problems.append(
                f"sgl-probe: ignoring {name}={raw!r}: accepted values are {accepted}; using {default!r}"
            )
            return default

    cfg = Config(
        enabled=get("SGL_PROBE", _parse_bool, True, "1/true/yes/on or 0/false/no/off"),
        timer=get("SGL_PROBE_TIMER", _parse_choice(("auto", "cuda", "cpu")), "auto", "auto, cuda, cpu"),
        gpu_every_ms=get(ENV_GPU_EVERY_MS, _parse_nonneg_float, defaults.gpu_every_ms,
                         "a number of milliseconds >= 0 (0 times every step on the GPU)"),
        hotpath=get("SGL_PROBE_HOTPATH", _parse_choice(hotpath.CHOICES), "auto", ", ".join(hotpath.CHOICES)),
        trace_dir=get("SGL_PROBE_TRACE_DIR", str, None, "a directory path"),
        summary_s=get("SGL_PROBE_SUMMARY_S", _parse_nonneg_float, defaults.summary_s,
                      "a number of seconds >= 0 (0 turns the summary line off)"),
        env_allow=get("SGL_PROBE_ENV_ALLOW", _parse_allow, DEFAULT_ENV_ALLOW,
                      "comma-separated variable names or PREFIX* patterns"),
        max_pending=get("SGL_PROBE_MAX_PENDING", _parse_pos_int, defaults.max_pending, "an integer > 0"),
        drain_interval_s=get("SGL_PROBE_DRAIN_S", _parse_pos_float, defaults.drain_interval_s,
                             "a number of seconds > 0"),
        idle_flush_s=get("SGL_PROBE_IDLE_FLUSH_S", _parse_pos_float, defaults.idle_flush_s,
                         "a number of seconds > 0"),
        nccl_confirm=get("SGL_PROBE_NCCL_CONFIRM", _parse_bool, False, "1/true/yes/on or 0/false/no/off"),
        metrics=get("SGL_PROBE_METRICS", _parse_choice(("auto", "off")), "auto", "auto, off"),
        problems=tuple(problems),
    )
    for line in problems:
        log.warning(line)
    return cfg
