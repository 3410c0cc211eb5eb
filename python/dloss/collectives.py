"""dloss.all_gather and TorchMetrics' gather_all_tensors, with exact
autograd and uneven first dimensions."""

import torch

from .errors import caller_location, make_error
from .group import communicator

# The shape exchange: [ndim, dtype, sizes...] padded to a fixed length.
_MAX_DIMS = 16
_DTYPE_CODES = {}


def _dtype_code(dtype):
    return _DTYPE_CODES.setdefault(dtype, len(_DTYPE_CODES) + 1)


def _exchange_shapes(comm, x, location, op):
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

    def describe(row):
        return "[%s]" % ", ".join(str(v) for v in row[2:2 + row[0]])

    mine = rows[comm.rank]
    for r, row in enumerate(rows):
        if row[0] != mine[0] or row[1] != mine[1] or (
                row[0] > 0 and row[3:2 + row[0]] != mine[3:2 + mine[0]]):
            same_dtype = row[1] == mine[1]
            raise make_error(
                "the ranks' tensors disagree beyond the first dimension: "
                "rank %d has %s%s, rank %d has %s%s" %
                (comm.rank, describe(mine), "" if same_dtype else
                 " " + str(x.dtype), r, describe(row),
                 "" if same_dtype else " (another dtype)"),
                "Only the first dimension (the batch) may differ between "
                "ranks; every other dimension and the dtype must agree",
                rank=comm.rank, op=op, location=location)
    return [row[2] for row in rows] if mine[0] > 0 else None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm, sizes, location):
        ctx.comm, ctx.sizes, ctx.location = comm, sizes, location
        return comm.all_gather(x.contiguous(), 0, sizes, "dloss.all_gather",
                               location)

    @staticmethod
    def backward(ctx, grad):
        # Exact: rank r's input reached every rank's output, so its gradient
        # is the sum over ranks of their cotangents' r-th slice.
        out = ctx.comm.reduce_scatter(grad.contiguous(), "sum", 0, ctx.sizes,
                                      "dloss.all_gather (backward)",
                                      ctx.location)
        return out, None, None, None


def _gather(x, group, op):
    if not isinstance(x, torch.Tensor):
        raise make_error("%s takes a tensor, got %s" %
                         (op, type(x).__name__), "Pass a torch.Tensor")
    location = caller_location(3)
    comm = communicator(group)
    scalar = x.dim() == 0
    if scalar:
        x = x.reshape(1)
    sizes = _exchange_shapes(comm, x, location, op)
    return _AllGather.apply(x, comm, sizes, location), sizes, scalar


def all_gather(x, group=None):
    """Every rank's `x` concatenated along the first dimension, in rank
    order, on every rank. The first dimension may differ between ranks (the
    last, smaller batch); the others and the dtype must agree (a mismatch
    raises dloss.Error on every rank).

    Autograd is exact: the gradient reaches every rank's input, not only the
    local slot (unlike torch.distributed.all_gather, which drops it, and
    TorchMetrics, which keeps only the local slot). Every rank that calls
    all_gather must also run backward through it, as with
    torch.distributed.nn.all_gather.
    """
    gathered, _, scalar = _gather(x, group, "dloss.all_gather")
    return gathered


def gather_all_tensors(result, group=None):
    """TorchMetrics' ``gather_all_tensors``: a list with every rank's
    `result`, one tensor per rank, whose first dimensions may differ. No
    barrier, no padding visible to the caller; 0-d tensors come back as
    0-d tensors. Autograd is exact (see dloss.all_gather), where TorchMetrics
    keeps the gradient only in the local slot.
    """
    gathered, sizes, scalar = _gather(result, group, "gather_all_tensors")
    pieces = list(torch.split(gathered, sizes))
    if scalar:
        pieces = [p.reshape(()) for p in pieces]
    return pieces
