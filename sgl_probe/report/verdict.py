"""The speculative-decoding break-even math: one implementation, used by ``sgl-probe report`` and by
the live summary line in the server log (:mod:`sgl_probe.summary`). Stdlib only.

With τ the mean accept length (accepted drafts + the bonus token, SGLang's definition), one spec
cycle producing τ tokens per request and one plain decode step producing one:

    T_cycle  = T_draft + T_verify + T_draft_extend + T_other
    S        = τ · T_decode / T_cycle          (speed-up over plain decode; > 1 wins)
    τ*       = T_cycle / T_decode              (break-even accept length)
    T_verify,max = τ · T_decode − (T_cycle − T_verify)   (largest verify that still wins at this τ)

(Leviathan et al. 2023 in measured-phase form; research/anchors.md §7.) When some verifies ran
without a CUDA graph, the what-if replaces the mean verify by a graph verify time: measured on
the verifies that did have a graph, else taken as one graph decode step (a small-batch verify is,
like decode, bound by reading the weights once).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional


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


def _finite(x: Optional[float]) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def evaluate(tau: float, t_decode: float, t_verify: float, t_draft: float = 0.0,
             t_draft_extend: float = 0.0, t_other: float = 0.0, *, decode_graph: bool = True,
             verify_no_graph: Optional[float] = None, verify_graph_ms: Optional[float] = None,
             verify_graph_source: str = "") -> Optional[Verdict]:
    """All times in ms per step (per spec cycle for draft / verify / draft_extend / other).
    Returns None when the inputs cannot give a verdict (no decode time, no τ, empty cycle)."""
    if not (_finite(tau) and _finite(t_decode) and _finite(t_verify)) or tau <= 0 or t_decode <= 0:
        return None
    t_draft = t_draft if _finite(t_draft) else 0.0
    t_draft_extend = t_draft_extend if _finite(t_draft_extend) else 0.0
    t_other = max(0.0, t_other) if _finite(t_other) else 0.0
    cycle = t_draft + t_verify + t_draft_extend + t_other
    if cycle <= 0:
        return None
    speedup = tau * t_decode / cycle
    whatif_ms = whatif = None
    source = ""
    if _finite(verify_no_graph) and verify_no_graph > 0 and _finite(verify_graph_ms) and verify_graph_ms > 0:
        whatif_ms = verify_graph_ms
        source = verify_graph_source or "graph verify"
        whatif = tau * t_decode / (cycle - t_verify + verify_graph_ms)
    return Verdict(
        tau=tau, t_decode=t_decode, t_draft=t_draft, t_verify=t_verify, t_draft_extend=t_draft_extend,
        t_other=t_other, cycle_ms=cycle, speedup=speedup, break_even=cycle / t_decode,
        verify_max_ms=tau * t_decode - (cycle - t_verify), wins=speedup >= 1.0,
        decode_graph=decode_graph, verify_no_graph=verify_no_graph if _finite(verify_no_graph) else None,
        whatif_verify_ms=whatif_ms, whatif_source=source, whatif_speedup=whatif)
