#!/usr/bin/env bash
# Mutation score of the runtime core's pure-Python modules against the fast tests (mutmut 3).
#
#   benchmarks/mutation.sh [module.py ...]    # default: every module in MODULES below
#   benchmarks/mutation.sh --retest           # the last run's survivors again, against today's tests
#
# Runs in a scratch copy of the checkout (mutmut writes its mutants/ tree next to the sources),
# so the checkout is left alone. mutmut maps each test to the functions it calls and runs only
# those tests per mutant; TESTS bounds that to the fast suites (no real-SGLang server).
# Writes benchmarks/results/mutation.json: {"modules": {name: {"killed", "total", ...}}}.
# Needs: python3 (a venv with mutmut and the package's test extras is made under .venv-mutation).
# MUTATION_JOBS sets mutmut's parallel workers (default 1: nice to a shared machine).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${MUTATION_VENV:-$ROOT/.venv-mutation}
WORK=${MUTATION_WORK:-${TMPDIR:-/tmp}/sgl-probe-mutation}
JOBS=${MUTATION_JOBS:-1}
OUT=$ROOT/benchmarks/results/mutation.json

MODULES=(
  sgl_probe/envsnap.py sgl_probe/config.py sgl_probe/spans.py sgl_probe/drain.py sgl_probe/recorder.py
  sgl_probe/readers.py sgl_probe/nccl_confirm.py sgl_probe/redact.py sgl_probe/stats.py
  sgl_probe/report/speculative.py
)
RETEST=0
if [ "${1:-}" = "--retest" ]; then RETEST=1; shift; fi
[ $# -gt 0 ] && MODULES=("$@")
TESTS=(
  tests/test_exact_recorder.py tests/test_exact_parsers.py tests/test_exact_report.py
  tests/test_exact_targets.py tests/test_exact_spans.py tests/test_units.py
  tests/test_redact.py tests/test_report_verdict.py tests/test_gpu_free_parts.py tests/test_hotpath_no_graph.py
)

if [ ! -x "$VENV/bin/mutmut" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[test]" "mutmut>=3.3,<4"
fi

if [ "$RETEST" = 1 ]; then
  [ -d "$WORK/mutants" ] || { echo "no previous run in $WORK" >&2; exit 2; }
  # Today's tests; the sources stay as they were mutated.
  rm -rf "$WORK/tests" && cp -r "$ROOT/tests" "$WORK/"
else
  rm -rf "$WORK"
  mkdir -p "$WORK"
  cp -r "$ROOT/sgl_probe" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/pyproject.toml" "$WORK/"
  git -C "$ROOT" rev-parse HEAD > "$WORK/commit"
fi
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
# A retest keeps the settings of the run it continues: mutmut forgets every result when the test
# selection changes.
[ "$RETEST" = 1 ] || {
  echo "[mutmut]"
  echo "source_paths=sgl_probe"
  echo "also_copy=benchmarks"
  printf 'only_mutate=\n'; for m in "${MODULES[@]}"; do printf '    %s\n' "$m"; done
  printf 'pytest_add_cli_args_test_selection=\n'; for t in "${TESTS[@]}"; do [ -f "$ROOT/$t" ] && printf '    %s\n' "$t"; done
  printf 'pytest_add_cli_args=\n    -p\n    no:cacheprovider\n    -q\n'
  echo "process_isolation=forkserver"
} > "$WORK/setup.cfg"

cd "$WORK"
export SGL_PROBE_HARNESS_DIR=${SGL_PROBE_HARNESS_DIR:-$ROOT/.harness}
commit=$(cat "$WORK/commit")
names=()
if [ "$RETEST" = 1 ]; then
  mapfile -t names < <("$VENV/bin/python" -c '
import json, pathlib, sys
for mod in sys.argv[1:]:
    meta = pathlib.Path("mutants") / (mod + ".meta")
    if meta.exists():
        for k, v in json.loads(meta.read_text())["exit_code_by_key"].items():
            if v in (0, 5, 33, None):
                print(k)
' "${MODULES[@]}")
  echo "retesting ${#names[@]} survivors"
  [ ${#names[@]} -gt 0 ] || exit 0
fi
start=$(date +%s)
# mutmut draws a spinner with carriage returns: one line per frame would flood a log, so drop them.
nice -n 10 "$VENV/bin/mutmut" run --max-children "$JOBS" "${names[@]}" 2>&1 | tr '\r' '\n' \
  | grep --line-buffered -v '^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]' || true
RETEST=$RETEST "$VENV/bin/python" - "$OUT" "$commit" "$(( $(date +%s) - start ))" "${MODULES[@]}" <<'EOF'
import json, os, pathlib, sys

out, commit, seconds, modules = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
# mutmut's exit codes: 1/3 the tests failed (killed), 36/24/152/255 timeout (counted as killed:
# the mutant made the code hang), 0 survived, 33/5 no test reached it, None not run.
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
path = pathlib.Path(out)
result = json.loads(path.read_text()) if path.exists() else {}
result["tool"] = "mutmut 3 (benchmarks/mutation.sh)"
mods = result.setdefault("modules", {})
for mod in modules:
    meta = pathlib.Path("mutants") / (mod + ".meta")
    if not meta.exists():
        continue  # not mutated in this work dir (a retest of a partial run): keep its last result
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    mods[mod.removeprefix("sgl_probe/")] = {
        "killed": sum(1 for v in codes.values() if v in KILLED), "total": len(codes),
        "timeout": sum(1 for v in codes.values() if v in (36, 24, -24, 152, 255)),
        "no_tests": sum(1 for v in codes.values() if v in (5, 33)),
        "not_run": sum(1 for v in codes.values() if v is None),
        "survived": sorted(k for k, v in codes.items() if v not in KILLED),
        "commit": commit,
    }
result["commit"] = {}  # commit -> the modules whose sources came from it
for name, m in mods.items():
    result["commit"].setdefault(m["commit"], []).append(name)
k = sum(m["killed"] for m in mods.values())
t = sum(m["total"] for m in mods.values())
result["overall"] = {"killed": k, "total": t, "score": round(k / t, 4) if t else None}
result.pop("seconds", None)
result.setdefault("runs", []).append({"mode": "retest" if os.environ.get("RETEST") == "1" else "full",
                                      "modules": len(modules), "seconds": seconds})
path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
for name, m in mods.items():
    print(f"{name:28s} {m['killed']:4d}/{m['total']:<4d} killed")
print(f"{'overall':28s} {k:4d}/{t:<4d} killed ({100 * k / max(t, 1):.1f} %) -> {out}")
EOF
