"""dloss.all_gather and TorchMetrics' gather_all_tensors, with exact
autograd and uneven shapes."""

import zlib
from typing import List

import torch
import torch.distributed as dist

from . import _ops
from .errors import caller_location, make_error
from .group import communicator, world_size

# The shape exchange: [ndim, dtype, sizes...] padded to a fixed length.
_MAX_DIMS = 16


def _dtype_code(dtype):
    # The same number in every process, whatever dtypes it has seen before
    # (a code numbered by first use differs between ranks, and then a dtype
    # mismatch goes unseen and aborts inside Gloo).
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


def _dtype_name(code):
    for value in vars(torch).values():
        if isinstance(value, torch.dtype) and _dtype_code(value) == code:
            return str(value)
    return "another dtype"


def _exchange_shapes(comm, x, location, op, pad=False):
    """Every rank's shape (a list; [] for a 0-d tensor), after checking on
    every rank that all ranks' tensors agree in all else: number of dims,
    dtype and, unless `pad`, the dims after the first. A disagreement raises
    the same dloss.Error on every rank."""
    if x.dim() > _MAX_DIMS:
        problem = "%s takes tensors of at most %d dims, got %d" % (
            op, _MAX_DIMS, x.dim())
    else:
        problem = ""
    # Every rank sends its shape even when its own tensor is bad, so that
    # all ranks reach the same verdict in the same call.
    dims = list(x.shape)[:_MAX_DIMS]
    row = [x.dim() if not problem else -1,
           _dtype_code(x.dtype)] + dims + [0] * (_MAX_DIMS - len(dims))
    width = len(row)
    table = comm.all_gather_ints(row, op, location)
    rows = [table[r * width:(r + 1) * width] for r in range(comm.world_size)]
    bad = [r for r, row in enumerate(rows) if row[0] < 0]
    if bad:
        raise make_error(
            "rank(s) %s passed a tensor of more than %d dims" %
            (", ".join(map(str, bad)), _MAX_DIMS),
            "Reshape before gathering", rank=comm.rank, op=op,
            location=location)

    def describe(row, other):
        if row[0] == 0:
            shape = "a 0-d tensor"
        else:
            shape = "[%s]" % ", ".join(str(v) for v in row[2:2 + row[0]])
        if row[1] != other[1]:
            shape += " of " + _dtype_name(row[1])
        return shape

    mine = rows[comm.rank]
    for r, row in enumerate(rows):
        # Each rank compares every row with its own: when any two rows
        # differ, every rank finds a row unlike its own.
        if row[0] != mine[0] or row[1] != mine[1] or (
                not pad and row[3:2 + row[0]] != mine[3:2 + mine[0]]):
            if pad:
                problem = ("the ranks' tensors disagree in their number of "
                           "dimensions or dtype")
                hint = ("Every dimension may differ between ranks; the "
                        "number of dimensions and the dtype must agree")
            else:
                problem = ("the ranks' tensors disagree beyond the first "
                           "dimension")
                hint = ("Only the first dimension (the batch) may differ "
                        "between ranks; the number of dimensions, every "
                        "other dimension and the dtype must agree")
            raise make_error(
                "%s: rank %d has %s, rank %d has %s" %
                (problem, comm.rank, describe(mine, row), r,
                 describe(row, mine)), hint,
                rank=comm.rank, op=op, location=location)
    return [list(row[2:2 + row[0]]) for row in rows]


def _group_name(group):
    """The name dloss's ops take a group by ("" for the default group or
    none): a string, which Dynamo keeps as a constant."""
    if group is None or not dist.is_available() or \
            not dist.is_initialized() or group is dist.group.WORLD:
        return ""
    return group.group_name


def _group(name):
    return dist.distributed_c10d._resolve_process_group(name) if name \
        else None


@torch.library.custom_op("dloss::all_gather", mutates_args=())
def _all_gather_op(x: torch.Tensor, group: str,
                   site: str) -> List[torch.Tensor]:
    """[every rank's x along dim 0, the rows each rank sent (int64)], after
    checking on every rank that the ranks' tensors agree beyond dim 0."""
    comm = communicator(_group(group))
    shapes = _exchange_shapes(comm, x, site, "dloss.all_gather")
    scalar = x.dim() == 0
    sizes = [s[0] if s else 1 for s in shapes]
    gathered = _gather_rows(comm, x.reshape(1) if scalar else x, sizes, site)
    return _ops.fresh([gathered, torch.tensor(sizes, dtype=torch.int64)],
                      [x])


@_all_gather_op.register_fake
def _all_gather_fake(x, group, site):
    world = world_size(_group(group))
    if x.dim() == 0:  # one element per rank
        return [x.new_empty((world,)), torch.empty(world, dtype=torch.int64)]
    # The gathered rows are known at run time only (every rank's batch),
    # and are at least this rank's.
    rows = torch.library.get_ctx().new_dynamic_size()
    torch._check(rows >= x.shape[0])
    return [x.new_empty((rows,) + tuple(x.shape[1:])),
            torch.empty(world, dtype=torch.int64)]


@torch.library.custom_op("dloss::all_gather_backward", mutates_args=())
def _all_gather_backward_op(grad: torch.Tensor, sizes: torch.Tensor,
                            rows: int, group: str,
                            site: str) -> torch.Tensor:
    """The exact gradient of dloss::all_gather (`_scatter_rows`)."""
    comm = communicator(_group(group))
    return _ops.fresh([_scatter_rows(comm, grad, sizes.tolist(), site)],
                      [grad])[0]


@_all_gather_backward_op.register_fake
def _all_gather_backward_fake(grad, sizes, rows, group, site):
    return grad.new_empty((rows,) + tuple(grad.shape[1:]))


def _all_gather_setup(ctx, inputs, output):
    x, ctx.group, ctx.site = inputs
    ctx.rows = x.shape[0] if x.dim() else 1
    ctx.scalar = x.dim() == 0
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _all_gather_backward(ctx, grads):
    sizes, = ctx.saved_tensors
    grad = _all_gather_backward_op(grads[0], sizes, ctx.rows, ctx.group,
                                   ctx.site)
    return (grad.reshape(()) if ctx.scalar else grad), None, None


_all_gather_op.register_autograd(_all_gather_backward,
                                 setup_context=_all_gather_setup)


def _gather_rows(comm, x, sizes, location):
    """Every rank's rows of `x` (rank r sends sizes[r]), in rank order."""
    return comm.all_gather(x.contiguous(), 0, sizes, "dloss.all_gather",
                           location)


def _scatter_rows(comm, grad, sizes, location):
    """The exact gradient of `_gather_rows`: rank r's input reached every
    rank's output, so its gradient is the sum over ranks of their
    cotangents' r-th slice (a reduce-scatter)."""
    return comm.reduce_scatter(grad.contiguous(), "sum", 0, sizes,
                               "dloss.all_gather (backward)", location)


class _AllGather(torch.autograd.Function):
    """`_gather_rows` with its exact gradient, for gather_all_tensors (not
    an op: see there)."""

    @staticmethod
    def forward(ctx, x, comm, sizes, location):
        ctx.comm, ctx.sizes, ctx.location = comm, sizes, location
        return _gather_rows(comm, x, sizes, location)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_rows(ctx.comm, grad, ctx.sizes, ctx.location), None, \
            None, None


def _gather(x, group, op, pad=False):
    """The gathered tensor (every rank's rows, in rank order), every rank's
    shape and whether the tensors are 0-d. With `pad`, the dims after the
    first may differ: each rank's tensor travels zero-padded to the largest
    of each, and the caller slices the padding off."""
    if not isinstance(x, torch.Tensor):
        raise make_error("%s takes a tensor, got %s" %
                         (op, type(x).__name__), "Pass a torch.Tensor")
    location = caller_location(3)
    comm = communicator(group)
    shapes = _exchange_shapes(comm, x, location, op, pad)
    scalar = x.dim() == 0  # then every rank's is (checked above)
    if scalar:
        x = x.reshape(1)
    elif pad:
        widest = [max(dims) for dims in zip(*(s[1:] for s in shapes))]
        # F.pad takes (before, after) pairs from the last dim backwards;
        # its backward slices the padding off, so autograd stays exact.
        pairs = []
        for have, want in zip(reversed(x.shape[1:]), reversed(widest)):
            pairs += [0, want - have]
        if any(pairs):
            x = torch.nn.functional.pad(x, pairs)
    sizes = [s[0] if s else 1 for s in shapes]
    return _AllGather.apply(x, comm, sizes, location), shapes, scalar


def all_gather(x, group=None):
    """Every rank's `x` concatenated along the first dimension, in rank
    order, on every rank. The first dimension may differ between ranks (the
    last, smaller batch); the others and the dtype must agree (a mismatch
    raises dloss.Error on every rank). A 0-d `x` is one row: the result has
    one element per rank.

    Autograd is exact: the gradient reaches every rank's input, not only the
    local slot (unlike torch.distributed.all_gather, which drops it, and
    TorchMetrics, which keeps only the local slot). Every rank that calls
    all_gather must also run backward through it, as with
    torch.distributed.nn.all_gather.
    """
    if not isinstance(x, torch.Tensor):
        raise make_error("dloss.all_gather takes a tensor, got %s" %
                         type(x).__name__, "Pass a torch.Tensor")
    if x.device.type == "meta":
        # No op to dispatch to (its meta kernel would be the fake one): the
        # communicator refuses a tensor with no data, on every rank.
        return _gather(x, group, "dloss.all_gather")[0]
    return _all_gather_op(x, _group_name(group), _ops.call_site())[0]


@torch.compiler.disable(reason=(
    "dloss.gather_all_tensors returns one tensor per rank, each of a shape "
    "known only when it runs, so it is not an op: under torch.compile it "
    "runs eagerly, breaking the graph (dloss.all_gather is an op)"))
def gather_all_tensors(result, group=None):
    """TorchMetrics' ``gather_all_tensors``: a list with every rank's
    `result`, one tensor per rank, in rank order. As in TorchMetrics, every
    dimension may differ between ranks (the number of dimensions and the
    dtype must agree), and 0-d tensors come back as 0-d tensors. No barrier;
    the shapes travel in one small collective. Autograd is exact (see
    dloss.all_gather), where TorchMetrics keeps the gradient only in the
    local slot; every rank must run backward through the result.
    """
    gathered, shapes, scalar = _gather(result, group, "gather_all_tensors",
                                       pad=True)
    if scalar:
        return [p.reshape(()) for p in torch.split(gathered, 1)]
    pieces = torch.split(gathered, [s[0] for s in shapes])
    return [p[(slice(None),) + tuple(slice(d) for d in s[1:])]
            if list(p.shape) != s else p for p, s in zip(pieces, shapes)]
