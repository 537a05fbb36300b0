"""What differs between two runs: env per rank, SGLang's patched files and checkout, server
arguments, library versions and GPUs (``sgl-probe diff A B``; first in ``report --baseline``).

Reads the ``sgl_probe.env_snapshot`` and ``sgl_probe.fingerprint`` spans an :class:`Aggregator`
kept. Only what would change a measurement is compared: run ids (also SGLang's ``SGLANG_RUN_ID``),
pids, timestamps and the fingerprint's own timing are not.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from sgl_probe import contract as C
from sgl_probe.report.aggregate import Aggregator
from sgl_probe.report.document import env_summary

#: Fingerprint attributes compared as one value per run: (section, label, attribute key).
_SCALARS = [("sglang", "SGLang version", C.FP_SGLANG_VERSION),
            ("sglang", "SGLang imported from", C.FP_SGLANG_PATH),
            ("sglang", "SGLang install", C.FP_SGLANG_INSTALL),
            ("sglang", "SGLang git commit", C.FP_GIT_COMMIT)]
_SCALARS += [("gpu" if key.startswith("gpu") else "versions", key.replace("_", " "), attr)
             for key, attr in C.FP_RUNTIME.items()]
# The probe's own code: its overhead is part of what both runs measured.
_SCALARS += [("versions", "sgl-probe " + label, C.FP_PROBE[key])
             for key, label in (("version", "version"), ("install", "install"), ("git_commit", "git commit"))]
#: Fingerprint list attributes compared as sets: (label, attribute key).
_FILE_SETS = [("patched SGLang files", C.FP_PATCHED), ("missing SGLang files", C.FP_MISSING),
              ("modified files in the SGLang checkout", C.FP_GIT_MODIFIED),
              ("orphaned bytecode", C.FP_ORPHANED_BYTECODE), ("stale bytecode", C.FP_STALE_BYTECODE),
              ("patched sgl-probe files", C.FP_PROBE["patched"]),
              ("modified files in the sgl-probe checkout", C.FP_PROBE["git_modified"])]
#: Variables that name a launch rather than configure it (SGLang sets a new id per launch).
NOT_COMPARED_VARS = frozenset({"SGLANG_RUN_ID"})
#: Server flags that a speculative run and its plain baseline are expected to differ in.
EXPECTED_FLAG_PREFIXES = ("--speculative",)
#: Where a server listens, not how it runs: shown, but no reason to doubt a baseline (two servers
#: measured side by side cannot share a port).
ADDRESS_FLAGS = ("--host", "--port")
#: The value of a flag given without one (``--disable-cuda-graph``).
FLAG_SET = "(set)"


def _norm(value: Any) -> Any:
    """Lists arrive as lists (OTLP) or JSON strings (Jaeger); compare them as one form."""
    if isinstance(value, str) and value.startswith("["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def parse_args(argv: list[str]) -> dict[str, Optional[str]]:
    """``["-m", "sglang.launch_server", "--port", "1", "--x=2", "--flag"]`` ->
    ``{"(command)": "-m sglang.launch_server", "--port": "1", "--x": "2", "--flag": "(set)"}``."""
    out: dict[str, Optional[str]] = {}
    command: list[str] = []
    flag: Optional[str] = None
    for item in argv:
        if item.startswith("--"):
            name, eq, value = item.partition("=")
            flag = None if eq else name
            out[name] = value if eq else FLAG_SET
        elif flag is not None:
            out[flag] = item if out[flag] == FLAG_SET else f"{out[flag]} {item}"
        else:
            command.append(item)
    if command:
        out["(command)"] = " ".join(command)
    return out


def _launcher_env(attrs: dict) -> Optional[dict]:
    names = _norm(attrs.get(C.FP_LAUNCHER_ENV_NAMES))
    if not isinstance(names, list):
        return None
    return {n: attrs.get(C.FP_LAUNCHER_ENV_PREFIX + n) for n in names}


class RunView:
    """One side of a diff: per rank label, the env the worker saw and its fingerprint."""

    def __init__(self, agg: Aggregator) -> None:
        env = env_summary(agg) or {"per_rank": {}}
        self.env = {label: {n: v for n, v in snap["vars"].items() if n not in NOT_COMPARED_VARS}
                    for label, snap in env["per_rank"].items()}
        self.fp = {agg.label(rank): {k: _norm(v) for k, v in attrs.items()}
                   for rank, attrs in sorted(agg.fingerprints.items(), key=lambda kv: agg.rank_sort_key(kv[0]))}

    def values(self, attr: str) -> list:
        """The distinct values of one fingerprint attribute across this run's processes."""
        seen: dict[str, Any] = {}
        for attrs in self.fp.values():
            if attr in attrs:
                seen.setdefault(_key(attrs[attr]), attrs[attr])
        return [seen[k] for k in sorted(seen)]


def _one(values: list) -> Any:
    return values[0] if len(values) == 1 else (None if not values else values)


def _changed(a: dict, b: dict) -> dict[str, dict]:
    return {n: {"a": a.get(n), "b": b.get(n)} for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)}


def compare(a: Aggregator, b: Aggregator) -> dict:
    """Everything that differs between runs ``a`` and ``b`` (JSON-able); ``same`` says if none."""
    va, vb = RunView(a), RunView(b)
    out: dict[str, Any] = {"fingerprints": {"a": len(va.fp), "b": len(vb.fp)}, "notes": []}
    for side, view in (("a", va), ("b", vb)):
        if not view.fp:
            out["notes"].append(f"run {side.upper()} has no sgl_probe.fingerprint spans (recorded by sgl-probe "
                                "0.1 servers with an exporter; an earlier version or a cut trace has none): "
                                "its code, versions and arguments are not compared")
    env = {}
    for label in sorted(set(va.env) | set(vb.env)):
        if label not in va.env or label not in vb.env:
            continue
        changed = _changed(va.env[label], vb.env[label])
        if changed:
            env[label] = changed
    out["env"] = env
    ranks_a, ranks_b = set(va.env) | set(va.fp), set(vb.env) | set(vb.fp)
    out["ranks"] = {"only_a": sorted(ranks_a - ranks_b), "only_b": sorted(ranks_b - ranks_a)}
    both = bool(va.fp and vb.fp)
    launcher = {}
    if both:
        la = [e for e in (_launcher_env(x) for x in va.fp.values()) if e is not None]
        lb = [e for e in (_launcher_env(x) for x in vb.fp.values()) if e is not None]
        if la and lb:
            launcher = {n: c for n, c in _changed(la[0], lb[0]).items() if n not in NOT_COMPARED_VARS}
    out["launcher_env"] = launcher
    files = {}
    for label, attr in _FILE_SETS if both else ():
        sa = {f for v in va.values(attr) for f in (v or [])}
        sb = {f for v in vb.values(attr) for f in (v or [])}
        if sa != sb:
            files[label] = {"only_a": sorted(sa - sb), "only_b": sorted(sb - sa)}
    out["files"] = files
    scalars: dict[str, dict] = {"sglang": {}, "versions": {}, "gpu": {}}
    for section, label, attr in _SCALARS if both else ():
        xa, xb = va.values(attr), vb.values(attr)
        if [_key(x) for x in xa] != [_key(x) for x in xb]:
            scalars[section][label] = {"a": _one(xa), "b": _one(xb)}
    out.update(scalars)
    args = {}
    if both:
        pa, pb = va.values(C.FP_SERVER_ARGS), vb.values(C.FP_SERVER_ARGS)
        if len(pa) == 1 and len(pb) == 1:
            args = _changed(parse_args(pa[0]), parse_args(pb[0]))
        elif [_key(x) for x in pa] != [_key(x) for x in pb]:
            args = {"(all)": {"a": _one(pa), "b": _one(pb)}}
    out["server_args"] = args
    sections = ("env", "ranks", "launcher_env", "files", "sglang", "versions", "gpu", "server_args")
    out["differs"] = [s for s in sections if (any(out[s].values()) if s == "ranks" else out[s])]
    out["same"] = not out["differs"]
    out["compared"] = both or bool(set(va.env) & set(vb.env))
    # What makes a baseline suspect: anything but the speculative settings it is meant to lack.
    unexpected = [s for s in out["differs"] if s != "server_args"]
    if any(not f.startswith(EXPECTED_FLAG_PREFIXES) and f not in ADDRESS_FLAGS for f in args):
        unexpected.append("server_args")
    out["unexpected"] = unexpected
    return out


def mark_verdict(spec: Optional[dict], d: dict) -> None:
    """Say next to a speculative verdict that its baseline's fingerprint differs."""
    verdict = (spec or {}).get("verdict")
    if not verdict or not d["unexpected"]:
        return
    verdict["baseline_fingerprint_differs"] = list(d["unexpected"])
    verdict["sentence"] += (f" [measured against a baseline whose fingerprint differs in "
                            f"{', '.join(d['unexpected'])}: see the top]")


def _val(x: Any) -> str:
    if x is None:
        return "(unset)"
    if isinstance(x, list):
        return "[" + ", ".join(map(str, x)) + "]"
    return str(x)


def render(d: dict, name_a: str = "A", name_b: str = "B") -> list[str]:
    """Text lines, what differs first; ``name_a`` / ``name_b`` name the two sides."""
    head = f"Run fingerprint: {name_a} vs {name_b}"
    if not d["compared"]:
        return [f"{head}: not compared (no env snapshots or fingerprints of the same ranks on both sides)"]
    if d["same"]:
        lines = [f"{head}: no difference in env (per rank), SGLang files, server arguments, versions or GPUs"]
        return lines + ["  note: " + n for n in d["notes"]]
    lines = [f"{head}: differs in {', '.join(d['differs'])}"]
    for label, changed in d["env"].items():
        lines.append(f"  env {label}: " + "; ".join(f"{n} {_val(c['a'])} -> {_val(c['b'])}" for n, c in changed.items()))
    if d["launcher_env"]:
        lines.append("  launcher env: " + "; ".join(
            f"{n} {_val(c['a'])} -> {_val(c['b'])}" for n, c in d["launcher_env"].items()))
    for side, key in ((name_a, "only_a"), (name_b, "only_b")):
        if d["ranks"][key]:
            lines.append(f"  ranks only in {side}: {', '.join(d['ranks'][key])}")
    for label, sets in d["files"].items():
        for side, key in ((name_a, "only_a"), (name_b, "only_b")):
            if sets[key]:
                lines.append(f"  {label} only in {side}: {', '.join(sets[key])}")
    for section in ("sglang", "versions", "gpu"):
        for label, c in d[section].items():
            lines.append(f"  {label}: {_val(c['a'])} -> {_val(c['b'])}")
    for flag, c in d["server_args"].items():
        note = ("  (expected: speculative settings)" if flag.startswith(EXPECTED_FLAG_PREFIXES)
                else "  (where it listens)" if flag in ADDRESS_FLAGS else "")
        lines.append(f"  server arg {flag}: {_val(c['a'])} -> {_val(c['b'])}{note}")
    return lines + ["  note: " + n for n in d["notes"]]


def run(args) -> int:
    """``sgl-probe diff A B``: 0 no difference, 1 differences, 2 an input with nothing to compare."""
    import sys

    from sgl_probe.report.reading import read_aggregator

    sides = []
    for src in (args.a, args.b):
        agg, problems = read_aggregator([src], args.jobs)
        for line in problems.lines():
            print(f"sgl-probe diff: {line}", file=sys.stderr)
        if not agg.env and not agg.fingerprints:
            print(f"sgl-probe diff: {src}: no sgl_probe.env_snapshot or sgl_probe.fingerprint spans",
                  file=sys.stderr)
            return 2
        sides.append(agg)
    d = compare(*sides)
    if args.json:
        json.dump({"a": args.a, "b": args.b, **d}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(render(d, args.a, args.b)) + "\n")
    return 0 if d["same"] else 1
