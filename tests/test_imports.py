"""The package's import structure: every module imports; the runtime core (everything outside
``sgl_probe/report/`` and ``sgl_probe/testing/``) never imports the report or the testing API;
no module imports itself through others (no cycles, lazy imports inside functions included)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE_CORE = ("sgl_probe.report", "sgl_probe.testing")
#: The command line is the front door to both the probe's tools and ``sgl-probe report``; it loads
#: the report's modules only when that command runs (test_report checks ``doctor`` does not).
FRONT_DOOR = ("sgl_probe.cli",)


def modules(root: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its text (top level or lazily in a
    function). ``from a import b`` counts as importing ``a.b`` when that is a module, else ``a``."""
    mods = modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = here.split(".")
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a non-module attribute path
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def core_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    def outside(m: str) -> bool:
        return any(m == p or m.startswith(p + ".") for p in OUTSIDE_CORE)

    return sorted((m, t) for m, ts in graph.items() if not outside(m) and m not in FRONT_DOOR
                  for t in ts if outside(t))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_cycles_and_core_imports_of_the_report(tmp_path):
    pkg = tmp_path / "sgl_probe"
    (pkg / "report").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "report" / "__init__.py").write_text("")
    (pkg / "summary.py").write_text("def f():\n    from sgl_probe.report import verdict\n")
    (pkg / "report" / "verdict.py").write_text("from . import stats\n")
    (pkg / "report" / "stats.py").write_text("from ..summary import f\n")
    graph = import_graph(tmp_path, "sgl_probe")
    assert graph["sgl_probe.report.stats"] == {"sgl_probe.summary"}
    assert core_violations(graph) == [("sgl_probe.summary", "sgl_probe.report.verdict")]
    assert cycles(graph) == [["sgl_probe.report.stats", "sgl_probe.report.verdict", "sgl_probe.summary"]]


def test_core_never_imports_report_or_testing_and_there_are_no_cycles():
    graph = import_graph(ROOT, "sgl_probe")
    assert {"sgl_probe.stats", "sgl_probe.summary", "sgl_probe.report.model", "sgl_probe.report.otlp"} <= set(graph)
    assert core_violations(graph) == []
    assert cycles(graph) == []
    # Both the live summary line and the report take their statistics from the core:
    assert "sgl_probe.stats" in graph["sgl_probe.summary"]
    assert "sgl_probe.stats" in graph["sgl_probe.report.speculative"]


@pytest.mark.parametrize("name", sorted(m for m in modules(ROOT, "sgl_probe") if "._" not in m))
def test_every_module_imports(name):
    # Private startup modules (``sgl_probe._*``) run at interpreter start and are left out here.
    importlib.import_module(name)
