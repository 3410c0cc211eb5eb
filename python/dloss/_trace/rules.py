"""The op rules of a @dloss.loss trace: each torch operation, Tensor
method and Python operator on stand-ins adds its dloss ops to the graph at
the user's file:line (torch's type promotion and broadcasting), or is
refused with what is supported."""

import functools

import torch

from .locations import _code, _user_location, fail
from .materialise import (_cast_ir, _constant, _emit, _expand, _full, _mat,
                          _size_tensor)
from .values import (FLOAT_DTYPES, _Arange, _Bcast, _MaxResult, _NoIndices,
                     _Scaled, _Size, _Tensor, _Transposed, _Unsq, _Value,
                     _axis, _dim_text, _is_one, _size_op, install_rules)

# The dloss ops these rules emit (test_trace_emits keeps it true).
EMITS = frozenset({
    "dloss.add", "dloss.sub", "dloss.mul", "dloss.div", "dloss.eq",
    "dloss.select", "dloss.neg", "dloss.exp", "dloss.log", "dloss.softplus",
    "dloss.log_sigmoid", "dloss.sigmoid", "dloss.cos", "dloss.sin",
    "dloss.acos", "dloss.sqrt", "dloss.stop_gradient", "dloss.zeros_like",
    "dloss.clamp",
    "dloss.matmul", "dloss.reduce", "dloss.logsumexp", "dloss.l2_normalize",
    "dloss.cross_entropy", "dloss.take_along", "dloss.put_along",
    "dloss.pad", "dloss.slice", "dloss.all_reduce"})


def _trace_of(*values):
    for v in values:
        if isinstance(v, (_Value, _Size)):
            return v.tr
    raise AssertionError("no traced value among the operands")


def _operand(v, loc):
    """Python numbers stay numbers; torch constants become 0-d constants
    (larger ones are refused)."""
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            fail("a constant tensor of shape %s at %s" % (
                list(v.shape), _code(loc)),
                "Pass the tensor as an argument of the loss, or build it "
                "from torch.arange and dloss sizes: dloss embeds only 0-d "
                "constants (numbers)", loc)
        return v.item() if v.dtype != torch.bool else bool(v.item())
    if isinstance(v, (bool, int, float, _Value, _Size)):
        return v
    fail("%s is not a tensor or a number (at %s)" % (
        type(v).__name__, _code(loc)), "Pass tensors or numbers", loc)


def _dummy(v):
    if isinstance(v, _Size):
        return torch.empty((), dtype=torch.int64)
    if isinstance(v, (_Value, _Retyped)):
        return torch.empty((1,) * min(v.ndim, 1), dtype=v.dtype)
    return v


def _result_type(values):
    dummies = [_dummy(v) for v in values]
    if len(dummies) == 1:
        return dummies[0].dtype if isinstance(dummies[0], torch.Tensor) \
            else torch.get_default_dtype()
    dtype = torch.result_type(dummies[0], dummies[1])
    for d in dummies[2:]:
        dtype = torch.result_type(torch.empty((1,), dtype=dtype), d)
    return dtype


def _broadcast_dims(values, loc):
    ranks = [len(v.dims) for v in values if isinstance(v, _Value)]
    n = max(ranks) if ranks else 0
    dims = [1] * n
    for v in values:
        if not isinstance(v, _Value):
            continue
        for i, d in enumerate(v.dims):
            j = n - v.ndim + i
            r = dims[j]
            if _is_one(r):
                dims[j] = d
            elif _is_one(d):
                continue
            elif isinstance(r, int) and isinstance(d, int) and r != d:
                fail("shapes [%s] do not broadcast at %s" % (
                    ", ".join(map(_dim_text, v.dims)), _code(loc)),
                    "Check the operands' shapes", loc)
            elif isinstance(d, int) and not isinstance(r, int):
                dims[j] = d
    return tuple(dims)


def _tensor_operand(v, dtype, tr, loc, like=None):
    """An operand as a _Tensor of IR type `dtype` (a number as a constant,
    a size as a 0-d tensor)."""
    if isinstance(v, _Size):
        return _size_tensor(tr, v, dtype, loc)
    if not isinstance(v, _Value):
        return _constant(tr, v, dtype, loc)
    return _cast_ir(_mat(v, like), dtype, loc)


def _binary(op, a, b, loc):
    """+ - * / == != & | with torch's type promotion and broadcasting."""
    a, b = _operand(a, loc), _operand(b, loc)
    tr = _trace_of(a, b)
    if op in ("and", "or"):
        for v in (a, b):
            if isinstance(v, _Value) and v.dtype != torch.bool:
                _unsupported("bitwise & and | on non-boolean tensors", loc)
    dtype = _result_type([a, b])
    if op == "div" and dtype not in FLOAT_DTYPES:
        dtype = torch.get_default_dtype()
    # arange + offset: move the start.
    if op in ("add", "sub") and dtype == torch.int64:
        for x, y in ((a, b), (b, a)):
            if isinstance(x, _Arange) and isinstance(y, (int, _Size)) and \
                    not isinstance(y, bool) and (op == "add" or x is a):
                start = _size_op(op, x.start, y, loc)
                if start is not NotImplemented:
                    return _Arange(tr, start, x.count, x.dtype, loc)
    # A 0-d scale of a matrix: keep it apart for a matmul to pull out.
    if op == "mul" and dtype in FLOAT_DTYPES:
        for x, y, first in ((a, b, False), (b, a, True)):
            if isinstance(x, (_Tensor, _Transposed)) and x.ndim == 2 and \
                    x.dtype == dtype and (
                        isinstance(y, _Tensor) and y.ndim == 0 and
                        y.dtype == dtype or isinstance(y, (int, float)) and
                        not isinstance(y, bool)):
                s = y if isinstance(y, _Tensor) else \
                    _constant(tr, y, dtype, loc)
                return _Scaled(x, s, first, loc)
    dims = _broadcast_dims([a, b], loc)
    values = [v for v in (a, b) if isinstance(v, _Value)]
    # Views with size-1 axes of the same layout stay views.
    if all(isinstance(v, _Unsq) or (isinstance(v, _Value) and v.ndim == 0)
           or not isinstance(v, _Value) for v in (a, b)):
        views = [v for v in (a, b) if isinstance(v, _Unsq)]
        if views and all(v.ndim == views[0].ndim and
                         v.positions == views[0].positions for v in views):
            inner = _binary(op, *[v.base if isinstance(v, _Unsq) else v
                                  for v in (a, b)], loc)
            return _Unsq(inner, views[0].ndim, views[0].positions, loc)
    like = next((v for v in values if _full(v, dims)), None)
    needs = any(isinstance(v, _Value) and v.ndim and not _full(v, dims)
                for v in (a, b))
    if needs and like is None:
        return _Bcast(lambda x, y: _binary(op, x, y, loc), (a, b), dims,
                      dtype if op not in ("eq", "ne") else torch.bool, loc)
    if like is not None:
        like = _mat(like)
    if op in ("eq", "ne"):
        ir = _result_type([_Retyped(v) if isinstance(v, _Tensor) and
                           v.dtype == torch.bool else v for v in (a, b)])
        x = _tensor_operand(a, ir, tr, loc, like)
        y = _tensor_operand(b, ir, tr, loc, like)
        t = tr.g.binary("eq", x.node, y.node, *loc)
        out = _emit(tr, t, dims, torch.bool, (x, y), loc, ir=ir)
        return out if op == "eq" else _logical_not(out, loc)
    if op in ("and", "or"):
        x = _tensor_operand(a, _ir_of(a), tr, loc, like)
        y = _cast_ir(_tensor_operand(b, _ir_of(b), tr, loc, like), x.ir, loc)
        t = tr.g.binary("mul", x.node, y.node, *loc)
        both = _emit(tr, t, dims, torch.bool, (x, y), loc, ir=x.ir)
        if op == "and":
            return both
        total = tr.g.binary("add", x.node, y.node, *loc)
        s = tr.g.binary("sub", total, both.node, *loc)
        return _emit(tr, s, dims, torch.bool, (x, y), loc, ir=x.ir)
    x = _tensor_operand(a, dtype, tr, loc, like)
    y = _tensor_operand(b, dtype, tr, loc, like)
    t = tr.g.binary(op, x.node, y.node, *loc)
    return _emit(tr, t, dims, dtype, (x, y), loc)


class _Retyped:
    """A mask as its IR type, for promotion only."""

    def __init__(self, v):
        self.dtype, self.ndim = v.ir, v.ndim


def _ir_of(v):
    return v.ir if isinstance(v, _Tensor) else (
        _mat(v).ir if isinstance(v, _Value) else torch.int64)


def _logical_not(m, loc):
    if not isinstance(m, _Value) or m.dtype != torch.bool:
        _unsupported("~ on a non-boolean tensor", loc)
    if not isinstance(m, _Tensor):
        if isinstance(m, _Unsq):
            return _Unsq(_logical_not(m.base, loc), m.ndim, m.positions, loc)
        return _Bcast(lambda x: _logical_not(x, loc), (m,), m.dims,
                      torch.bool, loc)
    one = _constant(m.tr, 1, m.ir, loc)
    t = m.tr.g.binary("sub", one.node, m.node, *loc)
    return _emit(m.tr, t, m.dims, torch.bool, (m,), loc, ir=m.ir)


_UNARY = {"exp", "log", "cos", "acos", "sin", "sqrt", "sigmoid", "neg",
          "softplus", "log_sigmoid", "stop_gradient"}


def _unary(op, x, loc):
    if isinstance(x, _Unsq):
        return _Unsq(_unary(op, x.base, loc), x.ndim, x.positions, loc)
    if isinstance(x, _Bcast):
        return _Bcast(lambda v: _unary(op, v, loc), (x,), x.dims, x.dtype,
                      loc)
    x = _float(_mat(_value(x, loc)), loc)
    t = x.tr.g.unary(op, x.node, *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (x,), loc)


def _value(v, loc):
    if isinstance(v, _Value):
        return v
    if isinstance(v, _Size):
        return _size_tensor(v.tr, v, torch.int64, loc)
    fail("expected a tensor at %s, got %s" % (_code(loc), type(v).__name__),
         "Pass a tensor", loc)


def _float(x, loc):
    """Float math on an integer tensor computes in the default dtype."""
    if x.dtype in FLOAT_DTYPES:
        return x
    return _cast(x, torch.get_default_dtype(), loc)


def _pow(x, p, loc):
    if p == 2:
        return _binary("mul", x, x, loc)
    if p == 0.5:
        return _unary("sqrt", x, loc)
    if p == 1:
        return x
    _unsupported("x ** %r (only the powers 2, 1 and 0.5)" % (p,), loc)


def _clamp(x, min=None, max=None, loc=None):
    loc = loc or _user_location()
    for bound in (min, max):
        if bound is not None and not isinstance(bound, (int, float)):
            _unsupported("clamp with tensor bounds", loc)
    if min is None and max is None:
        fail("clamp at %s has neither min nor max" % _code(loc),
             "Give a bound", loc)
    if isinstance(x, _Unsq):
        return _Unsq(_clamp(x.base, min, max, loc), x.ndim, x.positions, loc)
    x = _mat(_value(x, loc))
    t = x.tr.g.clamp(x.node, None if min is None else float(min),
                     None if max is None else float(max), *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (x,), loc)


def _cast(x, dtype, loc):
    if dtype is None or dtype == x.dtype:
        return x
    if dtype == torch.bool:
        return _binary("ne", x, 0, loc)
    if isinstance(x, _Unsq):
        return _Unsq(_cast(x.base, dtype, loc), x.ndim, x.positions, loc)
    if isinstance(x, _Bcast):
        return _Bcast(lambda v: _cast(v, dtype, loc), (x,), x.dims, dtype,
                      loc)
    m = _mat(x)
    y = _cast_ir(m, dtype, loc)
    if y is m:  # a mask already in that type: now a number
        y = _emit(m.tr, m.node, m.dims, dtype, (m,), loc)
    y.dtype = dtype
    return y


def _transpose(x, loc, dim0=0, dim1=1):
    x = _value(x, loc)
    if x.ndim < 2:
        return x
    if x.ndim != 2 or {dim0 % 2, dim1 % 2} != {0, 1}:
        _unsupported("transposing a tensor of %d dims" % x.ndim, loc)
    if isinstance(x, _Transposed):
        return x.base
    if isinstance(x, _Scaled):
        return _Scaled(_transpose(x.x, loc), x.s, x.scale_first, loc)
    return _Transposed(_mat(x) if not isinstance(x, _Tensor) else x, loc)


def _matmul(a, b, loc):
    a, b = _value(_operand(a, loc), loc), _value(_operand(b, loc), loc)
    scales = []

    def split(v):
        if isinstance(v, _Scaled):
            scales.append(v.s)
            v = v.x
        if isinstance(v, _Transposed):
            return _mat(v.base), True
        v = _mat(v)
        if v.ndim != 2:
            _unsupported("@ (matmul) of a %d-dim tensor (dloss multiplies "
                         "matrices)" % v.ndim, loc)
        return v, False

    x, tx = split(a)
    y, ty = split(b)
    dtype = _result_type([x, y])
    x, y = _cast_ir(x, dtype, loc), _cast_ir(y, dtype, loc)
    t = x.tr.g.matmul(x.node, y.node, tx, ty, *loc)
    rows = x.dims[1] if tx else x.dims[0]
    cols = y.dims[0] if ty else y.dims[1]
    inner = x.dims[0] if tx else x.dims[1]
    note = None
    if (x.varying or y.varying) and isinstance(inner, _Size) and \
            inner.batch:
        # x.T @ y over the batch: this rank's addend of the global product.
        note = (loc, "{code} sums over this rank's rows only")
    out = _emit(x.tr, t, (rows, cols), dtype, (x, y), loc, note=note)
    if not scales:
        return out
    s = scales[0]
    if len(scales) == 2:
        s = _binary("mul", scales[0], scales[1], loc)
    return _Scaled(out, _cast_ir(_mat(s), dtype, loc), True, loc)


def _axes(dim, ndim, loc):
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        return tuple(sorted({_axis(d, ndim, loc) for d in dim}))
    return (_axis(dim, ndim, loc),)


def _keep(x, axes, keepdim, loc):
    if not keepdim or not axes:
        return x
    ndim = x.ndim + len(axes)
    positions = [i for i in range(ndim) if i not in axes]
    return _Unsq(x, ndim, positions, loc)


def _reduce(kind, x, dim=None, keepdim=False, loc=None, dtype=None):
    """sum/mean/max/min over `dim` (all when None)."""
    loc = loc or _user_location()
    x = _value(x, loc)
    if isinstance(x, _Unsq):
        # Reduce the base over its own axes; size-1 axes reduce to themselves.
        axes = _axes(dim, x.ndim, loc)
        inner = tuple(k for k, p in enumerate(x.positions) if p in axes)
        base = _reduce(kind, x.base, inner, False, loc, dtype) if inner \
            else x.base
        kept = [x.positions[k] for k in range(x.base.ndim) if k not in inner]
        if keepdim:
            return _Unsq(base, x.ndim, kept, loc) if kept or base.ndim else \
                _Unsq(base, x.ndim, [], loc)
        left = [i for i in range(x.ndim) if i not in axes]
        if len(left) == len(kept):
            return base
        return _Unsq(base, len(left), [left.index(p) for p in kept], loc)
    x = _mat(x)
    if dtype is not None:
        x = _cast(x, dtype, loc)
    if x.ndim == 0:
        return x
    axes = _axes(dim, x.ndim, loc)
    if kind == "mean":
        out = _mean(x, axes, loc)
    else:
        if x.dtype == torch.bool:
            x = _cast(x, torch.int64, loc)
        t = x.tr.g.reduce(x.node, kind, list(axes), *loc)
        dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
        note = None
        if x.varying and any(isinstance(x.dims[i], _Size) and
                             x.dims[i].batch for i in axes):
            verb = {"sum": "sums", "max": "takes the maximum",
                    "min": "takes the minimum"}[kind]
            note = (loc, "{code} %s over this rank's rows only" % verb)
        out = _emit(x.tr, t, dims, x.dtype, (x,), loc, note=note)
    return _keep(out, axes, keepdim, loc)


def _total(x, axes, loc):
    """The sum of `x` over `axes` and the number of elements summed. Over
    the batch (a split axis of a varying value) the sum is all-reduced and
    the count is the global one: the statistic of the global batch."""
    x = _float(x, loc)
    batch = [a for a in axes if isinstance(x.dims[a], _Size) and
             x.dims[a].batch] if x.varying else []
    dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
    tr = x.tr
    count = 1
    for a in axes:
        d = x.dims[a]
        count = _size_op("mul", count, d.glob(loc) if a in batch else d,
                         loc)
    t = tr.g.reduce(x.node, "sum", list(axes), *loc)
    if not batch:
        return _emit(tr, t, dims, x.dtype, (x,), loc), count
    t = tr.g.all_reduce(t, "sum", *loc)
    return _emit(tr, t, dims, x.dtype, (), loc, varying=False), count


def _mean(x, axes, loc):
    """A mean over the batch is the global mean (sum, all_reduce, divide by
    the global count); over other axes it is local."""
    x = _float(x, loc)
    if not x.varying or not any(isinstance(x.dims[a], _Size) and
                                x.dims[a].batch for a in axes):
        dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
        t = x.tr.g.reduce(x.node, "mean", list(axes), *loc)
        return _emit(x.tr, t, dims, x.dtype, (x,), loc)
    total, count = _total(x, axes, loc)
    return _binary("div", total, count, loc)


def _var(x, dim=None, unbiased=None, keepdim=False, correction=None,
         loc=None, std=False, mean=None):
    """var/std over `dim`: over the batch, the global batch's (two passes:
    the global mean, then the global sum of squared deviations), with
    Bessel's correction unless `unbiased=False` or `correction=0`."""
    loc = loc or _user_location()
    if isinstance(dim, bool) and unbiased is None:  # x.var(False)
        dim, unbiased = None, dim
    if correction is None:
        correction = 0 if unbiased is False else 1
    if isinstance(correction, float) and correction.is_integer():
        correction = int(correction)
    if not isinstance(correction, int) or isinstance(correction, bool):
        _unsupported("%s with correction=%r (an integer)" % (
            "std" if std else "var", correction), loc)
    x = _float(_mat(_value(x, loc)), loc)
    axes = _axes(dim, x.ndim, loc)
    if mean is None:  # `mean`: x's over `axes`, kept, when known already
        mean = _keep(_mean(x, axes, loc), axes, True, loc)
    dev = _binary("sub", x, mean, loc)
    total, count = _total(_mat(_binary("mul", dev, dev, loc)), axes, loc)
    out = _binary("div", total, _size_op("sub", count, correction, loc), loc)
    if std:
        out = _unary("sqrt", out, loc)
    return _keep(out, axes, keepdim, loc)


def _batch_norm(input, running_mean, running_var, weight=None, bias=None,
                training=False, momentum=0.1, eps=1e-5, loc=None):
    """F.batch_norm: in training, with the global batch's mean and biased
    variance (SyncBatchNorm's statistics; its backward comes from autodiff);
    otherwise with the given running statistics."""
    loc = loc or _user_location()
    x = _float(_mat(_value(input, loc)), loc)
    if x.ndim < 2:
        _unsupported("F.batch_norm of a %d-dim tensor" % x.ndim, loc)
    axes = tuple(a for a in range(x.ndim) if a != 1)

    def per_channel(v):  # [C] against [N, C, ...]: channel on axis 1
        if v is None or isinstance(v, (int, float)):
            return v
        v = _value(v, loc)
        return _Unsq(v, x.ndim, [1], loc) if v.ndim == 1 and x.ndim > 1 \
            else v
    if training:
        if running_mean is not None or running_var is not None:
            fail("F.batch_norm at %s updates running statistics in "
                 "training: state a @dloss.loss does not carry" % _code(loc),
                 "Pass running_mean=None and running_var=None (the "
                 "batch's statistics, as lightly's Barlow Twins does), "
                 "or keep the BatchNorm layer in the model", loc)
        mean = _keep(_mean(x, axes, loc), axes, True, loc)
        var = _var(x, axes, correction=0, keepdim=True, loc=loc, mean=mean)
    else:
        if running_mean is None or running_var is None:
            fail("F.batch_norm at %s has training=False and no running "
                 "statistics" % _code(loc),
                 "Pass training=True for the batch's statistics", loc)
        mean, var = per_channel(running_mean), per_channel(running_var)
    out = _binary("div", _binary("sub", x, mean, loc),
                  _unary("sqrt", _binary("add", var, eps, loc), loc), loc)
    if weight is not None:
        out = _binary("mul", out, per_channel(weight), loc)
    if bias is not None:
        out = _binary("add", out, per_channel(bias), loc)
    return out


def _mse_loss(input, target, size_average=None, reduce=None,
              reduction="mean", weight=None, loc=None):
    """F.mse_loss; its mean over the batch is the global mean."""
    loc = loc or _user_location()
    if size_average is not None or reduce is not None or weight is not None:
        _unsupported("F.mse_loss with size_average, reduce or weight", loc)
    d = _binary("sub", input, target, loc)
    sq = _binary("mul", d, d, loc)
    if reduction == "none":
        return sq
    if reduction not in ("mean", "sum"):
        _unsupported("F.mse_loss with reduction=%r" % (reduction,), loc)
    return _reduce(reduction, sq, None, False, loc)


def _diagonal(x, offset=0, dim1=0, dim2=1, loc=None):
    """The main diagonal of a square matrix: row i's element i
    (dloss.take_along), with no n x n mask."""
    loc = loc or _user_location()
    x = _mat(_value(x, loc))
    if x.ndim != 2 or offset != 0 or {dim1 % 2, dim2 % 2} != {0, 1}:
        _unsupported("diagonal other than the main one of a matrix", loc)
    n, m = x.dims
    if not (n is m or isinstance(n, int) and n == m):
        _unsupported("diagonal of a matrix not known to be square", loc)
    rows = _Arange(x.tr, 0, n, torch.int64, loc)
    return _squeeze(_gather(x, 1, _unsqueeze(rows, 1, loc), loc=loc), 1,
                    loc)


def _eye(n, m=None, dtype=None, loc=None, tr=None, **kwargs):
    """torch.eye(n): the mask rows == cols, in `dtype` (float by
    default)."""
    from .values import _current_trace
    loc = loc or _user_location()
    tr = tr or _current_trace()
    rows = _Arange(tr, 0, n, torch.int64, loc)
    cols = rows if m is None else _Arange(tr, 0, m, torch.int64, loc)
    mask = _binary("eq", _unsqueeze(rows, 1, loc), _unsqueeze(cols, 0, loc),
                   loc)
    return _cast(mask, dtype or torch.get_default_dtype(), loc)


def _logsumexp(x, dim, keepdim=False, loc=None):
    loc = loc or _user_location()
    x = _float(_mat(_value(x, loc)), loc)
    (axis,) = _axes(dim if not isinstance(dim, (list, tuple)) or
                    len(dim) == 1 else _unsupported(
                        "logsumexp over several dims", loc), x.ndim, loc)
    t = x.tr.g.logsumexp(x.node, axis, *loc)
    dims = tuple(d for i, d in enumerate(x.dims) if i != axis)
    note = None
    if x.varying and isinstance(x.dims[axis], _Size) and x.dims[axis].batch:
        note = (loc, "{code} takes a logsumexp over this rank's rows "
                "only")
    out = _emit(x.tr, t, dims, x.dtype, (x,), loc, note=note)
    return _keep(out, (axis,), keepdim, loc)


def _log_softmax(x, dim=None, _stacklevel=3, dtype=None, loc=None):
    loc = loc or _user_location()
    x = _mat(_value(x, loc))
    x = _float(x, loc) if dtype is None else _cast(x, dtype, loc)
    if dim is None:
        fail("log_softmax at %s needs dim=" % _code(loc), "Pass dim", loc)
    lse = _logsumexp(x, dim, True, loc)
    return _binary("sub", x, lse, loc)


def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None, loc=None):
    loc = loc or _user_location()
    if p != 2:
        _unsupported("F.normalize with p=%r (only p=2)" % (p,), loc)
    x = _float(_mat(_value(x, loc)), loc)
    axis = _axis(dim, x.ndim, loc)
    t = x.tr.g.l2_normalize(x.node, axis, float(eps), *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (x,), loc)


def _index_operand(v, loc, what):
    v = _value(v, loc)
    if isinstance(v, _Value) and v.dtype not in (torch.int32, torch.int64):
        fail("%s must be an integer tensor (at %s), got %s" % (
            what, _code(loc), v.dtype), "Use integer class indices", loc)
    return _mat(v)


def _cross_entropy(input, target, weight=None, size_average=None,
                   ignore_index=-100, reduce=None, reduction="mean",
                   label_smoothing=0.0, loc=None):
    loc = loc or _user_location()
    if weight is not None or size_average is not None or \
            reduce is not None or label_smoothing:
        _unsupported("F.cross_entropy with weight, label_smoothing or the "
                     "old size_average/reduce arguments", loc)
    logits = _float(_mat(_value(input, loc)), loc)
    if logits.ndim != 2:
        _unsupported("F.cross_entropy of a %d-dim input (dloss takes "
                     "[rows, classes] logits)" % logits.ndim, loc)
    labels = _index_operand(target, loc, "the target")
    if labels.ndim != 1:
        _unsupported("F.cross_entropy with class probabilities as targets "
                     "(dloss takes class indices)", loc)
    t = logits.tr.g.cross_entropy(logits.node, labels.node, 1, *loc)
    rows = _emit(logits.tr, t, (logits.dims[0],), logits.dtype,
                 (logits, labels), loc)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return _reduce("sum", rows, None, False, loc)
    if reduction == "mean":
        return _reduce("mean", rows, None, False, loc)
    fail("unknown reduction %r at %s" % (reduction, _code(loc)),
         "Use 'mean', 'sum' or 'none'", loc)


def _row_labels(index, x, axis, loc, refusal):
    """The labels of a gather/scatter `index` that holds one column per row
    of `x` along `axis` (labels.unsqueeze(axis)); else refused with
    `refusal`."""
    if not (isinstance(index, _Unsq) and index.ndim == x.ndim and
            len(index.positions) == x.ndim - 1 and
            axis not in index.positions):
        _unsupported(refusal, loc)
    return _index_operand(index.base, loc, "the index")


def _gather(x, dim, index, sparse_grad=False, loc=None):
    loc = loc or _user_location()
    x = _mat(_value(x, loc))
    axis = _axis(dim, x.ndim, loc)
    labels = _row_labels(index, x, axis, loc,
                         "gather with an index that is not one column per "
                         "row (write x.gather(%d, labels.unsqueeze(%d)))" %
                         (axis, axis))
    t = x.tr.g.take_along(x.node, labels.node, axis, *loc)
    picked = _emit(x.tr, t, labels.dims, x.dtype, (x, labels), loc)
    return _Unsq(picked, x.ndim, index.positions, loc)


def _scatter(x, dim, index, src=None, value=None, reduce=None, loc=None):
    loc = loc or _user_location()
    if reduce is not None:
        _unsupported("scatter with reduce=", loc)
    x = _mat(_value(x, loc))
    axis = _axis(dim, x.ndim, loc)
    src = value if src is None else src
    labels = _row_labels(index, x, axis, loc,
                         "scatter with an index that is not one column per "
                         "row (write x.scatter(%d, labels.unsqueeze(%d), "
                         "values))" % (axis, axis))
    if isinstance(src, _Unsq) and src.positions == index.positions:
        values = _cast_ir(_mat(src.base), x.ir, loc)
    elif isinstance(src, (int, float)) or (
            isinstance(src, _Value) and src.ndim == 0):
        values = _cast_ir(_mat(_like(_cast(labels, x.dtype, loc), src, loc)),
                          x.ir, loc)
    else:
        _unsupported("scatter with values that are not one per row", loc)
    t = x.tr.g.put_along(x.node, labels.node, values.node, axis, *loc)
    return _emit(x.tr, t, x.dims, x.dtype, (x, labels, values), loc)


def _where(condition, input=None, other=None, loc=None):
    loc = loc or _user_location()
    if input is None or other is None:
        _unsupported("torch.where(condition) (the indices form)", loc)
    cond = _operand(condition, loc)
    a, b = _operand(input, loc), _operand(other, loc)
    if not isinstance(cond, _Value) or cond.dtype != torch.bool:
        fail("torch.where's condition must be a boolean mask (at %s)" %
             _code(loc), "Compare with == to make one", loc)
    dtype = _result_type([a, b])
    dims = _broadcast_dims([cond, a, b], loc)
    like = next((v for v in (a, b, cond) if _full(v, dims)), None)
    if like is None:
        return _Bcast(lambda c, x, y: _where(c, x, y, loc), (cond, a, b),
                      dims, dtype, loc)
    like = _mat(like)
    tr = like.tr
    c = _mat(cond, like)
    if c.ndim == 0 and like.ndim:
        c = _expand(c, tuple(range(like.ndim)), like, loc)
    x = _tensor_operand(a, dtype, tr, loc, like)
    y = _tensor_operand(b, dtype, tr, loc, like)
    t = tr.g.select(c.node, x.node, y.node, *loc)
    return _emit(tr, t, dims, dtype, (c, x, y), loc)


def _masked_fill(x, mask, value, loc=None):
    return _where(mask, value, x, loc or _user_location())


def _cat(tensors, dim=0, loc=None, out=None):
    loc = loc or _user_location()
    parts = [_mat(_value(_operand(t, loc), loc)) for t in tensors]
    if not parts:
        fail("torch.cat of nothing at %s" % _code(loc), "", loc)
    if len(parts) == 1:
        return parts[0]
    ndim = parts[0].ndim
    axis = _axis(dim, ndim, loc)
    dtype = _result_type(parts)
    parts = [_cast_ir(p, dtype, loc) for p in parts]
    tr = parts[0].tr
    sizes = [p.dims[axis] for p in parts]
    total = functools.reduce(lambda u, v: _size_op("add", u, v, loc), sizes)
    result = None
    before = 0
    for i, p in enumerate(parts):
        after = functools.reduce(lambda u, v: _size_op("add", u, v, loc),
                                 sizes[i + 1:], 0)
        t = tr.g.pad(p.node, axis, tr.size(before, loc), tr.size(after, loc),
                     *loc)
        result = t if result is None else tr.g.binary("add", result, t, *loc)
        before = _size_op("add", before, sizes[i], loc)
    dims = list(parts[0].dims)
    dims[axis] = total
    return _emit(tr, result, tuple(dims), dtype, parts, loc)


def _unsqueeze(x, dim, loc):
    x = _value(x, loc)
    axis = _axis(dim, x.ndim + 1, loc)
    if isinstance(x, _Unsq):
        positions = [p + (p >= axis) for p in x.positions]
        return _Unsq(x.base, x.ndim + 1, positions, loc)
    if isinstance(x, _Bcast):
        _unsupported("unsqueeze of a broadcast value", loc)
    return _Unsq(x, x.ndim + 1, [i + (i >= axis) for i in range(x.ndim)],
                 loc)


def _squeeze(x, dim=None, loc=None):
    loc = loc or _user_location()
    x = _value(x, loc)
    if not isinstance(x, _Unsq):
        if dim is None or not _is_one(x.dims[_axis(dim, x.ndim, loc)]):
            return x
        _unsupported("squeezing a real size-1 dimension", loc)
    inserted = [i for i in range(x.ndim) if i not in x.positions]
    drop = inserted if dim is None else [_axis(dim, x.ndim, loc)]
    drop = [d for d in drop if d in inserted]
    left = [i for i in range(x.ndim) if i not in drop]
    if len(left) == x.base.ndim:
        return x.base
    return _Unsq(x.base, len(left), [left.index(p) for p in x.positions],
                 loc)


def _reshape(x, *shape, loc=None):
    """view/reshape that only adds or removes size-1 axes of a 1-d tensor
    (labels.view(-1, 1), column.view(-1))."""
    loc = loc or _user_location()
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = tuple(shape[0])
    x = _value(x, loc)
    base = x.base if isinstance(x, _Unsq) else x
    if base.ndim == 1:
        rest = [i for i, d in enumerate(shape) if not _is_one(d)]
        if len(rest) == 1:
            d = shape[rest[0]]
            if (isinstance(d, int) and d == -1) or d is base.dims[0] or (
                    isinstance(d, int) and isinstance(base.dims[0], int) and
                    d == base.dims[0]):
                if len(shape) == 1:
                    return base
                return _Unsq(base, len(shape), rest, loc)
    _unsupported("view/reshape to %s (dloss only adds or removes size-1 "
                 "axes of a 1-d tensor)" % (
                     "[%s]" % ", ".join(map(_dim_text, shape))), loc)


def _getitem(x, index, loc):
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        _unsupported("... in an index", loc)
    # Only None (new axes), full slices and 0 on a size-1 axis.
    result = x
    axis = 0
    for i in index:
        if i is None:
            result = _unsqueeze(result, axis, loc)
            axis += 1
        elif isinstance(i, slice) and i.start is None and i.stop is None \
                and i.step is None:
            axis += 1
        elif isinstance(i, slice):
            result = _slice(result, axis, i, loc)
            axis += 1
        elif isinstance(i, int) and not isinstance(i, bool) and \
                isinstance(result, _Unsq) and i in (0, -1) and \
                axis not in result.positions:
            result = _squeeze(result, axis, loc)
        else:
            _unsupported("indexing with %r (dloss supports [:, None], "
                         "slices and gather)" % (i,), loc)
    return result


def _slice(x, axis, s, loc):
    if s.step not in (None, 1):
        _unsupported("a slice with a step", loc)
    x = _mat(_value(x, loc))
    start = 0 if s.start is None else s.start
    stop = x.dims[axis] if s.stop is None else s.stop
    for v in (start, stop):
        if isinstance(v, int) and v < 0:
            _unsupported("negative slice bounds", loc)
    count = _size_op("sub", stop, start, loc)
    tr = x.tr
    t = tr.g.slice(x.node, axis, tr.size(start, loc), tr.size(count, loc),
                   *loc)
    dims = list(x.dims)
    dims[axis] = count
    return _emit(tr, t, tuple(dims), x.dtype, (x, start, stop), loc)


def _like(x, fill, loc, dtype=None):
    x = _mat(_value(x, loc))
    t = x.tr.g.unary("zeros_like", x.node, *loc)
    zeros = _emit(x.tr, t, x.dims, x.dtype, (x,), loc, ir=x.ir)
    out = zeros if fill == 0 else _binary("add", zeros, fill, loc)
    return _cast(out, dtype, loc) if dtype is not None else out


def _new_full(x, size, fill, dtype=None, loc=None):
    """x.new_full/new_ones/new_zeros of a 1-d size (x's dtype unless
    `dtype`): `fill` everywhere."""
    loc = loc or _user_location()
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    if len(size) != 1:
        _unsupported("new_full/new_ones/new_zeros of %d dims (dloss makes "
                     "1-d ones)" % len(size), loc)
    from .values import _current_trace
    count = _Arange(_current_trace(), 0, size[0], torch.int64, loc)
    return _like(count, fill, loc, dtype or _value(x, loc).dtype)


def _max_like(kind):
    def run(x, dim=None, keepdim=False, *rest, loc=None):
        loc = loc or _user_location()
        if isinstance(dim, _Value):  # torch.max(a, b): element-wise
            _unsupported("element-wise torch.%s(a, b)" % kind, loc)
        values = _reduce(kind, x, dim, keepdim, loc)
        if dim is None:
            return values
        return _MaxResult((values, _NoIndices(loc)))
    return run


def _amax(kind):
    def run(x, dim=None, keepdim=False, loc=None):
        return _reduce(kind, x, dim if dim != () else None, keepdim,
                       loc or _user_location())
    return run


def _to(x, *args, **kwargs):
    loc = _user_location()
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
    return _cast(x, dtype, loc)


def _detach(x):
    """x.detach(): the value, with no gradient (dloss.stop_gradient). An
    integer tensor has none to stop."""
    loc = _user_location()
    if _value(x, loc).dtype not in FLOAT_DTYPES:
        return x
    return _unary("stop_gradient", x, loc)


def _with_loc(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        kwargs.setdefault("loc", _user_location())
        return fn(*args, **kwargs)
    return run


def _unary_fn(op):
    def run(x, *args, **kwargs):
        loc = _user_location()
        if op == "softplus" and (kwargs.get("beta", args[0] if args else 1)
                                 != 1):
            _unsupported("F.softplus with beta != 1", loc)
        return _unary(op, x, loc)
    return run


def _binary_fn(op):
    def run(a, b, *args, **kwargs):
        loc = _user_location()
        if args or set(kwargs) - {"out"}:
            _unsupported("torch.%s with extra arguments" % op, loc)
        return _binary(op, a, b, loc)
    return run


def _matmul_fn(a, b, *args, **kwargs):
    return _matmul(a, b, _user_location())


def _transpose_fn(x, dim0=0, dim1=1):
    return _transpose(x, _user_location(), dim0, dim1)


def _sum_fn(x, dim=None, keepdim=False, dtype=None, **kwargs):
    return _reduce("sum", x, dim, keepdim, _user_location(), dtype)


def _mean_fn(x, dim=None, keepdim=False, dtype=None, **kwargs):
    return _reduce("mean", x, dim, keepdim, _user_location(), dtype)


def _square(x):
    return _binary("mul", x, x, _user_location())


def _pow_fn(x, p):
    return _pow(x, p, _user_location())


def _identity(x, *args, **kwargs):
    return x


def _cast_fn(dtype):
    def run(x, *args, **kwargs):
        return _cast(x, dtype, _user_location())
    return run


def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    loc = _user_location()
    return _unary("exp", _log_softmax(x, dim, dtype=dtype, loc=loc), loc)


# Tensor methods and torch functions, by name.
_COMMON = {
    "exp": _unary_fn("exp"), "log": _unary_fn("log"),
    "cos": _unary_fn("cos"), "acos": _unary_fn("acos"),
    "arccos": _unary_fn("acos"), "sin": _unary_fn("sin"),
    "sqrt": _unary_fn("sqrt"), "sigmoid": _unary_fn("sigmoid"),
    "neg": _unary_fn("neg"), "negative": _unary_fn("neg"),
    "softplus": _unary_fn("softplus"), "log_sigmoid": _unary_fn(
        "log_sigmoid"), "logsigmoid": _unary_fn("log_sigmoid"),
    "logsumexp": _with_loc(_logsumexp), "log_softmax": _with_loc(
        _log_softmax), "softmax": _softmax,
    "clamp": _with_loc(_clamp), "clip": _with_loc(_clamp),
    "clamp_min": lambda x, min: _clamp(x, min=min),
    "clamp_max": lambda x, max: _clamp(x, max=max),
    "sum": _sum_fn, "mean": _mean_fn,
    "var": _with_loc(_var),
    "std": _with_loc(functools.partial(_var, std=True)),
    "diagonal": _with_loc(_diagonal),
    "relu": lambda x, inplace=False: _clamp(x, min=0),
    "max": _max_like("max"), "min": _max_like("min"),
    "amax": _amax("max"), "amin": _amax("min"),
    "matmul": _matmul_fn, "mm": _matmul_fn,
    "t": _transpose_fn, "transpose": _transpose_fn,
    "gather": _with_loc(_gather), "scatter": _with_loc(_scatter),
    "masked_fill": _with_loc(_masked_fill), "where": _with_loc(_where),
    "square": _square, "pow": _pow_fn,
    "add": _binary_fn("add"), "sub": _binary_fn("sub"),
    "subtract": _binary_fn("sub"), "mul": _binary_fn("mul"),
    "multiply": _binary_fn("mul"), "div": _binary_fn("div"),
    "divide": _binary_fn("div"), "true_divide": _binary_fn("div"),
    "eq": _binary_fn("eq"), "ne": _binary_fn("ne"),
    "unsqueeze": lambda x, dim: _unsqueeze(x, dim, _user_location()),
    "squeeze": lambda x, dim=None: _squeeze(x, dim, _user_location()),
    "flatten": lambda x, *a, **k: _reshape(x, -1),
    "reshape": lambda x, *shape: _reshape(x, *shape),
    "zeros_like": lambda x, dtype=None, **k: _like(x, 0, _user_location(),
                                                   dtype),
    "ones_like": lambda x, dtype=None, **k: _like(x, 1, _user_location(),
                                                  dtype),
    "full_like": lambda x, fill, dtype=None, **k: _like(
        x, fill, _user_location(), dtype),
}

_METHODS = dict(_COMMON, **{
    "view": lambda x, *shape: _reshape(x, *shape),
    "float": _cast_fn(torch.float32), "double": _cast_fn(torch.float64),
    "half": _cast_fn(torch.float16), "bfloat16": _cast_fn(torch.bfloat16),
    "long": _cast_fn(torch.int64), "int": _cast_fn(torch.int32),
    "bool": _cast_fn(torch.bool), "to": _to,
    "type": lambda x, dtype=None, **k: _cast(x, dtype, _user_location()),
    "contiguous": _identity, "clone": _identity, "cpu": _identity,
    "cuda": _identity, "detach": _detach,
    "new_ones": lambda x, *size, dtype=None, **k: _new_full(x, size, 1,
                                                            dtype),
    "new_zeros": lambda x, *size, dtype=None, **k: _new_full(x, size, 0,
                                                             dtype),
    "new_full": lambda x, size, fill_value, dtype=None, **k: _new_full(
        x, (size,), fill_value, dtype),
})

_TORCH = dict(_COMMON, **{
    "cross_entropy": _with_loc(_cross_entropy),
    "normalize": _with_loc(_normalize),
    "cat": _with_loc(_cat), "concat": _with_loc(_cat),
    "concatenate": _with_loc(_cat),
    "detach": _detach,
    "batch_norm": _with_loc(_batch_norm),
    "mse_loss": _with_loc(_mse_loss),
})


def _call_torch(func, args, kwargs):
    name = getattr(func, "__name__", str(func))
    handler = _TORCH.get(name)
    if handler is None:
        module = getattr(func, "__module__", "") or ""
        prefix = "F." if module.startswith(("torch.nn", "torch._C._nn")) \
            else "torch."
        _unsupported(prefix + name, _user_location())
    return handler(*args, **kwargs)


def supported_ops():
    """The torch operations @dloss.loss records, by name."""
    methods = sorted(set(_METHODS) | {"T", "shape", "size", "dim"})
    return {"torch": sorted(set(_TORCH) | {"arange", "eye"}),
            "Tensor": methods,
            "operators": ["+", "-", "*", "/", "@", "**", "==", "!=", "&",
                          "|", "~", "x[:, None]", "x[a:b]"]}


def _unsupported(what, loc):
    ops = supported_ops()
    fail("%s at %s is not supported inside @dloss.loss" % (what, _code(loc)),
         "Supported: torch/F functions %s; Tensor methods %s; operators "
         "%s; and dloss.all_gather, all_reduce, shard_offset, global_size, "
         "world_size, rank" % (", ".join(ops["torch"]),
                                ", ".join(ops["Tensor"]),
                                " ".join(ops["operators"])), loc)


install_rules(binary=_binary, unary=_unary, matmul=_matmul, power=_pow,
              logical_not=_logical_not, getitem=_getitem,
              transpose=_transpose, call_torch=_call_torch,
              methods=_METHODS, unsupported=_unsupported)
