"""dloss's collectives and rank facts as a @dloss.loss function calls them
(dloss.all_gather, all_reduce, reduce_scatter, broadcast, ring_shift,
shard_offset, global_size, world_size, rank): inside a trace each records
its op; outside, all_gather runs at once and the others say where they
belong."""

from .. import _C
from ..collectives import all_gather as _eager_all_gather
from .locations import _code, _user_location, fail
from .materialise import _emit, _mat
from .values import _Size, _Unsq, _Value, _axis, _current_trace

# The dloss ops these rules emit (test_trace_emits keeps it true).
EMITS = frozenset({"dloss.all_gather", "dloss.all_reduce",
                   "dloss.reduce_scatter", "dloss.broadcast",
                   "dloss.ring_shift"})


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
    if isinstance(x, _Unsq):  # a keepdim reduction: its size-1 axes stay
        return _Unsq(all_reduce(x.base, op), x.ndim, x.positions, loc)
    x = _mat(x)
    t = x.tr.g.all_reduce(x.node, op, *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (), loc, varying=False, ir=x.ir)


def _own_dims(r, loc):
    """`r` with each run-time size its own (dloss.dim of r): a collective's
    result whose sizes are another rank's, or a share, not its operand's."""
    r.dims = tuple(d if isinstance(d, int) else
                   _Size(r.tr, "dim", (r, k), loc, varying=True)
                   for k, d in enumerate(r.dims))
    return r


def reduce_scatter(x, op="sum", size=None):
    """Inside a @dloss.loss function: `x` (whose first dimension is the
    global one) summed (or averaged: "mean") over the ranks, of which this
    rank keeps its own block of rows: `size` rows (this rank's share, such
    as its batch `image.shape[0]`; blocks may be uneven), or an even share
    when None. The inverse layout of dloss.all_gather, with its exact
    gradient."""
    if not isinstance(x, _Value):
        _outside("reduce_scatter")
    loc = _user_location()
    if op not in ("sum", "mean"):
        fail("unknown reduction %r for dloss.reduce_scatter" % (op,),
             "Use 'sum' or 'mean'", loc, op="dloss.reduce_scatter")
    x = _mat(x)
    if x.ndim == 0:
        fail("dloss.reduce_scatter of a 0-d tensor at %s" % _code(loc),
             "Scatter a tensor whose first dimension is the global batch",
             loc, op="dloss.reduce_scatter")
    tr = x.tr
    block = None if size is None else tr.size(size, loc)
    t = tr.g.reduce_scatter(x.node, op, 0, block, *loc)
    if size is None:
        return _own_dims(_emit(tr, t, x.dims, x.dtype, (), loc,
                               varying=True, ir=x.ir), loc)
    return _emit(tr, t, (size,) + tuple(x.dims[1:]), x.dtype, (), loc,
                 varying=True, ir=x.ir)


def broadcast(x, root=0):
    """Inside a @dloss.loss function: rank `root`'s `x` on every rank (the
    ranks' `x` have the same shape), with its exact gradient (the
    cotangents summed on the root)."""
    if not isinstance(x, _Value):
        _outside("broadcast")
    loc = _user_location()
    if not isinstance(root, int) or root < 0:
        fail("dloss.broadcast's root must be a rank number, got %r" %
             (root,), "Pass the root rank as an int (0, say)", loc,
             op="dloss.broadcast")
    x = _mat(x)
    t = x.tr.g.broadcast(x.node, root, *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (), loc, varying=False, ir=x.ir)


def ring_shift(x, shift=1):
    """Inside a @dloss.loss function: sends `x` to rank r + shift and
    returns what rank r - shift sent (its sizes, which may differ from
    this rank's): one step of a ring algorithm."""
    if not isinstance(x, _Value):
        _outside("ring_shift")
    loc = _user_location()
    if not isinstance(shift, int):
        fail("dloss.ring_shift's shift must be an int, got %r" % (shift,),
             "Pass how many ranks to shift by (1, say)", loc,
             op="dloss.ring_shift")
    x = _mat(x)
    t = x.tr.g.ring_shift(x.node, shift, *loc)
    return _own_dims(_emit(x.tr, t, x.dims, x.dtype, (), loc, varying=True,
                           ir=x.ir), loc)


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
