"""Pairs of several overhead_ab calls judged as one: the recording / paused ratio of every pair of
the named servers, median and 95 % bootstrap interval (as ``device.ab_judge``'s ``all_pairs``).

One call's interval on the tiny server is ~+-3 % (the host's speed wanders between windows), so
servers running the same in-process code are pooled across calls::

    python3 benchmarks/gpu_sglang/pool.py benchmarks/results r21:ab_ref_0 r26:ab_probe_0 r27:ab_probe_0

``TAG:cross`` takes an overhead_cross call's cross pairs instead (``r37_probe:cross`` reads
``gpu_sglang_r37_probe_overhead_cross.json``): kinds measured on different server pairs, whose
medians differ by more than one call's interval even for the same code (run h200-14).
``TAG:control`` takes the pairs of that call's control (``--control-pairs``: neither server
records, the windows labelled as if they flipped). ``TAG:stream`` and ``TAG:stream_control`` are
the same from the windows' streamed rates (calls after r133: counted as they arrived, which a request
running across a flip does not blur; see ``device.stream_tokens``). Where every pick is ``cross``
(or every pick ``stream``) and some call
has a control, the output adds the controls pooled (``control``: the estimator's own bias, with
``control_from``, the calls it came from) and ``over_control``: every recording pair's median over
the control pairs' median, resampling both, which takes out a bias the estimator has on that host.
A call without a control borrows the others': pick one machine's calls, the control run in the
first and the warm calls after it spent on recording pairs alone (~40 a call instead of ~22).

``--over PICK...`` after the picks compares two settings measured in the same calls, each on its
own server pair (``r128_selfsparse:cross ... --over r128_self:cross ...``): ``over`` is the picks'
median pair ratio over the others', resampling both (the two kinds' pairs interleave in time on
one host, so what the host does to both divides out)::

    python3 benchmarks/gpu_sglang/pool.py benchmarks/results r128_selfsparse:cross r129_selfsparse:cross \
        --over r128_self:cross r129_self:cross

``ci95`` resamples pairs as if every pair were independent; ``ci95_by_server`` resamples the
picks first (each a server or a server pair, with its own speed), then pairs within each, so it
carries the spread between servers too: the interval to judge a target by.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import analysis  # noqa: E402


def load_result(path: Path) -> dict:
    """A result file, or its gzipped copy (``NAME.json.gz``: how result files over 100 KB are kept)."""
    if path.exists():
        return json.loads(path.read_text())
    with gzip.open(path.with_name(path.name + ".gz"), "rt") as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def cross_result(results: Path, tag: str) -> dict:
    """One overhead_cross call's result, read once where both its pairs and its control are used."""
    return load_result(results / f"gpu_sglang_{tag}_overhead_cross.json")


# The overhead_cross picks: the window rate each reads (``device.REQUESTS`` or ``device.STREAM``) and
# the pick of its control, None for a control itself.
CROSS = {"cross": ("", "control"), "control": ("", None), "stream": ("_stream", "stream_control"),
         "stream_control": ("_stream", None)}


def pair_ratios(results: Path, tag: str, server: str) -> list[float]:
    if server in CROSS:
        import device

        by, control = CROSS[server]
        res = cross_result(results, tag)
        if control is None:
            res = res.get("control") or {}
        return device.cross_ratios(res.get("windows") or [], by)
    windows = load_result(results / f"gpu_sglang_{tag}_overhead_ab.json")["windows"][server]
    return analysis.pair_ratios(windows)


def pool(results: Path, picks: list[str], over: list[str] | None = None) -> dict:
    """``picks``: ``TAG:SERVER`` entries (e.g. ``r27:ab_probe_0``); ``over``: picks to compare them
    with (``over`` in the output, see the module's text)."""
    groups = {pick: pick_ratios(results, pick) for pick in picks}
    every = [r for g in groups.values() for r in g]
    out = {**median_of(every), "ci95_by_server": by_server_ci([g for g in groups.values() if g]), "pairs": len(every),
           "pairs_by_server": {pick: len(g) for pick, g in groups.items()}}
    kinds = {pick.partition(":")[2] for pick in picks}
    control = CROSS.get(kinds.pop(), (None, None))[1] if len(kinds) == 1 else None
    if control is not None:
        controls = {pick: pair_ratios(results, pick.partition(":")[0], control) for pick in picks}
        pooled = [r for g in controls.values() for r in g]
        if pooled:
            out["control"] = {**median_of(pooled), "pairs": len(pooled),
                              "control_from": [pick for pick, g in controls.items() if g]}
            out["over_control"] = analysis.bootstrap_ratio(pooled, every)
    if over:
        others = [r for pick in over for r in pick_ratios(results, pick)]
        out["over"] = dict(pairs_over(others, every), pairs=[len(every), len(others)], picks=list(over))
    return out


def pick_ratios(results: Path, pick: str) -> list[float]:
    """The pair ratios of one ``TAG:SERVER`` pick."""
    return pair_ratios(results, *pick.partition(":")[::2])


def median_of(ratios: list[float]) -> dict:
    """The pairs' median ratio and its 95 % bootstrap interval."""
    return pairs_over([1.0] * len(ratios), ratios)


def pairs_over(base: list[float], ratios: list[float]) -> dict:
    """``ratios``' median over ``base``'s, resampling both (``analysis.bootstrap_ratio`` without its
    launch counts: these are pairs)."""
    out = analysis.bootstrap_ratio(base, ratios)
    out.pop("launches", None)
    return out


def by_server_ci(groups: list[list[float]], n: int = 4000, seed: int = 0) -> list[float] | None:
    """95 % interval of the pooled median, resampling the groups, then the pairs inside each."""
    if len(groups) < 2:
        return None
    rng = random.Random(seed)
    draws = sorted(statistics.median([x for g in rng.choices(groups, k=len(groups)) for x in rng.choices(g, k=len(g))])
                   for _ in range(n))
    return [draws[int(0.025 * n)], draws[int(0.975 * n) - 1]]


def main() -> None:
    args = sys.argv[2:]
    cut = args.index("--over") if "--over" in args else len(args)
    picks, over = args[:cut], args[cut + 1:] if cut < len(args) else None
    if len(sys.argv) < 3 or not picks or over == []:
        sys.exit(__doc__)
    print(json.dumps(pool(Path(sys.argv[1]), picks, over), indent=1))


if __name__ == "__main__":
    main()
