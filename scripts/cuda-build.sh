#!/usr/bin/env bash
# The CUDA build (its GPU parts compiled, never run here): the runtime, the
# JIT, the Python extension (no compiler: DLOSS_BUILD_COMPILER=OFF), dloss-run
# and the runtime tests, CUDA tiles and the c10d group's NCCL backend included, against
# the CUDA torch (torch 2.14.1, CUDA 13) and the cuBLAS of its nvidia wheels, so
# that every DLOSS_TORCH_HAS_CUDA branch compiles and links as users build it;
# then the runtime's tests run against that torch on the CPU (a second torch).
# Runs where that torch lies on this machine's disk (pip takes it from there in
# about a minute); elsewhere it says in one line that it skipped and why: its
# download (several GB) would be too slow. scripts/test.sh calls it.
#
#   bash scripts/cuda-build.sh      # env: DLOSS_CUDA_TORCH (2.14.1), DLOSS_CUDA_VENV, DLOSS_CUDA_BUILD_DIR
#   bash scripts/cuda-build.sh --venv-only   # only make that venv (scripts/test.sh
#                                            # runs it beside the main build)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

VERSION=${DLOSS_CUDA_TORCH:-2.14.1}
VENV=${DLOSS_CUDA_VENV:-$ROOT/.venv-cuda}
BUILD_DIR=${DLOSS_CUDA_BUILD_DIR:-$ROOT/build-cuda}

skip() { echo "cuda-build: SKIPPED: $*"; exit 0; }

# pip's local sources (find-links folders and file:// indexes) that hold the wheel.
local_wheel() {
  python3 -m pip config list 2>/dev/null | grep -oE "(file://)?/[^' ,]+" | sed 's|^file://||' |
    while read -r dir; do
      { ls "$dir" "$dir/torch" 2>/dev/null; cat "$dir/torch/index.html" 2>/dev/null; } |
        grep -q "torch-$VERSION-" && echo "$dir"
    done | head -1
}
if ! "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('$VERSION') and torch.version.cuda" 2>/dev/null; then
  where=$(local_wheel || true)
  [ -n "$where" ] || skip "torch $VERSION (CUDA) is not on this machine's disk, and pip would download several GB"
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || skip "no nvcc on this machine"
  echo "cuda-build: making $VENV with torch $VERSION from $where (about 5.5 GB)"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --progress-bar off -q "torch==$VERSION" numpy 2>&1 |
    grep -v "^WARNING: Location" || true
fi
"$VENV/bin/python" -c "import torch; print('cuda-build: torch', torch.__version__, 'CUDA', torch.version.cuda)"
[ "${1:-}" != --venv-only ] || exit 0

mkdir -p "$BUILD_DIR"
# The compiler is not needed (and stays out: the GPU machines have no LLVM).
cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  -DPython3_EXECUTABLE="$VENV/bin/python" -DDLOSS_BUILD_COMPILER=OFF \
  -DDLOSS_ENABLE_CUDA=ON > "$BUILD_DIR/configure.log" 2>&1 ||
  { cat "$BUILD_DIR/configure.log"; echo "cuda-build: FAILED to configure"; exit 1; }
grep "dloss:" "$BUILD_DIR/configure.log"
for want in "LibTorch has CUDA"; do
  grep -q "$want" "$BUILD_DIR/configure.log" ||
    { echo "cuda-build: FAILED: the configure step did not say '$want'"; exit 1; }
done
cmake --build "$BUILD_DIR" -j "$(nproc)"

# Linked against torch's own CUDA libraries, not a second copy.
deps=$(ldd "$BUILD_DIR/runtime/libdloss_runtime.so")
for lib in libtorch_cuda libc10_cuda libcublas.so; do
  line=$(grep -F "$lib" <<< "$deps" | head -1)
  [ -n "$line" ] || { echo "cuda-build: FAILED: libdloss_runtime.so does not link $lib"; exit 1; }
  if [[ $line != *"$VENV/"* && $line != *"$BUILD_DIR/cuda-toolkit/"* ]]; then
    echo "cuda-build: FAILED: $lib resolves outside torch's wheels: $line"; exit 1
  fi
done
# CUDA tensors move through torch's own ProcessGroupNCCL (no NCCL of dloss's).
symbols=$(nm -DC --undefined-only "$BUILD_DIR/runtime/libdloss_runtime.so")
grep -qF "c10d::ProcessGroupNCCL::ProcessGroupNCCL" <<< "$symbols" ||
  { echo "cuda-build: FAILED: libdloss_runtime.so does not build the group's NCCL backend (ProcessGroupNCCL)"; exit 1; }
for test in dloss-fused-cuda-tests dloss-process-group-cuda-tests; do
  [ -x "$BUILD_DIR/test/runtime/$test" ] || { echo "cuda-build: FAILED: $test was not built"; exit 1; }
done
echo "cuda-build: the runtime, dloss-run and the CUDA tests compile and link against torch $VERSION's CUDA libraries"

# The JIT and the extension hold no compiler, so they build here too: against
# this torch, `import dloss` passes its self-check (a ProcessGroup crosses),
# and a drop-in runs from a plan compiled elsewhere, as on the GPU machines
# (no LLVM): first with the main build's libdloss_compiler.so, then with none,
# from the plan cache alone.
for built in "$BUILD_DIR/frontend/libdloss_jit.so" "$BUILD_DIR"/python/dloss/_C*.so; do
  [ -f "$built" ] || { echo "cuda-build: FAILED: $built was not built"; exit 1; }
done
PYTHONPATH="$BUILD_DIR/python" "$VENV/bin/python" -c \
  "import dloss, torch; print('cuda-build: import dloss works on torch', torch.__version__)"
COMPILER_LIB=${DLOSS_CUDA_COMPILER_LIBRARY:-$ROOT/${DLOSS_BUILD_DIR:-build}/frontend/libdloss_compiler.so}
if [ -f "$COMPILER_LIB" ]; then
  cache=$(mktemp -d)
  drop_in() {
    DLOSS_CACHE_DIR=$cache DLOSS_COMPILER_LIBRARY=$1 PYTHONPATH="$BUILD_DIR/python" \
      "$VENV/bin/python" -c '
import torch, torch.nn.functional as F, dloss
from dloss import _C
dloss.init()
g = torch.Generator().manual_seed(0)
x = F.normalize(torch.randn(8, 4, generator=g), dim=1)
y = F.normalize(torch.randn(8, 4, generator=g), dim=1)
loss = dloss.ClipLoss()(x, y, torch.tensor(10.0))
print("compiled=%d loss=%.9g" % (_C.plan_cache_stats()["compiled"], float(loss)))'
  }
  first=$(drop_in "$COMPILER_LIB" | tail -1)
  second=$(drop_in /nonexistent/libdloss_compiler.so | tail -1)
  [[ $first == compiled=1* && $second == compiled=0* && ${first#* } == "${second#* }" ]] ||
    { echo "cuda-build: FAILED: a plan compiled elsewhere did not run without the compiler ('$first' then '$second')"; exit 1; }
  echo "cuda-build: dloss.ClipLoss ran from a cached plan without the compiler library (${second#* })"
  rm -rf "$cache"
else
  echo "cuda-build: no $COMPILER_LIB (the main build's): the run from a plan compiled elsewhere is skipped"
fi

# A second torch end to end: the runtime's tests (collectives, reliability,
# kernels, executor) run against this torch on the CPU; the gpu-labelled ones
# skip, saying why, where no GPU is visible.
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --timeout 300 --output-on-failure > "$BUILD_DIR/ctest.log" 2>&1 ||
  { tail -40 "$BUILD_DIR/ctest.log"; echo "cuda-build: FAILED: the runtime's tests against torch $VERSION"; exit 1; }
grep "tests passed" "$BUILD_DIR/ctest.log"
echo "cuda-build: PASS: built against torch $VERSION's CUDA libraries; import dloss and its runtime tests pass on the CPU ($(grep -c '(Skipped)' "$BUILD_DIR/ctest.log") GPU tests skipped: no GPU here)"
