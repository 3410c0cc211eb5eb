#!/usr/bin/env bash
# Configures and builds dloss in build/ (Ninja, Release). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh

BUILD_DIR=${DLOSS_BUILD_DIR:-build}

# torch's pip wheels link kineto into libtorch_cpu, yet their TorchConfig.cmake
# looks for a separate libkineto and warns for every configure ("library
# kineto not found"): a warning about torch's packaging that nothing of
# dloss's build uses. Drops exactly that block; every other line passes.
drop_kineto_warning() {
  awk '
    /^CMake Warning at .*TorchConfig\.cmake:[0-9]+ \(message\):$/ { held = $0 "\n"; holding = 1; next }
    holding {
      held = held $0 "\n"
      # The block ends with the blank line after its call stack.
      if ($0 == "" && seen_stack) {
        # CMake ends a warning with two blank lines: drop the second too.
        if (held !~ /library kineto not found/) printf "%s", held
        else skip_blank = 1
        holding = 0; seen_stack = 0; held = ""
      } else if ($0 ~ /^Call Stack/) seen_stack = 1
      next
    }
    skip_blank && $0 == "" { skip_blank = 0; next }
    { skip_blank = 0; print; fflush() }
    END { if (holding) printf "%s", held }'
}

# Configure when the build folder is new, another Python is asked for, or
# CMake arguments are given; otherwise the build re-runs CMake itself when a
# CMake file changed, with the options already cached.
cached_python=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$cached_python" != "$DLOSS_PYTHON" ] || [ $# -gt 0 ]; then
  cmake -G Ninja -S . -B "$BUILD_DIR" \
    -DCMAKE_BUILD_TYPE=Release \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
    -DPython3_EXECUTABLE="$DLOSS_PYTHON" \
    "$@" 2>&1 | drop_kineto_warning
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" 2>&1 | drop_kineto_warning
