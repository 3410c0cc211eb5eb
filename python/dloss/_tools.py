"""The console script of the wheel: `dloss-run` on PATH runs the binary the
package carries (dloss/bin), as cmake's own wheel does. `dlossc` and
`dloss-opt` are the dloss-compiler wheel's (packaging/compiler)."""

import os
import sys

from . import _paths


def _exec(name):
    path = os.path.join(_paths.BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"dloss: {name} is not installed at {path}; reinstall dloss "
                 f"(pip install --no-build-isolation .)")
    os.execv(path, [path] + sys.argv[1:])


def dloss_run():
    _exec("dloss-run")
