#!/usr/bin/env bash
# The whole test suite on a fresh machine: install packages, build, fuzz, compile the CUDA build, run every test (lit + GoogleTest + Python) under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh

bash scripts/setup.sh
bash scripts/build.sh
# One minute of fuzzing parse + verify + the whole pass pipeline (clang build in build-fuzz/).
bash scripts/fuzz.sh 60
# The CUDA build against the CUDA torch (build-cuda/, compiled, not run), where
# that torch is on this machine's disk; one SKIPPED line elsewhere.
bash scripts/cuda-build.sh
ctest --test-dir "${DLOSS_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
