# Sourced by wheel_test.sh and pip_test.sh: their failures, steps, build
# progress and ccache's part in their builds.

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* ($(date +%T))"; }

# progress < LOG: a verbose pip build's output reduced to ninja's [n/N]
# counters (with what was made, up to 120 characters), pip's wheel line and errors.
progress() {
  sed -nE 's/^ *(\[[0-9]+\/[0-9]+\]) (.{0,120}).*/\1 \2/p; /Created wheel|error:/p'
}

# ccache_counts CCACHE_DIR: ccache's counters (hits, misses); nothing without
# a cache or ccache. An older ccache without --print-stats counts nothing,
# and fails nothing.
ccache_counts() {
  [[ -n $1 ]] && command -v ccache > /dev/null || return 0
  { CCACHE_DIR=$1 ccache --print-stats 2> /dev/null || true; } |
    awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ { hit += $2 } $1 == "cache_miss" { miss = $2 }
         END { print hit + 0, miss + 0 }'
}

# ccache_report WHAT CCACHE_DIR BEFORE AFTER: how many of a build's compiles
# ccache served (BEFORE and AFTER from ccache_counts).
ccache_report() {
  [[ -n $3 && -n $4 ]] || return 0
  local hit0 miss0 hit1 miss1
  read -r hit0 miss0 <<< "$3"
  read -r hit1 miss1 <<< "$4"
  echo "$1: ccache ($2): $((hit1 - hit0)) compiles taken from the cache, $((miss1 - miss0)) compiled"
}

# The checks both installs run, from OUTSIDE (a folder outside the source and
# build trees) with one intra-op thread, each output kept in WORK/<name>.log.
#
# check_clip_ranks PYTHON SOURCE OUTSIDE WORK PACKAGE: 2 Gloo ranks of
# dloss.ClipLoss against one process (check_wheel.py), dloss imported from
# PACKAGE (the installed one); an empty plan cache, so it compiles.
check_clip_ranks() {
  local python=$1 source=$2 outside=$3 work=$4 package=$5
  step "2 Gloo ranks of dloss.ClipLoss against one process, from $outside"
  (cd "$outside" && OMP_NUM_THREADS=1 DLOSS_CACHE_DIR="$work/plan-cache" \
    "$python" "$source/test/install/check_wheel.py") | tee "$work/python.log"
  grep -qx PASS "$work/python.log" || fail "the 2-rank check did not print PASS"
  grep -q "dloss imported from $package/" "$work/python.log" ||
    fail "dloss was not imported from the installed package $package"
}

# check_dloss_run PYTHON DLOSS_RUN SOURCE OUTSIDE WORK: dloss-run compiles
# clip.mlir with the installed compiler library (an empty cache: nothing to
# find there) and --check's 2 uneven ranks against one process.
check_dloss_run() {
  local python=$1 dloss_run=$2 source=$3 outside=$4 work=$5
  step "dloss-run --check: clip.mlir on 2 uneven ranks against one process"
  (cd "$outside" && OMP_NUM_THREADS=1 DLOSS_CACHE_DIR="$work/dloss-run-cache" \
    "$python" "$source/examples/run_example.py" "$dloss_run" \
    "$source/examples/clip.mlir" --sizes 3,2 --out "$outside/dloss-run") |
    tee "$work/dloss-run.log"
  grep -q "tolerance 1e-05: PASS" "$work/dloss-run.log" ||
    fail "dloss-run did not compile and check clip.mlir"
  compgen -G "$work/dloss-run-cache/*.plan" > /dev/null ||
    fail "dloss-run cached no plan in DLOSS_CACHE_DIR"
}
