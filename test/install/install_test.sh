#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then use only that prefix: build and run
# an out-of-tree C++ program with find_package(dloss), and `import dloss` from
# Debian's python3. Driven by ctest (test/install/CMakeLists.txt).
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR WORK_DIR PYTHON PYTHON_INSTALL_DIR
#                        -- CMAKE_ARGS...   (generator, compiler for the consumer)
set -euo pipefail

build=$(realpath "$1") source=$(realpath "$2") work=$3 python=$4 pydir=$5
shift 5
[[ ${1:-} == -- ]] && shift
consumer_args=("$@")

fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

rm -rf "$work"
mkdir -p "$work"
work=$(realpath "$work")
prefix=$work/prefix
# Nothing from the build tree may leak in through the environment.
unset LD_LIBRARY_PATH PYTHONPATH CMAKE_PREFIX_PATH

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install failed"; }

for file in lib/libdloss_runtime.so lib/libdloss_jit.so lib/libdloss_compiler.so \
    include/dloss/compiler/dloss_compiler.h \
    lib/cmake/dloss/dlossConfig.cmake lib/cmake/dloss/dlossConfigVersion.cmake \
    lib/cmake/dloss/dlossTargets.cmake \
    include/dloss/runtime/autograd/CompiledLoss.h \
    include/dloss/runtime/plan/Plan_generated.h \
    include/dloss/frontend/Jit.h "$pydir/dloss/__init__.py"; do
  [[ -e $prefix/$file ]] || fail "$file was not installed"
done
shopt -s nullglob
extension=("$prefix/$pydir"/dloss/_C*.so)
[[ ${#extension[@]} -eq 1 ]] || fail "dloss/_C*.so was not installed"

# The installed libraries find each other by $ORIGIN, never in the build tree.
for library in "$prefix"/lib/libdloss_*.so "${extension[0]}"; do
  runpath=$(readelf -d "$library" | grep -E 'RUNPATH|RPATH' || true)
  echo "$(basename "$library"): ${runpath:-no runpath}"
  if [[ $runpath == *"$source"* || $runpath == *"$build"* ]]; then
    fail "$library's run path points into the source or build tree"
  fi
done

step "out-of-tree C++ consumer (find_package(dloss))"
# A copy, so that nothing of the source tree sits beside it.
cp -r "$source/test/install/consumer" "$work/consumer"
cmake -S "$work/consumer" -B "$work/consumer-build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  "${consumer_args[@]}" > "$work/consumer-configure.log" 2>&1 ||
  { cat "$work/consumer-configure.log"; fail "configuring the consumer failed"; }
grep -q "dloss_DIR:PATH=$prefix/lib/cmake/dloss" "$work/consumer-build/CMakeCache.txt" ||
  fail "find_package(dloss) did not find the installed package"
cmake --build "$work/consumer-build" > "$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log"; fail "building the consumer failed"; }
# Its compile and link lines name only the prefix and system directories.
lines=$(cat "$work/consumer-build/compile_commands.json"
  grep -hE '^ *(LINK_FLAGS|LINK_LIBRARIES|LINK_PATH) = ' \
    "$work/consumer-build/build.ninja" 2>/dev/null || true)
lines=${lines//"$work"/}
# torch's own paths are the consumer's to name, even where its environment
# sits in the source tree (scripts/setup.sh's .venv).
torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
lines=${lines//"$torch_dir"/}
if [[ $lines == *"$source/"* || $lines == *"$build/"* ]]; then
  fail "the consumer's build lines point into the source or build tree:
$(grep -F -e "$source/" -e "$build/" <<< "$lines" | head -5)"
fi
"$work/consumer-build/consumer" | tee "$work/consumer.log"
grep -qx PASS "$work/consumer.log" || fail "the consumer did not print PASS"

step "$python: import dloss from $prefix/$pydir"
(cd "$work" && PYTHONPATH="$prefix/$pydir" "$python" \
  "$source/test/install/check_python.py" "$prefix") | tee "$work/python.log"
grep -qx PASS "$work/python.log" || fail "the Python check did not print PASS"
echo "PASS"
