"""CompiledLoss: a compiled plan as a callable torch module with autograd,
run on the user's process group; compile_graph: a recorded dloss graph
compiled into one (what dloss.compile and @dloss.loss both do with a
graph)."""

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _C, _ops
from .errors import Error, is_dloss_location, make_error
from .group import communicator
from .schedule import check_schedule


class CompiledLoss(_ops.Registered, torch.nn.Module):
    """A compiled loss: call it with the loss's inputs, by position or by
    name, on every rank of the group; it returns the global loss (the same
    value on every rank) with autograd. ``loss.backward()`` gives each
    ``dloss.grad`` input its gradient per the loss's gradient contract
    (ddp: ``N * dF/dx_r``, which DDP's gradient average turns into the
    single-device gradient; global: ``dF/dx_r``).

    All communication happens in the call, which every rank must make;
    backward() only scales gradients computed there, so a rank that skips
    backward() cannot hang its peers. `schedule` is the fused ops' schedule
    for this loss ("auto", "ring" or "gather"; None follows the process
    default, dloss.set_schedule).
    """

    # The C++ callables hold a communicator (a group).
    _TRANSIENT = ("_callables",)

    def __init__(self, plan, entry="", group=None, schedule=None):
        super().__init__()
        self._plan = plan
        self._entry = entry or ""
        self._group = group
        self._schedule = check_schedule(schedule, "dloss.CompiledLoss")
        self._callables = {}
        fn = self._callable()
        self.argument_names = list(fn.argument_names)
        self._loss_name = fn.loss_name
        # Inputs that are loss state (dloss.state): each takes its new value
        # at every call.
        self._states = tuple(fn.state_argument_indices)
        # The name torch.compile's graph calls this loss by (dloss/_ops.py).
        self._register()

    def _callable(self):
        """The C++ loss on the group's communicator as it is now (a group
        made after this module is picked up)."""
        comm = communicator(self._group)
        fn = self._callables.get(id(comm))
        if fn is None:
            fn = _C.CompiledLoss(self._plan, comm, self._entry,
                                 self._schedule or "")
            self._callables[id(comm)] = fn
        return fn

    def _op_target(self, part, inputs):
        return self

    def _run(self, inputs, requires_grad, site):
        """dloss::loss's implementation: [loss] or [loss, gradients...],
        errors located at `site`."""
        fn = self._callable()
        try:
            return fn.run(inputs, requires_grad, site or "")
        except Error as e:
            raise self._at_call_site(e, fn, site) from None

    @property
    def loss_name(self):
        return self._loss_name

    def plan_text(self):
        """The compiled plan as text, one line per step (as `dlossc
        --emit=plan-text`): fused losses appear as their ring ops."""
        return self._plan.text()

    def fused_ops(self):
        """The fused ring-tiled ops the plan runs (sorted names): its steps'
        ops that the op table marks fused (Dloss_Fused in their ODS)."""
        return list(self._plan.fused_ops())

    @property
    def grad_mode(self):
        """"ddp" or "global"."""
        return self._callable().grad_mode

    def forward(self, *args, **kwargs):
        """The global loss of this call's inputs (by position or by name, in
        the loss's argument order: ``argument_names``). An error names the
        user's line that made the call (see _at_call_site)."""
        site = _ops.call_site()
        tensors, problem = self._bind(self._loss_name, self.argument_names,
                                      args, kwargs)
        if problem is not None:
            self._refuse(problem, site)
        return call(self._op_key, tensors, site, self._states)

    def _refuse(self, problem, site):
        """Raises `problem`, a mistake in the call's arguments, after
        telling the peers: every rank makes this call, so its preflight
        refuses one input too many on every rank at once, where a local
        raise would leave them waiting for the deadline. This rank then
        raises its own, more precise, error."""
        fn = self._callable()
        try:
            fn([torch.empty(0)] * (len(self.argument_names) + 1))
        except Error as preflight:
            raise self._at_call_site(problem, fn, site) from preflight
        raise self._at_call_site(problem, fn, site)

    @staticmethod
    def _at_call_site(error, fn, site):
        """`error` located at the user's call of the loss, `site`, when it has
        no location of the user's own: none (the preflight, the arguments)
        or one in dloss's sources (a drop-in's graph is built by dloss, so
        its ops' locations, "frontend/Losses.cpp:36", mean nothing to the
        user). An error inside the user's own loss keeps its IR location."""
        if not site or (error.location and
                        not is_dloss_location(error.location)):
            return error
        return make_error(error.problem, error.hint, error.rank,
                          error.op or "@" + fn.loss_name, site)

    @staticmethod
    def _bind(loss_name, names, args, kwargs):
        """(the inputs in argument order, None) or (None, the call's
        mistake as a dloss.Error)."""
        if len(args) > len(names):
            return None, make_error(
                "@%s takes %d inputs (%s), got %d" %
                (loss_name, len(names), ", ".join(names), len(args)),
                "Pass one tensor per input")
        values = list(args) + [None] * (len(names) - len(args))
        for key, value in kwargs.items():
            if key not in names:
                return None, make_error(
                    "@%s has no input named %r (its inputs: %s)" %
                    (loss_name, key, ", ".join(names)),
                    "Use one of the input names")
            index = names.index(key)
            if values[index] is not None:
                return None, make_error(
                    "input %r given twice" % key,
                    "Pass it by position or by name, not both")
            values[index] = value
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            return None, make_error(
                "@%s is missing input(s) %s" % (loss_name,
                                                ", ".join(missing)),
                "Pass every input: %s" % ", ".join(names))
        # A number joins the call's tensors on their device: the runtime
        # computes a call on one device.
        device = next((v.device for v in values
                       if isinstance(v, torch.Tensor)), None)
        tensors = []
        for name, value in zip(names, values):
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                continue
            try:
                tensors.append(torch.tensor(value, device=device))
            except (TypeError, ValueError, RuntimeError):
                return None, make_error(
                    "input %r of @%s is a %s, not a tensor or a number" %
                    (name, loss_name, type(value).__name__),
                    "Pass a torch.Tensor")
        return tensors, None


class _EagerLoss(torch.autograd.Function):
    """dloss::loss's eager twin: the same run and the same backward (the
    gradients the call computed, scaled by the incoming gradient: the
    backward communicates nothing), without torch.library's per-call
    wrapping of the op (its schema check, pytree flattening and the
    autograd wrapper cost about 0.4 ms a call, more than the runtime's own
    host work at small batches). Only when nothing traces: torch.compile,
    and any dispatch mode (FakeTensorMode, export), see the op itself."""

    @staticmethod
    def forward(ctx, key, requires_grad, site, states, *tensors):
        outputs = _ops.fresh(_ops.run(key, list(tensors), requires_grad,
                                      site), tensors)
        ctx.count = len(tensors)
        ctx.indices = _ops.layout(key, tensors)[1] \
            if len(outputs) > 1 + states else []
        ctx.save_for_backward(*outputs[1 + states:])
        if not states:
            return outputs[0]
        # The state's new values: outputs without gradient, which call()
        # stores.
        ctx.mark_non_differentiable(*outputs[1:1 + states])
        return tuple(outputs[:1 + states])

    @staticmethod
    def backward(ctx, grad, *state_grads):
        result = [None] * ctx.count
        # loss.backward()'s gradient of 1 on the CPU (read without a device
        # sync) leaves the call's gradients as they are: no pass over each.
        one = grad.device.type == "cpu" and grad.dim() == 0 and \
            bool(grad == 1)
        for i, gradient in zip(ctx.indices, ctx.saved_tensors):
            result[i] = gradient if one else gradient * grad.to(gradient.dtype)
        return (None, None, None, None, *result)


def call(key, tensors, site, states=()):
    """The loss the registered `key` names (dloss/_ops.py) on `tensors`, with
    autograd: the loss alone, its gradients kept for backward. `states`:
    the positions of its state inputs (dloss.state), each of which takes
    its new value in place."""
    grad = torch.is_grad_enabled()
    requires_grad = [grad and t.requires_grad for t in tensors]
    if any(t.device.type == "meta" for t in tensors):
        # The op's meta kernel is its fake one, which would skip the
        # collectives: the runtime's preflight refuses such a tensor, on
        # every rank.
        return _ops.run(key, tensors, requires_grad, site)[0]
    if not torch.compiler.is_compiling() and \
            _get_current_dispatch_mode() is None:
        outputs = _EagerLoss.apply(key, requires_grad, site, len(states),
                                   *tensors)
        if not states:
            return outputs
    else:
        outputs = torch.ops.dloss.loss(tensors, key, requires_grad, site)
    _ops.store_state(tensors, states, outputs)
    return outputs[0]


def compile_graph(graph, grad_mode=None, fuse=True, entry=None, group=None,
                  schedule=None):
    """A dloss._C.Graph compiled for `group` (dloss.compile's options; the
    entry defaults to the graph's name). Cached under the graph's
    recording, not its MLIR text: a machine without the compiler library
    runs a graph compiled elsewhere. The schedule is the loss's, not the
    plan's: one cached plan serves every setting."""
    plan = _C.compile_graph_plan(graph, grad_mode or "", bool(fuse))
    return CompiledLoss(plan, entry or graph.name, group, schedule)
