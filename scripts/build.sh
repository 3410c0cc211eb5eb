#!/usr/bin/env bash
# Configures and builds dloss in build/ (Ninja, Release). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh

BUILD_DIR=${DLOSS_BUILD_DIR:-build}
cmake -G Ninja -S . -B "$BUILD_DIR" \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
  -DPython3_EXECUTABLE="$DLOSS_PYTHON" \
  "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
