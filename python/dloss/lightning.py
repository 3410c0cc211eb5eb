"""dloss.lightning: dloss.assert_grads_synced for Lightning, as a Trainer
callback (GradSyncCheck) and as one call for Fabric loops
(check_grads_synced), which also say which submodule of the DDP-wrapped model
was called directly, around DDP.

Under DDP a gradient is all-reduced only when the backward follows a forward
of the DDP wrapper. A submodule called directly (``fabric_model.student(x)``,
``ddp.module.student(x)``) with no forward of the wrapper in the same step
leaves its gradients as each rank computed them, and nothing says so: the
ranks' weights drift apart. In the Trainer, training_step runs inside the
wrapper's forward, so the ways out there are manual optimization calling
``loss.backward()`` instead of ``self.manual_backward(loss)``, or a backward
run in a hook outside training_step.

To explain a failure, forward pre-hooks watch the trainable submodules of the
DDP-wrapped module: a call made with gradients enabled while the wrapper's
forward is not running is recorded with the user's ``file:line``. Such a call
is harmless when the wrapper's forward runs in the same step (DDP then
reduces every gradient), so the record is only used to explain differing
gradients, never reported on its own.
"""

import inspect
import os
import sys
import weakref

import torch

try:
    import lightning.pytorch as _pl
    from lightning.fabric.wrappers import _FabricModule
except ImportError as e:
    raise ImportError(
        "dloss.lightning needs Lightning (the `lightning` package): "
        "pip install lightning (%s)" % e) from e

from .errors import caller_location, framework_dirs, make_error, user_frame
from .group import communicator
from .guard import guard as _install_guard
from .guard import site_hooks as _site_hooks
from .sync import differing, problem

__all__ = ["CollectiveGuard", "GradSyncCheck", "check_grads_synced", "watch"]

_FIX = ("call the DDP-wrapped model (or fabric-wrapped module) so DDP "
        "all-reduces these gradients, or move that call into its forward()")

_watches = weakref.WeakKeyDictionary()  # DDP module -> _Watch


def _is_ddp(module):
    return isinstance(module, torch.nn.parallel.DistributedDataParallel)


def _unwrap(module):
    """(the DDP wrapper or None, the user's module) of a _FabricModule, a DDP
    module or a plain module."""
    if isinstance(module, _FabricModule):
        inner = module._forward_module
        return (inner if _is_ddp(inner) else None), module._original_module
    if _is_ddp(module):
        return module, module.module
    return None, module


def _user_location():
    """``file:line`` of the innermost frame outside dloss, torch and
    Lightning: the line that called the submodule."""
    frame = user_frame(2, skip=framework_dirs())
    return "%s:%d" % frame if frame else "an unknown line"


class _Watch:
    """The forward hooks on one DDP wrapper and its trainable submodules,
    and the direct calls they saw since the last check."""

    def __init__(self, ddp):
        self.inside = 0  # depth of the wrapper's forward
        self.calls = {}  # submodule name -> where it was first called
        self.handles = [
            ddp.register_forward_pre_hook(self._enter),
            ddp.register_forward_hook(self._leave, always_call=True)]
        for name, sub in ddp.module.named_modules():
            if name and any(p.requires_grad for p in sub.parameters()):
                self.handles.append(sub.register_forward_pre_hook(
                    self._hook(name)))

    def _enter(self, *_):
        self.inside += 1

    def _leave(self, *_):
        self.inside -= 1

    def _hook(self, name):
        def hook(*_):
            if not self.inside and torch.is_grad_enabled() and \
                    name not in self.calls:
                self.calls[name] = _user_location()
        return hook

    def explain(self, names):
        """Why the parameters `names` differ, if a direct call owns them:
        the outermost directly called submodules that hold one of them."""
        calls = self.calls
        outer = [n for n in calls
                 if not any(n.startswith(o + ".") for o in calls)]
        found = [n for n in outer
                 if any(p == n or p.startswith(n + ".") for p in names)]
        if not found:
            return ""
        return "; ".join(
            "Submodule %s of the DDP-wrapped model was called directly at "
            "%s, outside the wrapper's forward(), so DDP did not all-reduce "
            "its gradients" % (n, calls[n]) for n in found)


def watch(module):
    """Installs the forward hooks that let check_grads_synced and
    GradSyncCheck name a submodule called directly, around DDP, and the line
    of that call. Takes the Fabric-wrapped module (after ``fabric.setup``)
    or a DDP module; does nothing for a module without DDP. Idempotent.
    check_grads_synced calls it itself, so without it the explanation starts
    from the second checked step."""
    ddp, _ = _unwrap(module)
    if ddp is None:
        return
    if ddp not in _watches:
        _watches[ddp] = _Watch(ddp)


def _check(ddp, inner, group, op, location, extra=""):
    """The check of `inner`'s trainable parameters; raises dloss.Error on
    every rank, explained where the hooks saw a direct call."""
    if ddp is not None and not ddp.require_backward_grad_sync:
        return  # inside no_sync(): gradients differ on purpose
    named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
    problems = differing(named, group, op, location)
    seen = _watches.get(ddp) if ddp is not None else None
    explanation = seen.explain([n for n, _ in problems]) if seen else ""
    if seen is not None:
        seen.calls.clear()
    if not problems:
        return
    if explanation:
        hint = "%s: %s" % (explanation, _FIX)
    elif extra:
        hint = extra
    elif ddp is not None and seen is None:
        hint = ("If a submodule of the DDP-wrapped model is called directly, "
                "%s (dloss.lightning.watch(model) after setup names it)" %
                _FIX)
    elif ddp is not None:
        hint = ("Check for a backward that no forward of the DDP-wrapped "
                "model prepared, or code that edits .grad on some ranks "
                "only")
    else:
        hint = ("This module is not wrapped in DDP: wrap it (Fabric's or "
                "the Trainer's strategy='ddp'), or all-reduce these "
                "gradients yourself")
    raise make_error(problem(problems, len(named)), hint,
                     rank=communicator(group).rank, op=op, location=location)


def check_grads_synced(module, group=None):
    """Raises dloss.Error on every rank unless every trainable parameter of
    `module` has the same gradient on every rank. For Fabric loops: call it
    after ``fabric.backward(loss)`` and before ``optimizer.step()``, on every
    rank. Takes the Fabric-wrapped module, a DDP module or a plain module;
    parameters are named as in the unwrapped module (``student.weight``).

    The error names each differing parameter and, when a submodule of the
    DDP-wrapped module was called directly (``model.student(x)``), that
    submodule and the line of the call. The hooks that see such calls are
    installed on the first call, so that explanation needs a second step;
    call ``watch(model)`` after ``fabric.setup`` to have it from the first.
    Skipped inside ``no_backward_sync``/``no_sync``, where gradients differ
    on purpose."""
    location = caller_location(2)
    ddp, inner = _unwrap(module)
    try:
        _check(ddp, inner, group, "dloss.lightning.check_grads_synced",
               location)
    finally:
        watch(module)


class GradSyncCheck(_pl.Callback):
    """A Trainer callback that checks, before every `every_n_steps`-th
    optimizer step (``trainer.global_step`` 0, n, 2n, ...), that every
    trainable parameter of the LightningModule has the same gradient on every
    rank, and raises dloss.Error on every rank naming those that differ.

    ``Trainer(strategy="ddp", callbacks=[dloss.lightning.GradSyncCheck()])``.
    It runs in ``on_before_optimizer_step``, after the last accumulated
    backward. Each check is one small collective of per-parameter
    fingerprints (dloss.assert_grads_synced). Only for strategies whose
    gradients are replicated (DDP); it refuses sharded ones (FSDP,
    DeepSpeed), whose gradients differ by design.
    """

    def __init__(self, every_n_steps=1, group=None):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise make_error(
                "every_n_steps must be a positive int, got %r" %
                (every_n_steps,), "Pass every_n_steps=1 to check every step")
        self.every_n_steps = every_n_steps
        self.group = group
        self._backwards = 0

    def on_fit_start(self, trainer, pl_module):
        model = trainer.strategy.model
        if _is_ddp(model):
            watch(model)
        elif trainer.world_size > 1:
            raise make_error(
                "GradSyncCheck needs replicated gradients, and strategy %s "
                "wraps the model in %s" % (type(trainer.strategy).__name__,
                                           type(model).__name__),
                "Use strategy='ddp', or remove GradSyncCheck: a sharded "
                "strategy's gradients differ between ranks by design",
                op="dloss.lightning.GradSyncCheck")

    def on_before_backward(self, trainer, pl_module, loss):
        self._backwards += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        backwards, self._backwards = self._backwards, 0
        # global_step is the same on every rank: all ranks check together.
        if trainer.world_size == 1 or trainer.global_step % self.every_n_steps:
            return
        model = trainer.strategy.model
        ddp = model if _is_ddp(model) else None
        extra = ""
        if not pl_module.automatic_optimization and not backwards:
            extra = ("No backward ran through Lightning before this "
                     "optimizer step: in manual optimization call "
                     "self.manual_backward(loss), not loss.backward(); "
                     "Lightning prepares DDP's all-reduce of the gradients "
                     "there")
        _check(ddp, pl_module, self.group, "dloss.lightning.GradSyncCheck",
               "optimizer step %d" % trainer.global_step, extra)


class CollectiveGuard(_pl.Callback):
    """dloss.guard for a Trainer: from the setup of fit (or validate, test,
    predict) to its teardown, every collective on the default group (the
    user's, Lightning's ``sync_dist`` and barriers, DDP's gradient
    all-reduce, dloss's) is checked first, so that one run on some ranks
    only fails on every rank within `timeout` seconds, naming each rank's
    line, instead of hanging. Setup runs before the strategy wraps the model
    in DDP, so DDP's collectives are seen too. Does nothing on one process.
    """

    def __init__(self, timeout=30.0):
        super().__init__()
        self.timeout = timeout
        self._guard = None

    def setup(self, trainer, pl_module, stage):
        if self._guard is None and torch.distributed.is_available() and \
                torch.distributed.is_initialized() and \
                torch.distributed.get_world_size() > 1:
            self._guard = _install_guard(timeout=self.timeout)

    def teardown(self, trainer, pl_module, stage):
        if self._guard is not None:
            self._guard.close()
            self._guard = None


# Where each self.log(name, ..., sync_dist=True) was called, by (hook, name):
# Lightning reduces the value later, from its own loop, where no frame of
# the user's is left to name.
_log_sites = {}


def _remember_log_sites():
    """Makes LightningModule.log remember where it was called with
    sync_dist (once per process; dloss.guard calls it when Lightning is
    loaded)."""
    cls = _pl.LightningModule
    original = cls.log
    if getattr(original, "_dloss_log_sites", False):
        return
    signature = inspect.signature(original)

    def log(self, *args, **kwargs):
        try:
            arguments = signature.bind(self, *args, **kwargs).arguments
        except TypeError:
            arguments = {}
        if arguments.get("sync_dist"):
            frame = sys._getframe(1)
            _log_sites[(self._current_fx_name, arguments.get("name"))] = \
                "%s:%d in %s" % (frame.f_code.co_filename, frame.f_lineno,
                                 frame.f_code.co_name)
        return original(self, *args, **kwargs)

    log.__doc__ = original.__doc__
    log.__wrapped__ = original
    log._dloss_log_sites = True
    cls.log = log


def _sync_dist_site(frames):
    """The site of a collective that Lightning runs to reduce a value
    logged with sync_dist: the self.log call that asked for it."""
    for frame in frames:
        if not frame.f_code.co_filename.endswith(os.path.join(
                "logger_connector", "result.py")):
            continue
        meta = getattr(frame.f_locals.get("self"), "meta", None)
        if meta is None or not hasattr(meta, "fx"):
            continue
        where = _log_sites.get((meta.fx, meta.name),
                               "a line of %s" % meta.fx)
        return "%s, through self.log(%r, sync_dist=True), which Lightning " \
            "reduces at the end of %s" % (where, meta.name, meta.fx)
    return None


_site_hooks.append(_sync_dist_site)
