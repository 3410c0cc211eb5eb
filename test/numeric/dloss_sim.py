"""A reference interpreter of dloss IR: N simulated ranks in one process.

This is a test oracle, deliberately independent of the compiler: it reads the
*generic* form that `dloss-opt --mlir-print-op-generic` prints and implements
every `dloss.*` op from its documented meaning (docs/DlossDialect.md) with
torch, in float64. It shares no code or rule with the C++ adjoints, so a
disagreement between the two is a real signal.

The loss functions are straight-line (one block), so the N ranks run in
lockstep, op by op: when a collective is reached every rank's operand is
already known and the collective is just a function of the N values.

All floating-point element types are simulated in float64 (the oracle checks
the math, not rounding); integer element types in int64; `index` values are
Python ints. Local ops are written with differentiable torch ops, so running a
function on one rank under torch.autograd gives the single-device gradient.
"""

import ast
import re
import struct

import numpy as np
import torch

FLOAT = torch.float64
INT = torch.int64

# The generic form spells a dloss enum as `#dloss<reduce_kind sum>`
# (dialect/DlossBase.td); the simulator keeps only the case name.
_ENUM_RE = re.compile(r"#dloss<(\w+)\s+(\w+)>")


class SimError(Exception):
    """An IR construct or a run-time condition the simulator rejects."""


# ----------------------------------------------------------------------------
# Types
# ----------------------------------------------------------------------------

class TensorType:
    """A ranked tensor type; `shape` holds None for a dynamic (`?`) dim."""

    def __init__(self, shape, elem):
        self.shape = shape
        self.elem = elem

    @property
    def is_float(self):
        return self.elem.startswith(("f", "bf", "tf"))

    @property
    def dtype(self):
        return FLOAT if self.is_float else INT

    def __repr__(self):
        dims = "".join(("?" if d is None else str(d)) + "x" for d in self.shape)
        return f"tensor<{dims}{self.elem}>"


class IndexType:
    def __repr__(self):
        return "index"


def parse_type(text):
    text = text.strip()
    if text == "index":
        return IndexType()
    m = re.fullmatch(r"tensor<(.*)>", text)
    if not m:
        raise SimError(f"unsupported type '{text}'")
    parts = m.group(1).split("x")
    elem = parts[-1]
    shape = [None if p == "?" else int(p) for p in parts[:-1]]
    return TensorType(shape, elem)


# ----------------------------------------------------------------------------
# A small parser for the generic textual form
# ----------------------------------------------------------------------------

def split_top(text, sep=","):
    """Splits at `sep` outside brackets and strings (`->` is not a bracket)."""
    parts, depth, start, i, in_str = [], 0, 0, 0, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif text.startswith("->", i):
            i += 1
        elif c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    tail = text[start:]
    if tail.strip() or parts:
        parts.append(tail)
    return [p.strip() for p in parts if p.strip()]


def match_bracket(text, start):
    """Index just past the bracket that closes the one at text[start]."""
    pairs = {"<": ">", "(": ")", "[": "]", "{": "}"}
    stack, i, in_str = [], start, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif text.startswith("->", i):
            i += 1
        elif c in pairs:
            stack.append(pairs[c])
        elif c in ">)]}":
            if not stack or stack.pop() != c:
                raise SimError(f"unbalanced brackets in: {text}")
            if not stack:
                return i + 1
        i += 1
    raise SimError(f"unbalanced brackets in: {text}")


def _hex_values(hexstr, ttype):
    data = bytes.fromhex(hexstr)
    fmt = {"f64": "<f8", "f32": "<f4", "f16": "<f2", "i64": "<i8", "i32": "<i4",
           "i16": "<i2", "i8": "<i1", "i1": "<u1"}
    if ttype.elem == "bf16":
        raw = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).astype(np.float64)
    if ttype.elem not in fmt:
        raise SimError(f"hex dense constant of type {ttype} is not supported")
    return np.frombuffer(data, dtype=fmt[ttype.elem]).astype(
        np.float64 if ttype.is_float else np.int64)


def parse_dense(body, ttype):
    """The value of `dense<body> : ttype` as a torch tensor."""
    shape = [d for d in ttype.shape]
    if any(d is None for d in shape):
        raise SimError(f"dense constant of dynamic type {ttype}")
    body = body.strip()
    if body.startswith('"0x'):
        flat = _hex_values(body[3:-1], ttype)
        values = flat if flat.size != 1 else np.full(shape, flat[0])
        return torch.tensor(np.asarray(values).reshape(shape), dtype=ttype.dtype)
    if re.fullmatch(r"0x[0-9A-Fa-f]+", body):
        # A splat float given by its bit pattern (infinities, NaNs).
        bits = int(body, 16)
        if ttype.elem == "f64":
            v = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
        elif ttype.elem == "f32":
            v = struct.unpack("<f", bits.to_bytes(4, "little"))[0]
        elif ttype.elem == "bf16":
            v = struct.unpack("<f", (bits << 16).to_bytes(4, "little"))[0]
        else:
            raise SimError(f"hex float splat of type {ttype} is not supported")
        return torch.full(shape, v, dtype=ttype.dtype)
    lit = re.sub(r"\btrue\b", "1", re.sub(r"\bfalse\b", "0", body))
    value = ast.literal_eval(lit)
    if isinstance(value, (list, tuple)):
        out = torch.tensor(value, dtype=ttype.dtype).reshape(shape)
    else:
        out = torch.full(shape, value, dtype=ttype.dtype)
    # A decimal literal means the nearest value of its element type (0.1 :
    # f32 is 0.100000001490116...), as a pass that reads the attribute (a
    # fused op's constant) sees it.
    narrow = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    if ttype.elem in narrow:
        out = out.to(narrow[ttype.elem]).to(ttype.dtype)
    return out


def parse_attr_value(text):
    text = text.strip()
    if text.startswith('"'):
        return ast.literal_eval(text)
    if text in ("unit",):
        return True
    if text in ("true", "false"):
        return text == "true"
    m = re.fullmatch(r"array<\w+(?::(.*))?>", text, re.S)
    if m:
        return [int(v) for v in split_top(m.group(1) or "")]
    if text.startswith("dense<"):
        end = match_bracket(text, len("dense"))
        ttype = parse_type(text[end:].lstrip()[1:].strip().lstrip(":").strip())
        return parse_dense(text[len("dense<"):end - 1], ttype)
    if text.startswith("["):
        return [parse_attr_value(v) for v in split_top(text[1:-1])]
    if text.startswith("{"):
        return parse_attr_dict(text)
    if text.startswith("("):  # a function type
        return text
    m = _ENUM_RE.fullmatch(text)
    if m:
        return m.group(2)
    m = re.fullmatch(r"(\S+)\s*:\s*(\w+)", text)
    if m:
        num, ty = m.groups()
        if ty.startswith(("i", "si", "ui")) or ty == "index":
            return int(num, 0)
        return float(num)
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # left as text; the op handlers say if it matters


def parse_attr_dict(text):
    """`{a = 1 : i64, unit_attr, "q.k" = ...}` -> dict (unit attrs map to True)."""
    text = text.strip()
    if text.startswith("<{"):
        text = text[1:-1]
    inner = text[1:-1]
    out = {}
    for item in split_top(inner):
        key, eq, value = item.partition("=")
        key = key.strip().strip('"')
        out[key] = parse_attr_value(value) if eq else True
    return out


class Op:
    def __init__(self, name, results, operands, props, attrs, operand_types,
                 result_types, line):
        self.name = name
        self.results = results
        self.operands = operands
        self.props = props
        self.attrs = attrs
        self.operand_types = operand_types
        self.result_types = result_types
        self.line = line

    def attr(self, key, default=None):
        if key in self.props:
            return self.props[key]
        return self.attrs.get(key, default)


class Func:
    def __init__(self, name, arg_types, arg_attrs, result_types):
        self.name = name
        self.arg_types = arg_types
        self.arg_attrs = arg_attrs
        self.result_types = result_types
        self.arg_names = []
        self.ops = []
        self.attrs = {}

    @property
    def grad_mode(self):
        return self.attrs.get("dloss.grad_mode", "ddp")


def parse_function_type(text):
    m = re.fullmatch(r"\((.*?)\)\s*->\s*(.*)", text.strip(), re.S)
    if not m:
        raise SimError(f"bad function type '{text}'")
    args = [parse_type(t) for t in split_top(m.group(1))]
    res = m.group(2).strip()
    if res.startswith("("):
        results = [parse_type(t) for t in split_top(res[1:-1])]
    else:
        results = [parse_type(res)]
    return args, results


_OP_RE = re.compile(r'^(?:(%[\w$.-]+)(?::(\d+))? = )?"([\w.]+)"\((.*?)\)(.*)$')


def parse_op_line(line):
    m = _OP_RE.match(line)
    if not m:
        raise SimError(f"cannot parse line: {line}")
    res, nres, name, operands, rest = m.groups()
    results = []
    if res:
        results = [res] if not nres else [f"{res}#{i}" for i in range(int(nres))]
    operands = [o.strip() for o in operands.split(",") if o.strip()]
    rest = rest.strip()
    props, attrs = {}, {}
    if rest.startswith("<{"):
        end = match_bracket(rest, 0)
        props = parse_attr_dict(rest[:end])
        rest = rest[end:].strip()
    region = rest.startswith("({")
    if region:
        return name, results, operands, props, attrs, None, None, True
    if rest.startswith("{"):
        end = match_bracket(rest, 0)
        attrs = parse_attr_dict(rest[:end])
        rest = rest[end:].strip()
    if not rest.startswith(":"):
        raise SimError(f"cannot parse the types of: {line}")
    fn_type = rest[1:].strip()
    m2 = re.fullmatch(r"\((.*?)\)\s*->\s*(.*)", fn_type)
    operand_types = [parse_type(t) for t in split_top(m2.group(1))]
    res_text = m2.group(2).strip()
    if res_text.startswith("("):
        result_types = [parse_type(t) for t in split_top(res_text[1:-1])]
    else:
        result_types = [parse_type(res_text)]
    return name, results, operands, props, attrs, operand_types, result_types, False


def parse_module(text):
    """Parses dloss-opt's generic output into {function name: Func}."""
    funcs = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("//"):
            continue
        if line.startswith('"builtin.module"'):
            continue
        if line.startswith('"func.func"'):
            _, _, _, props, _, _, _, _ = parse_op_line(line)
            arg_types, result_types = parse_function_type(props["function_type"])
            arg_attrs = props.get("arg_attrs", [{} for _ in arg_types])
            current = Func(props["sym_name"], arg_types, arg_attrs, result_types)
            funcs[current.name] = current
            continue
        if line.startswith("^"):
            if current is None or current.arg_names or current.ops:
                raise SimError("only single-block functions are supported: " + line)
            m = re.fullmatch(r"\^\w+(?:\((.*)\))?:", line)
            if m.group(1):
                current.arg_names = [a.split(":")[0].strip()
                                     for a in split_top(m.group(1))]
            continue
        if line.startswith("})"):
            if current is not None:
                rest = line[2:].strip()
                if rest.startswith("{"):
                    current.attrs = parse_attr_dict(rest[:match_bracket(rest, 0)])
                current = None
            continue
        if current is None:
            raise SimError(f"unexpected line outside a function: {line}")
        name, results, operands, props, attrs, otypes, rtypes, region = \
            parse_op_line(line)
        if region:
            raise SimError(f"op '{name}' has regions; the simulator only runs "
                           "straight-line functions")
        current.ops.append(Op(name, results, operands, props, attrs, otypes,
                              rtypes, line))
    return funcs


# ----------------------------------------------------------------------------
# Op semantics
# ----------------------------------------------------------------------------

def _check_broadcast(op, a, b):
    """Element-wise operands: same shape, or one of them 0-d."""
    if a.dim() != 0 and b.dim() != 0 and a.shape != b.shape:
        raise SimError(f"operand shapes {tuple(a.shape)} and "
                       f"{tuple(b.shape)} differ (only 0-d operands broadcast)")


def _binary(fn):
    def run(op, a, b):
        _check_broadcast(op, a, b)
        return fn(a, b)
    return run


def _take_along(x, idx, axis):
    idx = idx.to(INT)
    n = x.shape[axis]
    if idx.numel() and (idx.min() < 0 or idx.max() >= n):
        raise SimError(f"index out of range [0, {n})")
    return torch.gather(x, axis, idx.unsqueeze(axis)).squeeze(axis)


def _put_along(x, idx, values, axis):
    _take_along(x, idx, axis)  # range check
    return x.scatter(axis, idx.to(INT).unsqueeze(axis),
                     values.to(x.dtype).unsqueeze(axis))


def _reduce(kind, x, axes):
    axes = [a % x.dim() for a in axes] if x.dim() else []
    if not axes:
        return x
    if kind == "sum":
        return torch.sum(x, dim=axes)
    if kind == "mean":
        return torch.mean(x, dim=axes)
    # amax/amin split the gradient evenly between tied elements.
    if kind == "max":
        return torch.amax(x, dim=axes)
    if kind == "min":
        return torch.amin(x, dim=axes)
    raise SimError(f"unknown reduce kind {kind}")


def _l2_normalize_grad(g, x, axis, eps):
    """l2_normalize's vector-Jacobian product, written as torch ops so that
    torch.autograd gives the reference of its own adjoint."""
    norm = torch.linalg.vector_norm(x, dim=axis, keepdim=True)
    n = norm.clamp_min(eps)
    y = x / n
    along = (g * y).sum(dim=axis, keepdim=True) * (norm >= eps).to(x.dtype)
    return (g - y * along) / n


def _expand(x, axes, like_shape):
    for a in sorted(axes):
        x = x.unsqueeze(a)
    if x.dim() != len(like_shape):
        raise SimError(f"rank mismatch {tuple(x.shape)} vs {tuple(like_shape)}")
    for d, (s, t) in enumerate(zip(x.shape, like_shape)):
        if d not in axes and s != t:
            raise SimError(f"shape {tuple(x.shape)} does not fit like "
                           f"{tuple(like_shape)} without axes {axes}")
    return x.expand(*like_shape)


def _matmul(op, a, b):
    if a.dim() != 2 or b.dim() != 2:
        raise SimError("operands must be 2-D")
    if op.attr("transpose_lhs"):
        a = a.t()
    if op.attr("transpose_rhs"):
        b = b.t()
    if a.shape[1] != b.shape[0]:
        raise SimError(f"inner dims {a.shape[1]} and {b.shape[0]} differ")
    return a @ b


def _softplus(x):
    # log(1 + exp(x)) computed stably; its exact derivative is sigmoid(x)
    # (torch's softplus switches to x above a threshold, whose derivative 1 is
    # off by ~1e-9 there, which is the tolerance of this oracle).
    return torch.logaddexp(x, torch.zeros_like(x))


def _cast(op, x):
    rtype = op.result_types[0]
    if isinstance(x, int):
        return torch.tensor(x, dtype=rtype.dtype)
    return x.to(rtype.dtype)


def _slice(x, axis, offset, size):
    if offset < 0 or size < 0 or offset + size > x.shape[axis]:
        raise SimError(f"[{offset}, {offset + size}) is outside axis "
                       f"{axis} of size {x.shape[axis]}")
    return x.narrow(axis, offset, size)


def _pad(x, axis, low, high):
    if low < 0 or high < 0:
        raise SimError(f"negative padding low={low} high={high}")
    def zeros(n):
        shape = list(x.shape)
        shape[axis] = n
        return torch.zeros(shape, dtype=x.dtype)
    return torch.cat([zeros(low), x, zeros(high)], dim=axis)


def _clamp(op, x):
    lo, hi = op.attr("min"), op.attr("max")
    if lo is None and hi is None:
        raise SimError("neither min nor max")
    return torch.clamp(x, min=lo, max=hi)


# Local ops: (op, *operand values of one rank) -> result value.
LOCAL_OPS = {
    "dloss.add": _binary(lambda a, b: a + b),
    "dloss.sub": _binary(lambda a, b: a - b),
    "dloss.mul": _binary(lambda a, b: a * b),
    "dloss.div": _binary(lambda a, b: a / b),
    "dloss.eq": _binary(lambda a, b: (a == b).to(a.dtype)),
    "dloss.select": lambda op, c, a, b: torch.where(c != 0, a, b),
    "dloss.neg": lambda op, x: -x,
    "dloss.exp": lambda op, x: torch.exp(x),
    "dloss.log": lambda op, x: torch.log(x),
    "dloss.sqrt": lambda op, x: torch.sqrt(x),
    "dloss.stop_gradient": lambda op, x: x.detach(),
    "dloss.sin": lambda op, x: torch.sin(x),
    "dloss.cos": lambda op, x: torch.cos(x),
    "dloss.acos": lambda op, x: torch.acos(x),
    "dloss.sigmoid": lambda op, x: torch.sigmoid(x),
    "dloss.softplus": lambda op, x: _softplus(x),
    "dloss.log_sigmoid": lambda op, x: torch.nn.functional.logsigmoid(x),
    "dloss.clamp": _clamp,
    "dloss.cast": _cast,
    "dloss.zeros_like": lambda op, x: torch.zeros_like(x).detach(),
    "dloss.matmul": _matmul,
    "dloss.l2_normalize": lambda op, x: torch.nn.functional.normalize(
        x, p=2.0, dim=op.attr("axis"), eps=op.attr("eps", 1e-12)),
    "dloss.l2_normalize_grad": lambda op, g, x: _l2_normalize_grad(
        g, x, op.attr("axis"), op.attr("eps", 1e-12)),
    "dloss.reduce": lambda op, x: _reduce(op.attr("kind"), x,
                                          op.attr("axes")),
    "dloss.logsumexp": lambda op, x: torch.logsumexp(x, dim=op.attr("axis")),
    "dloss.take_along": lambda op, x, i: _take_along(x, i, op.attr("axis")),
    "dloss.put_along": lambda op, x, i, v: _put_along(x, i, v, op.attr("axis")),
    "dloss.cross_entropy": lambda op, x, t: (
        torch.logsumexp(x, dim=op.attr("axis")) - _take_along(x, t, op.attr("axis"))),
    "dloss.arange": lambda op, start, count: torch.arange(
        start, start + count, dtype=op.result_types[0].dtype),
    "dloss.expand": lambda op, x, like: _expand(x, op.attr("axes"), like.shape),
    "dloss.slice": lambda op, x, off, size: _slice(x, op.attr("axis"), off, size),
    "dloss.pad": lambda op, x, low, high: _pad(x, op.attr("axis"), low, high),
    "dloss.dim": lambda op, x: int(x.shape[op.attr("axis")]),
    "arith.addi": lambda op, a, b: a + b,
    "arith.subi": lambda op, a, b: a - b,
    "arith.muli": lambda op, a, b: a * b,
    "arith.divsi": lambda op, a, b: _divsi(a, b),
    "arith.maxsi": lambda op, a, b: max(a, b),
    "arith.minsi": lambda op, a, b: min(a, b),
    "arith.cmpi": lambda op, a, b: _cmpi(op, a, b),
    "arith.select": lambda op, c, a, b: a if c else b,
    "arith.index_cast": lambda op, a: a,
}


def _divsi(a, b):
    if b == 0:
        raise SimError("division by zero")
    q = abs(a) // abs(b)  # C's division truncates toward zero
    return q if (a < 0) == (b < 0) else -q


# arith.cmpi's predicates in the generic form's integer encoding (signless
# index values compare as signed; the unsigned forms as their 64-bit images).
_CMPI = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]


def _cmpi(op, a, b):
    pred = op.attr("predicate")
    pred = _CMPI[pred] if isinstance(pred, int) else str(pred).strip('"')
    if pred.startswith("u"):
        a, b, pred = a % 2**64, b % 2**64, "s" + pred[1:]
    return int({"eq": a == b, "ne": a != b, "slt": a < b, "sle": a <= b,
                "sgt": a > b, "sge": a >= b}[pred])


def _same_shapes(name, xs):
    if any(x.shape != xs[0].shape for x in xs):
        raise SimError(f"the ranks hold different shapes "
                       f"{[tuple(x.shape) for x in xs]}")


def _all_gather(op, xs, world):
    axis = op.attr("axis")
    for x in xs:
        rest = [d for i, d in enumerate(x.shape) if i != axis]
        if rest != [d for i, d in enumerate(xs[0].shape) if i != axis]:
            raise SimError("non-gathered dims differ across ranks")
    full = torch.cat(list(xs), dim=axis)
    return [full] * world.size


def _combine(name, kind, xs):
    _same_shapes(name, xs)
    stacked = torch.stack(list(xs))
    if kind == "sum":
        return stacked.sum(0)
    if kind == "mean":
        return stacked.sum(0) / len(xs)
    if kind == "max":
        return torch.amax(stacked, 0)
    if kind == "min":
        return torch.amin(stacked, 0)
    raise SimError(f"unknown kind {kind}")


def _all_reduce(op, xs, world):
    return [_combine("all_reduce", op.attr("kind"), xs)] * world.size


def _reduce_scatter(op, args, world):
    kind = op.attr("kind")
    if kind not in ("sum", "mean"):
        raise SimError(f"kind {kind} is not sum or mean")
    xs = [a[0] for a in args]
    axis = op.attr("axis")
    total = _combine("reduce_scatter", kind, xs)
    n = total.shape[axis]
    if len(args[0]) > 1:
        sizes = [a[1] for a in args]
    else:
        if n % world.size:
            raise SimError(f"without size, the axis size {n} does "
                           f"not divide by {world.size} ranks")
        sizes = [n // world.size] * world.size
    if sum(sizes) != n:
        raise SimError(f"slice sizes {sizes} do not add up to "
                       f"the axis size {n}")
    offsets = np.cumsum([0] + sizes[:-1]).tolist()
    return [total.narrow(axis, o, s) for o, s in zip(offsets, sizes)]


def _broadcast(op, xs, world):
    root = op.attr("root")
    _same_shapes("broadcast", xs)
    if world.single_device:
        # The single-device meaning: there is one copy of everything.
        return list(xs)
    if not 0 <= root < world.size:
        raise SimError(f"root {root} outside [0, {world.size})")
    return [xs[root]] * world.size


def _ring_shift(op, xs, world):
    k = op.attr("shift")
    n = world.size
    return [xs[(r - k) % n] for r in range(n)]


def _shard_offset(op, xs, world):
    sizes = [x.shape[op.attr("axis")] for x in xs]
    return [int(sum(sizes[:r])) for r in range(world.size)]


def _global_size(op, xs, world):
    return [int(sum(x.shape[op.attr("axis")] for x in xs))] * world.size


# Ops that need every rank's operands: (op, per-rank operand(s), world) ->
# per-rank results. Single-operand ops get the list of that operand.
COLLECTIVE_OPS = {
    "dloss.all_gather": _all_gather,
    "dloss.all_reduce": _all_reduce,
    "dloss.broadcast": _broadcast,
    "dloss.ring_shift": _ring_shift,
    "dloss.shard_offset": _shard_offset,
    "dloss.global_size": _global_size,
}
MULTI_OPERAND_COLLECTIVES = {"dloss.reduce_scatter": _reduce_scatter}


# Fused ops (dloss-fuse-gather-similarity): their meaning on the global
# matrices, which the runtime's ring kernels compute tile by tile. Each
# returns one tuple of results per rank.
def _cat(args, i):
    return torch.cat([a[i] for a in args], 0)


def _split(x, sizes):
    return list(torch.split(x, sizes, 0))


def _sizes(args, i):
    return [int(a[i].shape[0]) for a in args]


def _at_targets(m, targets):
    """m[i, targets[i]] for every row i."""
    return m[torch.arange(m.shape[0]), targets.long()]


def _onehot(shape, targets, dtype):
    out = torch.zeros(shape, dtype=dtype)
    out[torch.arange(shape[0]), targets.long()] = 1
    return out


def _per_rank_sums(x, row_sizes):
    """sum of x's rows owned by each rank."""
    return [part.sum() for part in _split(x, row_sizes)]


def _ring_softmax_ce(op, args, world):
    rows, cols, scale = _cat(args, 0), _cat(args, 1), args[0][2]
    rt, ct = _cat(args, 3), _cat(args, 4)
    n, m = _sizes(args, 0), _sizes(args, 1)
    logits = scale * rows @ cols.T
    row_lse, col_lse = torch.logsumexp(logits, 1), torch.logsumexp(logits, 0)
    row_ce = row_lse - _at_targets(logits, rt)
    col_ce = col_lse - _at_targets(logits.T, ct)
    return list(zip(_split(row_ce, n), _split(col_ce, m), _split(row_lse, n),
                    _split(col_lse, m)))


def _ring_softmax_ce_grad(op, args, world):
    rows, cols, scale = _cat(args, 0), _cat(args, 1), args[0][2]
    rt, ct = _cat(args, 3), _cat(args, 4)
    row_lse, col_lse, ct_row, ct_col = (_cat(args, i) for i in (5, 6, 7, 8))
    n, m = _sizes(args, 0), _sizes(args, 1)
    sim = rows @ cols.T
    logits = scale * sim
    by_row = ct_row[:, None] * (torch.exp(logits - row_lse[:, None])
                                - _onehot(logits.shape, rt, logits.dtype))
    by_col = ct_col[None, :] * (torch.exp(logits - col_lse[None, :])
                                - _onehot(logits.T.shape, ct, logits.dtype).T)
    grad = by_row + by_col
    d_rows, d_cols = scale * grad @ cols, scale * grad.T @ rows
    # Each rank's share of d scale: its rows' losses and its columns' losses.
    shares = [a + b for a, b in zip(_per_rank_sums((by_row * sim).sum(1), n),
                                    _per_rank_sums((by_col * sim).sum(0), m))]
    return list(zip(_split(d_rows, n), _split(d_cols, m), shares))


def _softplus_t(x):
    return torch.nn.functional.softplus(x)


def _ring_sigmoid_pairs(op, args, world):
    rows, cols, scale, bias = _cat(args, 0), _cat(args, 1), args[0][2], args[0][3]
    targets, n = _cat(args, 4), _sizes(args, 0)
    logits = scale * rows @ cols.T + bias
    return list(zip(_split(_softplus_t(logits).sum(1), n),
                    _split(_at_targets(logits, targets), n)))


def _ring_sigmoid_pairs_grad(op, args, world):
    rows, cols, scale, bias = _cat(args, 0), _cat(args, 1), args[0][2], args[0][3]
    targets, ct_pair, ct_pos = _cat(args, 4), _cat(args, 5), _cat(args, 6)
    n, m = _sizes(args, 0), _sizes(args, 1)
    sim = rows @ cols.T
    logits = scale * sim + bias
    grad = (ct_pair[:, None] * torch.sigmoid(logits)
            + ct_pos[:, None] * _onehot(logits.shape, targets, logits.dtype))
    d_rows, d_cols = scale * grad @ cols, scale * grad.T @ rows
    return list(zip(_split(d_rows, n), _split(d_cols, m),
                    _per_rank_sums((grad * sim).sum(1), n),
                    _per_rank_sums(grad.sum(1), n)))


def _shard_offsets(sizes):
    return np.cumsum([0] + sizes[:-1]).tolist()


def _sharded_softmax(op, args, world):
    # rows and targets are the same on every rank (the gathered batch).
    rows, weights, scale, targets = args[0][0], _cat(args, 1), args[0][2], args[0][3]
    dots = rows @ weights.T
    target = _onehot(dots.shape, targets, torch.bool)
    lse_rest = torch.logsumexp((scale * dots).masked_fill(target, float("-inf")), 1)
    target_dot = _at_targets(dots, targets)
    return [(lse_rest, target_dot)] * world.size


def _sharded_softmax_grad(op, args, world):
    sizes = _sizes(args, 1)
    outs = []
    for a, offset, size in zip(args, _shard_offsets(sizes), sizes):
        rows, w, scale, targets, lse_rest, ct_lse, ct_target = a
        local = targets.long() - offset
        mine = (local >= 0) & (local < size)
        dots = rows @ w.T
        p = torch.exp(scale * dots - lse_rest[:, None])
        hit = torch.zeros_like(p, dtype=torch.bool)
        hit[mine.nonzero().flatten(), local[mine]] = True
        grad = ct_lse[:, None] * p.masked_fill(hit, 0)
        onehot = ct_target[:, None] * hit.to(rows.dtype)
        d_rows = scale * grad @ w + onehot @ w
        d_w = scale * grad.T @ rows + onehot.T @ rows
        outs.append((d_rows, d_w, (grad * dots).sum()))
    return outs


# dloss.fused_similarity: the general family (dialect/DlossOps.td). Its tile
# program is written as torch ops over whole matrices: per rank r, the tile
# E_r holds e(i, j) for r's rows i and every column j the op sees (all
# ranks' columns when gathered, r's classes otherwise). Instruction t of the
# program (4 int64: opcode, a, b, c; runtime/plan/TileEncoding.h's encoding)
# defines register t; `outputs` holds (register, reduction) per result.

# Opcodes, by number (the plan's encoding).
_FS_OPS = ["sim", "col_id", "row", "col", "scalar", "const", "add", "sub",
           "mul", "div", "neg", "exp", "log", "softplus", "log_sigmoid",
           "sigmoid", "cos", "acos", "sin", "sqrt", "clamp", "eq", "select",
           "row_id", "stop_gradient"]
_FS_REDUCE = {0: "sum", 1: "logsumexp"}
_FS_UNARY = {
    "neg": lambda x: -x, "exp": torch.exp, "log": torch.log,
    "softplus": _softplus, "log_sigmoid": torch.nn.functional.logsigmoid,
    "sigmoid": torch.sigmoid, "cos": torch.cos, "acos": torch.acos,
    "sin": torch.sin, "sqrt": torch.sqrt,
    "stop_gradient": lambda x: x.detach(),  # the value, no gradient
}
_FS_BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "eq": lambda a, b: (a == b).to(FLOAT),  # an indicator, no gradient
}


def _bits_to_double(bits):
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def _fs_attrs(op):
    program = op.attr("program") or []
    if len(program) % 4 or not program:
        raise SimError(f"the program holds {len(program)} integers, not 4 per "
                       "instruction")
    instrs = [program[4 * t:4 * t + 4] for t in range(len(program) // 4)]
    outputs = op.attr("outputs") or []
    col_outputs = op.attr("col_outputs") or []

    def pairs(xs, what):
        if len(xs) % 2:
            raise SimError(f"{what} holds {len(xs)} integers, not 2 per result")
        out = [(xs[2 * k], xs[2 * k + 1]) for k in range(len(xs) // 2)]
        for reg, kind in out:
            if not 0 <= reg < len(instrs) or kind not in _FS_REDUCE:
                raise SimError(f"{what}: bad (register {reg}, reduction {kind})")
        return out

    gathered, sharded = bool(op.attr("gathered")), bool(op.attr("sharded"))
    if gathered and sharded:
        raise SimError("both gathered and sharded")
    if col_outputs and not gathered:
        raise SimError("col_outputs on an op that is not gathered")
    return (instrs, pairs(outputs, "outputs"), pairs(col_outputs, "col_outputs"),
            int(op.attr("row_leaves")), int(op.attr("col_leaves")), gathered,
            sharded)


def _fs_tile(instrs, sim, col_id, row_id, row_vals, col_vals, scalars):
    """Every register of the program over one [n, M] tile (float64 tensors)."""
    n, m = sim.shape
    regs = []
    for t, (code, a, b, c) in enumerate(instrs):
        if not 0 <= code < len(_FS_OPS):
            raise SimError(f"instruction {t}: unknown opcode {code}")
        name = _FS_OPS[code]
        if name not in ("sim", "col_id", "row", "col", "scalar", "const",
                        "row_id"):
            for k, r in enumerate((a, b, c)[:3 if name == "select" else 2
                                            if name in _FS_BINARY else 1]):
                if not 0 <= r < t:
                    raise SimError(f"instruction {t} ({name}) reads register "
                                   f"{r}, not an earlier one")
        if name == "sim":
            v = sim
        elif name == "col_id":
            v = col_id[None, :].expand(n, m)
        elif name == "row_id":
            v = row_id[:, None].expand(n, m)
        elif name == "row":
            v = row_vals[a][:, None].expand(n, m)
        elif name == "col":
            v = col_vals[a][None, :].expand(n, m)
        elif name == "scalar":
            v = scalars[a].expand(n, m)
        elif name == "const":
            v = torch.full((n, m), _bits_to_double(a), dtype=FLOAT)
        elif name in _FS_UNARY:
            v = _FS_UNARY[name](regs[a])
        elif name in _FS_BINARY:
            v = _FS_BINARY[name](regs[a], regs[b])
        elif name == "clamp":
            # Both bounds inclusive; torch.clamp passes the gradient there too.
            v = torch.clamp(regs[a], min=_bits_to_double(b), max=_bits_to_double(c))
        elif name == "select":
            v = torch.where(regs[a] != 0, regs[b], regs[c])
        regs.append(v)
    return regs


def _fs_reduce(x, kind, dim):
    return torch.logsumexp(x, dim) if _FS_REDUCE[kind] == "logsumexp" else x.sum(dim)


def _fs_forward(op, args, world, attrs, grad_leaves=None):
    """The results of every rank (row results, then column results) as
    differentiable functions of `grad_leaves`: per rank, the tensors that
    stand for its rows, cols, float row leaves and float 0-d leaves
    (default: the operands themselves)."""
    instrs, outs, col_outs, nrow, ncol, gathered, sharded = attrs
    size = len(args)
    if grad_leaves is None:
        grad_leaves = [list(a) for a in args]
    rows = [g[0] for g in grad_leaves]
    cols = [g[1] for g in grad_leaves]

    def as_float(v):
        return v if v.dtype == FLOAT else v.to(FLOAT)

    row_vals = [[as_float(g[2 + k]) for k in range(nrow)] for g in grad_leaves]
    col_vals = [[as_float(a[2 + nrow + k]) for k in range(ncol)] for a in args]
    first_scalar = 2 + nrow + ncol
    scalars = [[as_float(g[k]) for k in range(first_scalar, len(g))]
               for g in grad_leaves]
    for r in range(size):
        for v in scalars[r]:
            if v.dim() != 0:
                raise SimError("0-d leaves must be 0-d")
        for k, v in enumerate(row_vals[r]):
            if v.shape != (rows[r].shape[0],):
                raise SimError(f"row leaf {k} has shape {tuple(v.shape)}, rows "
                               f"{tuple(rows[r].shape)}")
        for k, v in enumerate(col_vals[r]):
            if v.shape != (cols[r].shape[0],):
                raise SimError(f"column leaf {k} has shape {tuple(v.shape)}, "
                               f"cols {tuple(cols[r].shape)}")

    n = [int(x.shape[0]) for x in rows]
    m = [int(x.shape[0]) for x in cols]
    row_offsets, col_offsets = _shard_offsets(n), _shard_offsets(m)
    tiles = []  # per rank: the registers over its tile
    for r in range(size):
        if gathered:
            # Every rank's columns (and per-column values), in rank order;
            # the column index is global.
            c = torch.cat(cols, 0)
            cv = [torch.cat([col_vals[q][k] for q in range(size)], 0)
                  for k in range(ncol)]
            col_id = torch.arange(sum(m), dtype=FLOAT)
        else:
            c, cv = cols[r], col_vals[r]
            start = col_offsets[r] if sharded else 0  # class shards in rank order
            col_id = torch.arange(start, start + m[r], dtype=FLOAT)
        # The rows' global index: their shard offset plus i (sharded: the
        # rows are the gathered batch, the same on every rank).
        start = 0 if sharded else row_offsets[r]
        row_id = torch.arange(start, start + n[r], dtype=FLOAT)
        if c.shape[1:] != rows[r].shape[1:]:
            raise SimError(f"rows {tuple(rows[r].shape)} and cols "
                           f"{tuple(c.shape)} differ in their feature size")
        tiles.append(_fs_tile(instrs, rows[r] @ c.T, col_id, row_id, row_vals[r],
                              cv, scalars[r]))

    results = []
    if sharded:
        if len(set(n)) != 1:
            raise SimError(f"sharded: the ranks hold different row counts {n}")
        # Every class shard's tile of the same rows: a row reduces over all.
        full = [torch.cat([tiles[r][reg] for r in range(size)], 1)
                for reg, _ in outs]
        vals = [_fs_reduce(x, kind, 1) for x, (_, kind) in zip(full, outs)]
        return [list(vals) for _ in range(size)]
    for r in range(size):
        results.append([_fs_reduce(tiles[r][reg], kind, 1) for reg, kind in outs])
    for reg, kind in col_outs:
        # Each column over every rank's rows; rank q keeps its own columns.
        full = torch.cat([tiles[r][reg] for r in range(size)], 0)
        for q, part in enumerate(_split(_fs_reduce(full, kind, 0), m)):
            results[q].append(part)
    return results


def _fused_similarity(op, args, world):
    attrs = _fs_attrs(op)
    count = len(attrs[1]) + len(attrs[2])
    if len(args[0]) < 2 + attrs[3] + attrs[4]:
        raise SimError("fewer leaves than row_leaves + col_leaves")
    outs = _fs_forward(op, args, world, attrs)
    if any(len(o) != count for o in outs):
        raise SimError("result count mismatch")
    # run_spmd binds a tuple per rank to a multi-result op, else the value.
    return [tuple(o) if count > 1 else o[0] for o in outs]


def _fused_similarity_grad(op, args, world):
    attrs = _fs_attrs(op)
    _, outs, col_outs, nrow, ncol, gathered, sharded = attrs
    nres = len(outs) + len(col_outs)
    nleaves = len(args[0]) - 2 - 2 * nres
    if nleaves < nrow + ncol:
        raise SimError(f"{len(args[0])} operands: too few for {nres} results "
                       f"and their cotangents")
    fwd_args = [a[:2 + nleaves] for a in args]
    cts = [a[2 + nleaves + nres:] for a in args]
    first_scalar = 2 + nrow + ncol
    size = len(args)

    # Differentiable copies, one set per rank: rows, cols, float row leaves
    # and float 0-d leaves (integer leaves get zeros).
    def wants_grad(k, v):
        return v.dtype == FLOAT and (k < 2 or 2 <= k < 2 + nrow or k >= first_scalar)

    leaves = [[v.detach().clone().requires_grad_(wants_grad(k, v))
               for k, v in enumerate(a)] for a in fwd_args]
    with torch.enable_grad():
        results = _fs_forward(op, fwd_args, world, attrs, leaves)
        inputs = [v for g in leaves for v in g if v.requires_grad]

        def grads(pairs):
            """Gradients of sum <result, ct> over `pairs` w.r.t. every input."""
            pairs = [(y, c.to(FLOAT)) for y, c in pairs if y.requires_grad]
            if not pairs:
                return [torch.zeros_like(v) for v in inputs]
            got = torch.autograd.grad([y for y, _ in pairs], inputs,
                                      [c for _, c in pairs], retain_graph=True,
                                      allow_unused=True)
            return [torch.zeros_like(v) if g is None else g
                    for v, g in zip(inputs, got)]

        def by_leaf(flat):
            it = iter(flat)
            return [[next(it) if v.requires_grad else None for v in g]
                    for g in leaves]

        if sharded:
            # The results are invariant and the cotangents the full ones:
            # each shard's partial gradients come from its own tile only.
            total = grads(list(zip(results[0], cts[0])))
            row_part = col_part = by_leaf(total)
            owners = None
        else:
            row_part = by_leaf(grads([(results[r][k], cts[r][k])
                                      for r in range(size) for k in range(len(outs))]))
            col_part = by_leaf(grads([(results[q][k], cts[q][k]) for q in range(size)
                                      for k in range(len(outs), nres)]))
            # The column results' share of each 0-d leaf goes to the
            # columns' owner: one gradient per owner.
            owners = []
            for q in range(size):
                g = by_leaf(grads([(results[q][k], cts[q][k])
                                   for k in range(len(outs), nres)]))
                owners.append([sum(g[r][k] for r in range(size))
                               for k in range(first_scalar, len(leaves[q]))])

    def total(r, k):
        parts = [p[r][k] for p in (row_part, col_part) if p[r][k] is not None]
        if sharded:
            parts = parts[:1]
        return sum(parts) if parts else torch.zeros_like(fwd_args[r][k], dtype=FLOAT)

    out = []
    for r in range(size):
        n = int(fwd_args[r][0].shape[0])
        d_rows, d_cols = total(r, 0), total(r, 1)
        stacked = torch.zeros((nrow, n), dtype=FLOAT)
        for k in range(nrow):
            if leaves[r][2 + k].requires_grad:
                stacked[k] = total(r, 2 + k)
        d_scalars = torch.zeros(nleaves - nrow - ncol, dtype=FLOAT)
        for k in range(first_scalar, 2 + nleaves):
            if not leaves[r][k].requires_grad:
                continue
            own = row_part[r][k]
            if owners is not None:
                own = own + owners[r][k - first_scalar]
            d_scalars[k - first_scalar] = own
        out.append((d_rows, d_cols, stacked, d_scalars))
    return out


# dloss.fused_elementwise (dialect/DlossOps.td): a chain of element-wise
# ops that dloss-fuse-elementwise makes after autodiff. Its program is the
# tile encoding with leaf `element` (opcode 25: operand a of the results'
# shape); per-row leaves hold one value per row (all axes but the last),
# per-column ones one per column (the last axis). `outputs` name the full
# results, `col_sums` further ones: a register summed over the rows (axis
# 0). Evaluated here per rank on whole tensors with torch's broadcasting;
# no communication.
_FE_ELEMENT = 25
_FE_ARITHMETIC = ("add", "sub", "mul", "div", "neg", "sqrt")


def _fused_elementwise(op, args, world):
    program = op.attr("program") or []
    outputs = op.attr("outputs") or []
    col_sums = op.attr("col_sums") or []
    ne, nr, nc = (int(op.attr("elements")), int(op.attr("row_leaves")),
                  int(op.attr("col_leaves")))
    if len(program) % 4 or not program or not outputs + col_sums or ne < 1:
        raise SimError("malformed program, outputs or leaf counts")
    out = []
    for leaves in args:
        elements = leaves[:ne]
        rows, cols = leaves[ne:ne + nr], leaves[ne + nr:ne + nr + nc]
        scalars = leaves[ne + nr + nc:]
        shape = tuple(elements[0].shape)
        regs = []
        for t in range(len(program) // 4):
            code, a, b, _ = program[4 * t:4 * t + 4]
            name = "element" if code == _FE_ELEMENT else (
                _FS_OPS[code] if 0 <= code < len(_FS_OPS) else None)
            if name == "element":
                v = elements[a]
            elif name == "row":
                v = rows[a].reshape(shape[:-1] + (1,))
            elif name == "col":
                v = cols[a]
            elif name == "scalar":
                v = scalars[a]
            elif name == "const":
                v = torch.tensor(_bits_to_double(a), dtype=FLOAT)
            elif name in _FE_ARITHMETIC:
                if not all(0 <= r < t for r in (a, b)[:2 if name in _FS_BINARY
                                                     else 1]):
                    raise SimError(f"instruction {t} reads a later register")
                v = (_FS_BINARY[name](regs[a], regs[b]) if name in _FS_BINARY
                     else _FS_UNARY[name](regs[a]))
            else:
                raise SimError(f"instruction {t}: opcode {code} is not one "
                               "of a fused element-wise program")
            regs.append(v)
        values = [torch.broadcast_to(regs[o], shape) for o in outputs]
        values += [torch.broadcast_to(regs[o], shape).sum(0) for o in col_sums]
        out.append(tuple(values) if len(values) > 1 else values[0])
    return out


MULTI_OPERAND_COLLECTIVES.update({
    "dloss.fused_elementwise": _fused_elementwise,
    "dloss.fused_similarity": _fused_similarity,
    "dloss.fused_similarity_grad": _fused_similarity_grad,
})

MULTI_OPERAND_COLLECTIVES.update({
    "dloss.ring_softmax_ce": _ring_softmax_ce,
    "dloss.ring_softmax_ce_grad": _ring_softmax_ce_grad,
    "dloss.ring_sigmoid_pairs": _ring_sigmoid_pairs,
    "dloss.ring_sigmoid_pairs_grad": _ring_sigmoid_pairs_grad,
    "dloss.sharded_softmax": _sharded_softmax,
    "dloss.sharded_softmax_grad": _sharded_softmax_grad,
})


class World:
    def __init__(self, size, single_device=False):
        self.size = size
        self.single_device = single_device


def run_spmd(func, inputs, single_device=False):
    """Runs `func` on len(inputs) ranks in lockstep.

    inputs[r] is the list of argument values of rank r (torch tensors, or ints
    for index arguments). Returns one list of results per rank.
    single_device: the one-rank run that defines the meaning of a loss;
    collectives are the identity (broadcast ignores its root).
    """
    world = World(len(inputs), single_device)
    if single_device and world.size != 1:
        raise SimError("single_device runs have one rank")
    envs = []
    for r, vals in enumerate(inputs):
        if len(vals) != len(func.arg_names):
            raise SimError(f"@{func.name} takes {len(func.arg_names)} arguments, "
                           f"rank {r} got {len(vals)}")
        envs.append(dict(zip(func.arg_names, vals)))

    def get(env, name):
        if name not in env:
            raise SimError(f"use of undefined value {name}")
        return env[name]

    for op in func.ops:
        try:
            if op.name == "func.return":
                return [[get(env, o) for o in op.operands] for env in envs]
            if op.name == "arith.constant":
                value = op.attr("value")
                if isinstance(op.result_types[0], TensorType):
                    if not torch.is_tensor(value):
                        value = torch.tensor(value, dtype=op.result_types[0].dtype)
                elif not isinstance(value, int):
                    raise SimError(f"unsupported constant {op.line}")
                for env in envs:
                    env[op.results[0]] = value
                continue
            if op.name == "dloss.rank":
                for r, env in enumerate(envs):
                    env[op.results[0]] = r
                continue
            if op.name == "dloss.world_size":
                for env in envs:
                    env[op.results[0]] = world.size
                continue
            if op.name in LOCAL_OPS:
                fn = LOCAL_OPS[op.name]
                for env in envs:
                    env[op.results[0]] = fn(op, *[get(env, o) for o in op.operands])
                continue
            if op.name in COLLECTIVE_OPS:
                if len(op.operands) != 1:
                    raise SimError(f"expected one operand, got {len(op.operands)}")
                xs = [get(env, op.operands[0]) for env in envs]
                outs = COLLECTIVE_OPS[op.name](op, xs, world)
            elif op.name in MULTI_OPERAND_COLLECTIVES:
                args = [[get(env, o) for o in op.operands] for env in envs]
                outs = MULTI_OPERAND_COLLECTIVES[op.name](op, args, world)
            else:
                raise SimError("unknown op: the simulator has no semantics for it")
            for env, out in zip(envs, outs):
                if len(op.results) > 1:
                    # A multi-result op returns one tuple per rank.
                    for name, value in zip(op.results, out):
                        env[name] = value
                else:
                    env[op.results[0]] = out
        except SimError as e:
            raise SimError(f"@{func.name}: {op.name}: {e}\n  at: {op.line}") from None
        except (RuntimeError, IndexError, TypeError) as e:
            raise SimError(f"@{func.name}: {op.name} failed: {e}\n  at: {op.line}") from None
    raise SimError(f"@{func.name} has no func.return")


# Ops run_spmd interprets itself, outside the tables.
SPECIAL_OPS = {"arith.constant", "dloss.rank", "dloss.world_size"}


def known_ops():
    """Every op the simulator gives a meaning (the op-completeness test asks)."""
    return (SPECIAL_OPS | set(LOCAL_OPS) | set(COLLECTIVE_OPS)
            | set(MULTI_OPERAND_COLLECTIVES))


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["--list-ops"]:
        sys.exit("usage: dloss_sim.py --list-ops (the module is the numeric "
                 "checks' oracle; run test/numeric/check_gradients.py)")
    print("\n".join(sorted(known_ops())))
