"""The built wheel in fresh venvs: the startup hook reaches spawn children, survives a shadowing
sitecustomize, stays out with SGL_PROBE=0, and imports nothing heavy before SGLang.

The activation trigger is observed by importing a placeholder package *named* ``sglang`` (an
empty directory with an ``__init__.py``): what is tested here is only that the first import of
that name activates the probe. The real server tests use the real SGLang.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.harness.wheel import ROOT, build_wheel, fresh_venv, pip_install, site_packages_of

CHILD_SCRIPT = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys

    def report(q, do_import):
        before = {m: m in sys.modules for m in ("sgl_probe", "wrapt", "opentelemetry", "torch")}
        import _sgl_probe_arm as arm
        if do_import:
            import sglang  # placeholder package: see the test module's docstring
        from sgl_probe import activate
        q.put({"armed": arm._ARMED, "trigger": arm._TRIGGER in sys.meta_path, "heavy_before": before,
               "activated": activate.get_probe() is not None,
               "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
               "other_ran": os.environ.get("OTHER_SITECUSTOMIZE_RAN") == "1",
               "run_id": os.environ.get("SGL_PROBE_RUN_ID")})

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        q = mp.Queue()
        p = mp.Process(target=report, args=(q, len(sys.argv) > 1))
        p.start()
        print(json.dumps(q.get(timeout=60)))
        p.join()
""")


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    base = tmp_path_factory.mktemp("bootstrap")
    wheel = build_wheel(base / "wheel")
    with_probe = fresh_venv(base / "with", wheel)
    fake = base / "placeholder"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    other = base / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n")
    script = base / "child.py"
    script.write_text(CHILD_SCRIPT)
    return {"with": with_probe, "fake": fake, "other": other, "script": script, "wheel": wheel}


def run_child(venv: Path, script: Path, env_extra: dict, do_import: bool, prefix: list[str] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGL_PROBE", "PYTHONPATH"))}
    env.update(env_extra)
    cmd = [*prefix, str(venv / "bin" / "python"), str(script)] + (["import"] if do_import else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=script.parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_wheel_installs_startup_files(venvs):
    sp = site_packages_of(venvs["with"])
    assert (sp / "sgl_probe.pth").read_text().strip() == "import _sgl_probe_arm; _sgl_probe_arm.arm()"
    assert (sp / "sgl_probe.start").read_text().strip() == "_sgl_probe_arm:arm"
    assert (sp / "_sgl_probe_arm.py").is_file()
    assert (sp / "_sgl_probe_startup" / "sitecustomize.py").is_file()


def test_spawn_child_is_armed_but_loads_nothing_heavy(venvs):
    got = run_child(venvs["with"], venvs["script"], {}, do_import=False)
    assert got["armed"] and got["trigger"] and not got["activated"]
    # Not even the sgl_probe package: the .pth loads one top-level module.
    assert got["heavy_before"] == {"sgl_probe": False, "wrapt": False, "opentelemetry": False, "torch": False}


def test_first_sglang_import_activates_in_spawn_child(venvs):
    got = run_child(venvs["with"], venvs["script"], {"PYTHONPATH": str(venvs["fake"])}, do_import=True)
    assert got["armed"] and got["activated"] and not got["trigger"]
    assert got["run_id"]  # the activated child created one


def test_pth_runs_even_when_another_sitecustomize_comes_first(venvs):
    path = os.pathsep.join([str(venvs["other"]), str(venvs["fake"])])
    got = run_child(venvs["with"], venvs["script"], {"PYTHONPATH": path}, do_import=True)
    assert got["other_ran"] and got["armed"] and got["activated"]
    assert got["sitecustomize"].startswith(str(venvs["other"]))


def test_sgl_probe_run_chains_the_shadowed_sitecustomize(venvs):
    path = os.pathsep.join([str(venvs["other"]), str(venvs["fake"])])
    cli = str(venvs["with"] / "bin" / "sgl-probe")
    got = run_child(venvs["with"], venvs["script"], {"PYTHONPATH": path, "SGL_PROBE_RUN_ID": ""},
                    do_import=True, prefix=[cli, "run", "--"])
    assert "_sgl_probe_startup/sitecustomize.py" in got["sitecustomize"]
    assert got["other_ran"], "the sitecustomize shadowed by sgl-probe's must still run"
    assert got["armed"] and got["activated"] and got["run_id"]


def test_sgl_probe_0_keeps_it_out(venvs):
    got = run_child(venvs["with"], venvs["script"], {"PYTHONPATH": str(venvs["fake"]), "SGL_PROBE": "0"},
                    do_import=True)
    assert not got["armed"] and not got["trigger"] and not got["activated"]


def test_source_checkout_sitecustomize_without_install(tmp_path, venvs):
    """PYTHONPATH=<checkout>/sitecustomize alone (no wheel installed) arms the probe too."""
    bare = fresh_venv(tmp_path / "bare", None)
    path = os.pathsep.join([str(ROOT / "sitecustomize"), str(venvs["other"])])
    # The package itself is found too (the trigger imports it on the first `import sglang`).
    probe = subprocess.run([str(bare / "bin" / "python"), "-c",
                            "import os, importlib.util, _sgl_probe_arm as a; "
                            "print(a._ARMED, importlib.util.find_spec('sgl_probe').origin, "
                            "os.environ.get('OTHER_SITECUSTOMIZE_RAN'))"],
                           env={**{k: v for k, v in os.environ.items() if not k.startswith("SGL_PROBE")},
                                "PYTHONPATH": path}, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["True", str(ROOT / "sgl_probe" / "__init__.py"), "1"], probe.stdout


def test_editable_install_maps_the_package_and_the_startup_folder(tmp_path):
    """``pip install -e .`` (the test command's install): the installed startup files must not
    create a ``sgl_probe`` directory in site-packages that would hide the mapped package."""
    venv = fresh_venv(tmp_path / "editable", None)
    pip_install(venv, "--no-deps", "editables", "-e", str(ROOT))  # editables: the mapping hook
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sgl_probe, sgl_probe.cli as c; print(sgl_probe.__file__); print(c.startup_dir())"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("SGL_PROBE", "PYTHONPATH"))})
    assert out.returncode == 0, out.stderr
    package, startup = out.stdout.split()
    assert package == str(ROOT / "sgl_probe" / "__init__.py")
    assert Path(startup, "sitecustomize.py").read_text() == (ROOT / "sitecustomize" / "sitecustomize.py").read_text()


def test_pip_uninstall_leaves_no_startup_file(tmp_path, venvs):
    """README "Uninstall": ``pip uninstall sgl-probe`` removes the .pth and everything it loads."""
    venv = fresh_venv(tmp_path / "uninstall", None)
    pip_install(venv, "--no-deps", str(venvs["wheel"]))
    sp = site_packages_of(venv)
    before = {p.name for p in sp.iterdir()}
    assert {"sgl_probe.pth", "sgl_probe.start", "_sgl_probe_arm.py", "_sgl_probe_startup", "sgl_probe"} <= before
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "sgl-probe"], check=True)
    left = {p.name for p in sp.iterdir()} & {"sgl_probe.pth", "sgl_probe.start", "_sgl_probe_arm.py",
                                            "_sgl_probe_startup", "sgl_probe"}
    assert not left
    assert not [p for p in sp.iterdir() if "sgl_probe" in p.name or "sgl-probe" in p.name]
    assert not list(sp.glob("__pycache__/_sgl_probe_arm*"))  # compiled by every start before


def _hotpath_in(venv: Path, cwd: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sgl_probe.hotpath as h; m = h.load(); print(h.name(m), getattr(m, '__file__', '-'))"],
                         cwd=cwd, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith(("SGL_PROBE", "PYTHONPATH"))})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_wheel_carries_the_c_hot_path_built_for_this_python(tmp_path, venvs):
    """With a C compiler (CI has one: tests/run.sh requires it then), ``pip install`` builds
    ``sgl_probe/_hot.c`` into the wheel, tagged for this interpreter, and the probe loads it."""
    import sysconfig
    import zipfile

    from tests.hotpaths import c_module

    c_module()  # skips (or fails, under SGL_PROBE_TEST_REQUIRE_EXT=1) where nothing could be built
    wheel = venvs["wheel"]
    tag = "cp%d%d" % tuple(__import__("sys").version_info[:2])
    assert f"-{tag}-{tag}-" in wheel.name, wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert {n for n in names if n.startswith("sgl_probe/_hot")} == {
        "sgl_probe/_hot" + sysconfig.get_config_var("EXT_SUFFIX"), "sgl_probe/_hot.c"}
    name, path = _hotpath_in(venvs["with"], tmp_path)
    assert name == "c" and path.startswith(str(site_packages_of(venvs["with"])))


def test_without_the_extension_the_wheel_is_pure_python_and_the_probe_runs_python(tmp_path):
    env = {**os.environ, "SGL_PROBE_BUILD_EXT": "0"}
    out = tmp_path / "wheel"
    subprocess.run([__import__("sys").executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    (wheel,) = out.glob("sgl_probe-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    import zipfile

    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith((".so", ".pyd"))]
    venv = fresh_venv(tmp_path / "pure", wheel)
    assert _hotpath_in(venv, tmp_path) == ["python", "-"]
