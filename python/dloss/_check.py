"""The import-time checks: dloss._C is built against the running torch's
release, torch's ProcessGroup and Store cross into dloss's C++, and the
dloss-compiler wheel is the one of dloss's own sources.

dloss._C links torch's C++ ABI, which changes between torch releases, and must
share pybind11's internals with torch's libtorch_python. When it does not
(dloss built against another torch, or another pybind11), _C fails to load
with an undefined symbol, or torch's objects reach C++ as foreign types and
every loss on the user's group would fail later, far from the cause. These
checks make that an ImportError now, naming what to install.
"""

import importlib.metadata
import os

import torch
import torch.distributed as dist

from ._built_against import TORCH_VERSION as BUILT_TORCH

# The library inside the dloss-compiler wheel (packaging/compiler).
WHEEL_LIBRARY = "dloss_compiler/lib/libdloss_compiler.so"


def release(version):
    """A torch version's release, without its local label (2.13.0+cpu:
    2.13.0): what dloss's wheel pins (packaging/dloss_build_metadata.py),
    as PEP 440 matches torch==2.13.0 with every build of that release."""
    return version.partition("+")[0]


def check_built_torch():
    """The torch release dloss._C is built against (dloss/_built_against.py,
    python/CMakeLists.txt) is the running one's. Runs before _C loads: under
    another torch, loading it may fail with a bare undefined symbol."""
    if release(BUILT_TORCH) != release(torch.__version__):
        raise ImportError(
            f"dloss was built against torch {BUILT_TORCH}, but this "
            f"environment runs torch {torch.__version__} (at "
            f"{os.path.dirname(torch.__file__)}): dloss's extension needs "
            f"the C++ ABI of the torch release it was built against. Install "
            f"that torch (pip install \"torch=={release(BUILT_TORCH)}\"), or "
            f"rebuild dloss against this one (pip install "
            f"--no-build-isolation . or scripts/build.sh)")


def check_torch_objects_cross():
    """Passes a fresh one-rank ProcessGroup and a HashStore to C++ and back."""
    from . import _C  # noqa: PLC0415 - after check_built_torch

    if not dist.is_available():
        raise ImportError(
            f"dloss needs torch.distributed, which this torch "
            f"({torch.__version__}) was built without; install a torch "
            f"wheel from pip")
    try:
        store = dist.HashStore()
        group = dist.ProcessGroup(store, 0, 1)
        crossed = tuple(_C.objects_cross(group, store))
    except Exception as e:  # noqa: BLE001 - any failure means the same thing
        crossed = e
    if crossed != (0, 1, 1):
        raise ImportError(
            f"dloss's extension cannot read this torch's ProcessGroup and "
            f"Store ({crossed!r}): it was built against another torch or "
            f"pybind11 than torch {torch.__version__} at "
            f"{torch.__file__}. Rebuild dloss in this environment "
            f"(pip install --no-build-isolation . or scripts/build.sh)")


def check_compiler_pair():
    """The dloss-compiler wheel, when it holds the library dloss would load
    (_C.compiler_library_path: frontend/CompilerLibrary.cpp decides), must be
    built from dloss's own compiler sources: its version's local label is
    that identity (packaging/dloss_build_metadata.py). Another one would be
    refused at the first compile, far from the cause; this makes it an
    ImportError now, naming both versions."""
    from . import _C  # noqa: PLC0415 - after check_built_torch

    try:
        wheel = importlib.metadata.distribution("dloss-compiler")
    except importlib.metadata.PackageNotFoundError:
        return  # Cached plans still run; compiling says what to install.
    theirs = wheel.locate_file(WHEEL_LIBRARY)
    if os.path.realpath(_C.compiler_library_path()) != os.path.realpath(theirs):
        return  # Not the wheel's: a build tree, a prefix, or the user's choice.
    installed = wheel.version
    want = _C.compiler_label
    have = installed.partition("+")[2]
    if have != want:
        try:
            mine = importlib.metadata.version("dloss")
            release = mine.partition("+")[0]  # the pair shares dloss's release
        except importlib.metadata.PackageNotFoundError:
            mine = "(not installed as a package)"
            release = installed.partition("+")[0]
        raise ImportError(
            f"dloss {mine} was built for the compiler of identity {want}, but "
            f"the installed dloss-compiler {installed} is "
            f"{'of identity ' + have if have else 'of no identity'}: its plans "
            f"would not match dloss's. Install the dloss-compiler wheel built "
            f"from the same sources as dloss (dloss-compiler=={release}+{want}: "
            f"pip wheel packaging/compiler in that checkout), or rebuild dloss "
            f"from the sources of the installed compiler")
