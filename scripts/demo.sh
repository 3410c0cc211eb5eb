#!/usr/bin/env bash
# The main job on a fresh machine: install, build, then run the CLIP loss on 4
# local ranks (processes, Gloo on loopback) with uneven batches, and check its
# gradients against one process on the concatenated global batch.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh >/dev/null
BUILD=${DLOSS_BUILD_DIR:-build}

echo "== dlossc: the derived backward of examples/clip.mlir (excerpt)"
"$BUILD/bin/dlossc" examples/clip.mlir --emit=backward | grep -E "func.func|reduce_scatter|world_size" | head -8

echo "== dloss-run: CLIP on 4 ranks, batches 256/192/320/128, d=128, --check"
/usr/bin/python3 examples/run_example.py "$BUILD/bin/dloss-run" examples/clip.mlir \
  --sizes 256,192,320,128 --dim 128 --iters 10 --out "$BUILD/demo"
