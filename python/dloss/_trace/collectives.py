"""dloss's collectives and rank facts as a @dloss.loss function calls them
(dloss.all_gather, all_reduce, shard_offset, global_size, world_size,
rank): inside a trace each records its op; outside, all_gather runs at
once and the others say where they belong."""

from .. import _C
from ..collectives import all_gather as _eager_all_gather
from .locations import _code, _user_location, fail
from .materialise import _emit, _mat
from .values import _Size, _Value, _axis, _current_trace

# The dloss ops these rules emit (test_trace_emits keeps it true).
EMITS = frozenset({"dloss.all_gather", "dloss.all_reduce"})


def _outside(name):
    loc = _user_location()
    fail("dloss.%s is called outside a @dloss.loss function" % name,
         "It records an op of a loss being traced: call it inside a "
         "function decorated with @dloss.loss (eagerly, use "
         "torch.distributed)", loc, op="dloss." + name)


def all_gather(x, group=None, grad="exact"):
    """Every rank's `x` concatenated along the first dimension, in rank
    order, on every rank (uneven sizes allowed), with exact gradients.

    Inside a @dloss.loss function it records a dloss.all_gather (the group
    is the loss's; `grad`: "exact", or "local"/"none" to reproduce
    TorchMetrics/OpenCLIP's gradients, with a compiler warning). Outside,
    it runs at once on `group` (see dloss.collectives.all_gather).
    """
    if not isinstance(x, _Value):
        return _eager_all_gather(x, group)
    loc = _user_location()
    x = _mat(x)
    if x.ndim == 0:
        fail("dloss.all_gather of a 0-d tensor at %s" % _code(loc),
             "Gather a 1-d tensor (x[None]... is not supported: keep a "
             "batch dimension)", loc, op="dloss.all_gather")
    if grad not in ("exact", "local", "none"):
        fail("grad must be 'exact', 'local' or 'none', got %r" % (grad,),
             "", loc, op="dloss.all_gather")
    tr = x.tr
    t = tr.g.all_gather(x.node, 0, getattr(_C.GatherGrad, grad), *loc)
    first = x.dims[0]
    if isinstance(first, _Size) and first.batch:
        first = first.glob(loc)
    else:
        first = _Size(tr, "global", (x, 0), loc)
    return _emit(tr, t, (first,) + tuple(x.dims[1:]), x.dtype, (), loc,
                 varying=False, ir=x.ir)


def all_reduce(x, op="sum", group=None):
    """Inside a @dloss.loss function: the element-wise sum (or "mean",
    "max", "min") of `x` over the ranks, the same on every rank, with its
    exact gradient."""
    if not isinstance(x, _Value):
        _outside("all_reduce")
    loc = _user_location()
    if op not in ("sum", "mean", "max", "min"):
        fail("unknown reduction %r for dloss.all_reduce" % (op,),
             "Use 'sum', 'mean', 'max' or 'min'", loc,
             op="dloss.all_reduce")
    x = _mat(x)
    t = x.tr.g.all_reduce(x.node, op, *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (), loc, varying=False, ir=x.ir)


def _axis_size(kind, x, axis, name):
    if not isinstance(x, _Value):
        _outside(name)
    loc = _user_location()
    axis = _axis(axis, x.ndim, loc)
    d = x.dims[axis]
    if isinstance(d, _Size) and d.kind == "dim":
        root, root_axis = d.args
    else:
        root, root_axis = _mat(x), axis
    if kind == "global" and isinstance(d, _Size) and d.batch:
        return d.glob(loc)
    return _Size(x.tr, kind, (root, root_axis), loc,
                 varying=kind == "offset")


def shard_offset(x, axis=0):
    """Inside a @dloss.loss function: the sum of the lower ranks' sizes of
    `x` along `axis`, i.e. the global index of this rank's first row
    (right for uneven batches, unlike n * rank)."""
    return _axis_size("offset", x, axis, "shard_offset")


def global_size(x, axis=0):
    """Inside a @dloss.loss function: the sum over ranks of the size of `x`
    along `axis` (the global batch)."""
    return _axis_size("global", x, axis, "global_size")


def world_size():
    """Inside a @dloss.loss function: the number of ranks (a size)."""
    tr = _current_trace()
    if tr is None:
        _outside("world_size")
    return _Size(tr, "world", (), _user_location())


def rank():
    """Inside a @dloss.loss function: this rank's index (a size that
    differs across ranks; for labels use dloss.shard_offset)."""
    tr = _current_trace()
    if tr is None:
        _outside("rank")
    return _Size(tr, "rank", (), _user_location(), varying=True, rank=True)
