"""Stand-in values of a @dloss.loss trace: the graph under construction,
sizes known only when the loss runs, and the stand-in tensors.

A stand-in is a graph tensor (_Tensor) or a form kept apart until its use
decides how to build it (materialise.py builds it): a transpose (a matmul's
flag), a 0-d scale of a matrix (pulled out of a matmul, as the fusion
patterns want), an arange of sizes (an offset moves its start), a tensor
with size-1 axes or a pending broadcast (built by dloss.expand next to a
tensor of the full shape).

Their Python operators and methods record ops through the op rules
(rules.py). The rules make stand-ins, so this module cannot import them:
rules.py installs them here (install_rules) when the package is imported.
"""

import contextlib
import functools
import threading
import types

import torch

from .. import _C
from .control import _control_flow_error
from .locations import _code, _text, _user_location, fail

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The dloss ops that sizes emit (test_trace_emits keeps it true).
EMITS = frozenset({"dloss.dim", "dloss.global_size", "dloss.shard_offset",
                   "dloss.rank", "dloss.world_size"})

# The op rules, as install_rules received them.
_rules = types.SimpleNamespace()


def install_rules(*, binary, unary, matmul, power, logical_not, getitem,
                  transpose, call_torch, methods, unsupported):
    """Called by rules.py: what the stand-ins' operators and methods call.
    binary(op, a, b, loc), unary(op, x, loc), matmul(a, b, loc),
    power(x, p, loc), logical_not(x, loc), getitem(x, index, loc),
    transpose(x, loc): the operators' rules; call_torch(func, args,
    kwargs): a torch function on stand-ins; methods: Tensor methods by
    name; unsupported(what, loc): the refusal of anything else."""
    vars(_rules).update(
        binary=binary, unary=unary, matmul=matmul, power=power,
        logical_not=logical_not, getitem=getitem, transpose=transpose,
        call_torch=call_torch, methods=methods, unsupported=unsupported)


# ---------------------------------------------------------------------------
# The graph under construction.
# ---------------------------------------------------------------------------

_state = threading.local()


def _current_trace():
    """The _Trace being recorded on this thread; None outside one."""
    return getattr(_state, "trace", None)


@contextlib.contextmanager
def _recording(tr):
    """Makes `tr` the current trace for the duration."""
    previous = _current_trace()
    _state.trace = tr
    try:
        yield tr
    finally:
        _state.trace = previous


class _Trace:
    """A loss being recorded: its dloss.Graph and the sizes built in it."""

    def __init__(self, name):
        self.g = _C.Graph(name)
        self.sizes = {}
        # Index tensors computed from the inputs' sizes alone (labels):
        # `hoisted` holds those built up front, `aranges` what this pass
        # built (see record.py's trace_graph).
        self.hoisted, self.aranges = {}, []

    def size(self, value, loc):
        """A builder Size for an int or a _Size."""
        if isinstance(value, _Size):
            return value.value(loc)
        key = ("const", int(value))
        if key not in self.sizes:
            self.sizes[key] = self.g.size(int(value), *loc)
        return self.sizes[key]


# ---------------------------------------------------------------------------
# Sizes: dimensions and rank facts, known only when the loss runs.
# ---------------------------------------------------------------------------

class _Cond:
    """A comparison of run-time values: using it as a Python bool is control
    flow that could differ across ranks."""

    def __init__(self, varying, loc):
        self.varying, self.loc = varying, loc

    def __bool__(self):
        _control_flow_error(self.varying, _user_location())


class _Size:
    """A size known when the loss runs: a batch dimension, an offset, the
    world size. Supports + - * with ints and sizes; in tensor arithmetic it
    is a 0-d tensor."""

    __hash__ = object.__hash__

    def __init__(self, tr, kind, args, loc, varying=False, batch=False,
                 rank=False):
        self.tr, self.kind, self.args, self.loc = tr, kind, args, loc
        self.varying = varying
        self.batch = batch    # this rank's share of an axis split across ranks
        self.rank = rank      # derived from dloss.rank()

    def key(self):
        parts = [self.kind]
        for a in self.args:
            if isinstance(a, _Size):
                parts.append(a.key())
            elif isinstance(a, _Tensor):
                name = getattr(a, "input_name", None)
                parts.append(("input", name) if name else ("tensor", id(a)))
            else:
                parts.append(a)
        return tuple(parts)

    def of_inputs(self):
        """Computed from the inputs' sizes and the rank facts only."""
        return all(a.of_inputs() if isinstance(a, _Size) else
                   getattr(a, "input_name", None) is not None
                   if isinstance(a, _Tensor) else True for a in self.args)

    def rebased(self, tr, inputs):
        """This size in another trace whose inputs are `inputs` (by name)."""
        args = tuple(a.rebased(tr, inputs) if isinstance(a, _Size) else
                     inputs[a.input_name] if isinstance(a, _Tensor) else a
                     for a in self.args)
        return _Size(tr, self.kind, args, self.loc, self.varying, self.batch,
                     self.rank)

    def value(self, loc=None):
        """The builder's Size, made at its first use (`loc`)."""
        key = self.key()
        cached = self.tr.sizes.get(key)
        if cached is not None:
            return cached
        loc = loc or self.loc
        g, k, a = self.tr.g, self.kind, self.args
        if k == "dim":
            v = g.dim(a[0].node, a[1], *loc)
        elif k == "global":
            v = g.global_size(a[0].node, a[1], *loc)
        elif k == "offset":
            v = g.shard_offset(a[0].node, a[1], *loc)
        elif k == "rank":
            v = g.rank(*loc)
        elif k == "world":
            v = g.world_size(*loc)
        else:  # add, sub, mul
            v = g.size_arith(k, self.tr.size(a[0], loc),
                             self.tr.size(a[1], loc), *loc)
        self.tr.sizes[key] = v
        return v

    def has_dim(self):
        if self.kind == "dim":
            return True
        return any(isinstance(a, _Size) and a.has_dim() for a in self.args)

    def glob(self, loc=None):
        """The sum over ranks of a batch size (its global counterpart),
        built at `loc`."""
        loc = loc or self.loc
        if self.kind == "dim":
            return _Size(self.tr, "global", self.args, loc)
        if self.kind == "add":
            return _size_op("add", self.args[0].glob(loc),
                            self.args[1].glob(loc), loc)
        raise AssertionError("no global size for " + self.kind)

    # Arithmetic.
    def __add__(self, other):
        return _size_op("add", self, other, _user_location())

    def __radd__(self, other):
        return _size_op("add", other, self, _user_location())

    def __sub__(self, other):
        return _size_op("sub", self, other, _user_location())

    def __rsub__(self, other):
        return _size_op("sub", other, self, _user_location())

    def __mul__(self, other):
        return _size_op("mul", self, other, _user_location())

    def __rmul__(self, other):
        return _size_op("mul", other, self, _user_location())

    def __truediv__(self, other):
        return _rules.binary("div", self, other, _user_location())

    def __rtruediv__(self, other):
        return _rules.binary("div", other, self, _user_location())

    def __neg__(self):
        return _size_op("sub", 0, self, _user_location())

    # Anything that needs the number itself is control flow.
    def _compare(self, other):
        varying = self.varying or getattr(other, "varying", False)
        return _Cond(varying, _user_location())

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __bool__(self):
        _control_flow_error(self.varying, _user_location())

    def __index__(self):
        fail("a size known only when the loss runs (a batch size, an "
             "offset, the world size) is used as a Python number at "
             "%s" % _code(_user_location()),
             "Python loops and indexing over it would make each rank run a "
             "different program. Use tensor operations (torch.arange(n), "
             "sums) instead", _user_location())

    __int__ = __index__

    def __repr__(self):
        return "<dloss size %s>" % self.kind


def _size_op(kind, a, b, loc):
    if isinstance(a, bool) or isinstance(b, bool) or not all(
            isinstance(v, (int, _Size)) for v in (a, b)):
        if isinstance(a, (_Value, float)) or isinstance(b, (_Value, float)):
            return _rules.binary(kind, a, b, loc)
        return NotImplemented
    if isinstance(a, int) and isinstance(b, int):
        return {"add": a + b, "sub": a - b, "mul": a * b}[kind]
    if kind == "mul":
        for x, y in ((a, b), (b, a)):
            if isinstance(x, _Size) and x.rank and \
                    isinstance(y, _Size) and y.has_dim():
                fail("%s multiplies a batch size by the rank: that is this "
                     "rank's first global row only when every rank holds "
                     "the same number of rows" % _code(loc),
                     "Use dloss.shard_offset(x), the sum of the lower "
                     "ranks' sizes, which is right for uneven batches too",
                     loc)
        if _is_one(a):
            return b
        if _is_one(b):
            return a
    if kind == "add":
        if isinstance(a, int) and a == 0:
            return b
        if isinstance(b, int) and b == 0:
            return a
    if kind == "sub" and isinstance(b, int) and b == 0:
        return a
    tr = a.tr if isinstance(a, _Size) else b.tr
    sizes = [v for v in (a, b) if isinstance(v, _Size)]
    batch = kind == "add" and all(isinstance(v, _Size) and v.batch
                                  for v in (a, b))
    return _Size(tr, kind, (a, b), loc,
                 varying=any(v.varying for v in sizes), batch=batch,
                 rank=any(v.rank for v in sizes))


# ---------------------------------------------------------------------------
# Stand-in tensors.
# ---------------------------------------------------------------------------

class _Shape(tuple):
    """x.shape: ints where fixed, dloss sizes where known only at run time."""

    def numel(self):
        n = 1
        for d in self:
            n = n * d
        return n


def _is_one(d):
    return isinstance(d, int) and not isinstance(d, bool) and d == 1


class _Value:
    """Anything that stands for a tensor while a loss is traced. Subclasses
    set tr, dims, dtype, varying, note (where it started to vary), loc."""

    __hash__ = object.__hash__

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _rules.call_torch(func, args, kwargs or {})

    # Facts about the tensor.
    @property
    def ndim(self):
        return len(self.dims)

    @property
    def shape(self):
        return _Shape(self.dims)

    def size(self, dim=None):
        if dim is None:
            return _Shape(self.dims)
        return self.dims[_axis(dim, self.ndim, _user_location())]

    def dim(self):
        return len(self.dims)

    def numel(self):
        return _Shape(self.dims).numel()

    @property
    def device(self):
        return torch.device("cpu")

    @property
    def requires_grad(self):
        return False

    @property
    def is_cuda(self):
        return False

    def __len__(self):
        if self.ndim and isinstance(self.dims[0], int):
            return self.dims[0]
        fail("len() of a tensor whose first dimension is known only when "
             "the loss runs, at %s" % _code(_user_location()),
             "Use x.shape[0], a size that works in tensor arithmetic",
             _user_location())

    def __iter__(self):
        fail("iterating over a tensor at %s" % _code(_user_location()),
             "A Python loop over a tensor runs once per row, a number known "
             "only when the loss runs; write it with tensor operations",
             _user_location())

    def __bool__(self):
        _control_flow_error(self.varying, _user_location())

    def item(self):
        fail("x.item() at %s: the value is known only when the loss runs" %
             _code(_user_location()),
             "Keep it a tensor (a 0-d tensor broadcasts in arithmetic)",
             _user_location())

    __float__ = __int__ = __index__ = item

    def __repr__(self):
        return "<dloss traced tensor %s %s>" % (
            self.dtype, list(map(_dim_text, self.dims)))

    # Operators.
    def __add__(self, o):
        return _rules.binary("add", self, o, _user_location())

    def __radd__(self, o):
        return _rules.binary("add", o, self, _user_location())

    def __sub__(self, o):
        return _rules.binary("sub", self, o, _user_location())

    def __rsub__(self, o):
        return _rules.binary("sub", o, self, _user_location())

    def __mul__(self, o):
        return _rules.binary("mul", self, o, _user_location())

    def __rmul__(self, o):
        return _rules.binary("mul", o, self, _user_location())

    def __truediv__(self, o):
        return _rules.binary("div", self, o, _user_location())

    def __rtruediv__(self, o):
        return _rules.binary("div", o, self, _user_location())

    def __matmul__(self, o):
        return _rules.matmul(self, o, _user_location())

    def __rmatmul__(self, o):
        return _rules.matmul(o, self, _user_location())

    def __neg__(self):
        return _rules.unary("neg", self, _user_location())

    def __pos__(self):
        return self

    def __pow__(self, p):
        return _rules.power(self, p, _user_location())

    def __eq__(self, o):
        return _rules.binary("eq", self, o, _user_location())

    def __ne__(self, o):
        return _rules.binary("ne", self, o, _user_location())

    def __and__(self, o):
        return _rules.binary("and", self, o, _user_location())

    __rand__ = __and__

    def __or__(self, o):
        return _rules.binary("or", self, o, _user_location())

    __ror__ = __or__

    def __invert__(self):
        return _rules.logical_not(self, _user_location())

    def _order(self, o):
        return _Order(self, o, _user_location())

    __lt__ = __le__ = __gt__ = __ge__ = _order

    def __getitem__(self, index):
        return _rules.getitem(self, index, _user_location())

    @property
    def T(self):
        return _rules.transpose(self, _user_location())

    @property
    def mT(self):
        return _rules.transpose(self, _user_location())

    def __getattr__(self, name):
        if name.startswith("_") or name in _INTERNAL:
            raise AttributeError(name)
        method = _rules.methods.get(name)
        if method is None:
            _rules.unsupported("Tensor." + name, _user_location())
        return functools.partial(method, self)


_INTERNAL = {"tr", "node", "dims", "dtype", "ir", "varying", "note", "loc",
             "base", "made", "x", "s", "scale_first", "start", "count",
             "positions", "fn", "args", "input_name"}


def _dim_text(d):
    return str(d) if isinstance(d, int) else "?"


def _axis(d, ndim, loc):
    if not isinstance(d, int) or not -max(ndim, 1) <= d < max(ndim, 1):
        fail("dimension %r is out of range for a %d-dim tensor at %s" % (
            d, ndim, _code(loc)), "Dimensions count from 0", loc)
    return d % max(ndim, 1)


class _Order(_Value):
    """x < y: dloss has no ordering op; only its use as a condition (control
    flow) gets a specific message."""

    def __init__(self, a, b, loc):
        self.loc = loc
        self.varying = any(isinstance(v, (_Value, _Size)) and v.varying
                           for v in (a, b))

    def __bool__(self):
        _control_flow_error(self.varying, _user_location())

    def __getattribute__(self, name):
        if name in ("__bool__", "loc", "varying", "__class__"):
            return object.__getattribute__(self, name)
        _rules.unsupported("comparison <, <=, >, >= (dloss compares with "
                           "== only)", object.__getattribute__(self, "loc"))


class _Tensor(_Value):
    """A tensor of the graph: `t` is the builder's; `ir` its element type in
    the IR (a bool mask is an indicator in another type)."""

    def __init__(self, tr, t, dims, dtype, varying, note, loc, ir=None):
        self.tr, self.node, self.dtype = tr, t, dtype
        self.ir = ir or dtype
        self.varying, self.note, self.loc = varying, note, loc
        shape = t.shape
        if len(shape) != len(dims):
            raise AssertionError("dloss trace: rank %d vs %d at %s" % (
                len(shape), len(dims), _text(loc)))
        self.dims = tuple(s if s >= 0 else d for s, d in zip(shape, dims))


class _Transposed(_Value):
    """x.T of a 2-D tensor: dloss has no transpose op, so it lives in a
    matmul's transpose flags."""

    def __init__(self, base, loc):
        self.base, self.loc, self.tr = base, loc, base.tr
        self.dims = tuple(reversed(base.dims))
        self.dtype, self.varying, self.note = base.dtype, base.varying, \
            base.note


class _Scaled(_Value):
    """s * x with s 0-d, kept apart until it is known whether a matmul reads
    it: (s * a) @ b is emitted as s * (a @ b), the form the fusion patterns
    match (OpenCLIP writes `logit_scale * image @ text.T`)."""

    def __init__(self, x, s, scale_first, loc):
        self.x, self.s, self.scale_first, self.loc = x, s, scale_first, loc
        self.tr = x.tr
        self.dims, self.dtype = x.dims, x.dtype
        self.varying = x.varying or s.varying
        self.note = x.note if x.varying else s.note
        self.made = None


class _Arange(_Value):
    """torch.arange: start and count are sizes, so adding an offset moves
    the start (arange(n) + shard_offset = the global row indices)."""

    def __init__(self, tr, start, count, dtype, loc):
        self.tr, self.start, self.count, self.loc = tr, start, count, loc
        self.dims, self.dtype = (count,), dtype
        self.varying = any(isinstance(v, _Size) and v.varying
                           for v in (start, count))
        self.note = (loc, "{code} uses this rank's sizes")
        self.made = None

    def key(self):
        """A name for it across traces when it depends on the inputs' sizes
        alone (None otherwise)."""
        parts = []
        for v in (self.start, self.count):
            if isinstance(v, _Size):
                if not v.of_inputs():
                    return None
                parts.append(v.key())
            else:
                parts.append(("const", v))
        return ("arange", str(self.dtype)) + tuple(parts)


class _Unsq(_Value):
    """`base` viewed with size-1 axes inserted (x[:, None], keepdim=True,
    gather's column): broadcast against a tensor of the full shape."""

    def __init__(self, base, ndim, positions, loc):
        self.base, self.loc, self.tr = base, loc, base.tr
        self.positions = tuple(positions)  # where base's dims sit
        dims = [1] * ndim
        for p, d in zip(self.positions, base.dims):
            dims[p] = d
        self.dims = tuple(dims)
        self.dtype, self.varying, self.note = base.dtype, base.varying, \
            base.note


class _Bcast(_Value):
    """An element-wise op whose operands broadcast to a shape that no tensor
    has yet (rows[:, None] == cols[None, :]): built next to one that has."""

    def __init__(self, fn, args, dims, dtype, loc):
        self.fn, self.args, self.dims, self.dtype, self.loc = \
            fn, args, dims, dtype, loc
        vs = [a for a in args if isinstance(a, _Value)]
        self.tr = vs[0].tr
        self.varying = any(a.varying for a in vs)
        self.note = next((a.note for a in vs if a.varying), None)


class _MaxResult(tuple):
    """torch.max(x, dim): (values, indices); dloss has no argmax."""

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        return self[1]


class _NoIndices:
    def __init__(self, loc):
        self.loc = loc

    def __getattr__(self, name):
        _rules.unsupported("the indices of max/min", self.loc)
