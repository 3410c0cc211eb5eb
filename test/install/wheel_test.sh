#!/usr/bin/env bash
# pip's path, as a user takes it: build the wheel (pip wheel, scikit-build-core,
# against the build's torch), install it into a fresh venv that holds only
# torch, then from a folder outside the source tree: 2 Gloo ranks of
# dloss.ClipLoss against one process, a C++ consumer through
# find_package(dloss) and dloss.cmake_prefix_path, the console scripts (dloss-run
# compiling a loss with the wheel's compiler library), and
# ldd: nothing resolves to LLVM, MLIR, the build or the source tree.
# Driven by ctest (test/install/CMakeLists.txt, wheel-install).
#
# The wheel is built from scratch in WHEEL_BUILD_DIR, through the main build's
# ccache (CCACHE_DIR, cmake/DlossCcache.cmake; empty: none): with the main
# build folder at the same depth under the source tree, the objects whose flags
# agree come from the main build's compiles, and the script says how many.
#
# usage: wheel_test.sh SOURCE_DIR WORK_DIR PYTHON WHEEL_BUILD_DIR CCACHE_DIR -- CMAKE_ARGS...
set -euo pipefail

source=$(realpath "$1") work=$2 python=$3 wheel_build=$4 ccache_dir=$5
shift 5
[[ ${1:-} == -- ]] && shift
consumer_args=("$@")

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $* ($(date +%T))"; }

rm -rf "$work" "$wheel_build"
mkdir -p "$work"
work=$(realpath "$work")
unset LD_LIBRARY_PATH PYTHONPATH CMAKE_PREFIX_PATH VIRTUAL_ENV

torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')

# The fresh venv (pip unpacking torch: one core and the disk) is made beside
# the wheel's build (both cores).
venv_python=$work/venv/bin/python
(
  "$python" -m venv "$work/venv"
  "$venv_python" -m pip install --progress-bar off -q "torch==$torch_version" numpy 2>&1 |
    { grep -v "^WARNING: Location" || true; }  # pip's own failure still fails
) > "$work/venv.log" 2>&1 &
venv_pid=$!
# Where the build fails, its pip ends before this script does.
trap 'wait "$venv_pid" 2>/dev/null || true' EXIT

# ccache's counters (hits, misses) before and after the wheel's build.
ccache_counts() {
  [[ -n $ccache_dir ]] && command -v ccache > /dev/null || return 0
  # An older ccache without --print-stats counts nothing, and fails nothing.
  { CCACHE_DIR=$ccache_dir ccache --print-stats 2> /dev/null || true; } |
    awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ { hit += $2 } $1 == "cache_miss" { miss = $2 }
         END { print hit + 0, miss + 0 }'
}
# The consumer's CMake definitions (the main build's compiler: the same name,
# so ccache's hash agrees) go to the wheel's CMake too, which would otherwise
# take Python's (sysconfig's g++).
build_args=()
for arg in "${consumer_args[@]}"; do
  [[ $arg != -D* ]] || build_args+=(-C "cmake.define.${arg#-D}")
done
[[ -z $ccache_dir ]] || build_args+=(-C "cmake.define.DLOSS_CCACHE_DIR=$ccache_dir")
before=$(ccache_counts)
step "pip wheel --no-build-isolation $source (torch $torch_version; the build prints [n/N])"
"$python" -m pip wheel -v --no-build-isolation --no-deps -w "$work/dist" \
  -C build-dir="$wheel_build" "${build_args[@]}" "$source" 2>&1 |
  tee "$work/wheel.log" | grep -E '^\[[0-9]+/[0-9]+\]|Created wheel|error' || true
after=$(ccache_counts)
if [[ -n $before && -n $after ]]; then
  read -r hit0 miss0 <<< "$before"
  read -r hit1 miss1 <<< "$after"
  echo "wheel: ccache ($ccache_dir): $((hit1 - hit0)) compiles taken from the cache, $((miss1 - miss0)) compiled"
fi
shopt -s nullglob
wheels=("$work"/dist/dloss-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { tail -40 "$work/wheel.log"; fail "no wheel was built"; }
echo "wheel: $(basename "${wheels[0]}"), $(du -m "${wheels[0]}" | cut -f1) MB"

step "a fresh venv with only torch==$torch_version (made beside the build), then the wheel"
wait "$venv_pid" || { cat "$work/venv.log"; fail "making the venv failed"; }
cat "$work/venv.log"
"$venv_python" -m pip install --progress-bar off -q --no-deps "${wheels[0]}"
site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
package=$site/dloss
[[ -d $package ]] || fail "the wheel installed no dloss package in $site"

step "ldd: every library and tool of the install"
mapfile -t binaries < <(find "$package" -type f \( -name '*.so*' -o -perm -u+x \) |
  while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
[[ ${#binaries[@]} -ge 7 ]] || fail "expected the extension, 3 libraries and 3 tools, found: ${binaries[*]}"
[[ -f $package/lib/libdloss_compiler.so ]] || fail "the wheel has no lib/libdloss_compiler.so"
for binary in "${binaries[@]}"; do
  deps=$(ldd "$binary")
  echo "$(basename "$binary"): $(grep -c '=>' <<< "$deps") libraries"
  if grep -q "not found" <<< "$deps"; then
    fail "$binary has unresolved libraries:
$(grep 'not found' <<< "$deps")"
  fi
  if grep -E 'libLLVM|libMLIR|libclang' <<< "$deps"; then
    fail "$binary needs LLVM or MLIR at run time"
  fi
  # The test's own venv (torch's libraries) may lie under the source tree.
  if grep -v -F "$work/venv/" <<< "$deps" | grep -F -e "$source/" -e "$wheel_build"; then
    fail "$binary resolves a library in the source or build tree"
  fi
done

outside=$work/outside
mkdir -p "$outside"
step "2 Gloo ranks of dloss.ClipLoss against one process, from $outside"
(cd "$outside" && OMP_NUM_THREADS=1 DLOSS_CACHE_DIR="$work/plan-cache" \
  "$venv_python" "$source/test/install/check_wheel.py") | tee "$work/python.log"
grep -qx PASS "$work/python.log" || fail "the 2-rank check did not print PASS"
grep -q "dloss imported from $package/" "$work/python.log" ||
  fail "dloss was not imported from the installed wheel"

step "the console scripts"
"$work/venv/bin/dlossc" "$source/examples/clip.mlir" -o "$outside/clip.plan" ||
  fail "dlossc failed"
[[ -s $outside/clip.plan ]] || fail "dlossc wrote no plan"
"$work/venv/bin/dloss-run" --help > "$work/dloss-run-help.log" 2>&1 ||
  { cat "$work/dloss-run-help.log"; fail "dloss-run --help failed"; }
"$work/venv/bin/dloss-opt" "$source/examples/clip.mlir" > /dev/null ||
  fail "dloss-opt failed"
# dloss-run compiles a .mlir loss with the wheel's compiler library (an empty
# cache: nothing to find there) and checks 2 uneven ranks against one process.
(cd "$outside" && OMP_NUM_THREADS=1 DLOSS_CACHE_DIR="$work/dloss-run-cache" \
  "$venv_python" "$source/examples/run_example.py" "$work/venv/bin/dloss-run" \
  "$source/examples/clip.mlir" --sizes 3,2 --out "$outside/dloss-run") |
  tee "$work/dloss-run.log"
grep -q "tolerance 1e-05: PASS" "$work/dloss-run.log" ||
  fail "dloss-run did not compile and check clip.mlir"
compgen -G "$work/dloss-run-cache/*.plan" > /dev/null ||
  fail "dloss-run cached no plan in DLOSS_CACHE_DIR"

step "C++ consumer through find_package(dloss) with dloss.cmake_prefix_path"
prefix_path=$("$venv_python" -c 'import dloss, torch.utils; print(dloss.cmake_prefix_path + ";" + torch.utils.cmake_prefix_path)')
cp -r "$source/test/install/consumer" "$work/consumer"
cmake -S "$work/consumer" -B "$work/consumer-build" -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_BUILD_TYPE=Release "${consumer_args[@]}" > "$work/consumer-configure.log" 2>&1 ||
  { cat "$work/consumer-configure.log"; fail "configuring the consumer failed"; }
grep -q "dloss_DIR:PATH=$package/lib/cmake/dloss" "$work/consumer-build/CMakeCache.txt" ||
  fail "find_package(dloss) did not find the wheel's package"
cmake --build "$work/consumer-build" > "$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log"; fail "building the consumer failed"; }
(cd "$outside" && DLOSS_CACHE_DIR="$work/plan-cache" "$work/consumer-build/consumer") |
  tee "$work/consumer.log"
grep -qx PASS "$work/consumer.log" || fail "the consumer did not print PASS"
echo "PASS"
