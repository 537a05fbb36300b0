"""``--plot FILE.png``: per-phase duration histograms split by cuda_graph, and a timeline of a few
steps per rank. matplotlib is an optional extra (``pip install 'sgl-probe[report]'``), imported
only here and only when a plot is asked for."""

from __future__ import annotations

import math
from typing import Optional

from sgl_probe.contract import CUDA_GRAPH, PHASES, STEP_INDEX, phase_span
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.keep import TraceKeeper
from sgl_probe.report.model import PHASE_NAMES, STEP
from sgl_probe.stats import percentile

COLORS = {"decode": "#4c72b0", "extend": "#55a868", "draft": "#8172b2", "verify": "#c44e52",
          "draft_extend": "#ccb974"}
TIMELINE_STEPS = 4


class MissingMatplotlib(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingMatplotlib(
            f"--plot needs matplotlib, which is not installed in this Python ({exc}); "
            "install it with: pip install 'sgl-probe[report]'") from None
    return plt


def timeline_traces(keeper: TraceKeeper, n: int = TIMELINE_STEPS) -> list[list]:
    """A few consecutive steps (whatever they ran) starting at a spec step (with a verify), else
    a decode step; from the middle of the kept traces, to skip warm-up."""
    items = []
    for spans in keeper.traces.values():
        steps = [s for s in spans if s.name == STEP]
        if steps:
            idx = steps[0].attrs.get(STEP_INDEX, 0)
            items.append((idx if isinstance(idx, int) else 0, {s.name for s in spans}, spans))
    items.sort(key=lambda it: it[0])
    for want in (phase_span("verify"), phase_span("decode"), None):
        pos = [i for i, it in enumerate(items) if want is None or want in it[1]]
        if pos:
            start = pos[len(pos) // 2]
            return [spans for _, _, spans in items[start:start + n]]
    return []


def write(path: str, agg: Aggregator, keeper: Optional[TraceKeeper], title: str = "") -> str:
    plt = _pyplot()
    phases = [p for p in PHASES if any(k[0] == p for k in agg.groups)]
    ncols = min(3, max(1, len(phases)))
    nrows_h = math.ceil(len(phases) / ncols) if phases else 0
    traces = timeline_traces(keeper) if keeper is not None else []
    nrows = nrows_h + (1 if traces else 0)
    if nrows == 0:
        raise ValueError("nothing to plot: no phase spans")
    fig = plt.figure(figsize=(5 * ncols, 3.2 * nrows), constrained_layout=True)
    grid = fig.add_gridspec(nrows, ncols)
    for i, phase in enumerate(phases):
        ax = fig.add_subplot(grid[i // ncols, i % ncols])
        series = [(g, sorted(agg.values(phase, graph=g))) for g in (True, False)]
        allv = sorted(v for _, vals in series for v in vals)
        lo, hi = allv[0], percentile(allv, 0.995)
        if hi <= lo:
            hi = lo + max(abs(lo) * 0.1, 1e-3)
        bins = [lo + (hi - lo) * k / 40 for k in range(41)]
        for g, vals in series:
            if vals:
                clipped = [min(v, hi) for v in vals]
                ax.hist(clipped, bins=bins, alpha=0.85 if g else 0.5,
                        label=f"{'graph' if g else 'no graph'} (n={len(vals):,})",
                        color=COLORS.get(phase, "#777777"), hatch=None if g else "//",
                        edgecolor="white" if g else "black", linewidth=0.3)
        ax.set_title(f"{phase}")
        ax.set_xlabel("ms (top 0.5 % folded into the last bin)")
        ax.set_ylabel("calls")
        ax.legend(fontsize=8)
    if traces:
        ax = fig.add_subplot(grid[nrows - 1, :])
        spans = [s for tr in traces for s in tr]
        # Each rank from its own first shown step: ranks run the same steps, but their clocks
        # (other hosts) and start times need not agree.
        base: dict = {}
        for s in spans:
            r = agg.rank_of(s)
            base[r] = min(base.get(r, s.start_ns), s.start_ns)
        ranks = sorted(base, key=agg.rank_sort_key)
        ypos = {r: i for i, r in enumerate(ranks)}
        seen = set()
        for s in spans:
            y = ypos[agg.rank_of(s)]
            x0 = (s.start_ns - base[agg.rank_of(s)]) / 1e6
            w = max(0, s.end_ns - s.start_ns) / 1e6
            if s.name == STEP:
                ax.barh(y, w, left=x0, height=0.9, color="none", edgecolor="#333333", linewidth=0.8)
                continue
            phase = PHASE_NAMES.get(s.name)
            if phase is None:
                continue
            graph = s.attrs.get(CUDA_GRAPH) is True
            label = f"{phase}{'' if graph else ' (no graph)'}"
            ax.barh(y, w, left=x0, height=0.6, color=COLORS.get(phase, "#777777"),
                    hatch=None if graph else "//", edgecolor="white" if graph else "black", linewidth=0.3,
                    label=label if label not in seen else None)
            seen.add(label)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([agg.label(r) for r in ranks])
        idxs = sorted({s.attrs.get(STEP_INDEX) for s in spans if s.name == STEP} - {None})
        ax.set_title(f"timeline: steps {idxs[0]}-{idxs[-1]}" if idxs else "timeline")
        ax.set_xlabel("ms since the first shown step began on that rank")
        ax.invert_yaxis()
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=6, frameon=False)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"{len(phases)} histograms" + (f", timeline of {len(traces)} steps" if traces else "")
