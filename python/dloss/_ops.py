"""dloss's torch.library custom ops: what torch.compile sees of dloss.

Every compiled loss is called through one op, ``dloss::loss(inputs, key,
requires_grad, site)``, whenever something traces (torch.compile, a
dispatch mode); an eager call runs the same `run` through a plain
autograd.Function instead (dloss/compiled.py, ``_EagerLoss``), which skips
the op's per-call wrapping: `key` names the loss in this module's registry (a
string, so that Dynamo keeps it as a constant), `requires_grad` says which
inputs require grad (a traced graph's tensors carry no such flag; the
runtime's preflight refuses, on every rank, an input that requires grad but
gets no gradient), `site` is the user's ``file:line`` for errors. The op
runs the plan's @<loss>_grad, every collective included, and returns the
loss and the gradients; its registered autograd scales the gradients by the
loss's incoming gradient, so the backward communicates nothing (an op of
torch's, which AOTAutograd records). The fake implementation takes the
output dtypes and the gradients' inputs from the plan, compiling it first
if needed: that runs when Dynamo propagates shapes, never inside the code
Dynamo traces. Shapes stay symbolic: the loss is 0-d and each gradient has
its input's shape.

The op is opaque to Inductor, so the collectives inside it keep the plan's
order. A key is registered by the object that owns the plans
(`register`): it resolves the key's part and the inputs' dtype to a
dloss.CompiledLoss (`_op_target`), compiling on first use.
"""

from __future__ import annotations

import itertools
import weakref
from typing import List

import torch

from .errors import Error, _is_users, caller_location, make_error

# key -> weak reference to the object that resolves it (a module holding
# compiled plans); a dead reference means the loss was deleted.
_TARGETS: dict = {}
_NUMBERS = itertools.count()


def register(owner) -> str:
    """A new key for `owner`, whose ``_op_target(part, inputs)`` returns
    the dloss.CompiledLoss for the key's part (the text after "/", which
    the owner chooses) and these inputs."""
    key = "%s-%d" % (type(owner).__name__, next(_NUMBERS))
    _TARGETS[key] = weakref.ref(owner, lambda _: _TARGETS.pop(key, None))
    return key


class Registered:
    """Base of the objects dloss::loss calls by key (`register`): made, and
    copied or unpickled, each under a key of its own. Its compiled state
    (the attributes named in ``_TRANSIENT``: plans hold the group's
    communicator) is dropped when it is pickled or copied, and made again
    on first use, so that ``copy.deepcopy`` of a loss that ran works."""

    _TRANSIENT = ()

    def _register(self):
        self._op_key = register(self)

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in self._TRANSIENT:
            state[name] = {}
        return state

    def __setstate__(self, state):
        parent = getattr(super(), "__setstate__", None)
        if parent is not None:  # torch.nn.Module's
            parent(state)
        else:
            self.__dict__.update(state)
        self._register()


def _callable(key, inputs):
    """The C++ loss of `key` for `inputs`, outside any dispatch mode: while
    torch.compile traces, FakeTensorMode would otherwise catch the tensors
    that compiling the plan and building its executor make (its constants)
    and make them fake too."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return _target(key, inputs)._callable()


def _target(key, inputs):
    owner_key, _, part = key.partition("/")
    reference = _TARGETS.get(owner_key)
    owner = reference() if reference is not None else None
    if owner is None:
        raise make_error(
            "dloss::loss was called with the key %r, whose loss no longer "
            "exists in this process" % key,
            "Keep the loss module alive while its compiled step runs")
    return owner._op_target(part, inputs)


@torch.library.custom_op("dloss::loss", mutates_args=())
def loss(inputs: List[torch.Tensor], key: str, requires_grad: List[bool],
         site: str) -> List[torch.Tensor]:
    """The loss of `key` on `inputs`: [loss], or [loss, gradients...] when
    an input requires grad (see the module's docstring)."""
    return fresh(run(key, inputs, requires_grad, site), inputs)


def run(key, inputs, requires_grad, site):
    """dloss::loss's work, without the op around it; an error in finding
    the loss's plan (PartialFC's shard) is located at the user's `site`."""
    try:
        target = _target(key, inputs)
    except Error as e:
        if e.location or not site:
            raise
        raise make_error(e.problem, e.hint, e.rank, e.op, site) from None
    return target._run(inputs, requires_grad, site)


def fresh(outputs, inputs):
    """`outputs` as a custom op must return them: none aliasing an input (a
    world of one's collectives return their input), each contiguous, as the
    fake implementations say."""
    storages = {t.untyped_storage().data_ptr() for t in inputs
                if t.numel()}
    return [t.clone() if t.numel() and
            t.untyped_storage().data_ptr() in storages else t.contiguous()
            for t in outputs]


@loss.register_fake
def _loss_fake(inputs, key, requires_grad, site):
    fn = _callable(key, inputs)
    dtypes = fn.result_dtypes
    device = next((t.device for t in inputs if t.is_floating_point()),
                  inputs[0].device)
    outputs = [torch.empty((), dtype=dtypes[0], device=device)]
    states = fn.state_argument_indices
    for k, i in enumerate(states):  # each state's new value
        outputs.append(inputs[i].new_empty(inputs[i].shape,
                                           dtype=dtypes[1 + k]))
    if any(requires_grad):
        for k, i in enumerate(fn.grad_argument_indices):
            outputs.append(inputs[i].new_empty(
                inputs[i].shape, dtype=dtypes[1 + len(states) + k]))
    return outputs


def layout(key, inputs):
    """The inputs whose new values the loss of `key` returns after the loss
    (its state, in order), and the inputs each gradient after them belongs
    to."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    fn = (_target(key, inputs)._callable()
          if _get_current_dispatch_mode() is None else _callable(key, inputs))
    return list(fn.state_argument_indices), list(fn.grad_argument_indices)


def store_state(tensors, states, outputs):
    """Each state input takes its new value (outputs after the loss), in
    place, as the call's last act: the update is the same on every rank."""
    with torch.no_grad():
        for i, value in zip(states, outputs[1:1 + len(states)]):
            tensors[i].copy_(value)


def _loss_setup(ctx, inputs, output):
    tensors, key, _, _ = inputs
    ctx.count = len(tensors)
    states, ctx.indices = layout(key, tensors)
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*output[1 + len(states):])
    ctx.indices = ctx.indices if len(output) > 1 + len(states) else []


def _loss_backward(ctx, grads):
    scale = grads[0]
    result = [None] * ctx.count
    for i, gradient in zip(ctx.indices, ctx.saved_tensors):
        result[i] = gradient * scale.to(gradient.dtype)
    return result, None, None, None


loss.register_autograd(_loss_backward, setup_context=_loss_setup)


def call_site() -> str:
    """The user's ``file:line`` of the dloss call being made: while Dynamo
    traces it, a constant of the graph (`traced_site`); else read from the
    caller's frames."""
    if torch.compiler.is_compiling():
        return traced_site()
    return caller_location(3)


@torch._dynamo.assume_constant_result
def traced_site() -> str:
    """The user's ``file:line`` of the call Dynamo is tracing: the innermost
    frame of the traced user stack outside dloss and torch. Called while
    tracing, its result is a constant of the graph: no frame is inspected
    when the compiled step runs."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    if context is None:
        return ""
    users = _is_users()
    for frame in reversed(list(context.extract_stack())):
        if users(frame.filename):
            return "%s:%d" % (frame.filename, frame.lineno)
    return ""


__all__ = ["Registered", "call_site", "fresh", "layout", "loss",
           "register", "run", "store_state", "traced_site"]
