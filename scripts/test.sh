#!/usr/bin/env bash
# The whole test suite on a fresh machine: install packages, build, fuzz, compile the CUDA build, run every test (lit + GoogleTest + Python) under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh
BUILD_DIR=${DLOSS_BUILD_DIR:-build}

# Steps that leave a core idle run beside the others: each in a process group
# of its own (stopped if this script stops), its output printed when it ends.
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/dloss-test.XXXXXX")
declare -A running=()
trap 'for pid in "${running[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; rm -rf "$LOGS"' EXIT
beside() {  # beside NAME COMMAND...: start COMMAND, its output in $LOGS/NAME.log
  local name=$1
  shift
  setsid --wait "$@" > "$LOGS/$name.log" 2>&1 &
  running[$name]=$!
}
finish() {  # finish NAME: wait for NAME; its exit status
  local rc=0
  wait "${running[$1]}" || rc=$?
  unset "running[$1]"
  return "$rc"
}

bash scripts/setup.sh
# The CUDA build's venv (pip unpacking torch's CUDA wheels: one core and the
# disk) beside the main build (both cores). Where it fails or skips,
# scripts/cuda-build.sh below says so.
beside cuda-venv bash scripts/cuda-build.sh --venv-only
bash scripts/build.sh
if finish cuda-venv; then
  grep -v "SKIPPED" "$LOGS/cuda-venv.log" || true
else
  cat "$LOGS/cuda-venv.log"
fi
# One minute of fuzzing parse + verify + the whole pass pipeline (clang build
# in build-fuzz/) beside the CUDA build: the fuzzer's build competes with it
# for both cores, then the fuzzing takes one, which the CUDA build (niced)
# leaves it.
beside fuzz bash scripts/fuzz.sh 60
# The CUDA build against the CUDA torch (build-cuda/, compiled, not run), where
# that torch is on this machine's disk; one SKIPPED line elsewhere.
nice -n 5 bash scripts/cuda-build.sh
rc=0
finish fuzz || rc=$?
cat "$LOGS/fuzz.log"
[ "$rc" -eq 0 ] || { echo "test: scripts/fuzz.sh FAILED (exit $rc)"; exit "$rc"; }
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
