"""The import-time check that torch's ProcessGroup and Store cross into dloss's C++.

dloss._C must share pybind11's internals with torch's libtorch_python. When it
does not (dloss built against another torch, or another pybind11), torch's
objects reach C++ as foreign types and every loss on the user's group would
fail later, far from the cause. This check makes that an ImportError now.
"""

import torch
import torch.distributed as dist

from . import _C


def check_torch_objects_cross():
    """Passes a fresh one-rank ProcessGroup and a HashStore to C++ and back."""
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
