"""The run fingerprint: which SGLang code, libraries, GPUs, arguments and launch env a process ran
with, so that a baseline can be checked before it is trusted.

Collected once per process, in a background thread started from the scheduler's constructor (never
on a step). The costly part is the check of SGLang's files against its wheel's ``RECORD`` hashes:
a file is hashed only when its size matches the record but its inode changed after ``RECORD`` was
written (``st_ctime``, which no user-space tool can set back, unlike ``st_mtime``); a different
size is a change without hashing. On a fresh install nothing is hashed and the check is one
``stat`` per file. ``full=True`` (``sgl-probe doctor --full``) hashes every file.

Nothing here initialises CUDA: GPU names come from torch only when this process already
initialised CUDA, otherwise from ``/proc/driver/nvidia``. Stdlib only (torch if already imported).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping, Optional

from sgl_probe import contract as C
from sgl_probe.redact import redact_args, redact_value

#: How many file names a list attribute carries at most (the count is always exact).
MAX_LISTED = 200
GIT_TIMEOUT_S = 10.0


def _package_dir(name: str = "sglang") -> Optional[str]:
    """Where ``name`` is (or would be) imported from, without importing it."""
    mod = sys.modules.get(name)
    origin = getattr(mod, "__file__", None) if mod is not None else None
    if origin is None:
        spec = _find_spec_quietly(name)
        if spec is None:
            return None
        origin = spec.origin
        if origin is None and spec.submodule_search_locations:
            return os.path.realpath(list(spec.submodule_search_locations)[0])
    return os.path.dirname(os.path.realpath(origin)) if origin else None


def _find_spec_quietly(name: str):
    """``importlib.util.find_spec`` for a top-level name, minus the probe's own import trigger
    on the meta path: a lookup of "sglang" would fire it and activate the probe in a process
    that never imported SGLang."""
    for finder in sys.meta_path:
        if type(finder).__name__ == "_SGLangTrigger" or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name, None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def _record_hash(path: str) -> str:
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_check(record_path: str, site_dir: str, top: str = "sglang", full: bool = False,
                 text: Optional[str] = None) -> dict:
    """Files of package ``top`` whose content differs from ``RECORD`` (see the module doc);
    ``text``: RECORD's content when the caller has already read it."""
    rec_stat = os.stat(record_path)
    if text is None:
        with open(record_path, encoding="utf-8", newline="") as fh:
            text = fh.read()
    rows = csv.reader(io.StringIO(text))
    prefix = top + "/"
    patched: list[str] = []
    missing: list[str] = []
    checked = hashed = 0
    for row in rows:
        if len(row) < 3 or not row[0].startswith(prefix) or not row[1].startswith("sha256="):
            continue
        rel, want, size = row[0], row[1], row[2]
        path = os.path.join(site_dir, rel)
        checked += 1
        try:
            st = os.stat(path)
        except OSError:
            missing.append(rel)
            continue
        if size.isdigit() and st.st_size != int(size):
            patched.append(rel)
            continue
        # ``>=``: inode times tick coarsely (a few ms), so a file changed in RECORD's tick counts.
        if full or st.st_ctime_ns >= rec_stat.st_ctime_ns:
            hashed += 1
            try:
                if _record_hash(path) != want:
                    patched.append(rel)
            except OSError:
                missing.append(rel)
    return {"checked": checked, "hashed": hashed, "patched": sorted(patched), "missing": sorted(missing)}


def _distribution(name: str):
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        return distribution(name)
    except Exception:  # PackageNotFoundError, or broken metadata
        return None


def _git_root(path: str) -> Optional[str]:
    d = path
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True,
                          timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL).stdout


def git_state(pkg_dir: str) -> Optional[dict]:
    """Commit and modified (or new, unignored) files of the git checkout holding ``pkg_dir``;
    None when no repository tracks the package (a venv inside some other repository)."""
    root = _git_root(pkg_dir)
    if root is None:
        return None
    try:
        if not _git(root, "ls-files", "--", os.path.join(pkg_dir, "__init__.py")).strip():
            return None
    except (OSError, subprocess.SubprocessError):
        pass  # git missing or failing: say so below rather than pretend there is no checkout
    out: dict[str, Any] = {"root": root}
    try:
        out["commit"] = _git(root, "rev-parse", "HEAD").strip()
        status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=normal", "--", pkg_dir)
        files = []
        for entry in status.split("\0"):
            if len(entry) > 3:
                files.append(entry[3:])
        out["modified"] = sorted(files)
    except FileNotFoundError:
        out["error"] = "git is not installed: commit and modified files unknown"
    except subprocess.TimeoutExpired:
        out["error"] = f"git took over {GIT_TIMEOUT_S:.0f} s: commit and modified files unknown"
    except subprocess.CalledProcessError as exc:
        out["error"] = "git failed: " + (exc.stderr or "").strip()[:200]
    return out


def bytecode_check(pkg_dir: str, top: str = "sglang") -> dict:
    """Bytecode that runs instead of, or without, its source.

    ``orphaned``: ``.pyc`` files outside ``__pycache__`` with no ``.py`` beside them (Python
    imports these) and ``__pycache__`` entries whose source is gone (not imported; a sign of
    deleted files). ``stale``: modules of ``top`` loaded in this process from an unchecked-hash
    ``.pyc`` (PEP 552) that no longer matches its source, i.e. code that differs from the file.
    """
    orphaned: list[str] = []
    stack = [pkg_dir]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue
        names = {e.name for e in entries}
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name == "__pycache__":
                    try:
                        cached = os.listdir(e.path)
                    except OSError:
                        continue
                    for f in cached:
                        if f.endswith(".pyc") and f.split(".", 1)[0] + ".py" not in names:
                            orphaned.append(os.path.relpath(os.path.join(e.path, f), os.path.dirname(pkg_dir)))
                else:
                    stack.append(e.path)
            elif e.name.endswith(".pyc") and e.name[:-1] not in names:
                orphaned.append(os.path.relpath(e.path, os.path.dirname(pkg_dir)) + " (imported without source)")
    stale: list[str] = []
    for name, mod in list(sys.modules.items()):
        if not (name == top or name.startswith(top + ".")):
            continue
        spec = getattr(mod, "__spec__", None)
        cached, origin = getattr(spec, "cached", None), getattr(spec, "origin", None)
        if not cached or not origin or not origin.endswith(".py"):
            continue
        try:
            with open(cached, "rb") as fh:
                head = fh.read(16)
            if len(head) < 16 or int.from_bytes(head[4:8], "little") != 0b01:  # hash-based, unchecked
                continue
            with open(origin, "rb") as fh:
                if importlib.util.source_hash(fh.read()) != head[8:16]:
                    stale.append(name)
        except OSError:
            continue
    return {"orphaned": sorted(orphaned), "stale": sorted(stale)}


def sglang_code(full: bool = False, top: str = "sglang") -> dict:
    """Which SGLang code this Python runs: version, location, install kind and local changes."""
    out: dict[str, Any] = {"version": None, "path": None, "install": "absent"}
    pkg_dir = _package_dir(top)
    dist = _distribution(top)
    if dist is not None:
        out["version"] = dist.version
    if pkg_dir is None:
        return out
    out["path"] = pkg_dir
    errors: list[str] = []
    record = None
    if dist is not None:
        try:
            site_dir = os.path.realpath(str(dist.locate_file("")))
            init_rel = os.path.relpath(os.path.join(pkg_dir, "__init__.py"), site_dir)
            text = dist.read_text("RECORD")
            if text and ("\n" + init_rel + ",") in ("\n" + text):
                record = os.path.join(str(dist._path), "RECORD")  # type: ignore[attr-defined]
                out["install"] = "wheel"
                out.update(record_check(record, site_dir, top, full, text))
            elif text:
                errors.append(f"the installed {top} {dist.version} ({site_dir}) is not the one imported")
        except Exception as exc:
            errors.append(f"RECORD check failed: {exc!r}")
    git = git_state(pkg_dir) if record is None else None
    if git is not None:
        out["install"] = "git" if record is None else out["install"]
        out["git_commit"] = git.get("commit")
        out["git_modified"] = git.get("modified")
        if git.get("error"):
            errors.append(git["error"])
    elif record is None:
        out["install"] = "unknown"
        errors.append(f"{pkg_dir}: neither an installed wheel with a RECORD nor a git checkout; "
                      "local changes cannot be told")
    try:
        out.update({k + "_bytecode": v for k, v in bytecode_check(pkg_dir, top).items()})
    except Exception as exc:
        errors.append(f"bytecode check failed: {exc!r}")
    if errors:
        out["errors"] = errors
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _driver_version() -> Optional[str]:
    text = _read("/proc/driver/nvidia/version")
    if not text:
        return None
    for word in text.split():
        if word[:1].isdigit() and word.count(".") >= 1:
            return word
    return None


def _proc_gpus() -> list[str]:
    base = "/proc/driver/nvidia/gpus"
    try:
        buses = sorted(os.listdir(base))
    except OSError:
        return []
    models = []
    for bus in buses:
        model = "unknown"
        for line in (_read(os.path.join(base, bus, "information")) or "").splitlines():
            if line.startswith("Model:"):
                model = line.split(":", 1)[1].strip()
        models.append(model)
    return models


def runtime_versions(import_torch: bool = False) -> dict:
    """Python, torch, CUDA, NCCL, driver and GPUs, without initialising CUDA."""
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        try:
            import torch  # type: ignore[no-redef]
        except Exception as exc:
            out["torch_error"] = repr(exc)
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", None)
        ver = getattr(torch, "version", None)
        out["cuda"] = getattr(ver, "cuda", None)
        if getattr(ver, "hip", None):
            out["hip"] = ver.hip
        try:
            if out["cuda"]:
                nccl = torch.cuda.nccl.version()
                out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
        try:
            if torch.cuda.is_initialized():
                n = torch.cuda.device_count()
                out["gpu_models"] = [torch.cuda.get_device_name(i) for i in range(n)]
                out["gpu_source"] = "torch"
        except Exception:
            pass
    if "gpu_models" not in out:
        out["gpu_models"] = _proc_gpus()
        out["gpu_source"] = "/proc/driver/nvidia"
    out["gpu_count"] = len(out["gpu_models"])
    out["driver"] = _driver_version()
    return out


def collect(argv: Optional[Iterable[str]] = None, launcher_env: Optional[Mapping[str, str]] = None,
            full: bool = False, import_torch: bool = False) -> dict:
    """The whole fingerprint as a JSON-able dict (``sgl-probe doctor --json`` prints it)."""
    t0 = time.perf_counter()
    fp: dict[str, Any] = {"sglang": sglang_code(full=full)}
    # The probe's own code the same way: a checkout or a second install on the path shadows the
    # installed wheel without changing the version it reports.
    fp["sgl_probe"] = sglang_code(full=full, top="sgl_probe")
    fp.update(runtime_versions(import_torch=import_torch))
    fp["server_args"] = redact_args(sys.argv if argv is None else argv)
    if launcher_env is not None:
        fp["launcher_env"] = {k: redact_value(v) for k, v in sorted(launcher_env.items())}
    fp["collect_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return fp


def _listed(values: list) -> list:
    return list(values[:MAX_LISTED])


def to_attributes(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sgl_probe.fingerprint`` span's attributes (see contract.py, FP_*)."""
    sg = fp.get("sglang") or {}
    attrs: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, list):
            value = [str(v) for v in _listed(value)]
        attrs[key] = value

    put(C.FP_SGLANG_VERSION, sg.get("version"))
    put(C.FP_SGLANG_PATH, sg.get("path"))
    put(C.FP_SGLANG_INSTALL, sg.get("install"))
    if "patched" in sg:
        put(C.FP_PATCHED, sg["patched"])
        put(C.FP_MISSING, sg["missing"])
        attrs[C.FP_RECORD_CHECKED] = sg["checked"]
        attrs[C.FP_RECORD_HASHED] = sg["hashed"]
    put(C.FP_GIT_COMMIT, sg.get("git_commit"))
    put(C.FP_GIT_MODIFIED, sg.get("git_modified"))
    put(C.FP_ORPHANED_BYTECODE, sg.get("orphaned_bytecode"))
    put(C.FP_STALE_BYTECODE, sg.get("stale_bytecode"))
    probe = fp.get("sgl_probe") or {}
    for key, attr in C.FP_PROBE.items():
        put(attr, probe.get(key))
    errors = list(sg.get("errors") or ()) + ["sgl_probe: " + str(e) for e in probe.get("errors") or ()]
    put(C.FP_ERRORS, [redact_value(str(e)) for e in errors] if errors else None)
    for key, attr in C.FP_RUNTIME.items():
        put(attr, fp.get(key))
    # Redacted again here: whoever built ``fp``, no secret reaches a span.
    if fp.get("server_args") is not None:
        put(C.FP_SERVER_ARGS, redact_args(fp["server_args"]))
    if fp.get("launcher_env") is not None:
        attrs[C.FP_LAUNCHER_ENV_NAMES] = list(fp["launcher_env"])
        for name, value in fp["launcher_env"].items():
            attrs[C.FP_LAUNCHER_ENV_PREFIX + name] = redact_value(str(value))
    put(C.FP_COLLECT_MS, fp.get("collect_ms"))
    return attrs


def _code_lines(name: str, sg: Mapping[str, Any]) -> list[str]:
    """One package's part of :func:`text_lines` (:func:`sglang_code`'s result for ``name``)."""
    out = [f"{name} {sg.get('version') or '?'} from {sg.get('path') or '?'} ({sg.get('install')})"]
    if "patched" in sg:
        how = "every file hashed" if sg["hashed"] == sg["checked"] else f"{sg['hashed']} hashed"
        out.append(f"patched files (differ from the wheel's RECORD; {sg['checked']} checked, {how}): "
                   + (", ".join(sg["patched"]) or "none"))
        if sg["missing"]:
            out.append("missing files: " + ", ".join(sg["missing"]))
    if sg.get("git_commit") is not None or sg.get("install") == "git":
        out.append(f"git commit {sg.get('git_commit') or '?'}; modified: "
                   + (", ".join(sg.get("git_modified") or []) or "none"))
    for key, label in (("orphaned_bytecode", "orphaned bytecode"), ("stale_bytecode", "stale bytecode")):
        if sg.get(key):
            out.append(f"{label}: " + ", ".join(sg[key]))
    for err in sg.get("errors") or ():
        out.append("! " + err)
    return out


def text_lines(fp: Mapping[str, Any]) -> list[str]:
    """The fingerprint for a terminal (``sgl-probe doctor``)."""
    out = _code_lines("sglang", fp.get("sglang") or {})
    if fp.get("sgl_probe"):
        out += _code_lines("sgl-probe", fp["sgl_probe"])
    gpus = fp.get("gpu_models") or []
    out.append(f"python {fp.get('python')}, torch {fp.get('torch') or '-'}, CUDA {fp.get('cuda') or '-'}, "
               f"NCCL {fp.get('nccl') or '-'}, driver {fp.get('driver') or '-'}, "
               f"{len(gpus)} GPU(s)" + (": " + ", ".join(sorted(set(gpus))) if gpus else ""))
    if fp.get("server_args"):
        out.append("server args: " + " ".join(fp["server_args"]))
    env = fp.get("launcher_env")
    if env is not None:
        out.append("launcher env: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none allow-listed)"))
    return out
