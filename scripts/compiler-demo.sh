#!/usr/bin/env bash
# The compiler-level demo (docs/Building.md): install, build, then
# show what dlossc derives and runs for examples/clip.mlir: the fused
# backward (excerpt), the memory/communication report, the fused plan run by
# dloss-run on 4 local ranks (processes, Gloo on loopback) with uneven batches
# and checked against one process on the concatenated global batch, and the
# fused plan checked against the unfused one on the same inputs.
# The Python main job (training with `import dloss`) is scripts/demo.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python with torch (the active venv, else .venv) first on PATH.
source scripts/python-env.sh

bash scripts/setup.sh
# The build prints its progress ([n/N] per file): a first build takes minutes.
bash scripts/build.sh
BUILD=${DLOSS_BUILD_DIR:-build}

echo "== dlossc: the derived backward of examples/clip.mlir, fused (excerpt)"
"$BUILD/bin/dlossc" examples/clip.mlir --emit=backward | grep -E "func.func|dloss.ring_|world_size" | cut -c1-150

echo "== dlossc --report: fused vs unfused at B_local=4096, 4 ranks, d=256 (summary)"
"$BUILD/bin/dlossc" examples/clip.mlir --report --report-world 4 --report-batch 4096 --report-dim 256 | grep -E "^@"

echo "== dloss-run: fused CLIP on 4 ranks, batches 256/192/320/128, d=128, --check"
"$DLOSS_PYTHON" examples/run_example.py "$BUILD/bin/dloss-run" examples/clip.mlir \
  --sizes 256,192,320,128 --dim 128 --iters 10 --out "$BUILD/demo"

echo "== fused vs unfused (--no-fuse) on the same inputs"
"$DLOSS_PYTHON" test/e2e/fused_vs_unfused.py "$BUILD/bin/dloss-run" "$BUILD/bin/dlossc" \
  examples/clip.mlir --sizes 256,192,320,128 --dim 128 --out "$BUILD/demo-fused" | tail -1
