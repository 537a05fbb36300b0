"""The target table against the real SGLang sources of both pinned versions, without importing
SGLang: each version's files are parsed (``ast``) from the harness venvs when they are built.

Every target the table expects in a version must be there as a ``def`` in its class body (or at
module level): the probe wraps what it finds in the class's own namespace, so an inherited or
renamed one would silently not be timed. A per-step target (step, phase, graph, accept) must
moreover stay a plain function: its replacement takes ``self`` first, so a ``classmethod``,
``staticmethod`` or ``property`` is refused. A decorator that returns a function (SGLang 0.5.23
wraps ``Scheduler.run_batch`` in its stage metrics) is fine."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from sgl_probe import targets
from sgl_probe.instrument import HANDLERS

PINNED = ("0.5.9", "0.5.23")
HARNESS = Path(os.environ.get("SGL_PROBE_HARNESS_DIR", Path(__file__).resolve().parents[1] / ".harness"))
COMPLETE_MARKER = ".harness-complete"  # written by tests/harness/venv.py once a build finished
#: Decorators that turn a def into something other than a plain function in the class dict.
NOT_A_FUNCTION = {"classmethod", "staticmethod", "property", "cached_property", "functools.cached_property",
                  "abstractproperty"}


def sglang_root(version: str) -> Path:
    venv = HARNESS / f"venv-{version}"
    found = sorted(venv.glob("lib/python3.*/site-packages/sglang"))
    if not (venv / COMPLETE_MARKER).exists() or len(found) != 1:
        pytest.skip(f"SGLang {version} sources not available: the harness venv {venv} is not built "
                    f"(python -m tests.harness build {version}; SGL_PROBE_HARNESS_DIR points elsewhere)")
    return found[0]


_parsed: dict[Path, ast.Module] = {}


def module_tree(root: Path, module: str) -> ast.Module | None:
    rel = module.split(".")[1:]  # below the "sglang" package
    for path in (root.joinpath(*rel).with_suffix(".py"), root.joinpath(*rel, "__init__.py")):
        if path.is_file():
            if path not in _parsed:
                _parsed[path] = ast.parse(path.read_text(encoding="utf-8"), str(path))
            return _parsed[path]
    return None


def find_def(tree: ast.Module, qualname: str) -> tuple[str, ast.AST | None]:
    """('ok' | why not, the node found)."""
    *owners, name = qualname.split(".")
    body = tree.body
    for owner in owners:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return f"no class {owner}", None
        body = cls.body
    node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None)
    if node is None:
        assigned = any(isinstance(n, (ast.Assign, ast.AnnAssign)) for n in body
                       if name in {getattr(t, "id", None) for t in getattr(n, "targets", [getattr(n, "target", None)])})
        return ("assigned, not defined" if assigned else f"no def {name}"), None
    if isinstance(node, ast.AsyncFunctionDef):
        return "async def", node
    odd = [ast.unparse(d) for d in node.decorator_list if ast.unparse(d) in NOT_A_FUNCTION]
    if odd:
        return "decorated: " + ", ".join(odd), node
    return "ok", node


def check(tree: ast.Module, target: targets.Target) -> str:
    why, node = find_def(tree, target.qualname)
    if why.startswith("decorated") and not HANDLERS[target.role].hot:
        return "ok"  # wrapped with wrapt, which takes descriptors as they come
    return why


def sglang_targets():
    return [t for t in targets.TARGETS if t.module.split(".")[0] == "sglang"]


@pytest.mark.parametrize("version", PINNED)
def test_every_expected_target_is_a_plain_def_in_its_class(version):
    root = sglang_root(version)
    expected = [t for t in sglang_targets() if t.expected_in(version)]
    assert len(expected) >= 12  # the table's core rows: step, forward, spec phases, graphs, accept, nccl
    problems = []
    for t in expected:
        tree = module_tree(root, t.module)
        if tree is None:
            problems.append(f"{t.name}: module file missing")
            continue
        why = check(tree, t)
        if why != "ok":
            problems.append(f"{t.name}: {why}")
    assert problems == [], f"SGLang {version}"


@pytest.mark.parametrize("version", PINNED)
def test_targets_outside_their_range_are_really_gone(version):
    """A range that says "gone" for a target still present would hide a warning the user needs
    when it disappears for real; only the 0.5.9 -> 0.5.23 moves are checked (the pinned pair)."""
    root = sglang_root(version)
    present = []
    for t in sglang_targets():
        if t.expected_in(version):
            continue
        tree = module_tree(root, t.module)
        if tree is not None and check(tree, t) == "ok":
            present.append(t.name)
    assert present == [], f"SGLang {version}"


@pytest.mark.parametrize("version", PINNED)
def test_version_of_the_sources_is_the_pinned_one(version):
    root = sglang_root(version)
    assert [p.name for p in root.parent.glob("sglang-*.dist-info")] == [f"sglang-{version}.dist-info"]


def test_phase_readers_see_the_arguments_sglang_passes():
    """The readers take the batch as the first argument (or by these keywords): check the first
    parameter after ``self`` of every phase target in both versions."""
    problems = []
    seen = 0
    for version in PINNED:
        try:
            root = sglang_root(version)
        except pytest.skip.Exception:
            continue
        for t in sglang_targets():
            if t.role != "phase" or not t.expected_in(version):
                continue
            why, node = find_def(module_tree(root, t.module), t.qualname)
            if node is None:
                continue
            seen += 1
            params = [a.arg for a in node.args.args][1:]
            if not params or params[0] not in ("batch", "model_worker_batch", "schedule_batch"):
                problems.append(f"{version} {t.name}: first parameter {params[:1]}")
    if not seen:
        pytest.skip("no SGLang sources available (harness venvs not built)")
    assert problems == []


def test_accept_sink_signature_matches_the_reader():
    """``readers.accept_length`` reads ``(bs, num_accepted_drafts)`` before 0.5.13 and
    ``(bs, num_correct_drafts, num_accept_tokens, ...)`` from 0.5.13 on."""
    want = {"0.5.9": ["bs", "num_accepted_tokens"], "0.5.23": ["bs", "num_correct_drafts", "num_accept_tokens"]}
    checked = 0
    for version in PINNED:
        try:
            root = sglang_root(version)
        except pytest.skip.Exception:
            continue
        (t,) = [t for t in sglang_targets() if t.role == "accept" and t.expected_in(version)]
        _, node = find_def(module_tree(root, t.module), t.qualname)
        params = [a.arg for a in node.args.args][1:]
        assert params[:len(want[version])] == want[version], (version, params)
        checked += 1
    if not checked:
        pytest.skip("no SGLang sources available (harness venvs not built)")


# -- the parser itself, on sources written here ------------------------------------------------------

SAMPLE = '''
class A:
    def plain(self, batch): ...
    async def later(self): ...
    @property
    def prop(self): ...
    alias = plain
    @stage_metrics("run")
    def stage(self): ...
    class Inner:
        def deep(self): ...
def top(): ...
'''


@pytest.mark.parametrize("qualname,want", [
    ("A.plain", "ok"), ("A.later", "async def"), ("A.prop", "decorated: property"), ("A.stage", "ok"),
    ("A.alias", "assigned, not defined"), ("A.Inner.deep", "ok"), ("top", "ok"), ("A.missing", "no def missing"),
    ("B.plain", "no class B"), ("A.Inner.plain", "no def plain"),
])
def test_find_def(qualname, want):
    assert find_def(ast.parse(SAMPLE), qualname)[0] == want



def test_the_graph_launch_row_is_a_plain_method_of_the_torch_sglang_runs_on():
    """torch's ``CUDAGraph.replay`` is wrapped as a hot (plain-function) role: a torch that made it
    a descriptor or moved it would leave graph phases without ``sgl_probe.graph_ms``. Checked in
    the SGLang 0.5.23 harness venv (its torch, without the probe installed: the same test as
    ``instrument.resolve`` / ``_plain_method``, inline)."""
    import subprocess
    import sys

    root = sglang_root("0.5.23")
    python = root.parents[3] / "bin" / "python"
    (row,) = [t for t in targets.TARGETS if t.role == "graph_launch"]
    assert HANDLERS[row.role].hot and row.module == "torch.cuda.graphs"
    cls, attr = row.qualname.split(".")
    code = ("import importlib, types\n"
            "m = importlib.import_module(%r); owner = getattr(m, %r, None)\n"
            "print(isinstance(owner, type) and type(vars(owner).get(%r)) is types.FunctionType)"
            % (row.module, cls, attr))
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
