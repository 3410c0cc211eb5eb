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
on stand-in tensors (the private package dloss._trace records it): every
torch operation it makes adds the matching dloss op to a dloss.Graph,
located at the user's own file:line, so that every error (here, in the
compiler, at run time) points at the user's code. The
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
- ``dloss.all_gather``, ``dloss.all_reduce``, ``dloss.reduce_scatter``,
  ``dloss.broadcast``, ``dloss.ring_shift``, ``dloss.shard_offset``,
  ``dloss.global_size``, ``dloss.world_size`` and ``dloss.rank`` are the
  communication and the rank facts;
- the loss must be the same on every rank, and no Python control flow may
  depend on a tensor or a run-time size (ranks would run different
  programs). ``torch.distributed`` is refused inside the function.
"""

import functools
import inspect

import torch

from ._trace import (FLOAT_DTYPES, all_gather, all_reduce, broadcast, fail,
                     global_size, rank, reduce_scatter, ring_shift,
                     shard_offset, trace_graph, world_size)
from . import _ops
from .compiled import call, compile_graph
from .errors import make_error
from .schedule import check_schedule

__all__ = ["Input", "Loss", "Replicated", "State", "all_gather",
           "all_reduce",
           "broadcast", "global_size", "loss", "rank", "reduce_scatter",
           "ring_shift", "shard_offset", "world_size"]


# ---------------------------------------------------------------------------
# Describing the arguments.
# ---------------------------------------------------------------------------

class Input:
    """Describes a tensor argument of a @dloss.loss function (as an
    annotation). Each field left None follows the first call's tensor and
    the defaults: `shape` with -1 for sizes that may differ between ranks or
    calls (default: the first dimension, for per-rank arguments), `dtype`,
    `grad` (default: float tensors are differentiated), `replicated` (the
    same on every rank; default: 0-d tensors). `state=True` makes it loss
    state (a centre, an EMA): replicated, never differentiated; the
    function returns ``(loss, new_value, ...)``, one new value per state
    argument in order, and each call stores it in the tensor passed."""

    def __init__(self, shape=None, dtype=None, grad=None, replicated=None,
                 state=False):
        self.shape = None if shape is None else tuple(shape)
        self.dtype, self.grad, self.replicated = dtype, grad, replicated
        self.state = bool(state)

    def __repr__(self):
        return ("dloss.Input(shape=%r, dtype=%r, grad=%r, replicated=%r, "
                "state=%r)" % (self.shape, self.dtype, self.grad,
                               self.replicated, self.state))


State = Input(state=True)
State.__doc__ = ("Annotation: the argument is loss state, returned updated "
                 "after the loss (DINO's centre, an EMA).")


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


def _describe(fn, name, tensor, loc, state=False):
    """(dtype, shape with -1s, grad, replicated, state) of a tensor
    argument; `state`: the loss declares it state (Loss's `state`)."""
    spec = _annotation(fn, name) or Input()
    if state and not spec.state:
        spec = Input(spec.shape, spec.dtype, spec.grad, spec.replicated,
                     state=True)
    dtype = spec.dtype or tensor.dtype
    if dtype != tensor.dtype:
        fail("argument %r is %s but its annotation says %s" % (
            name, tensor.dtype, dtype), "Pass a tensor of the annotated "
            "dtype, or change the annotation", loc)
    if dtype == torch.bool:
        fail("argument %r is a boolean tensor" % name,
             "Pass masks as integer (0/1) tensors", loc)
    if spec.state and (spec.grad or spec.replicated is False):
        fail("state argument %r is annotated with grad=True or "
             "replicated=False" % name, "Loss state is the same on every "
             "rank and carries no gradient: drop those options", loc)
    replicated = spec.replicated if spec.replicated is not None else \
        tensor.dim() == 0 or spec.state
    if spec.shape is not None:
        if len(spec.shape) != tensor.dim() or any(
                s >= 0 and s != t for s, t in zip(spec.shape, tensor.shape)):
            fail("argument %r has shape %s but its annotation says %s" % (
                name, list(tensor.shape), list(spec.shape)),
                "Pass a tensor of the annotated shape (-1 matches any size)",
                loc)
        shape = tuple(spec.shape)
    else:
        shape = tuple(tensor.shape)
        if not replicated and tensor.dim():
            shape = (-1,) + shape[1:]
    grad = spec.grad if spec.grad is not None else \
        dtype in FLOAT_DTYPES and not spec.state
    if spec.state and spec.shape is None:
        shape = tuple(tensor.shape)  # state has the same shape everywhere
    return dtype, shape, bool(grad), bool(replicated), spec.state


# ---------------------------------------------------------------------------
# The callable.
# ---------------------------------------------------------------------------

# "<key>/<part>" -> the call signature it stands for: per argument, (name,
# True, dtype, dims, sizes after the first) for a tensor, (name, False, type
# name, value) for a constant.
_PARTS = {}
_PART_OF = {}


@torch._dynamo.assume_constant_result
def _part(key, spec):
    """The part of `key` that names the call signature `spec` (made on
    first use). Under torch.compile it runs while Dynamo traces, and its
    result is a constant of the graph."""
    part = _PART_OF.get((key, spec))
    if part is None:
        part = str(len(_PART_OF))
        _PART_OF[(key, spec)] = part
        _PARTS[key + "/" + part] = spec
    return part


class Loss(_ops.Registered):
    """A loss written in PyTorch, compiled by dloss (see @dloss.loss). Call
    it with the function's arguments on every rank; it returns the global
    loss with autograd. `schedule`: the fused ops' schedule, as in
    dloss.compile."""

    # Compiled plans hold the group.
    _TRANSIENT = ("_compiled",)

    def __init__(self, fn, grad_mode="ddp", fuse=True, group=None,
                 name=None, schedule=None, state=()):
        if grad_mode not in ("ddp", "global"):
            raise make_error("grad_mode must be 'ddp' or 'global', got %r" %
                             (grad_mode,), "See docs/Autodiff.md")
        functools.update_wrapper(self, fn)
        self.fn, self.grad_mode, self.fuse, self.group = \
            fn, grad_mode, fuse, group
        self.schedule = check_schedule(schedule, "dloss.loss")
        self.name = name or fn.__name__
        signature = inspect.signature(fn)
        self.params = list(signature.parameters)
        self._positional = [
            name for name, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._defaults = {
            name: p.default for name, p in signature.parameters.items()
            if p.default is not p.empty}
        self._simple = all(p.kind in (p.POSITIONAL_ONLY,
                                      p.POSITIONAL_OR_KEYWORD,
                                      p.KEYWORD_ONLY)
                           for p in signature.parameters.values())
        # The state arguments (dloss.State annotations, or named in
        # `state`): each call stores their new values in the tensors passed.
        self._state = frozenset(state) | {
            name for name in self.params
            if getattr(_annotation(fn, name), "state", False)}
        self._compiled = {}
        # The name dloss::loss calls this function by (dloss/_ops.py).
        self._register()

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
                tensors[name] = _describe(self.fn, name, value, loc,
                                          name in self._state)
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
            graph = trace_graph(self.fn, self.name, self.params, tensors,
                                constants, self.grad_mode)
            compiled = compile_graph(graph, fuse=self.fuse, group=self.group,
                                     schedule=self.schedule)
            compiled.graph = graph
            self._compiled[key] = compiled
        return compiled

    def to_mlir(self, *args, **kwargs):
        """The dloss MLIR recorded for these arguments."""
        return self.compiled(*args, **kwargs).graph.to_mlir()

    def plan_text(self, *args, **kwargs):
        """The compiled plan for these arguments, as text."""
        return self.compiled(*args, **kwargs).plan_text()

    def _values(self, args, kwargs):
        """The arguments in parameter order, as torch.compile can trace it
        (inspect.signature's bind cannot be): None when the call does not
        fit the parameters, which `_signature` then explains."""
        if not self._simple or len(args) > len(self._positional):
            return None
        values = dict(zip(self._positional, args))
        for name, value in kwargs.items():
            if name not in self.params or name in values:
                return None
            values[name] = value
        for name in self.params:
            if name not in values:
                if name not in self._defaults:
                    return None
                values[name] = self._defaults[name]
        return [values[name] for name in self.params]

    def __call__(self, *args, **kwargs):
        """The global loss: dloss::loss on the tensor arguments, the plan
        chosen by the call's signature (`_part`), compiled on first use."""
        values = self._values(args, kwargs)
        if values is None:
            self._signature(args, kwargs)  # raises the binding's error
            raise make_error("@%s: the arguments do not fit its parameters" %
                             self.name, "Pass the function's arguments")
        tensors, spec, states = [], [], []
        for name, value in zip(self.params, values):
            if isinstance(value, torch.Tensor):
                if name in self._state:
                    states.append(len(tensors))
                tensors.append(value)
                spec.append((name, True, value.dtype, value.dim(),
                             tuple(value.shape[1:])))
            else:
                spec.append((name, False, type(value).__name__, value))
        if not torch.compiler.is_compiling():
            for entry in spec:
                if not entry[1]:
                    try:
                        hash(entry[3])
                    except TypeError:
                        self._signature(args, kwargs)  # raises its error
        part = _part(self._op_key, tuple(spec))
        return call(self._op_key + "/" + part, tensors, _ops.call_site(),
                    tuple(states))

    def _op_target(self, part, inputs):
        """The dloss.CompiledLoss of `part`'s signature for `inputs` (its
        tensor arguments, in order): traced and compiled on first use."""
        spec = _PARTS[self._op_key + "/" + part]
        loc = (self.fn.__code__.co_filename, self.fn.__code__.co_firstlineno)
        tensors, constants = {}, {}
        given = iter(inputs)
        for entry in spec:
            if entry[1]:
                tensors[entry[0]] = _describe(self.fn, entry[0], next(given),
                                              loc, entry[0] in self._state)
            else:
                constants[entry[0]] = entry[3]
        key = (tuple(tensors.items()), tuple(sorted(
            (k, type(v).__name__, v) for k, v in constants.items())))
        return self._compile(key, tensors, constants)

    def __repr__(self):
        return "<dloss.loss %s>" % self.name


def loss(fn=None, *, grad_mode="ddp", fuse=True, schedule=None, group=None,
         name=None):
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
    schedule: how the fused ops move the columns between ranks, "auto",
    "ring" or "gather" (None: the process default, dloss.set_schedule).
    """
    check_schedule(schedule, "dloss.loss")

    def wrap(f):
        return Loss(f, grad_mode=grad_mode, fuse=fuse, group=group,
                    name=name, schedule=schedule)
    return wrap if fn is None else wrap(fn)
