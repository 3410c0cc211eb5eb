#!/usr/bin/env bash
# Installs every Debian package dloss needs to build and test; does nothing when all are present.
set -euo pipefail

PACKAGES=(
  # Build tools.
  cmake ninja-build g++ git clang-format
  # Compiler: LLVM/MLIR 22 (lit and FileCheck live in /usr/lib/llvm-22/bin).
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  # Runtime: LibTorch 1.13 CPU, Gloo, a fast BLAS for ATen, FlatBuffers for the plan.
  libtorch-dev libgloo-dev libopenblas0-pthread libflatbuffers-dev flatbuffers-compiler
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # Python-side reference checks (Debian's torch for /usr/bin/python3).
  python3-torch python3-numpy
  # The Python package: pybind11 (its internals match libtorch_python), the demo's plot.
  pybind11-dev python3-dev python3-matplotlib
  # Fuzzing (scripts/fuzz.sh): clang and its libFuzzer/ASan runtimes.
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
