"""dloss: exact, fused distributed losses for PyTorch.

Swap an import and keep your training script:

    import dloss
    loss_fn = dloss.ClipLoss()            # was open_clip.loss.ClipLoss(...)
    loss = loss_fn(image_features, text_features, logit_scale)
    loss.backward()

Every loss runs on the script's own torch.distributed group (or ``group=``),
returns the global loss on every rank, and is exact for uneven batches. See
README.md and docs/Migration.md.
"""

from ._check import check_built_torch as _check_built_torch
from ._check import check_compiler_pair as _check_compiler_pair
from ._check import check_torch_objects_cross as _check_torch_objects_cross

_check_built_torch()
_check_torch_objects_cross()
_check_compiler_pair()

import os as _os

from . import _C

# The package's sources are dloss's own: a step located there is named by
# the user's call of the loss instead (runtime/comm/CallSite.h).
_C.add_own_source_dir(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep)

from .collectives import all_gather, gather_all_tensors
from .compile import CompiledLoss, compile
from .errors import Error
from .graph import Graph
from .group import init, set_timeout
from .guard import guard
from .losses import (ArcFaceLoss, ClipLoss, CoCaLoss, CombinedMarginLoss,
                     CosFaceLoss, DistillClipLoss, PartialFC, SigLipLoss)
from .metric_learning import DistributedLossWrapper, NTXentLoss, SupConLoss
from .schedule import get_schedule, set_schedule
from .sync import assert_grads_synced
# After .collectives: inside a @dloss.loss function all_gather records the op.
from .trace import (Input, Loss, Replicated, State, all_gather, all_reduce,
                    broadcast, global_size, loss, rank, reduce_scatter,
                    ring_shift, shard_offset, world_size)

# For CMake's CMAKE_PREFIX_PATH, as torch.utils.cmake_prefix_path: then
# find_package(dloss) finds the installed package (None in the build tree).
from ._paths import CMAKE_DIR as cmake_prefix_path

# DLOSS_GUARD=<seconds>: the script's default group guarded (dloss.guard).
from .guard import install_from_environment as _install_guard

_install_guard()


def __getattr__(name):
    # dloss.check_loss on first use: `python -m dloss.check_loss` runs that
    # module as the main one, which an eager import here would have loaded
    # already (runpy warns, and its processes would load it twice).
    if name == "check_loss":
        from .check_loss import check_loss
        # The import set dloss.check_loss to the module: the function wins.
        globals()["check_loss"] = check_loss
        return check_loss
    raise AttributeError("module 'dloss' has no attribute %r" % name)

__all__ = [
    "ArcFaceLoss", "ClipLoss", "CoCaLoss", "CombinedMarginLoss",
    "CompiledLoss", "DistillClipLoss",
    "CosFaceLoss", "DistributedLossWrapper", "Error", "Graph", "Input", "Loss", "NTXentLoss", "PartialFC",
    "Replicated", "SigLipLoss", "State", "SupConLoss", "all_gather",
    "all_reduce",
    "assert_grads_synced", "broadcast", "check_loss", "cmake_prefix_path",
    "compile",
    "gather_all_tensors", "get_schedule", "global_size", "guard", "init",
    "loss", "rank", "reduce_scatter", "ring_shift", "set_schedule",
    "set_timeout", "shard_offset", "world_size",
]
