"""@dloss.loss: a per-rank loss written in plain PyTorch, recorded and
compiled like the IR.

    @dloss.loss
    def clip(image, text, scale):
        image_all, text_all = dloss.all_gather(image), dloss.all_gather(text)
        labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
        return (F.cross_entropy(scale * image @ text_all.T, labels) +
                F.cross_entropy(scale * text @ image_all.T, labels)) / 2

    loss = clip(image, text, scale)      # on every rank; the global loss
    loss.backward()                      # exact gradients (ddp contract)

How it works. At the first call with a given signature (the tensors' dtypes,
ranks and fixed sizes, the other arguments' values) the function runs once
on stand-in tensors: every torch operation it makes adds the matching dloss
op to a dloss.Graph, located at the user's own file:line, so that every
error (here, in the compiler, at run time) points at the user's code. The
graph then goes through dloss.compile's pipeline (collective checks,
fusion, autodiff, lowering), and calls run the compiled plan with autograd.

What the function sees. Each tensor argument is this rank's shard: its first
dimension is the rank's batch (it may differ between ranks), unless the
argument is replicated (the same on every rank: 0-d tensors such as a logit
scale, and arguments annotated ``dloss.Replicated``). Float arguments are
differentiated. ``dloss.Input(...)`` annotations override any of this.

Semantics, beyond torch's:

- a mean over the batch (``.mean()``, ``F.cross_entropy``'s default
  reduction) is the mean over the global batch: sum on each rank,
  ``all_reduce``, divide by the global count. Pasted single-device code thus
  stays exact for uneven batches. Sums, maxima and logsumexps stay per rank:
  combine them with ``dloss.all_reduce``;
- ``dloss.all_gather``, ``dloss.all_reduce``, ``dloss.shard_offset``,
  ``dloss.global_size``, ``dloss.world_size`` and ``dloss.rank`` are the
  communication and the rank facts;
- the loss must be the same on every rank, and no Python control flow may
  depend on a tensor or a run-time size (ranks would run different
  programs). ``torch.distributed`` is refused inside the function.
"""

import functools
import inspect
import os

import torch

from . import _C
from .errors import make_error
from .graph import to_dtype
from .trace_ops import (_FLOAT, _PACKAGE_DIR, _TORCH_DIR, _Arange, _Size,
                        _Tensor, _Trace, _Value, _axis, _code, _dim_text,
                        _emit, _fail, _mat, _size_op, _size_tensor, _state,
                        _text, _trace, _unsupported, _user_location)


# ---------------------------------------------------------------------------
# torch.distributed and factories, refused while tracing.
# ---------------------------------------------------------------------------

def _refuse(what, hint):
    def refused(*args, **kwargs):
        loc = _user_location()
        _fail("%s at %s inside a @dloss.loss function" % (what, _code(loc)),
              hint, loc, op=what)
    return refused


_GATHER_HINT = ("torch.distributed.all_gather carries no gradient and needs "
                "equal sizes on every rank. Write `x_all = "
                "dloss.all_gather(x)`: exact gradients, uneven batches")
_RANK_HINT = ("Labels computed as arange(n) + n * rank are wrong when ranks "
              "hold different batch sizes. Use `torch.arange(x.shape[0]) + "
              "dloss.shard_offset(x)` (the global index of this rank's "
              "rows), or dloss.rank() for the rank itself")
_DISTRIBUTED = {
    "all_gather": ("torch.distributed.all_gather", _GATHER_HINT),
    "all_gather_into_tensor": ("torch.distributed.all_gather_into_tensor",
                               _GATHER_HINT),
    "_all_gather_base": ("torch.distributed._all_gather_base", _GATHER_HINT),
    "all_reduce": ("torch.distributed.all_reduce",
                   "Write `total = dloss.all_reduce(x, \"sum\")`: it returns "
                   "the result and carries the exact gradient"),
    "reduce_scatter": ("torch.distributed.reduce_scatter",
                       "Use dloss.all_gather / dloss.all_reduce"),
    "broadcast": ("torch.distributed.broadcast",
                  "Pass the value as a replicated argument of the loss"),
    "get_rank": ("torch.distributed.get_rank()", _RANK_HINT),
    "get_world_size": ("torch.distributed.get_world_size()",
                       "Use dloss.world_size() (or dloss.global_size(x) for "
                       "the global batch)"),
    "barrier": ("torch.distributed.barrier()",
                "A loss needs no barrier: dloss's collectives synchronise"),
}
_NN_DISTRIBUTED = {
    "all_gather": ("torch.distributed.nn.all_gather", _GATHER_HINT),
    "all_reduce": ("torch.distributed.nn.all_reduce",
                   "Write `total = dloss.all_reduce(x, \"sum\")`"),
}


def _arange(*args, **kwargs):
    loc = _user_location()
    dtype = kwargs.pop("dtype", None) or torch.int64
    kwargs.pop("device", None)
    kwargs.pop("requires_grad", None)
    kwargs.pop("layout", None)
    if kwargs.pop("out", None) is not None or kwargs:
        _unsupported("torch.arange with %s" % ", ".join(kwargs), loc)
    if len(args) == 1:
        start, end = 0, args[0]
    elif len(args) == 2 or (len(args) == 3 and isinstance(args[2], int)
                            and args[2] == 1):
        start, end = args[0], args[1]
    else:
        _unsupported("torch.arange with a step", loc)
    for v in (start, end):
        if not isinstance(v, (int, _Size)) or isinstance(v, bool):
            _unsupported("torch.arange of %s (sizes only)" % (
                type(v).__name__), loc)
    tr = _trace()
    return _Arange(tr, start, _size_op("sub", end, start, loc), dtype, loc)


def _factory(name, original):
    def make(*args, **kwargs):
        loc = _user_location()
        sized = any(isinstance(a, (_Size, _Value)) for a in args) or any(
            isinstance(a, (_Size, _Value)) for a in
            (args[0] if args and isinstance(args[0], (list, tuple)) else ()))
        if not sized:
            return original(*args, **kwargs)
        hint = ("Build masks from indices: `rows[:, None] == cols[None, :]` "
                "with rows and cols from torch.arange and dloss.shard_offset"
                if name == "eye" else
                "A number broadcasts in arithmetic; torch.zeros_like/"
                "ones_like/full_like(x) make a tensor of x's shape")
        _fail("torch.%s with a size known only when the loss runs, at %s" %
              (name, _code(loc)), hint, loc)
    return make


class _Patches:
    """Replaces torch.arange, the factories and torch.distributed's
    collectives while a loss is traced (in torch's modules and in the
    function's globals, where `from torch.distributed import get_rank`
    put them)."""

    def __init__(self, fn_globals):
        import torch.distributed as dist
        self.saved = []
        replacements = {}

        def patch(module, name, new):
            if not hasattr(module, name):
                return
            old = getattr(module, name)
            replacements[id(old)] = new
            self.saved.append((module, name, old))
            setattr(module, name, new)

        patch(torch, "arange", _arange)
        for name in ("eye", "ones", "zeros", "full", "empty", "rand", "randn",
                     "tensor"):
            patch(torch, name, _factory(name, getattr(torch, name)))
        for name, (what, hint) in _DISTRIBUTED.items():
            patch(dist, name, _refuse(what, hint))
        try:
            import torch.distributed.nn as dist_nn
            import torch.distributed.nn.functional as dist_nn_f
            for name, (what, hint) in _NN_DISTRIBUTED.items():
                patch(dist_nn, name, _refuse(what, hint))
                patch(dist_nn_f, name, _refuse(what, hint))
        except ImportError:
            pass
        self.globals = fn_globals
        self.saved_globals = []
        for key, value in list(fn_globals.items()):
            new = replacements.get(id(value))
            if new is not None:
                self.saved_globals.append((key, value))
                fn_globals[key] = new

    def restore(self):
        for module, name, old in reversed(self.saved):
            setattr(module, name, old)
        for key, value in self.saved_globals:
            self.globals[key] = value


# ---------------------------------------------------------------------------
# dloss's collectives and rank facts, as the traced function calls them.
# ---------------------------------------------------------------------------

def _outside(name):
    loc = _user_location()
    _fail("dloss.%s is called outside a @dloss.loss function" % name,
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
        from .collectives import all_gather as eager
        return eager(x, group)
    loc = _user_location()
    x = _mat(x)
    if x.ndim == 0:
        _fail("dloss.all_gather of a 0-d tensor at %s" % _code(loc),
              "Gather a 1-d tensor (x[None]... is not supported: keep a "
              "batch dimension)", loc, op="dloss.all_gather")
    if grad not in ("exact", "local", "none"):
        _fail("grad must be 'exact', 'local' or 'none', got %r" % (grad,),
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
        _fail("unknown reduction %r for dloss.all_reduce" % (op,),
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
    tr = _trace()
    if tr is None:
        _outside("world_size")
    return _Size(tr, "world", (), _user_location())


def rank():
    """Inside a @dloss.loss function: this rank's index (a size that
    differs across ranks; for labels use dloss.shard_offset)."""
    tr = _trace()
    if tr is None:
        _outside("rank")
    return _Size(tr, "rank", (), _user_location(), varying=True, rank=True)


# ---------------------------------------------------------------------------
# Describing the arguments.
# ---------------------------------------------------------------------------

class Input:
    """Describes a tensor argument of a @dloss.loss function (as an
    annotation). Each field left None follows the first call's tensor and
    the defaults: `shape` with -1 for sizes that may differ between ranks or
    calls (default: the first dimension, for per-rank arguments), `dtype`,
    `grad` (default: float tensors are differentiated), `replicated` (the
    same on every rank; default: 0-d tensors)."""

    def __init__(self, shape=None, dtype=None, grad=None, replicated=None):
        self.shape = None if shape is None else tuple(shape)
        self.dtype, self.grad, self.replicated = dtype, grad, replicated

    def __repr__(self):
        return "dloss.Input(shape=%r, dtype=%r, grad=%r, replicated=%r)" % (
            self.shape, self.dtype, self.grad, self.replicated)


Replicated = Input(replicated=True)
Replicated.__doc__ = ("Annotation: the argument is the same on every rank "
                      "(a loss parameter such as ArcFace's W).")


def _annotation(fn, name):
    value = inspect.signature(fn).parameters[name].annotation
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, str):  # from __future__ import annotations
        try:
            value = eval(value, fn.__globals__)  # noqa: S307 - user's code
        except Exception:  # noqa: B902 - an annotation dloss does not use
            return None
    return value if isinstance(value, Input) else None


def _describe(fn, name, tensor, loc):
    """(dtype, shape with -1s, grad, replicated) of a tensor argument."""
    spec = _annotation(fn, name) or Input()
    dtype = spec.dtype or tensor.dtype
    if dtype != tensor.dtype:
        _fail("argument %r is %s but its annotation says %s" % (
            name, tensor.dtype, dtype), "Pass a tensor of the annotated "
            "dtype, or change the annotation", loc)
    if dtype == torch.bool:
        _fail("argument %r is a boolean tensor" % name,
              "Pass masks as integer (0/1) tensors", loc)
    replicated = spec.replicated if spec.replicated is not None else \
        tensor.dim() == 0
    if spec.shape is not None:
        if len(spec.shape) != tensor.dim() or any(
                s >= 0 and s != t for s, t in zip(spec.shape, tensor.shape)):
            _fail("argument %r has shape %s but its annotation says %s" % (
                name, list(tensor.shape), list(spec.shape)),
                "Pass a tensor of the annotated shape (-1 matches any size)",
                loc)
        shape = tuple(spec.shape)
    else:
        shape = tuple(tensor.shape)
        if not replicated and tensor.dim():
            shape = (-1,) + shape[1:]
    grad = spec.grad if spec.grad is not None else dtype in _FLOAT
    return dtype, shape, bool(grad), bool(replicated)


# ---------------------------------------------------------------------------
# Tracing and the callable.
# ---------------------------------------------------------------------------

def _trace_graph(fn, name, params, tensors, constants, grad_mode):
    """Runs `fn` on stand-ins and returns the loss's _C graph.

    Index tensors computed from the inputs' sizes alone (labels such as
    arange(n) + shard_offset(x)) are built where first used, which may be
    after the similarity that a fused op replaces (SigLIP's positives come
    after its softplus); the fusion patterns then decline. So when the first
    pass builds any, a second pass builds them first, before the user's
    ops."""
    tr, result = _run(fn, name, params, tensors, constants, [])
    if tr.aranges:
        tr, result = _run(fn, name, params, tensors, constants, tr.aranges)
    return _finish(fn, tr, result, grad_mode)


def _run(fn, name, params, tensors, constants, hoist):
    tr = _Trace(name)
    def_loc = (fn.__code__.co_filename, fn.__code__.co_firstlineno)
    args = dict(constants)
    for pname, (dtype, shape, grad, replicated) in tensors.items():
        t = tr.g.input(pname, to_dtype(dtype), list(shape), grad, replicated,
                       *def_loc)
        dims = []
        value = _Tensor(tr, t, [0] * len(shape), dtype, not replicated,
                        (def_loc, "it is computed from argument %r, which "
                         "each rank passes its own" % pname), def_loc)
        value.input_name = pname
        for axis, s in enumerate(shape):
            dims.append(s if s >= 0 else _Size(
                tr, "dim", (value, axis), def_loc, varying=not replicated,
                batch=not replicated))
        value.dims = tuple(dims)
        args[pname] = value
    inputs = {p: args[p] for p in tensors}
    for old in hoist:
        rebase = (lambda v: v.rebased(tr, inputs) if isinstance(v, _Size)
                  else v)
        early = _Arange(tr, rebase(old.start), rebase(old.count), old.dtype,
                        old.loc)
        tr.hoisted[early.key()] = _mat(early)
    previous = getattr(_state, "trace", None)
    _state.trace = tr
    patches = _Patches(fn.__globals__)
    try:
        result = fn(*[args[p] for p in params])
    except Exception as e:  # noqa: B902 - re-raised with the user's line
        from .errors import Error
        if isinstance(e, Error):
            raise
        loc = _traceback_location(e.__traceback__) or def_loc
        raise make_error(
            "tracing @%s failed at %s: %s: %s" % (
                name, _code(loc), type(e).__name__, e),
            "Inside @dloss.loss, tensors stand for values known only when "
            "the loss runs (see docs/Python.md for what is supported)",
            location=_text(loc)) from e
    finally:
        patches.restore()
        _state.trace = previous
    return tr, result


def _finish(fn, tr, result, grad_mode):
    """Checks the returned loss and ends the graph."""
    ret_loc = _return_location(fn)
    if isinstance(result, (list, tuple)) and result:
        result = result[0]
    if isinstance(result, _Size):
        result = _size_tensor(tr, result, torch.float32, ret_loc)
    if not isinstance(result, _Value):
        _fail("the loss function returned %s, not a tensor computed from its "
              "arguments" % type(result).__name__, "Return the loss, a 0-d "
              "tensor", ret_loc)
    result = _mat(result)
    if result.ndim != 0 or result.dtype not in _FLOAT:
        _fail("the loss must be a 0-d float tensor, got %s of shape [%s]" % (
            result.dtype, ", ".join(map(_dim_text, result.dims))),
            "Reduce it with .mean() (a global mean over the batch) or "
            "dloss.all_reduce(x.sum(), \"sum\")", ret_loc)
    if result.varying:
        where, what = result.note or (ret_loc, "{code} is computed from "
                                      "each rank's own data")
        _fail("the loss varies across ranks: %s (%s), so each rank would "
              "return a different loss" % (
                  what.replace("{code}", _code(where)), _text(where)),
              "A loss must be the same on every rank: add the ranks' parts "
              "with dloss.all_reduce(x, \"sum\") (divided by "
              "dloss.global_size(x) for a mean), or take .mean() over the "
              "batch, which dloss makes the global mean; an all_reduce is "
              "missing", where)
    mode = _C.GradMode.ddp if grad_mode == "ddp" else _C.GradMode.global_
    tr.g.set_loss(result.node, mode, *ret_loc)
    return tr.g


def _traceback_location(tb):
    """The innermost frame of a traceback in the user's code."""
    found = None
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not name.startswith(_TORCH_DIR) and \
                os.path.dirname(name) != _PACKAGE_DIR:
            found = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _return_location(fn):
    """The location of the function's last return statement."""
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return fn.__code__.co_filename, fn.__code__.co_firstlineno
    line = start
    for i, text in enumerate(lines):
        if text.strip().startswith("return"):
            line = start + i
    return fn.__code__.co_filename, line


class Loss:
    """A loss written in PyTorch, compiled by dloss (see @dloss.loss). Call
    it with the function's arguments on every rank; it returns the global
    loss with autograd."""

    def __init__(self, fn, grad_mode="ddp", fuse=True, group=None,
                 name=None):
        if grad_mode not in ("ddp", "global"):
            raise make_error("grad_mode must be 'ddp' or 'global', got %r" %
                             (grad_mode,), "See docs/Autodiff.md")
        functools.update_wrapper(self, fn)
        self.fn, self.grad_mode, self.fuse, self.group = \
            fn, grad_mode, fuse, group
        self.name = name or fn.__name__
        self.params = list(inspect.signature(fn).parameters)
        self._compiled = {}

    def _signature(self, args, kwargs):
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise make_error("@%s: %s" % (self.name, e),
                             "Pass the function's arguments") from None
        bound.apply_defaults()
        loc = (self.fn.__code__.co_filename, self.fn.__code__.co_firstlineno)
        tensors, constants, values = {}, {}, []
        for name in self.params:
            value = bound.arguments[name]
            if isinstance(value, torch.Tensor):
                tensors[name] = _describe(self.fn, name, value, loc)
                values.append(value)
            else:
                try:
                    hash(value)
                except TypeError:
                    raise make_error(
                        "argument %r of @%s is neither a tensor nor a "
                        "hashable constant (%s)" % (
                            name, self.name, type(value).__name__),
                        "Pass tensors, numbers, strings or tuples") from None
                constants[name] = value
        key = (tuple(tensors.items()), tuple(sorted(
            (k, type(v).__name__, v) for k, v in constants.items())))
        return key, tensors, constants, values

    def compiled(self, *args, **kwargs):
        """The dloss.CompiledLoss for these arguments' signature (traced and
        compiled on first use)."""
        return self._compile(*self._signature(args, kwargs)[:3])

    def _compile(self, key, tensors, constants):
        compiled = self._compiled.get(key)
        if compiled is None:
            from .compile import compile as compile_source
            graph = _trace_graph(self.fn, self.name, self.params, tensors,
                                 constants, self.grad_mode)
            compiled = compile_source(graph, fuse=self.fuse,
                                      group=self.group)
            compiled.graph = graph
            self._compiled[key] = compiled
        return compiled

    def to_mlir(self, *args, **kwargs):
        """The dloss MLIR recorded for these arguments."""
        return self.compiled(*args, **kwargs).graph.to_mlir()

    def plan_text(self, *args, **kwargs):
        """The compiled plan for these arguments, as text."""
        return self.compiled(*args, **kwargs).plan_text()

    def __call__(self, *args, **kwargs):
        key, tensors, constants, values = self._signature(args, kwargs)
        return self._compile(key, tensors, constants)(*values)

    def __repr__(self):
        return "<dloss.loss %s>" % self.name


def loss(fn=None, *, grad_mode="ddp", fuse=True, group=None, name=None):
    """Decorator: compile a per-rank loss written in plain PyTorch.

        @dloss.loss
        def siglip(image, text, log_t, bias): ...

        @dloss.loss(grad_mode="global")
        def arcface(x, labels, W: dloss.Replicated): ...

    The function is the program one rank runs on its shard of the batch
    (see the module docstring of dloss.trace and docs/Python.md). It is
    recorded on its first call (per signature: dtypes, ranks, fixed sizes,
    non-tensor arguments) and compiled; every call runs the compiled plan on
    `group` and returns the global loss with autograd. grad_mode: "ddp"
    (default) or "global". fuse: fuse gather + similarity + loss.
    """
    def wrap(f):
        return Loss(f, grad_mode=grad_mode, fuse=fuse, group=group,
                    name=name)
    return wrap if fn is None else wrap(fn)
