"""Materialising stand-ins as graph tensors: a form kept apart (a
transpose, a scale, an arange, size-1 axes, a pending broadcast) is built
when its use needs a tensor."""

import torch

from ..graph import to_dtype
from .locations import _code, fail
from .values import (_Arange, _Bcast, _Scaled, _Size, _Tensor, _Transposed,
                     _Unsq, _Value, _dim_text, _is_one)

# The dloss ops these rules emit (test_trace_emits keeps it true).
EMITS = frozenset({"dloss.arange", "dloss.cast", "dloss.expand", "dloss.mul"})


def _emit(tr, t, dims, dtype, like, loc, ir=None, note=None, varying=None):
    """A new _Tensor; varying-ness and its note follow the operands in
    `like` unless given."""
    if not torch.is_grad_enabled():
        # The function runs under enable_grad (record.py): the user's own
        # block turned it off, and its values would still carry gradients.
        fail("torch.no_grad() (or inference_mode) at %s is not supported "
             "inside @dloss.loss: the values computed there would still "
             "pass gradients" % _code(loc),
             "Compute them outside the block and write .detach() on what "
             "must carry no gradient (dloss.stop_gradient)", loc)
    vs = [v for v in like if isinstance(v, (_Value, _Size))]
    if varying is None:
        varying = any(v.varying for v in vs)
    if note is None:
        note = next((getattr(v, "note", None) for v in vs
                     if v.varying and getattr(v, "note", None)), None)
        if note is None and varying:
            note = (loc, "{code} uses this rank's sizes")
    return _Tensor(tr, t, dims, dtype, varying, note, loc, ir)


def _full(v, dims):
    """`v` has all of `dims` (no broadcasting needed to reach them)."""
    if not isinstance(v, (_Tensor, _Transposed, _Scaled, _Arange)):
        return False
    return len(v.dims) == len(dims) and not any(
        _is_one(d) and not _is_one(r) for d, r in zip(v.dims, dims))


def _mat(v, like=None):
    """`v` as a _Tensor; broadcast to `like`'s shape when `like` is given
    and `v` is neither 0-d nor of that shape already."""
    if isinstance(v, _Tensor):
        if like is None or v.ndim == 0 or (
                v.ndim == like.ndim and not any(
                    _is_one(d) and not _is_one(r)
                    for d, r in zip(v.dims, like.dims))):
            return v
        # Broadcasting aligns trailing axes, as in torch: a [d] vector
        # against [n, d] is a row, repeated along the new leading axis. A
        # size-1 axis of v's own (a [1, d] tensor) is dropped first (a sum
        # over one element) and expanded as a new one.
        shift = like.ndim - v.ndim
        ones = [i for i, d in enumerate(v.dims)
                if _is_one(d) and not _is_one(like.dims[shift + i])]
        if ones:
            t = v.tr.g.reduce(v.node, "sum", ones, *v.loc)
            v = _emit(v.tr, t, tuple(d for i, d in enumerate(v.dims)
                                     if i not in ones), v.dtype, (v,),
                      v.loc, ir=v.ir)
        axes = tuple(range(shift)) + tuple(shift + i for i in ones)
        return _expand(v, axes, like, v.loc)
    if isinstance(v, _Transposed):
        if v.ndim < 2:
            return _mat(v.base, like)
        fail("x.T at %s is used other than as an operand of @ (matmul)" %
             _code(v.loc),
             "Use a transpose only as an operand of a matrix product "
             "(x @ y.T), whose flags absorb it: dloss has no transpose op",
             v.loc)
    if isinstance(v, _Scaled):
        if v.made is None:
            x, s = _mat(v.x), _mat(v.s)
            a, b = (s, x) if v.scale_first else (x, s)
            v.made = _emit(v.tr, v.tr.g.binary("mul", a.node, b.node, *v.loc),
                           x.dims, x.dtype, (x, s), v.loc)
        return _mat(v.made, like)
    if isinstance(v, _Arange):
        if v.made is None:
            tr = v.tr
            key = v.key()
            v.made = tr.hoisted.get(key) if key else None
            if v.made is None:
                t = tr.g.arange(tr.size(v.start, v.loc),
                                tr.size(v.count, v.loc), to_dtype(v.dtype),
                                *v.loc)
                v.made = _emit(tr, t, (v.count,), v.dtype, (), v.loc,
                               varying=v.varying, note=v.note)
                if key:
                    tr.aranges.append(v)
        return _mat(v.made, like)
    if isinstance(v, _Unsq):
        if like is None:
            _broadcast_error(v)
        shift = like.ndim - v.ndim
        base = _mat(v.base)
        kept = [p + shift for p in v.positions]
        axes = tuple(i for i in range(like.ndim) if i not in kept)
        return _expand(base, axes, like, v.loc)
    if isinstance(v, _Bcast):
        if like is None:
            _broadcast_error(v)
        return v.fn(*[_mat(a, like) if isinstance(a, _Value) else a
                      for a in v.args])
    raise AssertionError("cannot materialise %r" % (v,))


def _broadcast_error(v):
    fail("the value made at %s broadcasts size-1 axes (to shape [%s]), "
         "and no tensor of its full shape is there to build it next to" % (
              _code(v.loc), ", ".join(map(_dim_text, v.dims))),
         "Use it in arithmetic or torch.where with a tensor of the full "
         "shape, next to which dloss builds the broadcast (for example "
         "logits.masked_fill(rows[:, None] == cols[None, :], -inf)), or "
         "reduce it with .squeeze()/.sum()", v.loc)


def _expand(x, axes, like, loc):
    like = _mat(like)
    if not axes:
        return x
    t = x.tr.g.expand(x.node, list(axes), like.node, *loc)
    return _emit(x.tr, t, like.dims, x.dtype, (x,), loc, ir=x.ir)


def _cast_ir(x, dtype, loc):
    """`x` (a _Tensor) with IR element type `dtype`."""
    if x.ir == dtype:
        return x
    t = x.tr.g.cast(x.node, to_dtype(dtype), *loc)
    return _emit(x.tr, t, x.dims, dtype, (x,), loc)


def _constant(tr, value, dtype, loc):
    t = tr.g.constant(float(value), to_dtype(dtype), *loc)
    return _emit(tr, t, (), dtype, (), loc, varying=False)


def _size_tensor(tr, size, dtype, loc):
    """A size as a 0-d tensor of `dtype`."""
    if isinstance(size, int):
        return _constant(tr, size, dtype, loc)
    t = tr.g.to_tensor(tr.size(size, loc), to_dtype(dtype), *loc)
    return _emit(tr, t, (), dtype, (size,), loc,
                 note=(size.loc, "{code} uses this rank's sizes")
                 if size.varying else None)
