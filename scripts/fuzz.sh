#!/usr/bin/env bash
# Fuzzes the compiler (parse, verify, every pass, derive-backward, plan lowering) with libFuzzer for SECONDS (default 60).
#
#   bash scripts/fuzz.sh [SECONDS]
#   bash scripts/fuzz.sh --build-only   # only build it (scripts/test.sh builds
#                                       # beside the tests, then fuzzes)
#
# Builds tools/dloss-fuzz with clang-14 (ASan + libFuzzer) in its own build
# directory ($DLOSS_FUZZ_BUILD_DIR, default build-fuzz), seeds it with every
# .mlir under test/ and examples/ (one input per `// -----` chunk) and the
# dictionary test/fuzz/dloss.dict, and fails when the fuzzer finds a crash,
# leaving the reproducer (crash-*, oom-*, timeout-*) in $DLOSS_FUZZ_WORK_DIR.
# The corpus it grows there is kept and reused by the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh
ROOT=$(pwd)

BUILD_ONLY=false
if [ "${1:-}" = --build-only ]; then
  BUILD_ONLY=true
  shift
fi
SECONDS_TO_FUZZ=${1:-60}
BUILD_DIR=${DLOSS_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
WORK_DIR=${DLOSS_FUZZ_WORK_DIR:-$BUILD_DIR/fuzz}
JOBS=${DLOSS_FUZZ_BUILD_JOBS:-$(nproc)}

# clang-14 and its libFuzzer/ASan runtimes (Debian 12); as scripts/setup.sh.
missing=()
for p in clang-14 libclang-rt-14-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_start=$(date +%s)
CC=clang-14 CXX=clang++-14 cmake -G Ninja -S . -B "$BUILD_DIR" \
  -DCMAKE_BUILD_TYPE=Release \
  -DDLOSS_BUILD_FUZZER=ON -DDLOSS_BUILD_TESTS=OFF -DDLOSS_ENABLE_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" --target dloss-fuzz -j "$JOBS"
echo "fuzz: built $BUILD_DIR/bin/dloss-fuzz in $(($(date +%s) - build_start)) s"
! $BUILD_ONLY || exit 0

# Seeds: every .mlir under test/ and examples/, split at `// -----` as
# --split-input-file does, so that each case is an input of its own.
SEEDS=$WORK_DIR/seeds
CORPUS=$WORK_DIR/corpus
rm -rf "$SEEDS"
mkdir -p "$SEEDS" "$CORPUS"
find test examples -name '*.mlir' -print0 | sort -z |
  while IFS= read -r -d '' f; do
    awk -v base="$SEEDS/$(echo "${f%.mlir}" | tr '/' '_')" '
      BEGIN { out = base ".0.mlir" }
      /^\/\/ -----/ { close(out); out = base "." ++n ".mlir"; next }
      { print > out }' "$f"
  done
echo "fuzz: $(ls "$SEEDS" | wc -l) seed inputs, $(ls "$CORPUS" | wc -l) inputs in the corpus from earlier runs"

# Crash, OOM and timeout reproducers land in WORK_DIR; the log gives the stats.
LOG=$WORK_DIR/fuzz.log
rm -f "$LOG"
set +e
(cd "$WORK_DIR" && ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  "$BUILD_DIR/bin/dloss-fuzz" \
  -max_total_time="$SECONDS_TO_FUZZ" -timeout=10 -rss_limit_mb=4096 \
  -dict="$ROOT/test/fuzz/dloss.dict" -print_final_stats=1 \
  "$CORPUS" "$SEEDS") >"$LOG" 2>&1
rc=$?
set -e

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOG" | tail -1)
time_s=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$LOG" | tail -1)
cov=$({ grep -oE 'cov: [0-9]+ ft: [0-9]+' "$LOG" || true; } | tail -1)
echo "fuzz: ${time_s:-?} s, ${execs:-?} executions, corpus $(ls "$CORPUS" | wc -l) inputs, ${cov:-no coverage line} (log: $LOG)"

if [ $rc -ne 0 ]; then
  tail -n 60 "$LOG"
  echo "fuzz: FAILED (exit $rc); reproducer(s):"
  ls -1 "$WORK_DIR" | grep -E '^(crash|oom|timeout|leak|slow-unit)-' | sed "s|^|  $WORK_DIR/|" || true
  echo "fuzz: replay with $BUILD_DIR/bin/dloss-fuzz FILE; minimize with -minimize_crash=1 -runs=10000 FILE"
  exit 1
fi
echo "fuzz: no crash"
