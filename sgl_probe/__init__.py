"""sgl-probe: per-phase GPU timing and worker env snapshots for SGLang, as OpenTelemetry spans.

This module is imported by the startup hook in every interpreter of the venv, so it must stay
free of imports: the machinery lives in submodules loaded only once SGLang itself is imported.
"""

__version__ = "0.1.0"
