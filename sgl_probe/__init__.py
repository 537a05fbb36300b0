"""sgl-probe: per-phase GPU timing and worker env snapshots for SGLang, as OpenTelemetry spans.

This module is imported by the startup hook in every interpreter of the venv, so it must stay
free of imports: the machinery lives in submodules loaded only once SGLang itself is imported.

PYTEST_DONT_REWRITE: the startup hook has imported this package before pytest starts, so pytest
(which marks every package with a ``pytest11`` plugin for assertion rewriting) must not warn
that it cannot rewrite it.
"""

__version__ = "0.1.0"
