"""The console scripts of the wheel: `dlossc`, `dloss-run` and `dloss-opt` on PATH
run the binaries the package carries (dloss/bin), as cmake's own wheel does."""

import os
import sys

from . import _paths


def _exec(name):
    path = os.path.join(_paths.BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"dloss: {name} is not installed at {path}; reinstall dloss "
                 f"(pip install --no-build-isolation .)")
    os.execv(path, [path] + sys.argv[1:])


def dlossc():
    _exec("dlossc")


def dloss_run():
    _exec("dloss-run")


def dloss_opt():
    _exec("dloss-opt")
