"""dloss.check_loss: finds the silent bugs of a hand-written distributed
loss, for losses you cannot switch to dloss's.

    report = dloss.check_loss(my_loss, image, text, params=[logit_scale])
    print(report)            # one line per finding, then the verdict
    assert report.ok

`my_loss` is your loss exactly as each rank calls it, on
torch.distributed's default group, with your own all_gather, all_reduce
and labels. `inputs` are global-batch tensors: each is split by rows across
the ranks in rank order (0-d tensors, such as the model's logit scale, go
whole to every rank, and DDP averages their gradients), and `params`
(tensors, or a module: the loss's own parameters, outside the DDP model,
such as ArcFace's W) go whole to every rank, after the inputs:
``my_loss(*shards, *params)`` (a module is one argument); their gradients
must also agree between ranks.

For each world size, W fresh CPU processes with a Gloo group run the loss
on their shard (under dloss.guard) and call backward; the reference is the
same function on the global batch in one process with a one-rank group.
Each world size runs an even split and an uneven one with a rank of one
row (or the `sizes` you give). What is checked, and the kind of each
failure:

- ``error``: the loss raises on the global batch, or on an even split;
- ``hang``: a rank does not finish within `timeout` (the guard names the
  collective each rank was in);
- ``uneven``: it fails on uneven batches only (labels ``n * rank``, say);
- ``value``: the value is neither the global batch's on every rank nor a
  per-rank value whose average over the ranks (DDP's) is the global one;
- ``grad_scale``: every input gradient under DDP's averaging (rank r's / W)
  is the one-process gradient times one factor (1/world: an in-place
  all_reduce of a tensor that needs grad);
- ``grad_missing_cross_rank``: the inputs' gradients lack what the other
  ranks' terms contribute (an all_gather that carries no gradient);
- ``grad``: any other gradient error, with the worst rows;
- ``param_grad``: a parameter's gradient averaged over the ranks is not the
  one-process gradient, or differs between ranks (DDP averages only the
  parameters of the module it wraps).

Command line: ``python -m dloss.check_loss MODULE:FUNCTION --inputs
MODULE:FACTORY [--worlds 2,3]``, where FACTORY() returns the inputs (a
tuple of tensors, or a dict with "inputs" and "params"); exits 1 when the
report is not ok.
"""

import argparse
import importlib
import math
import os
import pickle
import re
import socket
import sys
import time
import traceback
import warnings
from datetime import timedelta

import torch

from .errors import make_error

__all__ = ["Failure", "Report", "check_loss"]

KINDS = ("error", "hang", "uneven", "value", "grad_scale",
         "grad_missing_cross_rank", "grad", "param_grad")

# The torch.distributed functions with no autograd: called on a tensor that
# needs grad, the gradient does not cross ranks.
_NO_AUTOGRAD = ("all_gather", "all_gather_into_tensor", "all_reduce",
                "reduce_scatter", "reduce_scatter_tensor", "broadcast")

# A dloss.Error's "[rank r, op ...]" prefix: the ranks' errors alike but
# for it are said once.
_RANK_PREFIX = re.compile(r"^Error: dloss error \[[^\]]*\]: ")
# What dloss.guard raises on a rank when another skips a collective.
_GUARD_WAIT = ("never reached it within", "reached different collectives")

_GATHER_FIX = ("use torch.distributed.nn.functional.all_gather or "
               "dloss.all_gather (exact gradients, uneven batches)")
_REDUCE_FIX = ("use torch.distributed.nn.functional.all_reduce (its "
               "backward all-reduces the gradient), or compute the "
               "statistic in @dloss.loss with dloss.all_reduce")


# The dloss drop-in for a library whose code made a finding's collective.
_DROP_INS = (
    ("open_clip", "dloss.ClipLoss (and SigLipLoss, CoCaLoss, "
     "DistillClipLoss) replaces OpenCLIP's loss, exact and fused"),
    ("lightly", "dloss.lightly has lightly's losses, exact over the global "
     "batch"),
    ("pytorch_metric_learning", "dloss.ArcFaceLoss, CosFaceLoss, "
     "NTXentLoss and SupConLoss replace pytorch-metric-learning's"),
    ("torchmetrics", "dloss.gather_all_tensors replaces TorchMetrics' "
     "(the gradient reaches every rank's rows)"),
    ("sentence_transformers", "dloss.sentence_transformers has "
     "sentence-transformers' in-batch-negative losses"),
)


def _drop_in(site):
    for package, text in _DROP_INS:
        if os.sep + package + os.sep in site:
            return " (%s)" % text
    return ""


class Failure:
    """One finding: `kind` (one of KINDS), the world size and per-rank
    sizes it was found at, and a message that says what to change."""

    def __init__(self, kind, world, sizes, message):
        self.kind, self.world, self.sizes, self.message = \
            kind, world, list(sizes), message

    def __str__(self):
        return "%s (world %d, sizes %s): %s" % (
            self.kind, self.world, "/".join(map(str, self.sizes)),
            self.message)

    __repr__ = __str__


class Report:
    """What check_loss found: ``ok``, ``failures`` (Failure objects) and
    ``notes`` (what passed, and how: a global value or a per-rank one)."""

    def __init__(self, name):
        self.name, self.failures, self.notes = name, [], []

    @property
    def ok(self):
        return not self.failures

    def __str__(self):
        lines = ["note: " + n for n in self.notes]
        lines += ["FAIL " + str(f) for f in self.failures]
        kinds = sorted({f.kind for f in self.failures},
                       key=KINDS.index)
        lines.append("check_loss %s: %s" % (
            self.name, "PASS" if self.ok else "FAIL (%s)" % ", ".join(
                kinds)))
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# One run: `world` processes, each calling fn on its shard.
# ---------------------------------------------------------------------------

def _user_site(stack):
    """Where in `stack` a collective was called: the innermost frame outside
    torch and dloss, as file:line, and, when that is a library's (under
    site-packages), "called at" the innermost frame of the user's own."""
    own = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
           os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    frames = [f for f in reversed(stack)
              if not os.path.abspath(f.filename).startswith(own)]
    if not frames:
        return "?"
    site = "%s:%d" % (frames[0].filename, frames[0].lineno)
    users = [f for f in frames if not any(
        part in f.filename for part in ("site-packages", "dist-packages"))]
    if users and users[0] is not frames[0]:
        site += ", called at %s:%d" % (users[0].filename, users[0].lineno)
    return site


def _watch_collectives(seen):
    """Wraps torch.distributed's collectives without autograd: each call
    on a tensor that needs grad, made from outside torch and dloss (whose
    autograd Functions call them in their forward), is noted in `seen` as
    (name, the user's file:line)."""
    import torch.distributed as dist
    own = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
           os.path.dirname(os.path.abspath(__file__)) + os.sep)

    def wrap(name, original):
        def call(*args, **kwargs):
            caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
            if caller.startswith(own):
                return original(*args, **kwargs)
            tensors = [a for a in list(args) + list(kwargs.values())
                       if isinstance(a, torch.Tensor)]
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, (list, tuple)):
                    tensors += [t for t in a if isinstance(t, torch.Tensor)]
            # A float gather outside autograd drops the gradient of what it
            # gathers (TorchMetrics pads a no-grad copy first); a reduction
            # of a tensor that needs grad keeps only the rank's own.
            if any(t.requires_grad or "gather" in name and
                   t.is_floating_point() for t in tensors):
                seen.append((name, _user_site(traceback.extract_stack()[:-1])))
            return original(*args, **kwargs)
        call._dloss_watched = True
        # What dloss.guard names as the function the user called.
        call.__name__ = call.__qualname__ = name
        call.__code__ = call.__code__.replace(co_name=name, co_qualname=name)
        return call

    for name in _NO_AUTOGRAD:
        original = getattr(dist, name, None)
        if original is not None and \
                not getattr(original, "_dloss_watched", False):
            setattr(dist, name, wrap(name, original))


def _name_the_backward(fn):
    """Makes dloss.guard name a collective of the backward pass, which this
    module's _rank_main starts, after the loss: the stack holds no line of
    the user's there, and the frame above this module's is
    multiprocessing's."""
    from .guard import site_hooks
    code = getattr(fn, "__code__", None)
    where = " at %s:%d" % (code.co_filename, code.co_firstlineno) \
        if code is not None else ""
    text = "the backward of %s%s (run by dloss.check_loss)" % (
        getattr(fn, "__qualname__", repr(fn)), where)

    def hook(inner):
        return text if any(f.f_code is _rank_main.__code__
                           for f in inner) else None
    site_hooks.append(hook)


def _grads(values):
    return [None if v.grad is None else v.grad.detach().clone()
            for v in values]


def _rank_main(fn, rank, world, port, shards, params, timeout, queue, done):
    torch.set_num_threads(1)
    # The libraries' warnings, once per process and run, would bury the
    # report (which says what matters: an in-place all_reduce's "no
    # autograd kernel" warning is a grad_scale finding).
    warnings.simplefilter("ignore")
    result = None
    try:
        import torch.distributed as dist

        import dloss
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
            world_size=world, timeout=timedelta(seconds=timeout + 30))
        seen = []
        _watch_collectives(seen)
        leaves = [t.clone().requires_grad_(t.is_floating_point())
                  for t in shards]
        if isinstance(params, torch.nn.Module):
            args, tracked = [params], [p for _, p in
                                       params.named_parameters()]
        else:
            args = [p.detach().clone().requires_grad_(p.is_floating_point())
                    for p in params]
            tracked = args
        _name_the_backward(fn)
        with dloss.guard(timeout=timeout):
            loss = fn(*leaves, *args)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise TypeError("the loss returned %s, not a one-element "
                                "tensor" % type(loss).__name__)
            loss.reshape(()).backward()
        result = ("ok", (loss.detach().reshape(()).double().item(),
                         _grads(leaves), _grads(tracked), seen))
    except BaseException as e:  # noqa: B902 - everything goes back
        result = ("error", "%s: %s" % (type(e).__name__, e))
    queue.put((rank,) + result)
    queue.close()
    queue.join_thread()
    done.wait(timeout=timeout + 60)
    # Skip teardown: a group whose peer failed may wait in its destructor.
    os._exit(0)


def _held_port():
    """A socket bound (never listening) to a free port: while it is held,
    no other bind(port 0) gets that port, so checks run side by side never
    share one, and rank 0's store (SO_REUSEADDR) can still listen on it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s


def _run(fn, shards, params, timeout):
    """Runs fn on len(shards) ranks. Returns ({rank: ("ok", (value,
    grads, param_grads, seen)) or ("error", text)}, {rank: exit code, or
    None when still running at the deadline} of the ranks that never
    reported)."""
    import torch.multiprocessing as mp
    world = len(shards)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    queue, done = ctx.Queue(), ctx.Event()
    held = _held_port()
    port = held.getsockname()[1]
    procs = [ctx.Process(target=_rank_main, args=(
        fn, r, world, port, shards[r], params, timeout, queue, done))
        for r in range(world)]
    for p in procs:
        p.start()
    results, stuck = {}, set()
    deadline = time.monotonic() + timeout + 20
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, status, value = queue.get(timeout=1)
            except Exception:  # noqa: B902 - queue.Empty, or a dead peer
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
                continue
            results[rank] = (status, value)
    finally:
        stuck = {r for r, p in enumerate(procs)
                 if r not in results and p.is_alive()}
        done.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        held.close()
    # A rank that never reported: still running at the deadline (None), or
    # dead with its exit code (an abort, say).
    lost = {r: None if r in stuck else procs[r].exitcode
            for r in range(world) if r not in results}
    return results, lost


# ---------------------------------------------------------------------------
# The comparisons.
# ---------------------------------------------------------------------------

def _rel(a, b, scale=None):
    scale = b.abs().max().item() if scale is None else scale
    error = (a - b).abs().max().item() / (scale if scale > 0 else 1.0)
    return error if math.isfinite(error) else float("inf")


def _fraction(factor, world):
    """A scale factor as a fraction of the world size, where it is one."""
    for num, den, text in ((1, world, "1/world"), (world, 1, "world"),
                           (1, world * world, "1/world^2")):
        if abs(factor - num / den) <= 1e-3 * abs(num / den):
            return "%s = %s" % ("%d/%d" % (num, den) if den != 1 else
                                "%d" % num, text)
    return "%.4g" % factor


def _split(rows, world, uneven):
    """Per-rank sizes: as even as they go, or with the last rank holding
    one row."""
    if uneven:
        return _split(rows - 1, world - 1, False) + [1]
    return [rows // world + (1 if r < rows % world else 0)
            for r in range(world)]


class _Check:
    """The comparisons of one check_loss call."""

    def __init__(self, fn, inputs, params, tol, timeout, report):
        self.fn, self.inputs, self.params = fn, inputs, params
        self.tol, self.timeout, self.report = tol, timeout, report
        self.rows = {t.shape[0] for t in inputs if t.dim() > 0}

    def shards(self, sizes):
        starts = [sum(sizes[:r]) for r in range(len(sizes) + 1)]
        return [[t[starts[r]:starts[r + 1]] if t.dim() > 0 else t
                 for t in self.inputs] for r in range(len(sizes))]

    def run(self, sizes):
        return _run(self.fn, self.shards(sizes), self.params, self.timeout)

    def failed(self, results, lost, sizes, kind):
        """Adds the failure of a run that did not finish on every rank
        (`kind`: error or uneven, unless a rank hung); returns whether it
        did not."""
        world = len(sizes)
        errors = {r: v for r, (s, v) in results.items() if s == "error"}
        errors.update({r: "died (exit code %s) before it reported" % code
                       for r, code in lost.items() if code is not None})
        if not errors and not lost:
            return False
        stuck = sorted(r for r, code in lost.items() if code is None)
        # A rank that raised (or died) is the cause; the guard's errors on
        # the ranks that then waited for it are not.
        causes = {r: v for r, v in errors.items()
                  if not any(w in v for w in _GUARD_WAIT)}
        shown = causes or errors
        # The ranks' messages, each said once (every waiting rank raises the
        # guard's same error).
        said = []
        for r in sorted(shown):
            first = _RANK_PREFIX.sub("", shown[r].splitlines()[0])
            if first not in said:
                said.append(("rank %d: " % r if causes else "") + first)
        if causes and len(causes) < world:
            said.append("the other ranks waited for it")
        text = "; ".join(said + ["rank %s still running" % r
                                 for r in stuck])
        skipped = stuck or any(_GUARD_WAIT[0] in v for v in errors.values())
        mismatch = any(_GUARD_WAIT[1] in v for v in errors.values())
        if not causes and (skipped or mismatch and kind != "uneven"):
            self.report.failures.append(Failure(
                "hang", world, sizes, "not every rank finished the same "
                "collectives within %g s: %s. A rank that skips a "
                "collective (a branch on the rank, a log on rank 0 only) "
                "leaves the others waiting: call the same collectives on "
                "every rank" % (self.timeout, text)))
        elif kind == "uneven":
            self.report.failures.append(Failure(
                "uneven", world, sizes, "%s. The loss assumes equal "
                "batches: gather with dloss.all_gather (uneven first "
                "dimensions), and take offsets from the gathered sizes "
                "(dloss.shard_offset inside @dloss.loss), not n * rank" %
                text))
        else:
            self.report.failures.append(Failure(kind, world, sizes, text))
        return True

    def compare(self, reference, results, sizes):
        ref_value, ref_grads, ref_params, _ = reference
        world = len(sizes)
        per_rank = [results[r][1] for r in range(world)]
        seen = sorted({s for v in per_rank for s in v[3]})
        values = [v[0] for v in per_rank]
        scale = max(1.0, abs(ref_value))
        tol = self.tol
        if all(abs(v - ref_value) <= tol * scale for v in values):
            how = "the global batch's value on every rank"
        elif abs(sum(values) / world - ref_value) <= tol * scale:
            how = "a per-rank value whose average over the ranks is the " \
                "global one"
        else:
            self.report.failures.append(Failure(
                "value", world, sizes,
                "the ranks' values %s are neither the global batch's "
                "(%.6g) nor average to it (%.6g): the loss is not the "
                "global batch's%s" % (
                    ", ".join("%.6g" % v for v in values), ref_value,
                    sum(values) / world, self._value_hint(sizes))))
            how = None
        grads_ok = self.compare_grads(ref_grads, per_rank, sizes, seen)
        params_ok = self.compare_params(ref_params, per_rank, sizes,
                                        ref_grads)
        if how and grads_ok and params_ok:
            self.report.notes.append(
                "world %d, sizes %s: %s; gradients under DDP's averaging "
                "match one process" % (world, "/".join(map(str, sizes)),
                                       how))

    def _value_hint(self, sizes):
        if len(set(sizes)) > 1:
            return (" (on uneven batches a mean per rank, averaged over the "
                    "ranks, weighs each rank's rows unequally: divide the "
                    "all-reduced sum by the global count; statistics such "
                    "as a batch norm or a covariance must be the global "
                    "batch's, all-reduced)")
        return (" (statistics such as a batch norm, a variance or a "
                "covariance taken over each rank's rows: all-reduce them "
                "over the global batch)")

    def compare_grads(self, ref_grads, per_rank, sizes, seen):
        """Adds the inputs' gradient findings (one per kind and message,
        naming every input it holds for); returns whether all match."""
        world = len(sizes)
        starts = [sum(sizes[:r]) for r in range(world + 1)]
        found = {}  # (kind, message with {where}) -> input numbers
        for i, (t, want) in enumerate(zip(self.inputs, ref_grads)):
            if want is None or t.dim() == 0:
                continue
            got = torch.cat([
                (v[1][i] if v[1][i] is not None else
                 torch.zeros_like(want[starts[r]:starts[r + 1]])) / world
                for r, v in enumerate(per_rank)])
            scale = want.abs().max().item()
            if _rel(got, want, scale) <= self.tol:
                continue
            where = "{where}"
            dot = (want * want).sum().item()
            factor = (got * want).sum().item() / dot if dot > 0 else 0.0
            fit = _rel(got, factor * want, scale) if factor else 1.0
            reduces = [s for s in seen if s[0] != "all_gather" and
                       "gather" not in s[0]]
            gathers = [s for s in seen if "gather" in s[0]]
            if factor and fit <= self.tol and abs(factor - 1) > self.tol:
                if reduces:
                    hint = (" torch.distributed.%s at %s ran on a tensor "
                            "that needs grad: its gradient stays each "
                            "rank's own; %s%s" % (
                                reduces[0][0], reduces[0][1], _REDUCE_FIX,
                                _drop_in(reduces[0][1])))
                elif gathers:
                    hint = (" Each rank computes the global loss from "
                            "copies gathered by torch.distributed.%s at %s "
                            "(no gradient) and gets its own rows' gradient, "
                            "which DDP's average divides by the world size: "
                            "%s, each rank's loss over its own rows%s" % (
                                gathers[0][0], gathers[0][1], _GATHER_FIX,
                                _drop_in(gathers[0][1])))
                else:
                    hint = (" Check the loss's normalisation: DDP averages "
                            "the ranks' gradients")
                found.setdefault((
                    "grad_scale", "the gradient of %s under DDP's averaging "
                    "is the one-process gradient times %s.%s" % (
                        where, _fraction(factor, world), hint)), []).append(i)
            elif gathers:
                found.setdefault((
                    "grad_missing_cross_rank", "the gradient of %s misses "
                    "what the other ranks' terms contribute: "
                    "torch.distributed.%s at %s carries no gradient to the "
                    "other ranks' rows; %s%s" % (
                        where, gathers[0][0], gathers[0][1], _GATHER_FIX,
                        _drop_in(gathers[0][1]))),
                    []).append(i)
            else:
                rows = ((got - want).abs().reshape(got.shape[0], -1)
                        .amax(1) / (scale or 1.0))
                worst = rows.argsort(descending=True)[:3].tolist()
                found.setdefault((
                    "grad", "the gradient of %s under DDP's averaging is "
                    "off by %.3g relative; worst rows %s (global indices)" % (
                        where, rows.max().item(), worst)), []).append(i)
        for (kind, message), numbers in found.items():
            where = "input %d" % numbers[0] if len(numbers) == 1 else \
                "inputs %s" % ", ".join(map(str, numbers))
            self.report.failures.append(Failure(
                kind, world, sizes, message.replace("{where}", where)))
        return not found

    def compare_params(self, ref_params, per_rank, sizes, ref_inputs=()):
        """The parameters' gradients, and the 0-d inputs' (a logit scale of
        the model: whole on every rank; DDP averages it, so only the
        average must be right)."""
        world = len(sizes)
        ok = True
        items = [("parameter %d" % i, want, [v[2][i] for v in per_rank],
                  True) for i, want in enumerate(ref_params)]
        items += [("input %d" % i, want, [v[1][i] for v in per_rank], False)
                  for i, (t, want) in enumerate(zip(self.inputs, ref_inputs))
                  if t.dim() == 0]
        for name, want, got, own in items:
            if want is None:
                continue
            got = [g if g is not None else torch.zeros_like(want)
                   for g in got]
            scale = want.abs().max().item()
            mean = sum(got) / world
            differ = max(_rel(g, got[0], scale) for g in got)
            if _rel(mean, want, scale) > self.tol:
                ok = False
                self.report.failures.append(Failure(
                    "param_grad", world, sizes,
                    "%s's gradient averaged over the ranks is off by %.3g "
                    "relative from one process's" % (
                        name, _rel(mean, want, scale))))
            elif own and differ > self.tol:
                ok = False
                self.report.failures.append(Failure(
                    "param_grad", world, sizes,
                    "%s's gradient differs between ranks (by %.3g "
                    "relative; their average is right): DDP averages only "
                    "the parameters of the module it wraps, so a parameter "
                    "outside it (a loss's own W) drifts apart on each "
                    "rank: put it in the DDP-wrapped module, or all-reduce "
                    "its gradient" % (name, differ)))
        return ok


def _check_importable(fn):
    name = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if name is None or "<" in name or module is None:
        raise make_error(
            "dloss.check_loss runs the loss in fresh processes, which "
            "import it by name; %r is not importable by name (a lambda, "
            "or a function defined inside another)" % (fn,),
            "Define the loss at the top level of a module (or of the "
            "script, under if __name__ == '__main__':)")
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: B902 - what pickle says is the reason
        raise make_error(
            "dloss.check_loss cannot send %s.%s to its processes: %s" % (
                module, name, e),
            "Define the loss at the top level of a module") from None


def check_loss(fn, *inputs, params=(), worlds=(2, 3), sizes=None,
               tol=1e-5, timeout=60, device="cpu"):
    """Checks a hand-written distributed loss against itself on one
    process (see the module's docstring). Returns a Report."""
    _check_importable(fn)
    if device != "cpu":
        raise make_error(
            "dloss.check_loss runs on the CPU only (device=%r)" % (device,),
            "Pass device='cpu': the ranks are CPU processes with Gloo, "
            "which check the loss's logic, not its kernels")
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise make_error("dloss.check_loss takes the loss's inputs as "
                         "tensors of the global batch",
                         "Pass fn, then the input tensors")
    if isinstance(params, torch.Tensor):
        params = [params]
    if not isinstance(params, torch.nn.Module):
        params = [p.detach() for p in params]
    inputs = [t.detach().cpu() for t in inputs]
    report = Report(getattr(fn, "__qualname__", str(fn)))
    check = _Check(fn, inputs, params, tol, timeout, report)
    if len(check.rows) != 1:
        raise make_error(
            "dloss.check_loss: the inputs' first dimensions differ (%s)" %
            sorted(check.rows), "Pass global-batch tensors with one row "
            "per sample each (0-d tensors go whole to every rank)")
    rows = check.rows.pop()
    if sizes is None:
        if rows < 2 * max(worlds):
            raise make_error(
                "dloss.check_loss: %d rows are too few to split over %d "
                "ranks evenly and unevenly" % (rows, max(worlds)),
                "Pass at least %d rows" % (2 * max(worlds)))
        sizes = [_split(rows, w, uneven) for w in worlds
                 for uneven in (False, True)]
    for split in sizes:
        if sum(split) != rows:
            raise make_error(
                "dloss.check_loss: sizes %s do not add up to the %d rows "
                "of the inputs" % (split, rows), "Pass per-rank sizes "
                "that add up to the global batch")
    results, lost = check.run([rows])
    if check.failed(results, lost, [rows], "error"):
        return report
    reference = results[0][1]
    broken = set()  # the world sizes whose even split did not finish
    for split in sizes:
        results, lost = check.run(split)
        even = max(split) - min(split) <= 1
        if len(split) in broken:
            continue  # its even split's failure says it
        if check.failed(results, lost, split,
                        "error" if even else "uneven"):
            if even:
                broken.add(len(split))
        else:
            check.compare(reference, results, split)
    return report


def _load(spec):
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit("expected MODULE:NAME, got %r" % spec)
    sys.path.insert(0, os.getcwd())
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m dloss.check_loss",
        description="Checks a hand-written distributed loss against one "
        "process on 2 and 3 Gloo ranks, even and uneven batches.")
    parser.add_argument("loss", help="MODULE:FUNCTION, the loss as each "
                        "rank calls it")
    parser.add_argument("--inputs", required=True, help="MODULE:FACTORY; "
                        "FACTORY() returns the global batch's inputs (a "
                        "tuple of tensors, or a dict with 'inputs' and "
                        "'params')")
    parser.add_argument("--worlds", default="2,3", help="world sizes "
                        "(default 2,3)")
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args(argv)
    made = _load(args.inputs)()
    inputs, params = (made["inputs"], made.get("params", ())) \
        if isinstance(made, dict) else (made, ())
    # This module's own functions, not __main__'s: its processes import
    # them by name.
    run = importlib.import_module("dloss.check_loss").check_loss
    report = run(_load(args.loss), *inputs, params=params,
                        worlds=[int(w) for w in args.worlds.split(",")],
                        tol=args.tol, timeout=args.timeout)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
