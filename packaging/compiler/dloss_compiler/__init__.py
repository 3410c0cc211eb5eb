"""dloss-compiler: the dloss compiler library (libdloss_compiler.so, MLIR and
LLVM linked in statically behind a C API), dlossc and dloss-opt.

dloss's runtime loads the library from here (frontend/CompilerLibrary.cpp
looks in ../../dloss_compiler/lib beside its own lib folder); nothing in
this package imports torch.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: The compiler library, which dloss loads with dlopen.
LIBRARY = os.path.join(_HERE, "lib", "libdloss_compiler.so")
#: dlossc and dloss-opt.
BIN_DIR = os.path.join(_HERE, "bin")
#: The C API's header: <dloss/compiler/dloss_compiler.h>.
INCLUDE_DIR = os.path.join(_HERE, "include")


def identity():
    """The compiler's identity, asked of the library itself: the hash of the
    sources it was built from, which dloss's runtime must share."""
    import ctypes  # noqa: PLC0415

    library = ctypes.CDLL(LIBRARY)
    library.dloss_compiler_identity.restype = ctypes.c_char_p
    return library.dloss_compiler_identity().decode()


def _exec(name):
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.exit(f"dloss-compiler: {name} is not installed at {path}; reinstall the dloss-compiler wheel")
    os.execv(path, [path] + sys.argv[1:])


def _dlossc():
    _exec("dlossc")


def _dloss_opt():
    _exec("dloss-opt")
