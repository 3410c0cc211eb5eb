#!/usr/bin/env bash
# The demo on a fresh machine (README, "Install", way (a)): install,
# build, then train with `import dloss` on 4 local processes (DDP over Gloo on
# loopback), uneven batches at every step:
#   1. a two-tower CLIP model with dloss.ClipLoss,
#   2. a classifier with dloss.ArcFaceLoss, its W outside DDP,
# each beside the same training in one process on the global batch (the
# parameters must match: PASS/FAIL, non-zero exit on FAIL) and beside the
# usual hand-written distributed loss, which drifts away. Loss curves go to
# $DLOSS_DEMO_OUT (default build/demo-python). The scripts are
# examples/python/train_clip.py and train_arcface.py.
# The compiler-level demo (derived backward, report, dloss-run) is
# scripts/compiler-demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh

bash scripts/setup.sh
# The build prints its progress ([n/N] per file): a first build takes minutes.
bash scripts/build.sh
BUILD=$(cd "${DLOSS_BUILD_DIR:-build}" && pwd)
OUT=${DLOSS_DEMO_OUT:-$BUILD/demo-python}
export PYTHONPATH="$BUILD/python" OMP_NUM_THREADS=1

echo "== CLIP: DDP + dloss.ClipLoss on 4 ranks, uneven batches; then OpenCLIP-style hand-written gathering"
"$DLOSS_PYTHON" examples/python/launch.py --nproc 4 examples/python/train_clip.py --out "$OUT"

echo "== ArcFace: DDP backbone + dloss.ArcFaceLoss (W outside DDP) on 4 ranks; then PML's ArcFace per rank"
"$DLOSS_PYTHON" examples/python/launch.py --nproc 4 examples/python/train_arcface.py --out "$OUT"

echo "== done: loss curves in $OUT; compiler-level output: bash scripts/compiler-demo.sh"
