# Sourced (not run) by scripts/cuda-build.sh (CI's CUDA build against torch
# 2.14.1), scripts/gpu-check.sh (the GPU machine's) and
# scripts/torch-compat-build.sh (another torch, by hand): the CUDA build's
# configuration and the checks of what it built, written once. Every function
# prints its lines prefixed with "$DLOSS_CUDA_TAG: " and returns non-zero,
# after a line saying FAILED and why, where a check fails.
#
#   DLOSS_CUDA_TAG=name; source scripts/cuda-common.sh
#   dloss_cuda_configure BUILD_DIR PYTHON [CMAKE_ARGS...]
#   dloss_cuda_check_links BUILD_DIR PYTHON
#   dloss_cuda_check_drop_in BUILD_DIR PYTHON COMPILER_LIBRARY

: "${DLOSS_CUDA_TAG:=cuda}"

_dloss_cuda_fail() { echo "$DLOSS_CUDA_TAG: FAILED: $*"; return 1; }

# Configures BUILD_DIR (absolute) with no compiler (the GPU machines have no
# LLVM) and the CUDA parts on, against PYTHON's torch; the log is
# BUILD_DIR/configure.log. The configure step must say that LibTorch has CUDA.
dloss_cuda_configure() {
  local build_dir=$1 python=$2
  shift 2
  mkdir -p "$build_dir"
  cmake -G Ninja -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$python" -DDLOSS_BUILD_COMPILER=OFF \
    -DDLOSS_ENABLE_CUDA=ON "$@" > "$build_dir/configure.log" 2>&1 ||
    { cat "$build_dir/configure.log"; _dloss_cuda_fail "to configure (log: $build_dir/configure.log)"; return 1; }
  grep "dloss:" "$build_dir/configure.log" | sed "s/^/$DLOSS_CUDA_TAG: /"
  grep -q "LibTorch has CUDA" "$build_dir/configure.log" ||
    { _dloss_cuda_fail "the configure step did not say 'LibTorch has CUDA'"; return 1; }
}

# libdloss_runtime.so links torch's own CUDA libraries (the ones in PYTHON's
# site-packages: torch/lib and the nvidia wheels, or the build's toolkit view
# of them), not a second copy, and builds the group's NCCL backend through
# torch's ProcessGroupNCCL (no NCCL of dloss's).
dloss_cuda_check_links() {
  local build_dir=$1 python=$2 runtime=$1/runtime/libdloss_runtime.so
  [ -f "$runtime" ] || { _dloss_cuda_fail "$runtime was not built"; return 1; }
  local sites
  sites=$("$python" -c 'import os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
print(site); print(os.path.realpath(site))') ||
    { _dloss_cuda_fail "$python cannot import torch"; return 1; }
  local deps lib line site ok
  deps=$(ldd "$runtime")
  for lib in libtorch_cuda libc10_cuda libcublas.so; do
    line=$(grep -F "$lib" <<< "$deps" | head -1)
    [ -n "$line" ] || { _dloss_cuda_fail "libdloss_runtime.so does not link $lib"; return 1; }
    ok=
    while read -r site; do
      [[ $line == *"$site/"* ]] && ok=1
    done <<< "$sites"
    [[ $line == *"$build_dir/cuda-toolkit/"* ]] && ok=1
    [ -n "$ok" ] || { _dloss_cuda_fail "$lib resolves outside torch's wheels: $line"; return 1; }
    echo "$DLOSS_CUDA_TAG: ldd: $(sed 's/^[[:space:]]*//' <<< "$line")"
  done
  # Into a variable first: `nm | grep -q` fails under pipefail when grep
  # stops reading early (nm gets SIGPIPE).
  local symbols
  symbols=$(nm -DC --undefined-only "$runtime")
  grep -qF "c10d::ProcessGroupNCCL::ProcessGroupNCCL" <<< "$symbols" ||
    { _dloss_cuda_fail "libdloss_runtime.so does not build the group's NCCL backend (ProcessGroupNCCL)"; return 1; }
}

# A drop-in runs from a plan compiled elsewhere, as on the GPU machines (no
# LLVM): dloss.ClipLoss (CPU tensors) compiles its plan with COMPILER_LIBRARY
# (built on another machine from the same sources), then runs again with no
# compiler at all, from the plan cache alone, to the same loss.
dloss_cuda_check_drop_in() {
  local build_dir=$1 python=$2 compiler=$3 cache first second
  cache=$(mktemp -d)
  _dloss_cuda_drop_in() {
    DLOSS_CACHE_DIR=$cache DLOSS_COMPILER_LIBRARY=$1 PYTHONPATH="$build_dir/python" \
      "$python" -c '
import torch, torch.nn.functional as F, dloss
from dloss import _C
dloss.init(backend="gloo")  # CPU tensors, also where CUDA is available
g = torch.Generator().manual_seed(0)
x = F.normalize(torch.randn(8, 4, generator=g), dim=1)
y = F.normalize(torch.randn(8, 4, generator=g), dim=1)
loss = dloss.ClipLoss()(x, y, torch.tensor(10.0))
print("compiled=%d loss=%.9g" % (_C.plan_cache_stats()["compiled"], float(loss)))'
  }
  first=$(_dloss_cuda_drop_in "$compiler" | tail -1)
  second=$(_dloss_cuda_drop_in /nonexistent/libdloss_compiler.so | tail -1)
  rm -rf "$cache"
  [[ $first == compiled=1* && $second == compiled=0* && ${first#* } == "${second#* }" ]] ||
    { _dloss_cuda_fail "a plan compiled with $compiler did not run without the compiler ('$first' then '$second')"; return 1; }
  echo "$DLOSS_CUDA_TAG: dloss.ClipLoss ran from a cached plan without the compiler library (${second#* })"
}
