#!/usr/bin/env bash
# Configures and builds dloss in build/ (Ninja, Release). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${DLOSS_BUILD_DIR:-build}
cmake -G Ninja -S . -B "$BUILD_DIR" \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit \
  "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
