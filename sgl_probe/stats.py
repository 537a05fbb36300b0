"""Robust statistics, the warm-up rule and the speculative-decoding break-even verdict: one
implementation, used live by the summary line in the server log (:mod:`sgl_probe.summary`) and
offline by ``sgl-probe report``. Stdlib only; imports nothing from the package.

Warm-up. On a real GPU server the first call of every new shape pays for JIT-compiled kernels,
Triton autotuning and lazy allocations: 0.1-14 s against a steady 1-30 ms. A few such calls
make means 10-60x the medians and decide a verdict on their own. So:

- a call is *warm-up* when it is the first call of its shape (:func:`shape_key`: phase, forward
  mode, batch size, graph, token-count bucket) on its rank and took more than
  ``WARMUP_FACTOR`` x the median of that shape's other calls and at least ``WARMUP_MIN_MS``
  more (:func:`is_warmup`); warm-up calls are counted and left out of the statistics;
- the verdict's per-phase times are medians (:data:`VERDICT_STATISTIC`), so what the first rule
  misses (a second slow call, a stall) cannot decide it either.

The verdict. With τ the mean accept length (accepted drafts + the bonus token, SGLang's
definition), one spec cycle producing τ tokens per request and one plain decode step producing
one:

    T_cycle  = T_draft + T_verify + T_draft_extend + T_other
    S        = τ · T_decode / T_cycle          (speed-up over plain decode; > 1 wins)
    τ*       = T_cycle / T_decode              (break-even accept length)
    T_verify,max = τ · T_decode − (T_cycle − T_verify)   (largest verify that still wins at this τ)

(Leviathan et al. 2023, in measured-phase form.) When some verifies ran without a CUDA graph,
the what-if replaces the verify by a graph verify time: measured on the verifies that did have
a graph, else taken as one graph decode step (a small-batch verify is, like decode, bound by
reading the weights once).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Optional, Sequence

#: A first call is warm-up only when it is this many times its shape's median ...
WARMUP_FACTOR = 3.0
#: ... and at least this much slower: scheduler jitter on a busy host must not count as warm-up.
WARMUP_MIN_MS = 100.0
WARMUP_RULE = (f"a shape's first call (phase, mode, batch size, graph, tokens; per rank) taking "
               f"> {WARMUP_FACTOR:g}x the shape's median and >= {WARMUP_MIN_MS:g} ms more")
#: What the verdict's per-phase times are.
VERDICT_STATISTIC = "median"


# -- order statistics -------------------------------------------------------------------------

def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when empty)."""
    if not sorted_vals:
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[idx]


def median(values: Iterable[float]) -> float:
    """The middle value (mean of the two middle ones for an even count); NaN when empty."""
    vals = sorted(values)
    n = len(vals)
    if not n:
        return float("nan")
    mid = n // 2
    return vals[mid] if n % 2 else (vals[mid - 1] + vals[mid]) / 2


def describe(values: Iterable[float]) -> dict:
    """count, sum, mean, p50, p90, p99, max (ms) of one group of durations."""
    vals = sorted(values)
    n = len(vals)
    total = math.fsum(vals)
    nan = float("nan")
    return {"count": n, "sum_ms": total, "mean_ms": total / n if n else nan,
            "p50_ms": percentile(vals, 0.5), "p90_ms": percentile(vals, 0.9),
            "p99_ms": percentile(vals, 0.99), "max_ms": vals[-1] if n else nan}


def bucket(n: Optional[int]) -> str:
    """Power-of-two bucket of a count: 1, 2, 3-4, 5-8, 9-16, ... ("?" when unknown)."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        return "?"
    if n <= 2:
        return str(n)
    hi = 1 << (n - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


def bucket_order(label: str) -> int:
    if label == "?":
        return 1 << 40
    return int(label.split("-")[0])


# -- warm-up --------------------------------------------------------------------------------------

def token_class(num_tokens: Optional[int]) -> Optional[int]:
    """Power-of-two class of a token count (1, 2, 3-4, 5-8, ... -> 0, 1, 2, 3, ...)."""
    if type(num_tokens) is not int or num_tokens <= 0:
        return None
    return (num_tokens - 1).bit_length()


def shape_key(phase: str, mode: Optional[str], batch_size: Optional[int], graph: bool,
              num_tokens: Optional[int]) -> tuple:
    """What a kernel is compiled / autotuned for, as far as a span tells. Token counts go in as
    a power-of-two class: a prefill's length varies every call, its kernels' variants do not."""
    return (phase, mode, batch_size, graph, token_class(num_tokens))


def is_warmup(ms: float, reference_ms: Optional[float]) -> bool:
    """Whether a first call of ``ms`` is warm-up against its shape's median ``reference_ms``
    (None / NaN: nothing to compare with, so it is not)."""
    if reference_ms is None or reference_ms != reference_ms:
        return False
    return ms > WARMUP_FACTOR * reference_ms and ms - reference_ms >= WARMUP_MIN_MS


# -- the verdict ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    tau: float
    t_decode: float
    t_draft: float
    t_verify: float
    t_draft_extend: float
    t_other: float
    cycle_ms: float
    speedup: float
    break_even: float
    verify_max_ms: float
    wins: bool
    decode_graph: bool
    verify_no_graph: Optional[float] = None  # fraction of verify steps that ran without a graph
    whatif_verify_ms: Optional[float] = None
    whatif_source: str = ""
    whatif_speedup: Optional[float] = None

    @property
    def decode_label(self) -> str:
        return "graph decode" if self.decode_graph else "eager decode (no graph decode seen)"

    def short(self) -> str:
        """The live summary line's tail: ``spec 0.69× vs graph decode (τ 2.0, break-even 2.9;
        verify had no graph in 100 % of steps)``."""
        kind = "graph" if self.decode_graph else "eager"
        tail = ""
        if self.verify_no_graph is not None:
            tail = f"; verify had no graph in {100 * self.verify_no_graph:.0f} % of steps"
        return (f"spec {self.speedup:.2f}× vs {kind} decode (τ {self.tau:.1f}, "
                f"break-even {self.break_even:.1f}{tail})")

    def sentence(self) -> str:
        """Whether spec decoding beats the baseline, and what would have to change."""
        parts = []
        if self.wins:
            parts.append(f"Speculative decoding wins: {self.speedup:.2f}× {self.decode_label} "
                         f"(τ {self.tau:.2f} ≥ break-even {self.break_even:.2f}).")
        else:
            parts.append(f"Speculative decoding loses: {self.speedup:.2f}× {self.decode_label} "
                         f"(τ {self.tau:.2f} < break-even {self.break_even:.2f}).")
        if self.whatif_speedup is not None and self.verify_no_graph:
            verb = ("would win by" if self.whatif_speedup >= 1 else "would still lose at")
            if self.wins:
                verb = "would reach"
            parts.append(f"Verify ran without a CUDA graph in {100 * self.verify_no_graph:.0f} % of "
                         f"steps; at graph speed ({self.whatif_verify_ms:.1f} ms, {self.whatif_source}) "
                         f"it {verb} {self.whatif_speedup:.2f}×.")
        if self.wins:
            parts.append(f"It keeps winning while verify stays under {self.verify_max_ms:.1f} ms "
                         f"(now {self.t_verify:.1f} ms) and τ above {self.break_even:.2f}.")
        elif self.verify_max_ms > 0:
            parts.append(f"To win at τ {self.tau:.2f}, verify must take under {self.verify_max_ms:.1f} ms "
                         f"(now {self.t_verify:.1f} ms), or τ must reach {self.break_even:.2f}.")
        else:
            parts.append(f"Even a free verify would not win at τ {self.tau:.2f}: draft + draft_extend + "
                         f"other already take {self.cycle_ms - self.t_verify:.1f} ms ≥ τ × decode "
                         f"({self.tau * self.t_decode:.1f} ms); τ must reach {self.break_even:.2f}.")
        return " ".join(parts)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["short"] = self.short()
        out["sentence"] = self.sentence()
        return out


def finite(x: Optional[float]) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def evaluate(tau: float, t_decode: float, t_verify: float, t_draft: float = 0.0,
             t_draft_extend: float = 0.0, t_other: float = 0.0, *, decode_graph: bool = True,
             verify_no_graph: Optional[float] = None, verify_graph_ms: Optional[float] = None,
             verify_graph_source: str = "") -> Optional[Verdict]:
    """All times in ms per step (per spec cycle for draft / verify / draft_extend / other).
    Returns None when the inputs cannot give a verdict (no decode time, no τ, empty cycle)."""
    if not (finite(tau) and finite(t_decode) and finite(t_verify)) or tau <= 0 or t_decode <= 0:
        return None
    t_draft = t_draft if finite(t_draft) else 0.0
    t_draft_extend = t_draft_extend if finite(t_draft_extend) else 0.0
    t_other = max(0.0, t_other) if finite(t_other) else 0.0
    cycle = t_draft + t_verify + t_draft_extend + t_other
    if cycle <= 0:
        return None
    speedup = tau * t_decode / cycle
    whatif_ms = whatif = None
    source = ""
    if finite(verify_no_graph) and verify_no_graph > 0 and finite(verify_graph_ms) and verify_graph_ms > 0:
        whatif_ms = verify_graph_ms
        source = verify_graph_source or "graph verify"
        whatif = tau * t_decode / (cycle - t_verify + verify_graph_ms)
    return Verdict(
        tau=tau, t_decode=t_decode, t_draft=t_draft, t_verify=t_verify, t_draft_extend=t_draft_extend,
        t_other=t_other, cycle_ms=cycle, speedup=speedup, break_even=cycle / t_decode,
        verify_max_ms=tau * t_decode - (cycle - t_verify), wins=speedup >= 1.0,
        decode_graph=decode_graph, verify_no_graph=verify_no_graph if finite(verify_no_graph) else None,
        whatif_verify_ms=whatif_ms, whatif_source=source, whatif_speedup=whatif)
