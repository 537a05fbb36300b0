#!/usr/bin/env bash
# The test command (README "Two commands"; CI's .ci/run calls exactly this).
# Creates .venv-test with sgl-probe and the test tools, then runs pytest. The SGLang harness venvs
# are built on first use by the tests themselves (cached under .harness/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-test
# A venv whose creation was interrupted has a python but no pip: start it again.
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
# With a C compiler here the install built the C hot path: its tests must run, not skip.
if command -v "${CC:-cc}" >/dev/null 2>&1 && [ "${SGL_PROBE_BUILD_EXT:-1}" != 0 ]; then
  export SGL_PROBE_TEST_REQUIRE_EXT=1
fi
# The real-SGLang environments (cached under .harness/ after the first run): built before the
# tests, so the fast checks that read SGLang's sources (test_exact_targets) find them too.
"$VENV/bin/python" -m tests.harness build
exec "$VENV/bin/python" -m pytest -q -rs --durations=15 "$@"
