#!/usr/bin/env bash
# The main job on a fresh machine: install packages, build, then compile and verify the example losses.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh >/dev/null
BIN=${DLOSS_BUILD_DIR:-build}/bin

for loss in examples/*.mlir; do
  echo "== $loss: parsed and verified by dloss-opt"
  "$BIN/dloss-opt" "$loss"
done
