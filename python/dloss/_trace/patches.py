"""What a @dloss.loss trace replaces in torch while it runs: torch.arange
records an arange of sizes; the factories and torch.distributed's
collectives are refused, each with what to write instead."""

import torch
import torch.distributed as dist

from .locations import _code, _user_location, fail
from .rules import _eye as _rules_eye
from .rules import _unsupported
from .values import _Arange, _Size, _Value, _current_trace, _size_op


def _refuse(what, hint):
    def refused(*args, **kwargs):
        loc = _user_location()
        fail("%s at %s inside a @dloss.loss function" % (what, _code(loc)),
             hint, loc, op=what)
    return refused


_GATHER_HINT = ("Write `x_all = dloss.all_gather(x)` (exact gradients, "
                "uneven batches): torch.distributed.all_gather carries no "
                "gradient and needs equal sizes on every rank")
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
                       "Write `mine = dloss.reduce_scatter(x, \"sum\", "
                       "size=n)`: it returns this rank's block of n rows and "
                       "carries the exact gradient"),
    "broadcast": ("torch.distributed.broadcast",
                  "Write `x = dloss.broadcast(x, root)` (exact gradient), or "
                  "pass the value as a replicated argument of the loss"),
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
    tr = _current_trace()
    return _Arange(tr, start, _size_op("sub", end, start, loc), dtype, loc)


def _eye(n, m=None, *, dtype=None, device=None, requires_grad=False,
         layout=None, out=None, pin_memory=False):
    """torch.eye(n[, m]) of sizes: the mask rows == cols, as a tensor."""
    loc = _user_location()
    for v in (n, m):
        if v is not None and (not isinstance(v, (int, _Size)) or
                              isinstance(v, bool)):
            _unsupported("torch.eye of %s (sizes only)" % type(v).__name__,
                         loc)
    if out is not None:
        _unsupported("torch.eye with out=", loc)
    return _rules_eye(n, m, dtype=dtype, loc=loc)


def _factory(name, original):
    def make(*args, **kwargs):
        loc = _user_location()
        sized = any(isinstance(a, (_Size, _Value)) for a in args) or any(
            isinstance(a, (_Size, _Value)) for a in
            (args[0] if args and isinstance(args[0], (list, tuple)) else ()))
        if not sized:
            return original(*args, **kwargs)
        hint = ("A number broadcasts in arithmetic; torch.zeros_like/"
                "ones_like/full_like(x) make a tensor of x's shape")
        fail("torch.%s with a size known only when the loss runs, at %s" %
             (name, _code(loc)), hint, loc)
    return make


class _Patches:
    """Replaces torch.arange, the factories and torch.distributed's
    collectives while a loss is traced (in torch's modules and in the
    function's globals, where `from torch.distributed import get_rank`
    put them)."""

    def __init__(self, fn_globals):
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
        patch(torch, "eye", _eye)
        for name in ("ones", "zeros", "full", "empty", "rand", "randn",
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
