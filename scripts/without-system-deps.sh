#!/usr/bin/env bash
# Runs a command with the system's build packages hidden, as on a machine
# that never had them: a private mount namespace (root, Linux: unshare -m)
# where Debian's LLVM/MLIR 22, Gloo, FlatBuffers (headers and flatc) and
# GoogleTest are empty folders or /dev/null. Nothing changes outside it.
#
#   bash scripts/without-system-deps.sh COMMAND [ARGS...]
#
# Used by test/install/pip_test.sh (dloss built from its sdist with PyPI's
# tools alone) and scripts/gpu-check.sh --hide-system-deps (the GPU machine's
# build, rehearsed). DLOSS_WITHOUT_SYSTEM_DEPS=1 is set inside.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: without-system-deps.sh COMMAND [ARGS...]" >&2; exit 2; }

hidden=()
for path in /usr/lib/llvm-22 /usr/include/mlir /usr/include/mlir-c /usr/include/llvm-22 \
    /usr/include/gloo /usr/include/flatbuffers /usr/include/gtest /usr/include/gmock \
    /usr/src/googletest /usr/src/gtest /usr/lib/x86_64-linux-gnu/cmake/GTest \
    /usr/lib/x86_64-linux-gnu/cmake/flatbuffers /usr/lib/x86_64-linux-gnu/cmake/gloo \
    /usr/bin/flatc /usr/bin/mlir-tblgen-22 /usr/bin/mlir-opt-22 \
    /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a \
    /usr/lib/x86_64-linux-gnu/libflatbuffers.a /usr/lib/x86_64-linux-gnu/libflatbuffers.so \
    /usr/lib/x86_64-linux-gnu/libgloo.so /usr/lib/x86_64-linux-gnu/libgloo.a; do
  # A link is hidden with what it points to (and mounting on it fails).
  [ -e "$path" ] && [ ! -L "$path" ] && hidden+=("$path")
done
echo "without-system-deps: hiding ${hidden[*]:-nothing (none installed)}"
exec env DLOSS_WITHOUT_SYSTEM_DEPS=1 unshare -m --propagation private bash -c '
  for path in "${@:2:$1}"; do
    if [ -d "$path" ]; then mount -t tmpfs none "$path"; else mount --bind /dev/null "$path"; fi || {
      echo "without-system-deps: FAILED: could not hide $path (needs root and unshare -m)" >&2
      exit 1
    }
  done
  exec "${@:$(($1 + 2))}"' hide "${#hidden[@]}" "${hidden[@]}" "$@"
