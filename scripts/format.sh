#!/usr/bin/env bash
# Formats every C++ and CUDA file git tracks with the pinned clang-format
# (test/requirements.txt; scripts/setup.sh installs it into the venv). The
# `format` test fails when this would change a file. Usage: bash scripts/format.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
exec "$DLOSS_PYTHON" test/lint/check_format.py --fix
