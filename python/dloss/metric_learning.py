"""pytorch-metric-learning's NTXentLoss and SupConLoss as exact, fused
distributed drop-ins, and its DistributedLossWrapper as a converter to them.

Each loss is the program one rank runs on its shard (written with
@dloss.loss, so gather + similarity + loss compile to dloss's fused
ring-tiled op): its value is PML's value on one process over the
concatenated global batch, the same on every rank; embedding gradients
follow the ddp contract (rank r gets N * dF/dx_r, so DDP's average is the
single-process gradient). PML's meaning is kept exactly: CosineSimilarity
(embeddings L2-normalised), all pairs from the labels (positives: same
label, not the row itself; negatives: another label), NTXent's per-pair
loss and MeanReducer, SupCon's per-anchor loss and AvgNonZeroReducer, and
the zero loss when the global batch has no positive or no negative pair.
Differences are listed in docs/Migration.md.
"""

import torch
import torch.nn.functional as F

from .errors import make_error
from .schedule import check_schedule
from .trace import Loss, all_gather, all_reduce, global_size, shard_offset

# What a masked similarity is set to: finite (as PML's finfo.min), so that a
# row with nothing left has a finite log-sum-exp and a zero, not NaN,
# gradient; exp of it underflows to exactly 0 next to any real logit.
_MASKED = -1e30


def _logaddexp(values):
    """log(sum(exp(v))) of per-row log-sum-exps, pairwise:
    log(e^z + e^v) = z - log sigmoid(z - v). The first must be finite."""
    total = values[0]
    for v in values[1:]:
        total = total - F.logsigmoid(total - v)
    return total


# ---------------------------------------------------------------------------
# PML's constructor keywords: accepted when they hold PML's defaults.
# ---------------------------------------------------------------------------

def _pml_module(name):
    """PML's class `name` from pytorch_metric_learning, or None when PML is
    not installed (then no PML object can have been passed either)."""
    try:
        from pytorch_metric_learning import distances, reducers
    except ImportError:
        return None
    return getattr(distances, name, None) or getattr(reducers, name, None)


def _is_default_distance(distance):
    cls = _pml_module("CosineSimilarity")
    return cls is not None and type(distance) is cls and \
        distance.normalize_embeddings and distance.p == 2 and \
        distance.power == 1 and distance.is_inverted


def _is_default_reducer(reducer, default):
    cls = _pml_module(default)
    if cls is None or type(reducer) is not cls:
        return False
    if default == "AvgNonZeroReducer":
        return reducer.low == 0 and reducer.high is None
    return True


def check_pml_options(loss_name, options, default_reducer="MeanReducer"):
    """Refuses PML keywords that would change the loss: a `distance` other
    than the default CosineSimilarity, a `reducer` other than the loss's
    default, an embedding or weight regularizer, stats collection.
    `options` maps PML's keyword names to values (a constructor's keywords,
    or a PML object's attributes)."""
    bad = []
    distance = options.get("distance")
    if distance is not None and not _is_default_distance(distance):
        bad.append("distance=%s (only CosineSimilarity() with its defaults)"
                   % type(distance).__name__)
    reducer = options.get("reducer")
    if reducer is not None and not _is_default_reducer(reducer,
                                                       default_reducer):
        bad.append("reducer=%s (only %s() with its defaults)" %
                   (type(reducer).__name__, default_reducer))
    for reg in ("embedding_regularizer", "weight_regularizer"):
        if options.get(reg) is not None:
            bad.append("%s=%s" % (reg, type(options[reg]).__name__))
    if options.get("collect_stats"):
        bad.append("collect_stats=True (dloss records no statistics)")
    if bad:
        raise make_error(
            "dloss.%s supports PML's default distance, reducer and no "
            "regularizers; got %s" % (loss_name, "; ".join(bad)),
            "Drop the argument(s), or add a regularizer's term to the loss "
            "yourself (it is per-rank: all_reduce it, dividing by the global "
            "batch, to keep it exact)")


def _labels(labels, loss_name):
    if labels is None:
        raise make_error(
            "dloss.%s needs labels" % loss_name,
            "Pass (embeddings, labels): dloss forms every positive and "
            "negative pair of the global batch from them")
    if isinstance(labels, torch.Tensor) and not labels.is_floating_point() \
            and labels.dtype not in (torch.bool, torch.int64):
        return labels.long()
    return labels


def _refuse_extras(loss_name, indices_tuple, ref_emb, ref_labels):
    if indices_tuple is not None:
        raise make_error(
            "dloss.%s does not support indices_tuple (a miner's pairs or "
            "triplets) yet; it would be silently wrong to ignore it" %
            loss_name,
            "Call it with (embeddings, labels): every pair of the global "
            "batch is used, as PML does without a miner")
    if ref_emb is not None or ref_labels is not None:
        raise make_error(
            "dloss.%s does not support ref_emb / ref_labels" % loss_name,
            "Call it with (embeddings, labels): each rank's rows are "
            "compared with every rank's rows, the global batch")


# ---------------------------------------------------------------------------
# The per-rank programs.
# ---------------------------------------------------------------------------

def _pair_masks(u, labels):
    """(same label, positive) masks of this rank's rows against every
    rank's: positive = same label and not the row itself (PML's
    fill_diagonal_)."""
    labels_all = all_gather(labels)
    rows = torch.arange(u.shape[0]) + shard_offset(u)
    cols = torch.arange(global_size(u))
    same = labels[:, None] == labels_all[None, :]
    is_self = rows[:, None] == cols[None, :]
    return same, same & ~is_self, is_self


def _ones(logits):
    """1 at every element of `logits`, as an element-wise function of it:
    a count of pairs (a mask's sum) then stays in the fused tile program,
    where torch.ones_like would read the similarity as a whole matrix.
    `logits` is finite (a cosine over a temperature)."""
    return logits * 0.0 + 1.0


def _ntxent(embeddings, labels, temperature):
    """PML's NTXentLoss: for every positive pair (a, p) of the global batch
    -log(e^l_ap / (e^l_ap + sum over a's negatives n of e^l_an)), l the
    cosine over temperature, averaged over the positive pairs (MeanReducer);
    0 without positive or negative pairs. Per pair that is
    softplus(lse_neg(a) - l_ap) = -log sigmoid(l_ap - lse_neg(a)): a log-sum-exp over the anchor's negatives
    (one fused similarity), then a sum over its positives that reads it as a
    per-row value (a second one: a fused program cannot read its own
    reduction)."""
    u = F.normalize(embeddings, dim=1)
    same, positive, _ = _pair_masks(u, labels)
    logits = u @ all_gather(u).T / temperature
    lse_neg = torch.logsumexp(logits.masked_fill(same, _MASKED), dim=1)
    logits2 = u @ all_gather(u).T / temperature
    # softplus(lse_neg - l) as -log_sigmoid(l - lse_neg): the same value,
    # and the unfused runtime's softplus cuts off at 20 (2e-9 absolute).
    per_pair = -F.logsigmoid(logits2 - lse_neg[:, None])
    total = all_reduce(torch.where(positive, per_pair, 0.0).sum())
    ones = _ones(logits2)
    pairs = all_reduce(torch.where(positive, ones, 0.0).sum())
    return total / torch.where(pairs == 0, 1.0, pairs)


def _supcon(embeddings, labels, temperature):
    """PML's SupConLoss: per anchor i, -mean over its positives p of
    log softmax_{a != i}(l_i)[p]; the mean over the anchors whose loss is
    non-zero (AvgNonZeroReducer: the anchors with a positive, B > 2); 0
    when the global batch has no positive or no negative pair."""
    u = F.normalize(embeddings, dim=1)
    same, positive, is_self = _pair_masks(u, labels)
    logits = u @ all_gather(u).T / temperature
    lse = torch.logsumexp(logits.masked_fill(is_self, _MASKED), dim=1)
    pos_sum = torch.where(positive, logits, 0.0).sum(dim=1)
    ones = _ones(logits)
    count = torch.where(positive, ones, 0.0).sum(dim=1)
    negatives = all_reduce(torch.where(same, 0.0, ones).sum())
    has_pos = count != 0
    per_row = torch.where(has_pos, lse - pos_sum /
                          torch.where(has_pos, count, 1.0), 0.0)
    total = all_reduce(per_row.sum())
    anchors = all_reduce(has_pos.to(embeddings.dtype).sum())
    loss = total / torch.where(anchors == 0, 1.0, anchors)
    return torch.where(negatives == 0, 0.0, loss)


# ---------------------------------------------------------------------------
# The drop-ins.
# ---------------------------------------------------------------------------

class _PairLoss(torch.nn.Module):
    _program = None
    _reducer = "MeanReducer"

    def __init__(self, temperature, group=None, fuse=True, schedule=None,
                 distance=None, reducer=None, embedding_regularizer=None,
                 embedding_reg_weight=1, collect_stats=None):
        super().__init__()
        name = type(self).__name__
        check_schedule(schedule, "dloss." + name)
        check_pml_options(name, dict(
            distance=distance, reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
            collect_stats=collect_stats), self._reducer)
        self.temperature = float(temperature)
        self._fn = Loss(type(self)._program, grad_mode="ddp", fuse=fuse,
                        group=group, name=name.lower(), schedule=schedule)

    def _inputs(self, embeddings, labels, indices_tuple, ref_emb,
                ref_labels):
        name = type(self).__name__
        _refuse_extras(name, indices_tuple, ref_emb, ref_labels)
        return embeddings, _labels(labels, name), self.temperature

    def forward(self, embeddings, labels=None, indices_tuple=None,
                ref_emb=None, ref_labels=None):
        """The loss of the global batch (every rank's embeddings and
        labels), the same on every rank, with autograd."""
        return self._fn(*self._inputs(embeddings, labels, indices_tuple,
                                      ref_emb, ref_labels))

    def compiled(self, embeddings, labels):
        """The dloss.CompiledLoss these inputs run (``.fused_ops()``,
        ``.plan_text()``)."""
        return self._fn.compiled(*self._inputs(embeddings, labels, None,
                                               None, None))

    def to_mlir(self, embeddings, labels):
        """The recorded dloss IR for these inputs (for ``dlossc``)."""
        return self._fn.to_mlir(*self._inputs(embeddings, labels, None,
                                              None, None))

    def extra_repr(self):
        return "temperature=%g" % self.temperature


class NTXentLoss(_PairLoss):
    """pytorch-metric-learning's ``NTXentLoss(temperature=0.07)``: the
    per-positive-pair softmax loss over the global batch (positives share a
    label, negatives do not; each pair's denominator is its positive and the
    anchor's negatives), averaged over the global batch's positive pairs.
    PML's other keywords (``distance``, ``reducer``,
    ``embedding_regularizer``, ``embedding_reg_weight``, ``collect_stats``)
    are accepted holding PML's defaults (check_pml_options). Extra keywords:
    ``group``, ``fuse`` and ``schedule`` (as in dloss.ClipLoss)."""

    _program = staticmethod(_ntxent)

    def __init__(self, temperature=0.07, group=None, fuse=True,
                 schedule=None, **kwargs):
        super().__init__(temperature, group, fuse, schedule, **kwargs)


class SupConLoss(_PairLoss):
    """pytorch-metric-learning's ``SupConLoss(temperature=0.1)``: per anchor
    the mean over its positives of -log softmax over every other row of the
    global batch, averaged over the anchors that have a positive. PML's
    other keywords as for NTXentLoss. Extra keywords: ``group``, ``fuse``
    and ``schedule``, as for NTXentLoss."""

    _program = staticmethod(_supcon)
    _reducer = "AvgNonZeroReducer"

    def __init__(self, temperature=0.1, group=None, fuse=True,
                 schedule=None, **kwargs):
        super().__init__(temperature, group, fuse, schedule, **kwargs)


_SUPPORTED = ("NTXentLoss", "SupConLoss", "ArcFaceLoss", "CosFaceLoss")


def DistributedLossWrapper(loss, efficient=False, group=None, fuse=True,
                           schedule=None):
    """pytorch-metric-learning's ``DistributedLossWrapper(loss, efficient)``:
    returns the dloss loss equivalent to the PML `loss` object (its class's
    parameters, and for ArcFace/CosFace its current ``W``), which computes
    the loss of the global batch on every rank exactly and fused.

    Supported: PML's NTXentLoss, SupConLoss, ArcFaceLoss and CosFaceLoss with
    their default distance and reducer and no regularizer (a dloss loss of
    these classes is returned as is). PML's wrapper returns world_size times
    the global loss; dloss returns the global loss itself with the same
    embedding gradients (docs/Migration.md). `efficient` is accepted: dloss
    never builds the global similarity matrix and is always exact. Extra
    keywords: ``group``, ``fuse`` and ``schedule``, as in dloss.ClipLoss,
    for the loss made from a PML one (a dloss loss keeps its own)."""
    from .losses import ArcFaceLoss, CosFaceLoss

    check_schedule(schedule, "dloss.DistributedLossWrapper")

    name = type(loss).__name__
    if isinstance(loss, (NTXentLoss, SupConLoss, ArcFaceLoss, CosFaceLoss)):
        return loss
    module = type(loss).__module__ or ""
    if not module.startswith("pytorch_metric_learning") or \
            name not in _SUPPORTED:
        raise make_error(
            "dloss.DistributedLossWrapper does not support %s.%s" %
            (module, name),
            "Supported: pytorch_metric_learning.losses.%s" %
            ", ".join(_SUPPORTED))
    options = {k: getattr(loss, k, None) for k in (
        "distance", "reducer", "embedding_regularizer", "collect_stats")}
    margin = name in ("ArcFaceLoss", "CosFaceLoss")
    if margin:
        options["weight_regularizer"] = getattr(loss, "weight_regularizer",
                                                None)
    check_pml_options(name, options, "AvgNonZeroReducer"
                      if name == "SupConLoss" else "MeanReducer")
    if name == "NTXentLoss":
        return NTXentLoss(loss.temperature, group=group, fuse=fuse,
                          schedule=schedule)
    if name == "SupConLoss":
        return SupConLoss(loss.temperature, group=group, fuse=fuse,
                          schedule=schedule)
    import math
    W = loss.W.detach()
    cls = ArcFaceLoss if name == "ArcFaceLoss" else CosFaceLoss
    # PML keeps ArcFace's margin in radians; its constructor takes degrees.
    margin_arg = math.degrees(float(loss.margin)) if cls is ArcFaceLoss \
        else float(loss.margin)
    converted = cls(int(loss.num_classes), int(W.shape[0]), margin=margin_arg,
                    scale=float(loss.scale), group=group, fuse=fuse,
                    schedule=schedule)
    converted.margin = float(loss.margin)  # exactly PML's radians
    converted.to(device=W.device, dtype=W.dtype)
    converted.load_state_dict(loss.state_dict())
    return converted
