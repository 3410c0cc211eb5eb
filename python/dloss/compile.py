"""dloss.compile: a loss (dloss MLIR text, a .mlir file, a dloss.Graph, or
a function written in PyTorch) as a CompiledLoss, a callable torch module
with autograd (dloss/compiled.py)."""

import os

from . import _C
from .compiled import CompiledLoss, compile_graph
from .errors import make_error
from .graph import Graph
from .schedule import check_schedule
from .trace import Loss


def _source_text(source):
    """(MLIR text, name) of a compile() source other than a graph."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise make_error(
            "dloss.compile takes dloss MLIR text, a .mlir path or a "
            "dloss.Graph, not %s" % type(source).__name__,
            "Pass the loss's source")
    if "func.func" in source or "\n" in source:
        return source, "<python>"
    if not os.path.exists(source):
        raise make_error(
            "%r is neither dloss MLIR text nor an existing file" % source,
            "Pass the MLIR text itself, or the path of a .mlir file")
    with open(source) as f:
        return f.read(), source


def compile(source, grad_mode=None, fuse=True, entry=None, group=None,
            schedule=None):
    """Compiles a loss for this process group.

    source: dloss MLIR text, the path of a ``.mlir`` file, a
    dloss.Graph, or a Python function written in PyTorch (as @dloss.loss,
    which see). grad_mode: "ddp" or "global" to override the loss's own
    contract (None keeps it). fuse: fuse gather + similarity + loss into
    ring-tiled kernels (False runs every op unfused). entry: the loss to call
    when the source defines several. group: the torch.distributed group
    (default: the default group). schedule: how the fused ops move the
    columns between ranks, "auto", "ring" or "gather" (None: the process
    default, dloss.set_schedule); a setting of the run, not of the plan.

    Compiled plans are cached by source and options, in memory and on disk
    ($DLOSS_CACHE_DIR, default ~/.cache/dloss; ``off`` turns it off), so
    compiling the same loss again, in this process or the next, is free. A loss that does not compile raises dloss.Error with the
    compiler's messages and their locations.
    """
    if grad_mode not in (None, "ddp", "global"):
        raise make_error("grad_mode must be 'ddp', 'global' or None, got %r"
                         % (grad_mode,), "See docs/Autodiff.md")
    check_schedule(schedule, "dloss.compile")
    if callable(source) and not isinstance(source, (Graph, _C.Graph)):
        return Loss(source, grad_mode=grad_mode or "ddp", fuse=fuse,
                    group=group, name=entry, schedule=schedule)
    if isinstance(source, (Graph, _C.Graph)):
        graph = source._g if isinstance(source, Graph) else source
        return compile_graph(graph, grad_mode, fuse, entry or source.name,
                             group, schedule)
    text, name = _source_text(source)
    plan = _C.compile_plan(text, grad_mode or "", name, bool(fuse))
    return CompiledLoss(plan, entry or "", group, schedule)
