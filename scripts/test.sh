#!/usr/bin/env bash
# The whole test suite on a fresh machine: install packages, build, fuzz, compile the CUDA build, run every test (lit + GoogleTest + Python) under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The machine's own PATH, for the CUDA build's venv (below).
MACHINE_PATH=$PATH
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh
BUILD_DIR=${DLOSS_BUILD_DIR:-build}

# Steps that leave a core idle run beside the others: each in a process group
# of its own (stopped if this script stops), its output printed when it ends.
# Each step says how long it took, in seconds of wall clock and of CPU (user +
# sys, its own processes only: it runs in a shell of its own).
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/dloss-test.XXXXXX")
declare -A running=()
trap 'for pid in "${running[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; rm -rf "$LOGS"' EXIT
timed() {  # timed NAME COMMAND...: run COMMAND, then say how long it took
  (
    TIMEFORMAT="test: $1 took %0R s (%0U + %0S CPU-s)"
    shift
    time "$@"
  )
}
beside() {  # beside [--idle] NAME COMMAND...: start COMMAND, its output in $LOGS/NAME.log
  # --idle: at the lowest priority, so that it takes only the CPU the rest
  # leaves. setsid starts a session, hence (where the kernel groups sessions,
  # sched_autogroup) a scheduling group of its own, which the scheduler
  # shares the CPU with equally whatever its processes' nice: the group's own
  # nice (/proc/self/autogroup) is set too.
  local idle=""
  if [ "$1" = --idle ]; then
    idle='{ echo 19 > /proc/self/autogroup; } 2> /dev/null || true;'
    shift
    set -- "$1" nice -n 19 "${@:2}"
  fi
  local name=$1
  shift
  setsid --wait bash -c "$idle $(declare -f timed); timed \"\$@\"" timed "$name" "$@" \
    > "$LOGS/$name.log" 2>&1 &
  running[$name]=$!
}
finish() {  # finish NAME: wait for NAME and print its output; its exit status
  local rc=0
  wait "${running[$1]}" || rc=$?
  unset "running[$1]"
  cat "$LOGS/$1.log"
  [ "$rc" -eq 0 ] || echo "test: $1 FAILED (exit $rc)"
  return "$rc"
}

# The CUDA build's venv (pip unpacking torch's CUDA wheels: one core and the
# disk) beside the setup (pip filling .venv: the other core), made with the
# machine's Python, not with .venv's, which setup may be making meanwhile.
# Where it fails (a fresh machine without python3-venv, say),
# scripts/cuda-build.sh makes it again below.
beside cuda-venv env PATH="$MACHINE_PATH" bash scripts/cuda-build.sh --venv-only
timed setup bash scripts/setup.sh
timed "the main build" bash scripts/build.sh
finish cuda-venv || true

# The tests of the main build (ctest -j2), with the two other builds beside
# them at the lowest priority: the CUDA build against the CUDA torch (build-cuda/,
# compiled, not run; one SKIPPED line where that torch is not on this machine's
# disk) and the fuzzer's (clang, build-fuzz/). They take the cores that the
# tests leave idle (many wait on peers, timeouts and process start-up) and
# slow no time-bounded test. Then the CUDA build's tests on the CPU (a second
# torch) and one minute of fuzzing, beside each other at normal priority.
beside --idle cuda-compile bash scripts/cuda-build.sh --build-only
beside --idle fuzz-build bash scripts/fuzz.sh --build-only
rc=0
# torch looks up the name of both ends of each TCPStore connection; this
# machine's resolver drops some of those queries, each then waiting 5 s
# (docs/Lightning.md). One second is the resolver's shortest timeout.
export RES_OPTIONS="${RES_OPTIONS:-timeout:1 attempts:2}"
timed ctest ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" || rc=$?
failed=()
[ "$rc" -eq 0 ] || failed+=(ctest)
finish cuda-compile || failed+=(cuda-build)
finish fuzz-build || failed+=(fuzz-build)
if [[ " ${failed[*]} " != *" fuzz-build "* ]]; then
  beside fuzz bash scripts/fuzz.sh 60
fi
if [[ " ${failed[*]} " != *" cuda-build "* ]]; then
  timed "the CUDA build's checks and tests" bash scripts/cuda-build.sh --check-only ||
    failed+=(cuda-build)
fi
if [ -n "${running[fuzz]:-}" ]; then
  finish fuzz || failed+=(fuzz)
fi
if [ ${#failed[@]} -ne 0 ]; then
  echo "test: FAILED: ${failed[*]}"
  exit 1
fi
echo "test: PASS"
