"""dloss.Graph: build a loss in Python, op by op, as the program one rank
runs (the C++ dloss::Graph builder, bound). Nothing runs until
dloss.compile(graph) is called.

    g = dloss.Graph("clip")
    image = g.input("image", torch.float32, [-1, -1], grad=True)
    text = g.input("text", torch.float32, [-1, -1], grad=True)
    scale = g.input("scale", torch.float32, [], grad=True, replicated=True)
    labels = g.arange(g.shard_offset(image, 0), g.dim(image, 0))
    logits = g.matmul(image, g.all_gather(text, 0), transpose_b=True) * scale
    per_row = g.cross_entropy(logits, labels)
    total = g.all_reduce(g.reduce(per_row, "sum", [0]), "sum")
    g.set_loss(total / g.to_tensor(g.global_size(image, 0)))
    loss = dloss.compile(g)(image=x, text=y, scale=s)

Each op is checked as it is added; a mistake raises dloss.Error naming the
op and the Python line that built it. The ops are the dloss dialect's
(docs/DlossDialect.md). Symbolic tensors support + - * / with each other and
with numbers.
"""

import torch

from . import _C
from .errors import caller_location

_DTYPES = {
    torch.float16: _C.DType.f16,
    torch.bfloat16: _C.DType.bf16,
    torch.float32: _C.DType.f32,
    torch.float64: _C.DType.f64,
    torch.int32: _C.DType.i32,
    torch.int64: _C.DType.i64,
}


def to_dtype(dtype):
    """A torch dtype (or a dloss DType) as the graph's DType."""
    if isinstance(dtype, _C.DType):
        return dtype
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        from .errors import make_error
        raise make_error(
            "dtype %r is not one dloss computes in" % (dtype,),
            "Use torch.float16, bfloat16, float32, float64, int32 or "
            "int64") from None


def _at():
    location = caller_location(3)
    file, _, line = location.rpartition(":")
    return file, int(line or 0)


class Graph:
    """A loss under construction (see the module docstring)."""

    def __init__(self, name="loss"):
        self._g = _C.Graph(name)

    @property
    def name(self):
        return self._g.name

    def input_names(self):
        """The inputs' names, in call order."""
        return self._g.input_names()

    def to_mlir(self):
        """The verified program as dloss MLIR text."""
        return self._g.to_mlir()

    def input(self, name, dtype, shape, grad=False, replicated=False):
        """A new input; -1 in `shape` for sizes known at run time (the
        batch). `grad`: differentiate the loss with respect to it.
        `replicated`: the same value on every rank (a loss parameter)."""
        return self._g.input(name, to_dtype(dtype), list(shape), grad,
                             replicated, *_at())

    # Collectives.
    def all_gather(self, x, axis=0, grad="exact"):
        """Every rank's `x` concatenated along `axis` (uneven sizes allowed).
        grad: "exact" (default), "local" (only the local slot, as
        TorchMetrics) or "none"."""
        return self._g.all_gather(x, axis, getattr(_C.GatherGrad, grad),
                                  *_at())

    def all_reduce(self, x, kind="sum"):
        """Every rank's `x` reduced element-wise (kind: sum, mean, max, min), the same on every rank."""
        return self._g.all_reduce(x, kind, *_at())

    def reduce_scatter(self, x, kind="sum", axis=0, size=None):
        """`x` summed (or reduced by `kind`) over the ranks; each rank keeps
        its own block of `axis`: `size` rows (a symbolic size; the blocks
        may be uneven, as the adjoint of an all_gather keeps g.dim(x, 0)),
        or an even share when None."""
        return self._g.reduce_scatter(x, kind, axis, size, *_at())

    def broadcast(self, x, root=0):
        """Rank `root`'s `x` on every rank."""
        return self._g.broadcast(x, root, *_at())

    def ring_shift(self, x, shift=1):
        """Sends `x` to rank r + shift and returns what rank r - shift sent."""
        return self._g.ring_shift(x, shift, *_at())

    # Rank facts (symbolic sizes).
    def rank(self):
        """This rank's number, as a symbolic size."""
        return self._g.rank(*_at())

    def world_size(self):
        """The number of ranks, as a symbolic size."""
        return self._g.world_size(*_at())

    def dim(self, x, axis):
        """This rank's size of `x` along `axis`."""
        return self._g.dim(x, axis, *_at())

    def shard_offset(self, x, axis):
        """The sum of the lower ranks' sizes along `axis`."""
        return self._g.shard_offset(x, axis, *_at())

    def global_size(self, x, axis):
        """The sum of every rank's size along `axis`."""
        return self._g.global_size(x, axis, *_at())

    # Compute.
    def constant(self, value, dtype=torch.float32):
        """A 0-d constant of `dtype`."""
        return self._g.constant(float(value), to_dtype(dtype), *_at())

    def matmul(self, a, b, transpose_a=False, transpose_b=False):
        """a @ b, with either operand transposed first."""
        return self._g.matmul(a, b, transpose_a, transpose_b, *_at())

    def select(self, cond, a, b):
        """cond ? a : b element-wise; `cond` is a 1/0 indicator of the
        result's shape (from eq), `a` or `b` may be 0-d. Each value gets the
        gradient where it was chosen and an exact zero elsewhere, so masking
        with -inf stays NaN-free."""
        return self._g.select(cond, a, b, *_at())

    def size(self, value):
        """A constant symbolic size."""
        return self._g.size(int(value), *_at())

    def add_sizes(self, a, b):
        """a + b of two symbolic sizes."""
        return self._g.size_arith("add", a, b, *_at())

    def sub_sizes(self, a, b):
        """a - b of two symbolic sizes."""
        return self._g.size_arith("sub", a, b, *_at())

    def mul_sizes(self, a, b):
        """a * b of two symbolic sizes."""
        return self._g.size_arith("mul", a, b, *_at())

    def eq(self, a, b):
        """1 where equal, 0 elsewhere (no gradient)."""
        return self._g.binary("eq", a, b, *_at())

    def neg(self, x):
        """-x, element-wise."""
        return self._g.unary("neg", x, *_at())

    def exp(self, x):
        """exp(x), element-wise."""
        return self._g.unary("exp", x, *_at())

    def log(self, x):
        """log(x), element-wise."""
        return self._g.unary("log", x, *_at())

    def softplus(self, x):
        """log(1 + exp(x)), element-wise."""
        return self._g.unary("softplus", x, *_at())

    def log_sigmoid(self, x):
        """log(sigmoid(x)), element-wise."""
        return self._g.unary("log_sigmoid", x, *_at())

    def sigmoid(self, x):
        """1 / (1 + exp(-x)), element-wise."""
        return self._g.unary("sigmoid", x, *_at())

    def cos(self, x):
        """cos(x), element-wise."""
        return self._g.unary("cos", x, *_at())

    def sin(self, x):
        """sin(x), element-wise."""
        return self._g.unary("sin", x, *_at())

    def acos(self, x):
        """acos(x), element-wise."""
        return self._g.unary("acos", x, *_at())

    def sqrt(self, x):
        """sqrt(x), element-wise."""
        return self._g.unary("sqrt", x, *_at())

    def stop_gradient(self, x):
        """`x` itself, whose gradient is zero (torch's x.detach())."""
        return self._g.unary("stop_gradient", x, *_at())

    def zeros_like(self, x):
        """Zeros of `x`'s shape and dtype."""
        return self._g.unary("zeros_like", x, *_at())

    def clamp(self, x, min=None, max=None):
        """`x` clamped to [min, max] (either bound may be None)."""
        return self._g.clamp(x, min, max, *_at())

    def cast(self, x, dtype):
        """`x` converted to `dtype`."""
        return self._g.cast(x, to_dtype(dtype), *_at())

    def to_tensor(self, size, dtype=torch.float32):
        """A symbolic size as a 0-d tensor (to divide by the global batch)."""
        return self._g.to_tensor(size, to_dtype(dtype), *_at())

    def l2_normalize(self, x, axis=1, eps=1e-12):
        """`x` divided by its L2 norm along `axis` (at least `eps`)."""
        return self._g.l2_normalize(x, axis, eps, *_at())

    def reduce(self, x, kind, axes):
        """kind: "sum", "mean" or "max" over `axes`."""
        return self._g.reduce(x, kind, list(axes), *_at())

    def logsumexp(self, x, axis):
        """log(sum(exp(x))) along `axis`, stable."""
        return self._g.logsumexp(x, axis, *_at())

    def take_along(self, x, indices, axis):
        """One element per row: x[i, indices[i]] along `axis`."""
        return self._g.take_along(x, indices, axis, *_at())

    def put_along(self, x, indices, values, axis):
        """`x` with x[i, indices[i]] replaced by values[i] along `axis`."""
        return self._g.put_along(x, indices, values, axis, *_at())

    def arange(self, start, count, dtype=torch.int64):
        """start, start + 1, ..., start + count - 1 (symbolic sizes)."""
        return self._g.arange(start, count, to_dtype(dtype), *_at())

    def cross_entropy(self, logits, targets, axis=1):
        """Per row: logsumexp(logits) - logits[target]."""
        return self._g.cross_entropy(logits, targets, axis, *_at())

    def expand(self, x, axes, like):
        """`x` broadcast to `like`'s shape, new dimensions at `axes`."""
        return self._g.expand(x, list(axes), like, *_at())

    def slice(self, x, axis, offset, size):
        """`size` entries of `x` along `axis` from `offset` (symbolic sizes)."""
        return self._g.slice(x, axis, offset, size, *_at())

    def pad(self, x, axis, low, high):
        """`x` padded with zeros along `axis`: `low` before, `high` after."""
        return self._g.pad(x, axis, low, high, *_at())

    def set_loss(self, loss, grad_mode="ddp"):
        """Ends the program: `loss` is a 0-d float tensor equal on every rank
        (after an all_reduce, say). grad_mode "ddp" or "global"."""
        mode = _C.GradMode.ddp if grad_mode == "ddp" else _C.GradMode.global_
        if grad_mode not in ("ddp", "global"):
            from .errors import make_error
            raise make_error("grad_mode must be 'ddp' or 'global', got %r" %
                             (grad_mode,), "See docs/Autodiff.md")
        self._g.set_loss(loss, mode, *_at())
