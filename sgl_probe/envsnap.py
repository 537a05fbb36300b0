"""Allow-listed, redacted environment snapshots and their diff against the launching process.

Only names matching the allow-list are ever captured, and a name that looks secret is never
captured with its value, whatever the allow-list says (``SGL_PROBE_ENV_ALLOW=MY_API_KEY`` still
exports only the fact that it was withheld). Every captured value goes through
:func:`sgl_probe.redact.redact_value`: a credential inside a value (``user:password@`` in a URL,
an ``hf_...`` token) is replaced, the rest kept.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable, Mapping

from sgl_probe.contract import SECRET_NAME_PATTERN
from sgl_probe.redact import redact_value

#: Set by the first process of a run that imports SGLang (or by ``sgl-probe run``) and inherited
#: by every worker it spawns: the allow-listed environment the user launched with, as JSON.
LAUNCHER_ENV_VAR = "SGL_PROBE_LAUNCHER_ENV"

_SECRET = re.compile(SECRET_NAME_PATTERN, re.I)


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


#: The probe's own variables, and SGLang's copies of them (SGLang >= 0.5.9 copies every
#: ``SGL_*`` variable to ``SGLANG_*`` at import), are bookkeeping, not the user's tuning.
_OWN = ("SGL_PROBE", "SGLANG_PROBE")


def is_allowed(name: str, allow: Iterable[str]) -> bool:
    """``allow`` holds prefixes, and exact names marked with a trailing ``=`` (see config)."""
    if name.startswith(_OWN):
        return False
    for pat in allow:
        if pat.endswith("="):
            if name == pat[:-1]:
                return True
        elif name.startswith(pat):
            return True
    return False


def snapshot(allow: Iterable[str], environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Return (allowed variables with values, allowed names withheld as secret-looking)."""
    env = os.environ if environ is None else environ
    allow = tuple(allow)
    values: dict[str, str] = {}
    withheld: list[str] = []
    for name, value in env.items():
        if not is_allowed(name, allow):
            continue
        if is_secret(name):
            withheld.append(name)
        else:
            values[name] = redact_value(value)
    return dict(sorted(values.items())), sorted(withheld)


def record_launcher_env(allow: Iterable[str], environ: dict[str, str] | None = None,
                        replace: bool = False) -> None:
    """Remember the launcher's environment for the workers, unless a parent already did (or
    ``replace``: this process is launching a server now, and its env is the launcher's)."""
    env = os.environ if environ is None else environ
    if LAUNCHER_ENV_VAR in env and not replace:
        return
    values, _ = snapshot(allow, env)
    env[LAUNCHER_ENV_VAR] = json.dumps(values, separators=(",", ":"))


def launcher_env(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    env = os.environ if environ is None else environ
    raw = env.get(LAUNCHER_ENV_VAR)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    # Re-filter: the variable may have been hand-written, and must not smuggle secrets out.
    return {str(k): redact_value(str(v)) for k, v in data.items() if not is_secret(str(k))}


def diff(current: Mapping[str, str], launcher: Mapping[str, str]) -> list[str]:
    """Names whose value differs, or that exist on one side only."""
    names = set(current) | set(launcher)
    return sorted(n for n in names if current.get(n) != launcher.get(n))


def snapshot_attributes(point: str, allow: Iterable[str], environ: Mapping[str, str] | None = None,
                        ) -> dict[str, object]:
    """The attributes of one ``sgl_probe.env_snapshot`` span (see README, span contract)."""
    values, withheld = snapshot(allow, environ)
    attrs: dict[str, object] = {"sgl_probe.snapshot_point": point}
    for name, value in values.items():
        attrs["env." + name] = value
    attrs["sgl_probe.env.names"] = list(values)
    if withheld:
        attrs["sgl_probe.env.withheld"] = withheld
    base = launcher_env(environ)
    if base is not None:
        changed = diff(values, base)
        attrs["sgl_probe.env.differs_from_launcher"] = changed
        for name in changed:
            if name in base:
                attrs["launcher_env." + name] = base[name]
    return attrs
