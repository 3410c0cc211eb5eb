#!/usr/bin/env bash
# pip's path, as a user takes it: build the two wheels (pip wheel,
# scikit-build-core): dloss-compiler (packaging/compiler: the compiler alone,
# no torch) and dloss (the runtime, against the build's torch). Install both
# into a fresh venv that holds only torch (pip check: dloss requires exactly
# this dloss-compiler, and the torch release it is built against), then from a folder outside the source tree: 2 Gloo
# ranks of dloss.ClipLoss against one process, a C++ consumer through
# find_package(dloss) and dloss.cmake_prefix_path, the console scripts
# (dloss-run compiling a loss with the compiler wheel's library), and ldd:
# nothing resolves to LLVM, MLIR, the build or the source tree. Leaves the
# wheels in WORK_DIR/dist for pip-install-sdist (test/install/pip_test.sh).
# Driven by ctest (test/install/CMakeLists.txt, wheel-install).
#
# The wheels are built from scratch in WHEEL_BUILD_DIR and
# WHEEL_BUILD_DIR-compiler, through the main build's ccache (CCACHE_DIR,
# cmake/DlossCcache.cmake; empty: none): with the main build folder at the
# same depth under the source tree, the objects whose flags agree come from
# the main build's compiles, and the script says how many.
#
# usage: wheel_test.sh SOURCE_DIR WORK_DIR PYTHON WHEEL_BUILD_DIR CCACHE_DIR -- CMAKE_ARGS...
set -euo pipefail

source=$(realpath "$1") work=$2 python=$3 wheel_build=$4 ccache_dir=$5
shift 5
[[ ${1:-} == -- ]] && shift
consumer_args=("$@")

source "$(dirname "$0")/common.sh"

rm -rf "$work" "$wheel_build" "$wheel_build-compiler"
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

# The consumer's CMake definitions (the main build's compiler: the same name,
# so ccache's hash agrees) go to the wheel's CMake too, which would otherwise
# take Python's (sysconfig's g++).
build_args=()
for arg in "${consumer_args[@]}"; do
  [[ $arg != -D* ]] || build_args+=(-C "cmake.define.${arg#-D}")
done
[[ -z $ccache_dir ]] || build_args+=(-C "cmake.define.DLOSS_CCACHE_DIR=$ccache_dir")
before=$(ccache_counts "$ccache_dir")
# build_wheel NAME BUILD_DIR PROJECT_DIR: pip wheel PROJECT_DIR into $work/dist.
build_wheel() {
  step "pip wheel --no-build-isolation $3 (torch $torch_version; the build prints [n/N])"
  "$python" -m pip wheel -v --no-build-isolation --no-deps -w "$work/dist" \
    -C build-dir="$2" "${build_args[@]}" "$3" 2>&1 |
    tee "$work/$1.log" | progress
}
build_wheel compiler-wheel "$wheel_build-compiler" "$source/packaging/compiler"
build_wheel wheel "$wheel_build" "$source"
ccache_report wheels "$ccache_dir" "$before" "$(ccache_counts "$ccache_dir")"
shopt -s nullglob
compiler_wheels=("$work"/dist/dloss_compiler-*.whl)
[[ ${#compiler_wheels[@]} -eq 1 ]] || { tail -40 "$work/compiler-wheel.log"; fail "no dloss-compiler wheel was built"; }
wheels=("$work"/dist/dloss-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { tail -40 "$work/wheel.log"; fail "no dloss wheel was built"; }
label=$(cmake -DSOURCE_DIR="$source" -DLABEL=ON -P "$source/cmake/DlossCompilerIdentity.cmake")
project=$(sed -n 's/^project(dloss VERSION \([0-9.]*\).*/\1/p' "$source/CMakeLists.txt")
[[ $(basename "${compiler_wheels[0]}") == dloss_compiler-$project+$label-py3-none-linux_x86_64.whl ]] ||
  fail "$(basename "${compiler_wheels[0]}") is not version $project+$label (CMakeLists.txt's project() and the compiler's label), tag py3-none-linux_x86_64"
[[ $(basename "${wheels[0]}") == dloss-$project-* ]] ||
  fail "$(basename "${wheels[0]}") is not version $project, CMakeLists.txt's project()"
for wheel in "${compiler_wheels[0]}" "${wheels[0]}"; do
  echo "wheel: $(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB"
done

step "a fresh venv with only torch==$torch_version (made beside the build), then the wheel"
wait "$venv_pid" || { cat "$work/venv.log"; fail "making the venv failed"; }
cat "$work/venv.log"
"$venv_python" -m pip install --progress-bar off -q --no-deps "${compiler_wheels[0]}" "${wheels[0]}"
"$venv_python" -m pip check || fail "pip check: the installed pair does not meet dloss's requirements"
# The extension links this torch release's C++ ABI: the wheel pins it.
requires=$("$venv_python" -c 'import importlib.metadata as m; print("\n".join(m.requires("dloss")))')
grep -qx "torch==$torch_version" <<< "$requires" ||
  fail "dloss requires $(grep '^torch' <<< "$requires" || echo 'no torch'), not torch==$torch_version, the release it was built against"
# Both wheels declare Apache-2.0 (PEP 639) and carry the repository's LICENSE
# in their .dist-info/licenses.
"$venv_python" - "$source/LICENSE" << 'PY' || fail "the wheels' license metadata is wrong (above)"
import importlib.metadata as m
import sys

want = open(sys.argv[1], "rb").read()
bad = []
for name in ("dloss", "dloss-compiler"):
    meta = m.metadata(name)
    expression = meta.get("License-Expression")
    if expression != "Apache-2.0":
        bad.append(f"{name} declares License-Expression {expression!r}, not 'Apache-2.0'")
    if "LICENSE" not in (meta.get_all("License-File") or []):
        bad.append(f"{name} names no License-File LICENSE: {meta.get_all('License-File')}")
    found = [f for f in m.files(name) or []
             if f.parts[-2:] == ("licenses", "LICENSE") and f.parts[0].endswith(".dist-info")]
    if not found:
        bad.append(f"{name} installed no .dist-info/licenses/LICENSE")
    elif found[0].read_binary() != want:
        bad.append(f"{name}'s {found[0]} is not the repository's LICENSE")
    else:
        print(f"{name}: License-Expression {expression}, {found[0]} is the repository's LICENSE")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
site=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
package=$site/dloss
compiler_package=$site/dloss_compiler
[[ -d $package ]] || fail "the wheel installed no dloss package in $site"
[[ -f $compiler_package/lib/libdloss_compiler.so ]] ||
  fail "the dloss-compiler wheel has no dloss_compiler/lib/libdloss_compiler.so"
[[ ! -e $package/lib/libdloss_compiler.so ]] ||
  fail "the dloss wheel carries a compiler library of its own: the compiler is dloss-compiler's"

step "ldd: every library and tool of the install"
mapfile -t binaries < <(find "$package" "$compiler_package" -type f \( -name '*.so*' -o -perm -u+x \) |
  while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
[[ ${#binaries[@]} -ge 7 ]] || fail "expected the extension, 3 libraries and 3 tools, found: ${binaries[*]}"
# What the compiler wheel needs of the system: its newest glibc and libstdc++
# symbol versions, at most Ubuntu 22.04's (glibc 2.35, GCC 12's libstdc++;
# compiler/GlibcCompat.cpp keeps glibc 2.36's arc4random out).
newest() { objdump -T "$1" | grep -o "$2_[0-9.]*" | sort -uV | tail -1; }
for binary in "$compiler_package"/lib/libdloss_compiler.so "$compiler_package"/bin/dlossc \
    "$compiler_package"/bin/dloss-opt; do
  glibc=$(newest "$binary" GLIBC) glibcxx=$(newest "$binary" GLIBCXX)
  echo "$(basename "$binary") needs $glibc and $glibcxx"
  [[ $(printf '%s\n' "$glibc" GLIBC_2.35 | sort -V | tail -1) == GLIBC_2.35 ]] ||
    fail "$binary needs $glibc: newer than Ubuntu 22.04's GLIBC_2.35"
  [[ $(printf '%s\n' "$glibcxx" GLIBCXX_3.4.30 | sort -V | tail -1) == GLIBCXX_3.4.30 ]] ||
    fail "$binary needs $glibcxx: newer than GCC 12's GLIBCXX_3.4.30"
done
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
check_clip_ranks "$venv_python" "$source" "$outside" "$work" "$package"

step "the console scripts"
"$work/venv/bin/dlossc" "$source/examples/clip.mlir" -o "$outside/clip.plan" ||
  fail "dlossc failed"
[[ -s $outside/clip.plan ]] || fail "dlossc wrote no plan"
"$work/venv/bin/dloss-run" --help > "$work/dloss-run-help.log" 2>&1 ||
  { cat "$work/dloss-run-help.log"; fail "dloss-run --help failed"; }
"$work/venv/bin/dloss-opt" "$source/examples/clip.mlir" > /dev/null ||
  fail "dloss-opt failed"
check_dloss_run "$venv_python" "$work/venv/bin/dloss-run" "$source" "$outside" "$work"

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
