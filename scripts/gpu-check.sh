#!/usr/bin/env bash
# The GPU path checked by one command on a GPU machine (docs/Cuda.md): builds
# dloss there without LLVM against that machine's torch, with what
# scripts/gpu-prepare.sh carried (gpu-carry/), probes NCCL, then runs the
# CUDA tiles' checks and timings, bench/gpu_bench.py and the GPU tests, each
# stage under its own time limit, and writes summary.md, summary.json and the
# logs (at most 8 files) to the output folder. Without a GPU, each stage that
# needs one says so in one line and is recorded as SKIP; the rest (the build,
# `import dloss`, a plan from the carried compiler) runs, and the exit status
# is 0 unless a stage FAILED or ran out of time (TIMEOUT).
#
#   bash scripts/gpu-check.sh [--stage build,python,kernels,bench,tests]
#        [--out DIR] [--budget SECONDS] [--limit STAGE=SECONDS] [--build-dir DIR]
#        [--carry DIR] [--hide-system-deps]
#
#   --stage    the stages to run, in this order (default all): build, python
#              (import dloss, a plan from the carried compiler, a CUDA smoke
#              test), kernels (dloss-bench-cuda-fused: the general op's
#              checks in f32/bf16/f16 and the tiles' timings), bench
#              (bench/gpu_bench.py: dloss, eager and Inf-CL), tests (ctest -L
#              gpu: the CUDA runtime tests and test_cuda.py's CUDA classes).
#              A later call on the same machine can run the rest: its summary
#              lists the earlier calls' stages too.
#   --out      where summary.md, summary.json and the logs go (default $OUT
#              when set, as on the device tool, else BUILD_DIR/gpu-check)
#   --budget   seconds for all stages together (default 570: the device tool
#              kills a command at 600); a stage gets the smaller of its own
#              limit and what is left once the later stages' reserves are
#              kept back (the bench's 120 s), and is skipped under 30 s
#   --limit STAGE=SECONDS  a stage's own limit (defaults: build 240, python
#              90, kernels 150, bench 150, tests 270, sized for the H100
#              machine's 16 cores; a 2-core CPU machine's build needs more)
#   --hide-system-deps  (root, Linux) first hide Debian's LLVM, FlatBuffers,
#              flatc and GoogleTest in a private mount namespace
#              (scripts/without-system-deps.sh), so that a build on a CPU
#              machine must take them from the carry, as on the GPU machine
#
# env: DLOSS_GPU_PYTHON (the Python with torch: default .venv-cuda's where it
# has a CUDA torch, else python3), DLOSS_GPU_ALL_TARGETS=1 (build every
# target, not only the ones the stages use), DLOSS_GPU_BENCH_ARGS (more
# arguments for bench/gpu_bench.py, e.g. "--b-local 8,32 --reps 30").
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SELF=$ROOT/scripts/gpu-check.sh
# In this order: the bench before the long tests, so that one call has time
# for it.
ALL_STAGES=(build python kernels bench tests)
# Each stage's own limit in seconds (the budget may cut it), and the time
# kept back for a stage while the stages before it in the same call run.
declare -A LIMIT=([build]=240 [python]=90 [kernels]=150 [bench]=150 [tests]=270)
declare -A RESERVE=([bench]=120)

stages=$(IFS=,; echo "${ALL_STAGES[*]}")
out=${OUT:-}
budget=570
build_dir=$ROOT/build-gpu
carry=$ROOT/gpu-carry
hide=
internal=
while [ $# -gt 0 ]; do
  case $1 in
    --stage|--stages) stages=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --limit) LIMIT[${2%%=*}]=${2#*=}; shift 2 ;;
    --build-dir) build_dir=$(realpath -m "$2"); shift 2 ;;
    --carry) carry=$(realpath -m "$2"); shift 2 ;;
    --hide-system-deps) hide=1; shift ;;
    --run-stage) internal=$2; shift 2 ;;
    -h|--help) sed -n '2,38p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)"; exit 2 ;;
  esac
done
out=$(realpath -m "${out:-$build_dir/gpu-check}")
state=$build_dir/gpu-check-state
for stage in ${stages//,/ }; do
  [[ " ${ALL_STAGES[*]} " == *" $stage "* ]] ||
    { echo "gpu-check: unknown stage '$stage' (stages: ${ALL_STAGES[*]})"; exit 2; }
done

# ---- Hiding the system's third-party packages (the CPU machine's proof) ----
if [ -n "$hide" ] && [ -z "${DLOSS_WITHOUT_SYSTEM_DEPS:-}" ]; then
  args=(--stage "$stages" --out "$out" --budget "$budget" --build-dir "$build_dir" --carry "$carry")
  for stage in "${ALL_STAGES[@]}"; do args+=(--limit "$stage=${LIMIT[$stage]}"); done
  exec bash "$ROOT/scripts/without-system-deps.sh" bash "$SELF" "${args[@]}"
fi

# ---- The machine --------------------------------------------------------------
if [ -n "${DLOSS_GPU_PYTHON:-}" ]; then
  PY=$DLOSS_GPU_PYTHON
elif "$ROOT/.venv-cuda/bin/python" -c 'import torch; assert torch.version.cuda' 2>/dev/null; then
  PY=$ROOT/.venv-cuda/bin/python
else
  PY=$(command -v python3)
fi
# The compiler library, from the dloss-compiler wheel the carry holds
# (scripts/gpu-prepare.sh), unpacked into the build folder when the wheel is
# newer than what is there.
# The stages run as child processes: they take COMPILER_LIB from the main
# process, which sets it empty where the library does not load here (then
# plans come from the plan cache alone, seeded from the carry's).
UNPACKED_LIB=$build_dir/dloss-compiler/dloss_compiler/lib/libdloss_compiler.so
COMPILER_LIB=${DLOSS_GPU_CHECK_COMPILER-$UNPACKED_LIB}
compiler_wheel=$(ls "$carry"/dloss_compiler-*.whl 2> /dev/null | head -1)
if [ -z "$internal" ] && [ -n "$compiler_wheel" ] && [ "$compiler_wheel" -nt "$UNPACKED_LIB" ]; then
  rm -rf "$build_dir/dloss-compiler"
  mkdir -p "$build_dir/dloss-compiler"
  "$PY" -m zipfile -e "$compiler_wheel" "$build_dir/dloss-compiler" ||
    echo "gpu-check: could not unpack $compiler_wheel"
fi
# The plan caches the stages use: the tests' (ctest's DLOSS_CACHE_DIR) and
# the python stage's and the bench's.
TEST_CACHE=$build_dir/test-plan-cache
RUN_CACHE=$build_dir/gpu-check-plan-cache
export DLOSS_GPU_PYTHON=$PY
# CUDA tensors' backend in the smoke test, test_cuda.py and the bench: the
# main process sets gloo where NCCL fails its probe.
export DLOSS_TEST_CUDA_BACKEND=${DLOSS_TEST_CUDA_BACKEND:-nccl}

# One line per fact, for the log and the summary.
machine_info() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname) ($(nproc) cores)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}" || echo unknown); $(ldd --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$' | sed 's/^/glibc /' || echo 'glibc unknown')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo "not a git checkout (the carry's: $(sed -n 's/^commit //p' "$carry/MANIFEST.txt" 2>/dev/null || echo none))")"
  local gpus
  gpus=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)
  echo "gpu: ${gpus:-none (nvidia-smi: $(command -v nvidia-smi > /dev/null && echo 'no GPU listed' || echo 'not found'))}" | head -1
  echo "torch: $("$PY" -c 'import sys, torch
print(torch.__version__, "CUDA", torch.version.cuda, "cuda_available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count(), "python", sys.version.split()[0])' 2>&1 | tail -1) ($PY)"
  echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | grep -o 'release [0-9.]*' | head -1 | grep . || echo none)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*' || echo none); ninja: $(ninja --version 2>/dev/null || echo none)"
  if [ -f "$carry/MANIFEST.txt" ]; then
    echo "carry: $carry ($(du -sh "$carry" | cut -f1)): $(sed -n 's/^commit //p' "$carry/MANIFEST.txt"), compiler $(sed -n 's/^compiler_identity //p' "$carry/MANIFEST.txt" | cut -c1-12)"
  else
    echo "carry: none at $carry (scripts/gpu-prepare.sh makes it)"
  fi
}
# The unpacked wheel's compiler identity, asked of its library by the
# wheel's own package, or why it does not load here (it was built on another
# machine: glibc, MANIFEST.txt).
compiler_identity() {
  PYTHONPATH=$build_dir/dloss-compiler "$PY" -c 'import dloss_compiler
print(dloss_compiler.identity())' 2>&1 | tail -1
}

# Copies the carry's plan cache (gpu-prepare.sh compiled every plan the
# Python stages use) into the stages' caches, keeping what is there: no
# plan is compiled on the GPU machine's time, and none needs the compiler
# library when it does not load.
seed_plan_caches() {
  [ -d "$carry/plan-cache" ] || { echo "no plan cache in the carry"; return 0; }
  local dir
  for dir in "$TEST_CACHE" "$RUN_CACHE"; do
    mkdir -p "$dir" && cp -rn "$carry/plan-cache/." "$dir/" || return 1
  done
  echo "the carry's $(find "$carry/plan-cache" -type f | wc -l) cached plan files"
}

# NCCL at world size 1: init, an all_reduce on the GPU, destroy, under 20 s.
# Prints "ok SECONDS" or why it failed.
nccl_probe() {
  local output
  output=$(NCCL_DEBUG=WARN timeout --foreground -k 5 20 "$PY" -c '
import time, torch, torch.distributed as dist
t0 = time.time()
dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
assert float(x.sum()) == 4.0, x
dist.destroy_process_group()
print("nccl_probe=ok %.1f" % (time.time() - t0))' 2>&1)
  local rc=$?
  if grep -q '^nccl_probe=ok' <<< "$output"; then
    sed -n 's/^nccl_probe=//p' <<< "$output" | tail -1
  else
    echo "FAILED (exit $rc$([ $rc -eq 124 ] && echo ': over 20 s')): $(grep -v '^\s*$' <<< "$output" | tail -2 | tr '\n' ' ' | cut -c1-300)"
  fi
}

# The Python headers the extension and Triton need: nothing where the
# machine's Python has Python.h, else the carry's copy for its version (made
# by gpu-prepare.sh); fails, saying so, where neither has one.
carried_python_headers() {
  local include version
  include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  [ -f "$include/Python.h" ] && return 0
  version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ -f "$carry/python$version/Python.h" ] ||
    { echo "no Python.h for Python $version in $include or in the carry"; return 1; }
  echo "$carry/python$version"
}

have_gpu() {
  [ -z "${DLOSS_GPU_CHECK_HAVE_GPU:-}" ] || return "$DLOSS_GPU_CHECK_HAVE_GPU"
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    [[ $(nvidia-smi -L 2>/dev/null) == GPU* ]]
}
no_gpu_reason() {
  local smi=none
  command -v nvidia-smi > /dev/null || smi="not found"
  [ "$smi" = none ] && smi=$(nvidia-smi -L 2>&1 | head -1 | cut -c1-80 | grep . || echo "no GPU listed")
  echo "no GPU visible (nvidia-smi: $smi; torch.cuda.is_available(): $("$PY" -c 'import torch; print(torch.cuda.is_available())' 2>&1 | tail -1))"
}

# ---- Stage bodies (run by --run-stage under `timeout`) ------------------------
# Each writes "note: ..." and "number: key=value" lines to $result and exits
# 0 (PASS), 77 (SKIP) or anything else (FAIL).
note() { echo "gpu-check: $stage: $*"; echo "note: $*" >> "$result"; }
number() { echo "number: $1=$2" >> "$result"; }

# What the stages use: the core first (python, kernels), then the tests, so
# that a test that does not compile still leaves the rest to run.
CORE_TARGETS=(dloss_runtime dloss_jit dloss_python dloss-run dloss-bench-cuda-fused)
TEST_TARGETS=(dloss-fused-cuda-tests dloss-process-group-cuda-tests)

stage_build() {
  local args=(-DDLOSS_CUDA_WHEEL_LIBRARIES=ON)
  if [ -f "$carry/MANIFEST.txt" ]; then
    args+=(-DDLOSS_THIRD_PARTY_DIR="$carry")
    # A carry may arrive without its exec bits.
    chmod +x "$carry"/bin/* 2> /dev/null || true
    "$carry/bin/flatc" --version > /dev/null ||
      { note "the carried flatc does not run here: $("$carry/bin/flatc" --version 2>&1 | head -1)"; return 1; }
  elif ! command -v flatc > /dev/null; then
    note "no carry at $carry and no flatc here: run scripts/gpu-prepare.sh on a CPU machine and carry gpu-carry"
    return 1
  else
    note "no carry: this machine's FlatBuffers and GoogleTest are used"
  fi
  # The extension needs Python.h; the carry has one for the GPU machine's Python.
  local headers
  headers=$(carried_python_headers) || { note "$headers"; return 1; }
  if [ -n "$headers" ]; then
    note "Python.h from the carry ($headers): the machine's Python has none"
    args+=(-DPython3_INCLUDE_DIR="$headers")
  fi
  DLOSS_CUDA_TAG="gpu-check: build"
  source "$ROOT/scripts/cuda-common.sh"
  local t0=$SECONDS
  dloss_cuda_configure "$build_dir" "$PY" "${args[@]}" || return 1
  number configure_s $((SECONDS - t0))
  local core=() tests=() target failed=0
  if [ "${DLOSS_GPU_ALL_TARGETS:-}" = 1 ]; then
    core=(all)
  else
    for target in "${CORE_TARGETS[@]}"; do
      ninja -C "$build_dir" -t query "$target" > /dev/null 2>&1 && core+=("$target")
    done
    for target in "${TEST_TARGETS[@]}"; do
      ninja -C "$build_dir" -t query "$target" > /dev/null 2>&1 && tests+=("$target")
    done
  fi
  note "building ${core[*]} ${tests[*]} with $(nproc) jobs"
  t0=$SECONDS
  cmake --build "$build_dir" -j "$(nproc)" --target "${core[@]}" ||
    { note "the build failed (the log's end above)"; return 1; }
  # From here on a failure fails this stage but leaves the others to run.
  number core_built 1
  if [ ${#tests[@]} -gt 0 ]; then
    cmake --build "$build_dir" -j "$(nproc)" --target "${tests[@]}" ||
      { note "the GPU tests did not build (the log's end above): the tests stage will fail"; failed=1; }
  fi
  number build_s $((SECONDS - t0))
  local links
  links=$(dloss_cuda_check_links "$build_dir" "$PY")
  local links_rc=$?
  echo "$links"
  if [ $links_rc -eq 0 ]; then
    note "linked against torch's own CUDA libraries and ProcessGroupNCCL"
  else
    note "the link check failed: $(grep -o 'FAILED: .*' <<< "$links" | head -1)"
    failed=1
  fi
  if [ -f "$carry/MANIFEST.txt" ]; then
    local want have
    want=$(sed -n 's/^compiler_identity //p' "$carry/MANIFEST.txt")
    have=$(grep -o '"[0-9a-f]\{64\}"' "$build_dir/runtime/plan/CompilerIdentity.h" | tr -d '"')
    if [ "$want" = "$have" ]; then
      note "the carried compiler library is this tree's (identity ${have:0:12})"
    else
      note "the carried compiler library (${want:0:12}) is not this tree's (${have:0:12}): run scripts/gpu-prepare.sh again at this tree"
      failed=1
    fi
  fi
  return $failed
}

stage_python() {
  PYTHONPATH="$build_dir/python" "$PY" -c "import dloss, torch; print('gpu-check: python: import dloss works on torch', torch.__version__)" ||
    { note "import dloss failed"; return 1; }
  local failed=0
  if [ -n "$COMPILER_LIB" ]; then
    note "the carried compiler library loads here (the summary's compiler line)"
    DLOSS_CUDA_TAG="gpu-check: python"
    source "$ROOT/scripts/cuda-common.sh"
    dloss_cuda_check_drop_in "$build_dir" "$PY" "$COMPILER_LIB" | tee -a "$result.out" || return 1
    number drop_in_loss "$(sed -n 's/.*(loss=\(.*\))$/\1/p' "$result.out")"
    note "a plan from the carried compiler ran, then from the cache alone"
  else
    # The machine's line says why (main); the stages run from the carry's
    # plan cache, which is what this stage then proves.
    note "FAILED: no compiler library that loads here: plans come from the carry's plan cache alone"
    failed=1
  fi
  if ! have_gpu; then
    note "CUDA smoke test: SKIP: $(no_gpu_reason)"
    return $failed
  fi
  # dloss.ClipLoss on CUDA tensors against the same loss on the CPU, one process.
  # Its whole output goes to the log; the result is the line that starts
  # with cpu_loss= (a warning printed at exit must not stand in for it).
  local output line
  output=$(DLOSS_COMPILER_LIBRARY=$COMPILER_LIB DLOSS_CACHE_DIR=$RUN_CACHE \
    PYTHONPATH="$build_dir/python" "$PY" -c '
import os, torch, torch.nn.functional as F, dloss
# A world of one: CPU over Gloo, CUDA over NCCL (Gloo where NCCL failed its probe).
dloss.init(backend="cpu:gloo,cuda:" + os.environ["DLOSS_TEST_CUDA_BACKEND"])
g = torch.Generator().manual_seed(0)
x = F.normalize(torch.randn(256, 64, generator=g, dtype=torch.float64), dim=1).float()
y = F.normalize(torch.randn(256, 64, generator=g, dtype=torch.float64), dim=1).float()
def run(device):
    # Fresh leaves per device: x.to("cpu") is x itself, and a leaf that
    # requires grad would make x.to("cuda") a non-leaf with no .grad.
    a = x.to(device, copy=True).requires_grad_(); b = y.to(device, copy=True).requires_grad_()
    loss = dloss.ClipLoss()(a, b, torch.tensor(10.0, device=device))
    loss.backward()
    return float(loss), a.grad.cpu(), b.grad.cpu()
lc, ac, bc = run("cpu"); lg, ag, bg = run("cuda")
import math
errs = [abs(lg - lc) / abs(lc), float((ag - ac).abs().max() / ac.abs().max()),
        float((bg - bc).abs().max() / bc.abs().max())]
err = max(errs) if all(math.isfinite(e) for e in errs) else float("inf")  # max() skips a NaN
print("cpu_loss=%.7g cuda_loss=%.7g max_rel_err=%.3g %s" % (lc, lg, err, "OK" if err < 1e-4 else "MISMATCH"))
torch.distributed.destroy_process_group()' 2>&1)
  echo "$output"
  line=$(grep '^cpu_loss=' <<< "$output" | tail -1)
  [ -n "$line" ] || line="no result line; its output ended: $(tail -3 <<< "$output" | tr '\n' ' ')"
  echo "gpu-check: python: CUDA smoke test: $line"
  [[ $line == *" OK" ]] || { note "dloss.ClipLoss on CUDA tensors: $line"; return 1; }
  number clip_cuda_max_rel_err "$(sed -n 's/.*max_rel_err=\([^ ]*\).*/\1/p' <<< "$line")"
  note "dloss.ClipLoss on CUDA tensors (cuda:$DLOSS_TEST_CUDA_BACKEND) matches the CPU ($line)"
  return $failed
}

stage_kernels() {
  local bench=$build_dir/bin/dloss-bench-cuda-fused
  [ -x "$bench" ] || { note "$bench was not built"; return 1; }
  if ! have_gpu; then
    [[ $("$bench") == *skipped* ]] || { note "$bench did not say that it skipped without a GPU"; return 1; }
    note "SKIP: $(no_gpu_reason)"
    return 77
  fi
  local failed=0 type log
  # Each run's output goes to the stage's log as it comes (tee -a: the log is
  # stderr, appended to), so a run that hangs still shows how far it got; and
  # each has its own limit, so one hang leaves the others their time. Line
  # buffered (stdbuf -oL): a run killed at its limit keeps the lines it
  # printed. --foreground keeps the inner timeout in the stage's process
  # group, so that the stage's own limit reaches the bench too.
  # The general op (dloss.fused_similarity, never run before) against float64 loops.
  for type in f32 bf16 f16; do
    log=$(timeout --foreground -k 5 60 stdbuf -oL "$bench" 4096 8192 256 $type similarity 2>&1 | tee -a /dev/stderr)
    local err
    err=$(sed -n 's/.*max relative error \([^:]*\):.*/\1/p' <<< "$log" | head -1)
    number "similarity_${type}_max_rel_err" "${err:-none}"
    if grep -q "CHECK OK" <<< "$log"; then
      note "similarity $type: CHECK OK (max relative error $err)"
    else
      note "similarity $type: CHECK FAILED or did not finish (max relative error ${err:-none})"
      failed=1
    fi
  done
  # Timings at the default size: the dedicated CLIP tiles, then the general op.
  for mode in clip similarity; do
    log=$(timeout --foreground -k 5 60 stdbuf -oL "$bench" 16384 65536 512 bf16 $mode 2>&1 | tee -a /dev/stderr)
    local rc=$?
    local fwd bwd
    # The tables' last column: GEMMs / fused (or / general).
    fwd=$(awk -F'|' '/^\| forward/ { gsub(/ /, "", $(NF-1)); print $(NF-1) }' <<< "$log")
    bwd=$(awk -F'|' '/^\| backward/ { gsub(/ /, "", $(NF-1)); print $(NF-1) }' <<< "$log")
    number "${mode}_bf16_fwd_gemm_over_fused" "${fwd:-none}"
    number "${mode}_bf16_bwd_gemm_over_fused" "${bwd:-none}"
    note "$mode bf16 16384x65536x512: GEMMs/fused forward ${fwd:-?}, backward ${bwd:-?} (target >= 0.70)$(grep -o 'verdict:.*' <<< "$log" | sed 's/^/; /')"
    [ $rc -eq 0 ] || { note "$mode timing run exited $rc"; failed=1; }
  done
  if [ $failed -ne 0 ] && command -v compute-sanitizer > /dev/null; then
    echo "gpu-check: kernels: a check failed: compute-sanitizer memcheck at 64 96 16 f32 similarity"
    CUDA_LAUNCH_BLOCKING=1 timeout 60 compute-sanitizer --tool memcheck "$bench" 64 96 16 f32 similarity 2>&1 | tail -40
  fi
  return $failed
}

stage_tests() {
  local listing listed
  listing=$(ctest --test-dir "$build_dir" -N -L gpu 2>/dev/null)
  listed=$(sed -n 's/^Total Tests: //p' <<< "$listing")
  if ! have_gpu; then
    note "SKIP: $(no_gpu_reason); ctest -L gpu lists ${listed:-0} tests here"
    return 77
  fi
  [ "${listed:-0}" -gt 0 ] || { note "ctest -L gpu lists no tests in $build_dir"; return 1; }
  # test_cuda.py's CUDA classes are one of them (test/CMakeLists.txt).
  [[ $listing == *python-cuda* ]] ||
    { note "ctest -L gpu does not list python-cuda in $build_dir"; return 1; }
  local limit=$(( ${STAGE_LIMIT:-270} - 20 ))
  local log rc
  # Plans from the carried compiler, or from the cache the carry seeded
  # (TEST_CACHE: ctest's DLOSS_CACHE_DIR).
  log=$(DLOSS_COMPILER_LIBRARY=$COMPILER_LIB NCCL_DEBUG=WARN \
    stdbuf -oL ctest --test-dir "$build_dir" -L gpu -j 4 --timeout "$limit" --output-on-failure 2>&1 | tee -a /dev/stderr)
  rc=$?
  local passed failed total skipped
  # ctest ends with "100% tests passed out of N" when none failed, and with
  # "P% tests passed, F tests failed out of N" otherwise.
  total=$(sed -n 's/.*% tests passed.* out of \([0-9]*\).*/\1/p' <<< "$log" | tail -1)
  failed=$(sed -n 's/.*% tests passed, \([0-9]*\) tests failed out of.*/\1/p' <<< "$log" | tail -1)
  [ -z "$total" ] || failed=${failed:-0}
  skipped=$(grep -c '(Skipped)' <<< "$log")
  passed=$(( ${total:-0} - ${failed:-0} - skipped ))
  # test_cuda.py's own counts (LastTest.log holds every entry's output):
  # python-cuda passes when all its tests skip, which counts as skipped here.
  local ran py_skipped
  ran=$(sed -n 's/^Ran \([0-9]*\) test.*/\1/p' "$build_dir/Testing/Temporary/LastTest.log" 2>/dev/null | tail -1)
  py_skipped=$(grep -o 'skipped=[0-9]*' "$build_dir/Testing/Temporary/LastTest.log" 2>/dev/null | tail -1 | cut -d= -f2)
  if [ -n "$ran" ] && [ "$ran" = "${py_skipped:-0}" ] && grep -q 'python-cuda .*Passed' <<< "$log"; then
    passed=$((passed - 1)); skipped=$((skipped + 1))
  fi
  number ctest_total "${total:-0}"
  number ctest_passed "$passed"
  number ctest_failed "${failed:-0}"
  number ctest_skipped "$skipped"
  number python_cuda_ran "${ran:-0}"
  number python_cuda_skipped "${py_skipped:-0}"
  note "ctest -L gpu: $passed passed, ${failed:-?} failed, $skipped skipped of ${total:-?}"
  note "test_cuda.py's CUDA classes (python-cuda): ran ${ran:-?}, skipped ${py_skipped:-0}$([ "$DLOSS_TEST_CUDA_BACKEND" != nccl ] && echo ", CUDA tensors over $DLOSS_TEST_CUDA_BACKEND: NCCL failed its probe")"
  [ $rc -eq 0 ] || note "failed: $(sed -n 's/^[[:space:]]*[0-9]* - \(.*\)/\1/p' <<< "$log" | grep -v Skipped | head -8 | tr '\n' ';')"
  [ "$passed" -gt 0 ] || { note "no GPU test passed on a GPU machine"; rc=1; }
  return $rc
}

stage_bench() {
  local script=$ROOT/bench/gpu_bench.py
  [ -f "$script" ] || { note "SKIP: bench/gpu_bench.py is not in this tree"; return 77; }
  mkdir -p "$out/bench"
  # Its own budget, inside the stage's limit, so that it writes its files.
  local extra=() usage
  usage=$("$PY" "$script" --help 2>/dev/null)
  [[ $usage == *--budget-s* ]] && extra=(--budget-s $(( ${STAGE_LIMIT:-150} - 30 )))
  # A run's own sizes, losses or repetitions (docs/Cuda.md).
  [ -n "${DLOSS_GPU_BENCH_ARGS:-}" ] && {
    read -ra more <<< "$DLOSS_GPU_BENCH_ARGS"
    extra+=("${more[@]}")
    note "bench arguments from DLOSS_GPU_BENCH_ARGS: $DLOSS_GPU_BENCH_ARGS"
  }
  # CUDA tensors over Gloo where NCCL failed its probe.
  if [ "$DLOSS_TEST_CUDA_BACKEND" != nccl ]; then
    [[ $usage == *--backend* ]] && extra+=(--backend "cpu:gloo,cuda:$DLOSS_TEST_CUDA_BACKEND")
    note "NCCL failed its probe: the bench's group is cpu:gloo,cuda:$DLOSS_TEST_CUDA_BACKEND"
  fi
  # Inf-CL, the strongest GPU anchor, beside dloss: the carried wheel
  # (pure Python; triton comes with the machine's torch), installed offline.
  # Triton builds its launcher with Python.h: the carry's where Python has none.
  local infcl=$build_dir/inf-cl wheel headers
  wheel=$(ls "$carry"/wheels/inf_cl-*.whl 2> /dev/null | head -1)
  if [ -n "$wheel" ] && [ ! -d "$infcl/inf_cl" ]; then
    "$PY" -m pip install -q --no-index --no-deps --target "$infcl" "$wheel" > /dev/null 2>&1 ||
      "$PY" -m zipfile -e "$wheel" "$infcl" || note "could not install $wheel"
  fi
  [ -n "$wheel" ] || note "no Inf-CL wheel in the carry: the bench has no Inf-CL rows"
  headers=$(carried_python_headers) && [ -n "$headers" ] &&
    export C_INCLUDE_PATH=$headers${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
  DLOSS_COMPILER_LIBRARY=$COMPILER_LIB DLOSS_CACHE_DIR=$RUN_CACHE \
    PYTHONPATH="$build_dir/python:$infcl" "$PY" "$script" --out "$out/bench" --skip-without-cuda "${extra[@]}"
  local rc=$?
  [ $rc -eq 0 ] || { note "bench/gpu_bench.py exited $rc"; return 1; }
  if ! have_gpu; then
    note "SKIP: $(no_gpu_reason); bench/gpu_bench.py --skip-without-cuda exited 0"
    return 77
  fi
  local json=$out/bench/gpu_bench.json
  if [ -f "$json" ]; then
    local counts
    counts=$("$PY" -c 'import json, sys
lines = json.load(open(sys.argv[1])).get("lines", {}).get("verdicts", [])
print(sum(l.endswith("PASS") for l in lines), sum(l.endswith("FAIL") for l in lines))' "$json")
    number bench_targets_met "${counts% *}"
    number bench_targets_missed "${counts#* }"
    note "bench/gpu_bench.py: ${counts% *} targets met, ${counts#* } missed (bench/gpu_bench.md)"
  else
    note "bench/gpu_bench.py wrote: $(cd "$out/bench" && ls | tr '\n' ' ')"
  fi
}

if [ -n "$internal" ]; then
  stage=$internal
  result=$state/$stage.partial
  "stage_$stage"
  exit $?
fi

# ---- The stages, each under its own limit ---------------------------------------
# One function, read whole before it runs: an edit of this file while it runs
# (a long build) cannot derail it.
main() {
mkdir -p "$out" "$state"
declare -A LOG=([build]=build.log [python]=build.log [kernels]=kernels.log [tests]=tests.log [bench]=bench.log)
call=$(date -u +%Y-%m-%dT%H:%M:%SZ)
start=$SECONDS
rm -rf "$out"/*.log "$out/bench" "$out/bench-results.tar.gz"
machine_info > "$state/machine.txt"  # once: it imports torch
have_gpu && gpu=1 || gpu=
export DLOSS_GPU_CHECK_HAVE_GPU=$([ -n "$gpu" ] && echo 0 || echo 1)
# The compiler library where it loads here; else plans from the carry's cache.
loaded=none
[ -f "$UNPACKED_LIB" ] && loaded=$(compiler_identity)
if [[ $loaded =~ ^[0-9a-f]{64}$ ]]; then
  export DLOSS_GPU_CHECK_COMPILER=$UNPACKED_LIB
  echo "compiler: the carried library loads here (identity ${loaded:0:12})" >> "$state/machine.txt"
else
  export DLOSS_GPU_CHECK_COMPILER=
  echo "compiler: FAILED: $([ "$loaded" = none ] && echo "none at $UNPACKED_LIB (no wheel in the carry?)" || echo "the carried library does not load here: $loaded"); plans come from the carry's plan cache alone" >> "$state/machine.txt"
fi
COMPILER_LIB=$DLOSS_GPU_CHECK_COMPILER
echo "plan cache: $(seed_plan_caches 2>&1 | tail -1)" >> "$state/machine.txt"
# NCCL first: if it does not start, CUDA tensors go through Gloo (the smoke
# test, test_cuda.py and the bench), and the summary says so.
DLOSS_TEST_CUDA_BACKEND=nccl
if [ -n "$gpu" ]; then
  probe=$(nccl_probe)
  if [[ $probe == FAILED* ]]; then
    DLOSS_TEST_CUDA_BACKEND=gloo
    echo "nccl: $probe; CUDA tensors go through Gloo (cpu:gloo,cuda:gloo)" >> "$state/machine.txt"
  else
    echo "nccl: ok (world 1 all_reduce, ${probe}s)" >> "$state/machine.txt"
  fi
fi
{
  echo "gpu-check: stages $stages; budget ${budget}s; output $out"
  sed 's/^/gpu-check: /' "$state/machine.txt"
} | tee "$out/build.log"

build_failed=
for stage in "${ALL_STAGES[@]}"; do
  [[ ",$stages," == *",$stage,"* ]] || continue
  log=$out/${LOG[$stage]}
  result=$state/$stage.partial
  rm -f "$result" "$result.out"
  left=$((budget - (SECONDS - start)))
  # Keep the later stages' reserves back (the bench's, before the tests).
  later=
  for next in "${ALL_STAGES[@]}"; do
    if [ "$next" = "$stage" ]; then later=1
    elif [ -n "$later" ] && [[ ",$stages," == *",$next,"* ]]; then
      left=$((left - ${RESERVE[$next]:-0}))
    fi
  done
  limit=${LIMIT[$stage]}
  [ "$limit" -le "$left" ] || limit=$left
  t0=$SECONDS
  echo "gpu-check: ---- $stage (limit ${limit}s) ----" | tee -a "$log"
  if [ "$limit" -lt 30 ]; then
    status=SKIP; echo "note: no time left in the budget (${budget}s): run --stage $stage in another call" > "$result"
  elif [ "$stage" != build ] && { [ -n "$build_failed" ] || [ ! -f "$build_dir/build.ninja" ]; }; then
    status=SKIP; echo "note: needs the build, which ${build_failed:-is not in $build_dir: run --stage build first}" > "$result"
  elif [ "$stage" != build ] && [[ ",$stages," != *",build,"* ]] && [ -f "$state/build.result" ] &&
      ! grep -q '^number: core_built=1' "$state/build.result"; then
    status=SKIP; echo "note: needs the build, which failed in an earlier call: run --stage build again" > "$result"
  else
    # Into the log, not a pipe: a process of the stage that outlives its
    # limit (a new session) cannot hold this script up.
    size=$(stat -c %s "$log")
    STAGE_LIMIT=$limit timeout -k 10 "$limit" bash "$SELF" --run-stage "$stage" --build-dir "$build_dir" \
      --carry "$carry" --out "$out" < /dev/null >> "$log" 2>&1
    rc=$?
    tail -c +$((size + 1)) "$log" | grep '^gpu-check'
    case $rc in
      0) status=PASS ;;
      77) status=SKIP ;;
      124|137) status=TIMEOUT; echo "note: stopped at its limit of ${limit}s" >> "$result" ;;
      *) status=FAIL ;;
    esac
  fi
  [ -n "${rc+x}" ] || echo "gpu-check: $stage: $(sed -n 's/^note: //p' "$result" | head -1)"
  unset rc
  # A build that failed after the core targets still lets the later stages run.
  [ "$stage" = build ] && [ "$status" != PASS ] && ! grep -q '^number: core_built=1' "$result" &&
    build_failed="failed in this call ($status)"
  seconds=$((SECONDS - t0))
  echo "gpu-check: $stage: $status (${seconds}s)" | tee -a "$log"
  if [ "$status" = FAIL ] || [ "$status" = TIMEOUT ]; then
    echo "gpu-check: the end of $stage's log ($log):"; tail -25 "$log" | grep -v '^gpu-check' | sed 's/^/  | /'
  fi
  { echo "status: $status"; echo "seconds: $seconds"; echo "call: $call"; echo "log: ${LOG[$stage]}"
    cat "$result" 2>/dev/null; } > "$state/$stage.result"
  rm -f "$result" "$result.out"
done

# ---- Files back: at most 8 (the device tool's limit) --------------------------
if [ -d "$out/bench" ]; then
  count=$(find "$out/bench" -type f | wc -l)
  if [ "$count" -gt 2 ]; then
    tar -C "$out" -czf "$out/bench-results.tar.gz" bench && rm -rf "$out/bench"
  elif [ "$count" -eq 0 ]; then
    rmdir "$out/bench"
  fi
fi

# ---- The summary: every stage this build has a result for --------------------
"$PY" - "$state" "$out" "$call" "$budget" "$((SECONDS - start))" "${ALL_STAGES[@]}" <<'EOF'
import json, os, sys
state, out, call, budget, elapsed, stages = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
machine = {}
for line in open(os.path.join(state, "machine.txt")):
    key, _, value = line.rstrip("\n").partition(": ")
    machine[key] = value
results = []
for name in stages:
    path = os.path.join(state, name + ".result")
    if not os.path.exists(path):
        continue
    entry = {"stage": name, "notes": [], "numbers": {}}
    for line in open(path):
        key, _, value = line.rstrip("\n").partition(": ")
        if key == "note":
            entry["notes"].append(value)
        elif key == "number":
            k, _, v = value.partition("=")
            try:
                entry["numbers"][k] = float(v) if "." in v or "e" in v else int(v)
            except ValueError:
                entry["numbers"][k] = v
        elif key == "seconds":
            entry["seconds"] = int(value)
        else:
            entry[key] = value
    entry["this_call"] = entry.get("call") == call
    results.append(entry)
bad = [r["stage"] for r in results if r["this_call"] and r["status"] in ("FAIL", "TIMEOUT")]
summary = {"call": call, "budget_s": budget, "elapsed_s": elapsed, "machine": machine,
           "stages": results, "ok": not bad}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
lines = ["# gpu-check %s" % call, ""]
lines += ["- %s: %s" % (k, v) for k, v in machine.items()]
lines += ["", "| stage | status | s | call | notes |", "|---|---|---:|---|---|"]
for r in results:
    when = "this" if r["this_call"] else r.get("call", "?")
    lines.append("| %s | %s | %s | %s | %s |" % (r["stage"], r["status"], r.get("seconds", ""), when,
                 "<br>".join(n.replace("|", "/") for n in r["notes"])))
numbers = [(r["stage"], k, v) for r in results for k, v in r["numbers"].items()]
if numbers:
    lines += ["", "| stage | number | value |", "|---|---|---:|"]
    lines += ["| %s | %s | %s |" % n for n in numbers]
lines += ["", "Logs: " + ", ".join(sorted({r["log"] for r in results if r["this_call"]})) +
          " (this call's); %ss of a %ss budget." % (elapsed, budget)]
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
EOF
echo "gpu-check: ---- summary ($out/summary.md) ----"
cat "$out/summary.md"
files=$(find "$out" -type f | wc -l)
echo "gpu-check: $files files in $out"
if grep -q '"ok": false' "$out/summary.json"; then
  echo "gpu-check: FAILED:$(grep -E '^\| [a-z]+ \| (FAIL|TIMEOUT) \| [0-9]* \| this' "$out/summary.md" |
    awk -F'|' '{ gsub(/ /, "", $2); gsub(/ /, "", $3); printf " %s (%s)", $2, $3 }')"
  return 1
fi
echo "gpu-check: done: no stage failed$([ -z "$gpu" ] && echo " (no GPU here: the device stages were skipped)")"
}
main; exit $?
