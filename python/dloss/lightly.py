"""lightly's self-supervised losses as exact distributed drop-ins: swap the
import, keep the training script.

    from dloss.lightly import BarlowTwinsLoss
    loss_fn = BarlowTwinsLoss(gather_distributed=True)

Each class subclasses lightly's own (same constructor, same ``forward``,
plus ``group=``, a torch.distributed group, default the default group);
only the loss is dloss's, the program one rank runs, compiled by
@dloss.loss:

- ``gather_distributed=True``: the single-device loss of the concatenated
  global batch, the same value on every rank, for batches of any size on
  each rank (an empty one included). Embedding gradients follow the ddp
  contract: rank r gets N * dF/dx_r, so DDP's average is the
  single-process gradient of the global batch.
  - BarlowTwinsLoss and VICRegLoss move statistics, never rows: the global
    batch's mean and variance (O(d) all-reduces) and the cross-correlation
    or covariance (one O(d^2) all-reduce). lightly's Barlow Twins
    batch-normalises each rank's rows apart, so its loss is not the
    global batch's.
  - NTXentLoss, DCLLoss and DCLWLoss gather, compare and reduce in dloss's
    fused ring-tiled op: no rank holds a B_local x B_global matrix.
    lightly's DCLW weights are a softmax over each rank's own rows; here
    they are the global batch's.
- ``gather_distributed=False``: each rank's own loss, as lightly computes
  it, with no collective (DDP then averages the per-rank gradients).

What is refused, and why, is in docs/Migration.md.
"""

import contextlib
import inspect
import logging
import math
import weakref

import torch
import torch.nn.functional as F

try:
    from lightly import loss as _lightly
except ImportError as e:
    raise ImportError(
        "dloss.lightly needs lightly 1.6 (tested with 1.6.0), which is not "
        "installed or does not import (%s): pip install lightly==1.6.0 "
        "(it needs torchvision), or pip install 'dloss[lightly]'" % e) from e

from .collectives import all_gather as _all_gather
from .errors import make_error
from .group import ALONE, runs_alone
from .metric_learning import _MASKED, _logaddexp
from .trace import (Input, Loss, State, all_gather, all_reduce, global_size,
                    shard_offset)

__all__ = ["BarlowTwinsLoss", "DCLLoss", "DCLWLoss", "DINOLoss",
           "IBOTPatchLoss", "MSNLoss", "NTXentLoss", "PMSNCustomLoss",
           "PMSNLoss", "SwaVLoss",
           "TiCoLoss", "VICRegLLoss", "VICRegLoss"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# The per-rank programs: lightly's single-device code, with the global
# batch's statistics where it means them.
# ---------------------------------------------------------------------------

def _barlow_twins(z_a, z_b, lambda_param):
    z_a_norm = F.batch_norm(z_a, None, None, training=True)
    z_b_norm = F.batch_norm(z_b, None, None, training=True)
    c = all_reduce(z_a_norm.T @ z_b_norm) / global_size(z_a)
    # The off-diagonal sum of squares as the whole one less the diagonal's:
    # lightly's flatten/view trick is not traceable, and a d x d identity
    # mask would cost more memory than c itself.
    diagonal = torch.diagonal(c)
    invariance = (diagonal - 1).pow(2).sum()
    off_diagonal = c.pow(2).sum() - diagonal.pow(2).sum()
    return invariance + lambda_param * off_diagonal


def _variance_and_covariance(x, eps):
    """VICReg's variance and covariance terms of one view from one global
    mean: the covariance's diagonal is the (unbiased) variance."""
    x = x - x.mean(dim=0)
    n = global_size(x)
    var = all_reduce(x.pow(2).sum(0)) / (n - 1)
    cov = all_reduce(x.T @ x) / (n - 1)
    variance = torch.mean(F.relu(1.0 - torch.sqrt(var + eps)))
    covariance = (cov.pow(2).sum() - var.pow(2).sum()) / x.shape[1]
    return variance, covariance


def _vicreg(z_a, z_b, lambda_param, mu_param, nu_param, eps):
    var_a, cov_a = _variance_and_covariance(z_a, eps)
    var_b, cov_b = _variance_and_covariance(z_b, eps)
    return (lambda_param * F.mse_loss(z_a, z_b) +
            mu_param * 0.5 * (var_a + var_b) + nu_param * (cov_a + cov_b))


def _ntxent(out0, out1, temperature):
    """SimCLR's NT-Xent over the 2B rows of the global batch (lightly's
    cross-entropy over [positive block, negatives]): each rank stacks its
    two views and gathers every rank's stack once; a row's positive is its
    other view, and a row is not its own negative."""
    out0, out1 = F.normalize(out0, dim=1), F.normalize(out1, dim=1)
    mine = torch.cat([out0, out1])
    logits = mine @ all_gather(mine).T / temperature
    n = out0.shape[0]
    firsts = torch.arange(n) + 2 * shard_offset(out0)
    rows = torch.cat([firsts, firsts + n])
    positives = torch.cat([firsts + n, firsts])
    own = rows[:, None] == torch.arange(2 * global_size(out0))[None, :]
    return F.cross_entropy(logits.masked_fill(own, float("-inf")), positives)


def _mises_fisher_weights(out0, out1, sigma):
    """lightly's negative_mises_fisher_weights, 2 - B softmax(s / sigma),
    with the softmax and B over the global batch (lightly's are the
    rank's own)."""
    s = (out0.detach() * out1.detach()).sum(1) / sigma
    # Cosines: s <= 1 / sigma, so exp(s - 1 / sigma) cannot overflow.
    e = torch.exp(s - 1.0 / sigma)
    return 2 - global_size(out0) * e / all_reduce(e.sum())


def _dcl(out0, out1, temperature, sigma):
    """lightly's DCL (sigma None) or DCLW: for each view, a row's negatives
    are every other row of both views (its positive excluded: decoupled),
    its positive term -cos / temperature, weighted in DCLW; the mean over
    the global batch, averaged over the two views."""
    out0, out1 = F.normalize(out0, dim=1), F.normalize(out1, dim=1)

    def half(a, b):
        ids = torch.arange(a.shape[0]) + shard_offset(a)
        own = ids[:, None] == torch.arange(global_size(a))[None, :]
        negatives = _logaddexp([
            torch.logsumexp((a @ all_gather(c).T / temperature)
                            .masked_fill(own, _MASKED), dim=1)
            for c in (a, b)])
        positive = (a * b).sum(1) / temperature
        if sigma is not None:
            positive = positive * _mises_fisher_weights(a, b, sigma)
        return (negatives - positive).mean()

    return 0.5 * (half(out0, out1) + half(out1, out0))


def _sinkhorn(q, iterations):
    """Sinkhorn-Knopp over the global batch's rows of the positive scores
    `q` (rows: samples, columns: prototypes), as lightly's SwaV and MSN
    normalise them, with no gradient: each prototype's mass all-reduced,
    each sample's row summing to 1 at the end. lightly divides by the
    local batch times the world size, or the local batch: wrong for
    uneven batches; here it is the global batch."""
    q = q.detach()
    q = q / all_reduce(q.sum())
    rows = global_size(q)
    for _ in range(iterations):
        q = q / all_reduce(q.sum(0, keepdim=True))  # each prototype's mass
        q = q / q.sum(1, keepdim=True) / rows       # each sample's
    return q * rows


def _swav(crops, n_high, n_queue, temperature, iterations, epsilon):
    """lightly's SwaV: the codes of each high-resolution crop (with its
    queue's rows, when given) predicted from every other crop; the mean
    over the global batch."""
    high, low = crops[:n_high], crops[n_high:len(crops) - n_queue]
    queue = crops[len(crops) - n_queue:]
    views = len(crops) - n_queue
    loss = 0.0
    for i in range(n_high):
        outputs = high[i]
        if n_queue:
            outputs = torch.cat((outputs, queue[i]))
        q = _sinkhorn(torch.exp(outputs.detach() / epsilon), iterations)
        if n_queue:
            q = q[:high[i].shape[0]]
        subloss = 0.0
        for z in [h for v, h in enumerate(high) if v != i] + list(low):
            subloss = subloss - torch.mean(torch.sum(
                q * F.log_softmax(z / temperature, dim=1), dim=1))
        loss = loss + subloss / (views - 1)
    return loss / n_high


def _program(name, params, body):
    """A per-rank program as @dloss.loss records it: `body(*args)` under
    the signature `params` (names, or (name, dloss.Input) pairs), so that
    a loss of several crops has one tensor parameter per crop and the
    counts are part of the plan."""
    def program(*args):
        return body(*args)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    program.__signature__ = inspect.Signature([
        inspect.Parameter(p, kind) if isinstance(p, str) else
        inspect.Parameter(p[0], kind, annotation=p[1]) for p in params])
    program.__name__ = program.__qualname__ = name
    return program


def _numbered(prefix, count):
    return ["%s_%d" % (prefix, i) for i in range(count)]


def _swav_program(n_high, n_low, n_queue):
    """`_swav` with one tensor parameter per crop and queue entry."""
    crops = n_high + n_low + n_queue
    return _program(
        "lightly_swav_%d_%d_%d" % (n_high, n_low, n_queue),
        _numbered("high", n_high) + _numbered("low", n_low) +
        _numbered("queue", n_queue) + ["temperature", "iterations",
                                       "epsilon"],
        lambda *args: _swav(list(args[:crops]), n_high, n_queue,
                            *args[crops:]))


def _dino(teachers, students, center, teacher_temp, student_temp,
          momentum, *pending):
    """lightly's DINO: the cross-entropy of every teacher view's centred,
    sharpened softmax against every other student view's log-softmax, the
    mean over the global batch; and the centre's EMA from the teacher
    outputs' global mean (lightly's is a mean of per-rank means). Under
    accumulation (`pending`: the step's sums so far), the centre stays
    and the step's sums grow instead."""
    t_out = [F.softmax((t - center) / teacher_temp, dim=-1) for t in teachers]
    s_out = [F.log_softmax(s / student_temp, dim=-1) for s in students]
    rows, terms = 0.0, 0
    for i, t in enumerate(t_out):
        for j, s in enumerate(s_out):
            if i != j:  # lightly's fill_diagonal_(0)
                rows = rows - (t * s).sum(-1)
                terms += 1
    loss = rows.mean() / terms
    if pending:
        return (loss,) + _accumulated(pending, teachers)
    batch_center = sum(t.detach().mean(0) for t in teachers) / len(teachers)
    return loss, center * momentum + batch_center * (1 - momentum)


def _accumulated(pending, views):
    """The step's running sums (`pending`: the teacher rows' sum, averaged
    over the views, and the global number of rows) with this call's
    global batch added: the centre's mean, once the step ends."""
    total, count = pending
    rows = sum(all_reduce(v.detach().sum(0)) for v in views) / len(views)
    return total + rows, count + global_size(views[0])


# The centre: loss state, or, under accumulation, fixed for the step while
# the step's sums are the state.
_CENTRE = [("center", State)]
_CENTRE_FIXED = [("center", Input(replicated=True, grad=False))]
_PENDING = [("pending_total", State), ("pending_count", State)]


def _dino_program(n_teacher, n_student, accumulate):
    """`_dino` with one tensor parameter per view and the teacher
    temperature as a tensor (a schedule changes it without a new plan)."""
    views = n_teacher + n_student
    return _program(
        "lightly_dino_%d_%d%s" % (n_teacher, n_student,
                                  "_accumulate" if accumulate else ""),
        _numbered("teacher", n_teacher) + _numbered("student", n_student) +
        (_CENTRE_FIXED if accumulate else _CENTRE) +
        [("teacher_temp", Input(grad=False)), "student_temp", "momentum"] +
        (_PENDING if accumulate else []),
        lambda *args: _dino(list(args[:n_teacher]),
                            list(args[n_teacher:views]), *args[views:]))


def _tico(z_a, z_b, covariance, beta, rho, update):
    """lightly's TiCo: transformative invariance plus the covariance
    contrast against C, an EMA of the batch's second moment of the
    normalised first view (no gradient), all-reduced over the global batch
    (lightly gathers the rows). Returns the loss and, when `update`, the
    new C."""
    z_a, z_b = F.normalize(z_a, dim=1), F.normalize(z_b, dim=1)
    moment = all_reduce(z_a.detach().T @ z_a.detach()) / global_size(z_a)
    c = beta * covariance + (1 - beta) * moment
    invariance = 1.0 - (z_a * z_b).sum(dim=1).mean()
    contrast = rho * ((z_a @ c) * z_a).sum(dim=1).mean()
    loss = invariance + contrast
    return (loss, c) if update else loss


def _tico_program(update):
    """`_tico`, C its state when it is updated, else a fixed input."""
    return _program(
        "lightly_tico" + ("" if update else "_fixed"),
        ["z_a", "z_b", ("covariance", State if update else Input(
            replicated=True, grad=False)), "beta", "rho"],
        lambda *args: _tico(*args, update))


def _msn(anchors, targets, prototypes, temperature, sharpen, iterations,
         regularization_weight, prior):
    """lightly's MSN over the global batch: each anchor view's
    cross-entropy against its target's sharpened prototype probabilities
    (Sinkhorn-normalised over the global batch; no gradient), the mean
    over every anchor; plus the mean-entropy regulariser of the global
    mean anchor probabilities (lightly's is each rank's), or PMSN's
    KL(prior || mean) when `prior` is given: the power-law distribution,
    or PMSNCustomLoss's function of the mean.
    lightly's sharpen(softmax(s / t), T) is softmax(s / (t T))."""
    prototypes = F.normalize(prototypes, dim=1)
    scores = F.normalize(targets.detach(), dim=1) @ prototypes.detach().T
    target = F.softmax(scores / (temperature * sharpen), dim=1)
    if iterations > 0:
        target = _sinkhorn(target, iterations)
    loss, mean_probs = 0.0, 0.0
    for a in anchors:
        logits = F.normalize(a, dim=1) @ prototypes.T / temperature
        loss = loss - (target * F.log_softmax(logits, dim=1)).sum(1).mean()
        mean_probs = mean_probs + F.softmax(logits, dim=1).mean(0)
    loss = loss / len(anchors)
    if regularization_weight > 0:
        m = mean_probs / len(anchors)
        if prior is None:  # mean entropy, plus log K
            reg = (m * torch.log(m)).sum() + math.log(m.shape[0])
        else:  # F.kl_div(m.log(), prior, reduction="sum")
            if callable(prior):
                prior = prior(m)
            reg = (prior * (torch.log(prior) - torch.log(m))).sum()
        loss = loss + regularization_weight * reg
    return loss


def _msn_program(views, power_law, target_distribution=None):
    """`_msn` with one tensor parameter per anchor view (each with this
    rank's rows of the targets), the prototypes replicated (a parameter
    of the model: DDP averages its gradient), and PMSN's prior (or
    PMSNCustomLoss's `target_distribution`, recorded into the program)."""
    def body(*args):
        rest = list(args[views:])
        prior = rest.pop(2) if power_law else target_distribution
        return _msn(list(args[:views]), *rest, prior)

    kind = "pmsn" if power_law else "msn" if target_distribution is None \
        else "pmsn_custom"
    return _program(
        "lightly_%s_%d" % (kind, views),
        _numbered("anchors", views) + [
            "targets", ("prototypes", Input(replicated=True))] +
        ([("prior", Input(replicated=True, grad=False))] if power_law
         else []) +
        ["temperature", "sharpen", "iterations", "regularization_weight"],
        body)


def _ibot_patch(teacher, student, weight, images, center, teacher_temp,
                student_temp, momentum, *pending):
    """lightly's iBOT patch loss over the global batch: the masked
    tokens' cross-entropies, each weighted by 1 / its image's masked
    count, summed over the global batch's tokens and divided by its
    number of images (`images`: one entry per image of this rank); the
    centre's EMA from the global mean of the masked teacher tokens
    (lightly's is a mean of the ranks' means), or, under accumulation,
    the step's sums."""
    t = F.softmax((teacher - center) / teacher_temp, dim=-1)
    s = F.log_softmax(student / student_temp, dim=-1)
    tokens = -(t * s).sum(-1) * weight
    loss = all_reduce(tokens.sum()) / global_size(images)
    if pending:
        return (loss,) + _accumulated(pending, [teacher])
    return loss, center * momentum + teacher.detach().mean(0) * (
        1 - momentum)


def _ibot_patch_program(accumulate):
    return _program(
        "lightly_ibot_patch" + ("_accumulate" if accumulate else ""),
        ["teacher", "student", ("weight", Input(grad=False)),
         ("images", Input(grad=False))] +
        (_CENTRE_FIXED if accumulate else _CENTRE) +
        [("teacher_temp", Input(grad=False)), "student_temp", "momentum"] +
        (_PENDING if accumulate else []),
        _ibot_patch)


# ---------------------------------------------------------------------------
# The drop-ins.
# ---------------------------------------------------------------------------

def _two_views(name, z_a, z_b, matrices=True):
    """lightly's checks of a pair of views, as dloss.Errors that say what
    to pass."""
    if matrices and (z_a.dim() != 2 or z_b.dim() != 2):
        raise make_error(
            "dloss.lightly.%s takes (batch, dim) embeddings; got shapes %s "
            "and %s" % (name, list(z_a.shape), list(z_b.shape)),
            "Flatten the features to (batch, dim) before the loss")
    if z_a.shape != z_b.shape:
        raise make_error(
            "dloss.lightly.%s: the two views' shapes differ on this rank: %s "
            "and %s" % (name, list(z_a.shape), list(z_b.shape)),
            "Pass the same rows of both views (one row per image in each)")


# Every drop-in's programs, by a key of the call (the number of crops, and
# whether it gathers), made on first use: while torch.compile traces the
# call, only a constant function may make one.
_BY_CROPS = weakref.WeakValueDictionary()


@torch._dynamo.assume_constant_result
def _made(owner, key):
    """Makes the program `key` of the drop-in registered as `owner` (once);
    returns True. Under torch.compile it runs while Dynamo traces, so the
    program exists when the compiled step calls it."""
    module = _BY_CROPS[owner]
    if key not in module._compiled:
        module._compiled[key] = module._program_for(key)
    return True


class _ByCrops:
    """A drop-in with one program per crop count and grouping, made on
    first use (`_program_for(key)`, `_gathers()` its flag)."""

    def _setup_crops(self, group):
        self._group = group
        self._compiled = {}
        self._owner = "%s-%d" % (type(self).__name__, id(self))
        _BY_CROPS[self._owner] = self

    def _program(self, counts):
        gathered = self._gathers() and not runs_alone(self._group)
        key = tuple(counts) + (gathered,)
        _made(self._owner, key)
        return self._compiled[key]


class _Centred(_ByCrops):
    """A drop-in with a centre (DINO's, iBOT's): loss state, updated in
    the loss's own program; ``accumulate()`` for gradient accumulation."""

    _pending = None

    def _gathers(self):
        return True  # lightly's centre is all-reduced: there is no flag

    def _centre(self):
        """The centre buffer's storage, flat: the loss stores the new
        centre there."""
        return self._centre_buffer().view(-1)

    def _centre_args(self, temperature):
        """The centre (and the step's sums under accumulation) and the
        teacher temperature, as the program takes them."""
        centre = self._centre()
        temp = torch.tensor(float(temperature), dtype=centre.dtype,
                            device=centre.device)
        return [centre, temp], list(self._pending or ())

    @contextlib.contextmanager
    def accumulate(self):
        """Gradient accumulation: one optimizer step over the calls in the
        block (under DDP's ``no_sync`` but the last, say). Each call's loss
        uses the centre as the block found it; the centre moves once, as
        the block ends, by the mean of the teacher outputs of all its
        calls: the step's whole batch, as one call on that batch would
        move it, identically on every rank. Without the block the centre
        moves at every call, as in lightly (whose PR #2062 is this)."""
        if self._pending is not None:
            raise make_error(
                "dloss.lightly.%s.accumulate() is already open" %
                type(self).__name__,
                "Open one block per optimizer step, not one inside another")
        centre = self._centre()
        self._pending = (torch.zeros_like(centre),
                         centre.new_zeros(()))
        try:
            yield self
        finally:
            total, count = self._pending
            self._pending = None
        # Not on an exception (above): the step did not happen.
        if count.item() > 0:
            momentum = self._momentum()
            with torch.no_grad():
                centre.mul_(momentum).add_(total / count * (1 - momentum))


class _Distributed(_ByCrops):
    """The dloss program of a two-view lightly loss: over `group` when the
    loss gathers (gather_distributed and more than one rank), else over
    this rank alone, as lightly computes it without the flag."""

    def _setup(self, program, group):
        self._program_fn = program
        self._setup_crops(group)

    def _gathers(self):
        return bool(self.gather_distributed)

    def _program_for(self, key):
        return Loss(self._program_fn, grad_mode="ddp",
                    group=self._group if key[-1] else ALONE,
                    name="lightly_" + type(self).__name__)

    def program(self):
        """The dloss.Loss this call runs (over the group, or alone) and the
        constants it takes after the two views."""
        return self._program(()), self._constants()

    def _run(self, a, b):
        fn, constants = self.program()
        return fn(a, b, *constants)


class BarlowTwinsLoss(_lightly.BarlowTwinsLoss, _Distributed):
    """lightly's ``BarlowTwinsLoss``. With ``gather_distributed=True``, the
    global batch's loss: each view batch-normalised with the global batch's
    mean and variance, its cross-correlation all-reduced (O(d^2), no rows
    move); lightly normalises each rank's rows apart."""

    def __init__(self, lambda_param=5e-3, gather_distributed=False,
                 group=None):
        super().__init__(lambda_param=lambda_param,
                         gather_distributed=gather_distributed)
        self._setup(_barlow_twins, group)

    def forward(self, z_a, z_b):
        _two_views("BarlowTwinsLoss", z_a, z_b)
        return self._run(z_a, z_b)

    def _constants(self):
        return (float(self.lambda_param),)


class VICRegLoss(_lightly.VICRegLoss, _Distributed):
    """lightly's ``VICRegLoss`` on (batch, dim) embeddings. With
    ``gather_distributed=True``, the global batch's loss: the invariance
    term's mean, the variances and the covariances are the global batch's
    (O(d) and O(d^2) all-reduces; lightly gathers the rows). Ranks may hold
    different numbers of rows; the global batch needs at least two."""

    def __init__(self, lambda_param=25.0, mu_param=25.0, nu_param=1.0,
                 gather_distributed=False, eps=0.0001, group=None):
        super().__init__(lambda_param=lambda_param, mu_param=mu_param,
                         nu_param=nu_param,
                         gather_distributed=gather_distributed, eps=eps)
        self._setup(_vicreg, group)

    def forward(self, z_a, z_b):
        _two_views("VICRegLoss", z_a, z_b)
        if not self.gather_distributed and z_a.shape[0] <= 1:
            raise make_error(
                "dloss.lightly.VICRegLoss: a batch of %d row(s) has no "
                "variance" % z_a.shape[0],
                "Pass at least 2 rows per rank, or gather_distributed=True "
                "(then only the global batch needs 2)")
        return self._run(z_a, z_b)

    def _constants(self):
        return (float(self.lambda_param), float(self.mu_param),
                float(self.nu_param), float(self.eps))


class NTXentLoss(_lightly.NTXentLoss, _Distributed):
    """lightly's ``NTXentLoss`` (SimCLR) without a memory bank. With
    ``gather_distributed=True``, the global batch's loss over its 2B rows,
    fused; lightly's labels (``rank * batch_size``) assume equal batches."""

    def __init__(self, temperature=0.5, memory_bank_size=0,
                 gather_distributed=False, group=None):
        super().__init__(temperature=temperature,
                         memory_bank_size=memory_bank_size,
                         gather_distributed=gather_distributed)
        if self.memory_bank.size[0] != 0:
            raise make_error(
                "dloss.lightly.NTXentLoss does not take a memory bank "
                "(memory_bank_size=%r): the bank's negatives are state "
                "that each rank fills from its own batches" %
                (memory_bank_size,),
                "Use memory_bank_size=0 (in-batch negatives, exact over "
                "the global batch), or lightly.loss.NTXentLoss for a bank")
        self._setup(_ntxent, group)

    def forward(self, out0, out1):
        _two_views("NTXentLoss", out0, out1)
        return self._run(out0, out1)

    def _constants(self):
        return (float(self.temperature),)


class DCLLoss(_lightly.DCLLoss, _Distributed):
    """lightly's ``DCLLoss`` (decoupled contrastive learning), fused. A
    ``weight_fn`` of your own is refused with ``gather_distributed=True``:
    dloss cannot tell whether it uses the batch (use DCLWLoss for the
    paper's weighting)."""

    _sigma = None

    def __init__(self, temperature=0.1, weight_fn=None,
                 gather_distributed=False, group=None):
        super().__init__(temperature=temperature, weight_fn=weight_fn,
                         gather_distributed=gather_distributed)
        if weight_fn is not None and type(self) is DCLLoss:
            raise make_error(
                "dloss.lightly.DCLLoss does not take a weight_fn: dloss "
                "cannot tell whether %s reads the batch (a softmax over it "
                "would be each rank's, not the global batch's)" %
                getattr(weight_fn, "__name__", type(weight_fn).__name__),
                "Use dloss.lightly.DCLWLoss(sigma=...) for the negative "
                "von Mises-Fisher weighting, or lightly.loss.DCLLoss")
        self._setup(_dcl, group)

    def forward(self, out0, out1):
        _two_views(type(self).__name__, out0, out1)
        return self._run(out0, out1)

    def _constants(self):
        return (float(self.temperature), self._sigma)


class DCLWLoss(_lightly.DCLWLoss, DCLLoss):
    """lightly's ``DCLWLoss``: DCL with negative von Mises-Fisher weights
    on the positive term. With ``gather_distributed=True`` the weights are
    a softmax over the global batch (lightly's are each rank's own)."""

    def __init__(self, temperature=0.1, sigma=0.5, gather_distributed=False,
                 group=None):
        # lightly's __init__ reaches DCLLoss's (this class's next in line)
        # with lightly's weight_fn, which dloss's program replaces.
        super().__init__(temperature=temperature, sigma=sigma,
                         gather_distributed=gather_distributed)
        self._sigma = float(sigma)
        self._setup(_dcl, group)


class SwaVLoss(_lightly.SwaVLoss, _ByCrops):
    """lightly's ``SwaVLoss``. With ``sinkhorn_gather_distributed=True``
    the Sinkhorn-Knopp codes are the global batch's (all-reduced sums, no
    gradient, the iterations unrolled into the plan), exact for uneven
    batches (lightly's normalisation assumes equal ones), and the loss is
    the global batch's mean, the same on every rank. A queue's rows join
    the rank's rows in the codes, as in lightly. Returns a tensor of shape
    (1,), as lightly does."""

    def __init__(self, temperature=0.1, sinkhorn_iterations=3,
                 sinkhorn_epsilon=0.05, sinkhorn_gather_distributed=False,
                 group=None):
        super().__init__(
            temperature=temperature, sinkhorn_iterations=sinkhorn_iterations,
            sinkhorn_epsilon=sinkhorn_epsilon,
            sinkhorn_gather_distributed=sinkhorn_gather_distributed)
        self._setup_crops(group)

    def _gathers(self):
        return bool(self.sinkhorn_gather_distributed)

    def _program_for(self, key):
        return Loss(_swav_program(*key[:3]), grad_mode="ddp",
                    group=self._group if key[3] else ALONE)

    def forward(self, high_resolution_outputs, low_resolution_outputs,
                queue_outputs=None):
        high, low = list(high_resolution_outputs), \
            list(low_resolution_outputs)
        queue = list(queue_outputs) if queue_outputs is not None else []
        if not high:
            raise make_error(
                "dloss.lightly.SwaVLoss: no high-resolution outputs",
                "Pass at least one crop's prototype scores in "
                "high_resolution_outputs")
        if queue and len(queue) != len(high):
            raise make_error(
                "dloss.lightly.SwaVLoss: %d queue outputs for %d "
                "high-resolution crops" % (len(queue), len(high)),
                "Pass one queue output per high-resolution crop")
        if len(high) + len(low) < 2:
            raise make_error(
                "dloss.lightly.SwaVLoss needs at least two crops in all",
                "Pass another high- or low-resolution crop")
        fn = self._program((len(high), len(low), len(queue)))
        loss = fn(*high, *low, *[q.detach() for q in queue],
                  float(self.temperature), int(self.sinkhorn_iterations),
                  float(self.sinkhorn_epsilon))
        return loss.reshape(1)


class DINOLoss(_lightly.DINOLoss, _Centred):
    """lightly's ``DINOLoss``, always over the global batch when a process
    group is running (lightly's DINO has no flag: its centre is
    all-reduced whenever torch.distributed is initialised). The loss is
    the global batch's mean, the same on every rank; the centre buffer is
    updated at each call, in the same program, from the teacher outputs'
    global mean (lightly averages the ranks' means: wrong for uneven
    batches), identically on every rank, and is in ``state_dict()`` as in
    lightly. Under gradient accumulation, ``with loss_fn.accumulate():``
    around a step's calls updates it once, from the step's whole batch."""

    def __init__(self, output_dim=65536, warmup_teacher_temp=0.04,
                 teacher_temp=0.04, warmup_teacher_temp_epochs=30,
                 student_temp=0.1, center_momentum=0.9, center_mode="mean",
                 group=None):
        super().__init__(
            output_dim=output_dim, warmup_teacher_temp=warmup_teacher_temp,
            teacher_temp=teacher_temp,
            warmup_teacher_temp_epochs=warmup_teacher_temp_epochs,
            student_temp=student_temp, center_momentum=center_momentum,
            center_mode=center_mode)
        self._setup_crops(group)

    def _program_for(self, key):
        return Loss(_dino_program(*key[:3]), grad_mode="ddp",
                    group=self._group if key[-1] else ALONE)

    def _centre_buffer(self):
        return self.center

    def _momentum(self):
        return float(self.center_momentum)

    def forward(self, teacher_out, student_out, teacher_temp=None,
                epoch=None):
        teachers, students = list(teacher_out), list(student_out)
        if not teachers or not students or \
                len(teachers) == 1 and len(students) == 1:
            raise make_error(
                "dloss.lightly.DINOLoss needs at least two views in all, "
                "got %d teacher and %d student view(s)" % (
                    len(teachers), len(students)),
                "Pass several crops' outputs (the terms of a view with "
                "itself are left out, as in lightly)")
        if teacher_temp is not None:
            temperature = float(teacher_temp)
        elif epoch is not None and epoch < self.warmup_teacher_temp_epochs:
            temperature = float(self.teacher_temp_schedule[epoch])
        else:
            temperature = float(self.teacher_temp)
        fn = self._program((len(teachers), len(students),
                            self._pending is not None))
        centre, pending = self._centre_args(temperature)
        return fn(*teachers, *students, *centre, float(self.student_temp),
                  float(self.center_momentum), *pending)


class TiCoLoss(_lightly.TiCoLoss, _ByCrops):
    """lightly's ``TiCoLoss``. With ``gather_distributed=True``, the global
    batch's loss, the same on every rank: the second moment behind C is
    all-reduced (O(d^2); lightly gathers the rows), and C, updated in the
    same program, is identical on every rank. C is a buffer here (None
    until the first call, then in ``state_dict()``); lightly keeps it as a
    plain attribute. TiCo's loss reads its own batch's moment, so under
    gradient accumulation no schedule of updates equals one large batch:
    pass ``update_covariance_matrix=False`` on all but one micro-batch to
    update C once per optimizer step."""

    def __init__(self, beta=0.9, rho=8.0, gather_distributed=False,
                 group=None):
        super().__init__(beta=beta, rho=rho,
                         gather_distributed=gather_distributed)
        del self.C
        self.register_buffer("C", None)
        self._setup_crops(group)

    def _gathers(self):
        return bool(self.gather_distributed)

    def _program_for(self, key):
        return Loss(_tico_program(key[0]), grad_mode="ddp",
                    group=self._group if key[-1] else ALONE)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        saved = state_dict.get(prefix + "C")
        if self.C is None and saved is not None:
            self.C = torch.empty_like(saved)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, z_a, z_b, update_covariance_matrix=True):
        _two_views("TiCoLoss", z_a, z_b)
        if not self._gathers() and z_a.shape[0] <= 1:
            raise make_error(
                "dloss.lightly.TiCoLoss: a batch of %d row(s) has no "
                "second moment to learn from" % z_a.shape[0],
                "Pass at least 2 rows per rank, or gather_distributed=True "
                "(then only the global batch needs 2)")
        d = z_a.shape[1]
        if self.C is None:
            self.C = z_a.new_zeros(d, d, requires_grad=False)
        elif self.C.shape != (d, d):
            raise make_error(
                "dloss.lightly.TiCoLoss: the embeddings have %d features "
                "but C, from earlier calls or a checkpoint, is %s" % (
                    d, list(self.C.shape)),
                "Pass embeddings of the width the loss was used with, or "
                "a new TiCoLoss")
        fn = self._program((bool(update_covariance_matrix),))
        return fn(z_a, z_b, self.C, float(self.beta), float(self.rho))


class MSNLoss(_lightly.MSNLoss, _ByCrops):
    """lightly's ``MSNLoss``. With ``gather_distributed=True``, the global
    batch's loss, the same on every rank: the targets' Sinkhorn
    normalisation over the global batch (lightly's assumes equal batches),
    the mean over every rank's anchors, and the mean-entropy regulariser
    of the global batch's mean anchor probabilities (lightly's is each
    rank's, as the official MSN's is not). ``anchors`` holds the views one
    after another, each with the rows of ``targets``; ``prototypes`` is
    the model's parameter, the same on every rank (DDP averages its
    gradient to the global batch's)."""

    _power_law = False

    def __init__(self, temperature=0.1, sinkhorn_iterations=3,
                 regularization_weight=1.0, gather_distributed=False,
                 group=None):
        super().__init__(temperature=temperature,
                         sinkhorn_iterations=sinkhorn_iterations,
                         regularization_weight=regularization_weight,
                         gather_distributed=gather_distributed)
        self._setup_crops(group)
        self._views = None

    def _gathers(self):
        return bool(self.gather_distributed)

    def _program_for(self, key):
        return Loss(_msn_program(key[0], self._power_law,
                                 self._target_distribution()),
                    grad_mode="ddp", group=self._group if key[-1] else ALONE)

    def _target_distribution(self):
        return None

    def _prior(self, prototypes):
        return []

    def _anchor_views(self, anchors, targets, prototypes):
        """The number of anchor views, checked; an empty rank's is the
        last call's (every rank's program must be the same)."""
        name = type(self).__name__
        if anchors.dim() != 2 or targets.dim() != 2 or \
                prototypes.dim() != 2:
            raise make_error(
                "dloss.lightly.%s takes (rows, dim) anchors, targets and "
                "prototypes; got shapes %s, %s and %s" % (
                    name, list(anchors.shape), list(targets.shape),
                    list(prototypes.shape)),
                "Flatten the features to (rows, dim)")
        if not anchors.shape[1] == targets.shape[1] == prototypes.shape[1]:
            raise make_error(
                "dloss.lightly.%s: anchors, targets and prototypes have %d, "
                "%d and %d features" % (name, anchors.shape[1],
                                        targets.shape[1],
                                        prototypes.shape[1]),
                "Project all three to the prototypes' width")
        n = targets.shape[0]
        if n == 0:
            if anchors.shape[0] != 0 or self._views is None:
                raise make_error(
                    "dloss.lightly.%s: this rank has no targets and %d "
                    "anchors, and no earlier call tells how many anchor "
                    "views there are" % (name, anchors.shape[0]),
                    "Give every rank at least one row on the first call")
            return self._views
        if anchors.shape[0] == 0 or anchors.shape[0] % n:
            raise make_error(
                "dloss.lightly.%s: %d anchor rows are not a whole number "
                "of views of the %d targets" % (name, anchors.shape[0], n),
                "Pass anchors as the views one after another, each with "
                "one row per target")
        self._views = anchors.shape[0] // n
        return self._views

    def forward(self, anchors, targets, prototypes,
                target_sharpen_temperature=0.25):
        views = self._anchor_views(anchors, targets, prototypes)
        n = targets.shape[0]
        fn = self._program((views,))
        return fn(*[anchors[v * n:(v + 1) * n] for v in range(views)],
                  targets, prototypes, *self._prior(prototypes),
                  float(self.temperature), float(target_sharpen_temperature),
                  int(self.sinkhorn_iterations),
                  float(self.regularization_weight))


class PMSNLoss(_lightly.PMSNLoss, MSNLoss):
    """lightly's ``PMSNLoss``: MSN whose regulariser is the KL divergence
    of the global batch's mean anchor probabilities from a power law
    (lightly's is each rank's)."""

    _power_law = True

    def __init__(self, temperature=0.1, sinkhorn_iterations=3,
                 regularization_weight=1, power_law_exponent=0.25,
                 gather_distributed=False, group=None):
        super().__init__(temperature=temperature,
                         sinkhorn_iterations=sinkhorn_iterations,
                         regularization_weight=regularization_weight,
                         power_law_exponent=power_law_exponent,
                         gather_distributed=gather_distributed)
        self._setup_crops(group)

    def _prior(self, prototypes):
        # lightly's power law: (1 / k) ** exponent for k = 1..K, summing
        # to 1.
        k = torch.arange(1, prototypes.shape[0] + 1, device=prototypes.device,
                         dtype=prototypes.dtype)
        prior = k ** -float(self.power_law_exponent)
        return [prior / prior.sum()]


class IBOTPatchLoss(_lightly.IBOTPatchLoss, _Centred):
    """lightly's ``IBOTPatchLoss``, always over the global batch when a
    process group is running (as lightly's centre is): the masked tokens'
    weighted cross-entropies summed over the global batch and divided by
    its number of images, the same on every rank; the centre (in
    ``state_dict()``) updated in the same program from the global mean of
    the masked teacher tokens, identical on every rank (lightly averages
    the ranks' means: wrong when the ranks mask different numbers of
    tokens). Under gradient accumulation, ``with loss_fn.accumulate():``
    around a step's calls updates it once, from the step's whole batch."""

    def __init__(self, output_dim=65536, teacher_temp=0.04, student_temp=0.1,
                 center_mode="mean", center_momentum=0.9, group=None):
        super().__init__(output_dim=output_dim, teacher_temp=teacher_temp,
                         student_temp=student_temp, center_mode=center_mode,
                         center_momentum=center_momentum)
        self._setup_crops(group)

    def _program_for(self, key):
        return Loss(_ibot_patch_program(key[0]), grad_mode="ddp",
                    group=self._group if key[-1] else ALONE)

    def _centre_buffer(self):
        return self.center.center

    def _momentum(self):
        return float(self.center.momentum)

    def forward(self, teacher_out, student_out, mask, teacher_temp=None):
        if teacher_out.dim() != 2 or teacher_out.shape != student_out.shape:
            raise make_error(
                "dloss.lightly.IBOTPatchLoss takes (masked tokens, dim) "
                "teacher and student outputs of one shape; got %s and %s" % (
                    list(teacher_out.shape), list(student_out.shape)),
                "Pass the outputs of the masked tokens only, flattened")
        # (Under torch.compile the count is data: not checked.)
        if mask.dtype != torch.bool or mask.dim() != 3 or (
                not torch.compiler.is_compiling() and
                int(mask.sum()) != teacher_out.shape[0]):
            raise make_error(
                "dloss.lightly.IBOTPatchLoss: the mask (%s, %s) must be a "
                "boolean (batch, height, width) tensor with one True entry "
                "per output row (%d)" % (
                    mask.dtype, list(mask.shape), teacher_out.shape[0]),
                "Pass the mask that selected the masked tokens")
        counts = mask.sum(dim=(1, 2))
        num_masked = counts.clamp(min=1.0)
        # Each token's 1 / its image's count (lightly's expand_as(mask)
        # [mask], without a data-dependent shape: the tokens come image by
        # image).
        weight = (1.0 / num_masked).repeat_interleave(
            counts, output_size=teacher_out.shape[0])
        centre, pending = self._centre_args(
            teacher_temp if teacher_temp is not None else self.teacher_temp)
        fn = self._program((self._pending is not None,))
        return fn(teacher_out, student_out, weight.to(student_out.dtype),
                  num_masked.to(student_out.dtype), *centre,
                  float(self.student_temp), self._momentum(), *pending)


class VICRegLLoss(_lightly.VICRegLLoss):
    """lightly's ``VICRegLLoss``. With ``gather_distributed=True``, the
    global batch's loss, the same on every rank, for uneven batches: but
    unfused. Every input is gathered with dloss.all_gather (exact
    gradients; lightly's gather needs equal batches and its invariance
    terms are each rank's), and lightly's own single-device computation,
    its nearest-neighbour matching of the local features included, runs
    on the global batch. Why: VICRegL's local covariance is one d x d
    matrix per matched position, a product over the batch per position
    that @dloss.loss cannot record yet; so each rank computes the whole
    batch's loss (the world size times the compute, the global batch's
    features in memory). Said once, on rank 0."""

    def __init__(self, lambda_param=25.0, mu_param=25.0, nu_param=1.0,
                 alpha=0.75, gather_distributed=False, eps=0.0001,
                 num_matches=(20, 4), group=None):
        super().__init__(lambda_param=lambda_param, mu_param=mu_param,
                         nu_param=nu_param, alpha=alpha,
                         gather_distributed=gather_distributed, eps=eps,
                         num_matches=num_matches)
        self._group = group
        self._remarked = False

    def _gather_all(self, views):
        return None if views is None else [
            tuple(_all_gather(t, self._group) for t in v)
            if isinstance(v, (tuple, list)) else _all_gather(v, self._group)
            for v in views]

    def forward(self, global_view_features, global_view_grids,
                local_view_features=None, local_view_grids=None):
        if not self.gather_distributed or runs_alone(self._group):
            return super().forward(global_view_features, global_view_grids,
                                   local_view_features, local_view_grids)
        if not self._remarked:
            self._remarked = True
            if torch.distributed.get_rank() == 0:
                log.warning(
                    "dloss.lightly.VICRegLLoss runs unfused: every rank "
                    "gathers the global batch and computes its whole loss "
                    "(exact, uneven batches included). VICRegL's local "
                    "covariance, a d x d matrix per matched position, is a "
                    "product over the batch that dloss's programs cannot "
                    "record yet.")
        # lightly's own computation, on the global batch, gathering nothing.
        flags = self.gather_distributed, self.vicreg_loss.gather_distributed
        self.gather_distributed = self.vicreg_loss.gather_distributed = False
        try:
            return super().forward(*(self._gather_all(v) for v in (
                global_view_features, global_view_grids, local_view_features,
                local_view_grids)))
        finally:
            self.gather_distributed, self.vicreg_loss.gather_distributed = \
                flags


class PMSNCustomLoss(_lightly.PMSNCustomLoss, MSNLoss):
    """lightly's ``PMSNCustomLoss``: MSN whose regulariser is the KL
    divergence of the global batch's mean anchor probabilities from
    ``target_distribution(mean)`` (lightly's mean is each rank's). Your
    function is recorded into dloss's program like the rest of the loss:
    it must use operations @dloss.loss records (an error names its line
    otherwise), and its result must be positive where the mean is."""

    def __init__(self, target_distribution, temperature=0.1,
                 sinkhorn_iterations=3, regularization_weight=1,
                 gather_distributed=False, group=None):
        super().__init__(target_distribution=target_distribution,
                         temperature=temperature,
                         sinkhorn_iterations=sinkhorn_iterations,
                         regularization_weight=regularization_weight,
                         gather_distributed=gather_distributed)
        self._setup_crops(group)

    def _target_distribution(self):
        return self.target_distribution
