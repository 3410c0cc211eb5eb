"""Recording a @dloss.loss function: it runs once on stand-ins, under
torch's replacements (patches.py), and its returned loss ends the graph."""

import inspect

import torch

from .. import _C
from ..errors import Error, _is_users, make_error
from ..graph import to_dtype
from .locations import _code, _text, fail
from .materialise import _mat, _size_tensor
from .patches import _Patches
from .rules import _cast
from .values import (FLOAT_DTYPES, _Arange, _Size, _Tensor, _Trace, _Value,
                     _dim_text, _recording)

def trace_graph(fn, name, params, tensors, constants, grad_mode):
    """Runs `fn` on stand-ins and returns the loss's _C graph. `params`:
    its parameter names in order; `tensors`: (dtype, shape with -1 for a
    size known at run time, grad, replicated) by tensor parameter;
    `constants`: the other arguments by name; grad_mode: "ddp" or
    "global".

    Index tensors computed from the inputs' sizes alone (labels such as
    arange(n) + shard_offset(x)) are built where first used, which may be
    after the similarity that a fused op replaces (SigLIP's positives come
    after its softplus); the fusion patterns then decline. So when the first
    pass builds any, a second pass builds them first, before the user's
    ops."""
    # Under enable_grad, so that a loss first called inside an evaluation's
    # no_grad records the same program, and a no_grad block of the
    # function's own is seen (materialise.py's _emit refuses it).
    with torch.enable_grad():
        tr, result = _run(fn, name, params, tensors, constants, [])
        if tr.aranges:
            tr, result = _run(fn, name, params, tensors, constants,
                              tr.aranges)
        return _finish(fn, tr, result, grad_mode)


def _run(fn, name, params, tensors, constants, hoist):
    tr = _Trace(name)
    def_loc = (fn.__code__.co_filename, fn.__code__.co_firstlineno)
    args = dict(constants)
    tr.states = []  # the state inputs, in order
    for pname, (dtype, shape, grad, replicated, state) in tensors.items():
        t = tr.g.input(pname, to_dtype(dtype), list(shape), grad, replicated,
                       *def_loc, state)
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
        if state:
            tr.states.append(value)
    inputs = {p: args[p] for p in tensors}
    for old in hoist:
        rebase = (lambda v: v.rebased(tr, inputs) if isinstance(v, _Size)
                  else v)
        early = _Arange(tr, rebase(old.start), rebase(old.count), old.dtype,
                        old.loc)
        tr.hoisted[early.key()] = _mat(early)
    with _recording(tr):
        patches = _Patches(fn.__globals__)
        try:
            result = fn(*[args[p] for p in params])
        except Exception as e:  # noqa: B902 - re-raised with the user's line
            if isinstance(e, Error):
                raise
            loc = _traceback_location(e.__traceback__) or def_loc
            raise make_error(
                "tracing @%s failed at %s: %s: %s" % (
                    name, _code(loc), type(e).__name__, e),
                "Inside @dloss.loss, tensors stand for values known only "
                "when the loss runs (see docs/Python.md for what is "
                "supported)", location=_text(loc)) from e
        finally:
            patches.restore()
    return tr, result


def _finish(fn, tr, result, grad_mode):
    """Checks the returned loss and ends the graph."""
    ret_loc = _return_location(fn)
    new_state = []
    if isinstance(result, (list, tuple)) and result:
        result, new_state = result[0], list(result[1:])
    if len(new_state) != len(tr.states):
        fail("the loss function returned %d value(s) after the loss for its "
             "%d state argument(s)%s" % (
                 len(new_state), len(tr.states),
                 " (%s)" % ", ".join(s.input_name for s in tr.states)
                 if tr.states else ""),
             "Return the loss alone, or (loss, new value of each state "
             "argument, in order) when arguments are dloss.State", ret_loc)
    state_nodes = [_new_state(tr, old, new, ret_loc)
                   for old, new in zip(tr.states, new_state)]
    if isinstance(result, _Size):
        result = _size_tensor(tr, result, torch.float32, ret_loc)
    if not isinstance(result, _Value):
        fail("the loss function returned %s, not a tensor computed from its "
             "arguments" % type(result).__name__, "Return the loss, a 0-d "
             "tensor", ret_loc)
    result = _mat(result)
    if result.ndim != 0 or result.dtype not in FLOAT_DTYPES:
        fail("the loss must be a 0-d float tensor, got %s of shape [%s]" % (
            result.dtype, ", ".join(map(_dim_text, result.dims))),
            "Reduce it with .mean() (a global mean over the batch) or "
            "dloss.all_reduce(x.sum(), \"sum\")", ret_loc)
    if result.varying:
        where, what = result.note or (ret_loc, "{code} is computed from "
                                      "each rank's own data")
        fail("the loss varies across ranks: %s (%s), so each rank would "
             "return a different loss" % (
                  what.replace("{code}", _code(where)), _text(where)),
             "A loss must be the same on every rank: add the ranks' parts "
             "with dloss.all_reduce(x, \"sum\") (divided by "
             "dloss.global_size(x) for a mean), or take .mean() over the "
             "batch, which dloss makes the global mean; an all_reduce is "
             "missing", where)
    mode = _C.GradMode.ddp if grad_mode == "ddp" else _C.GradMode.global_
    tr.g.set_loss(result.node, mode, *ret_loc, state_nodes)
    return tr.g


def _new_state(tr, old, new, loc):
    """The graph node of state argument `old`'s new value `new`: the same on
    every rank, of `old`'s shape, cast to its dtype."""
    if not isinstance(new, _Value):
        fail("the new value of state argument %r is %s, not a tensor "
             "computed in the loss" % (old.input_name, type(new).__name__),
             "Return (loss, new value of each state argument)", loc)
    new = _mat(new)
    if new.varying:
        where, what = new.note or (loc, "{code} is computed from each "
                                   "rank's own data")
        fail("the new value of state argument %r varies across ranks: %s "
             "(%s)" % (old.input_name, what.replace("{code}", _code(where)),
                       _text(where)),
             "State must stay the same on every rank: update it from "
             "all-reduced statistics (a .mean() over the batch is one)", loc)
    if new.ndim != old.ndim or any(
            isinstance(a, int) and isinstance(b, int) and a != b
            for a, b in zip(new.dims, old.dims)):
        fail("the new value of state argument %r has shape [%s], the "
             "argument [%s]" % (old.input_name,
                                ", ".join(map(_dim_text, new.dims)),
                                ", ".join(map(_dim_text, old.dims))),
             "Return a new value of the state's own shape", loc)
    if new.dtype != old.dtype:
        new = _mat(_cast(new, old.dtype, loc))
    return new.node


def _traceback_location(tb):
    """The innermost frame of a traceback in the user's code."""
    users = _is_users()
    found = None
    while tb is not None:
        if users(tb.tb_frame.f_code.co_filename):
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
