"""Control flow in a @dloss.loss function: Python control flow on a value
known only when the loss runs is refused, and a condition that differs
across ranks around a collective is named as the hang it would be."""

import ast
import functools

from .. import _C
from .locations import _code, fail

# The calls that communicate: dloss's collectives users may build (the op
# table's, as dloss.<op>, torch.distributed.<op> and dist.<op> share names),
# and torch's and TorchMetrics' other spellings.
_COLLECTIVES = {op["name"].split(".", 1)[1] for op in _C.op_table()
                if op["name"].startswith("dloss.") and op["collective"]
                and not op["internal"]} | {"gather_all_tensors",
                                           "all_gather_into_tensor"}


@functools.lru_cache(maxsize=64)
def _parsed(path):
    try:
        with open(path) as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _branch_collectives(loc):
    """(line, name) of the collective calls in the body of the if/while
    whose condition is at `loc`."""
    tree = _parsed(loc[0])
    if tree is None:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.If, ast.While, ast.IfExp)):
            continue
        test = node.test
        if not test.lineno <= loc[1] <= (test.end_lineno or test.lineno):
            continue
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else \
            [node.orelse]
        for part in body + orelse:
            for call in ast.walk(part):
                if isinstance(call, ast.Call):
                    f = call.func
                    name = f.attr if isinstance(f, ast.Attribute) else \
                        getattr(f, "id", "")
                    if name in _COLLECTIVES:
                        found.append((call.lineno, name))
    return sorted(set(found))


def _control_flow_error(varying, loc):
    calls = _branch_collectives(loc) if varying else []
    if calls:
        line, name = calls[0]
        fail("the condition %s depends on the rank (it differs across "
             "ranks), and its branch calls %s at %s:%d: ranks where the "
             "condition is false never reach that collective, and the job "
             "hangs" % (_code(loc), name, loc[0], line),
             "Make every rank run the collective: move it out of the "
             "condition, and choose values with torch.where(cond, a, b) "
             "(log from rank 0 outside the loss)", loc)
    fail("Python control flow on a value known only when the loss runs, "
         "at %s%s" % (_code(loc), " (it differs across ranks)"
                       if varying else ""),
         "The loss is recorded once and every rank runs the same program, "
         "so a condition on a tensor or a run-time size cannot pick a "
         "branch. Compute both values and choose element-wise with "
         "torch.where(cond, a, b)", loc)
