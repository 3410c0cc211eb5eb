"""Drop-in distributed losses: OpenCLIP's ClipLoss and SigLipLoss,
pytorch-metric-learning's ArcFaceLoss and CosFaceLoss, insightface's
PartialFC. Same constructors, same forward signatures, same conventions;
every difference in value or units is listed in docs/Migration.md.

Common contract: each returns the global loss (the loss of the concatenated
global batch, the same value on every rank) with autograd; per-rank batches
may differ in size and the result stays exact; feature gradients follow the
ddp contract (rank r gets N * dF/dx_r, so DDP's average is the
single-device gradient), and parameters the loss owns (ArcFace's W) get the
global gradient dF/dW on every rank, so they stay identical with or without
DDP.
"""

import logging
import math
import numbers

import torch

from . import _C
from .compile import compile as compile_loss
from .errors import make_error
from .graph import to_dtype
from .group import communicator

log = logging.getLogger("dloss")
_said_exact = False


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `factor`."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _GraphLoss(torch.nn.Module):
    """Compiles `make_graph(dtype)` once per dtype, for the module's group."""

    def __init__(self, group=None, fuse=True):
        super().__init__()
        self._group = group
        self._fuse = fuse
        self._compiled = {}

    def _make_graph(self, dtype):
        raise NotImplementedError

    def _loss(self, dtype):
        fn = self._compiled.get(dtype)
        if fn is None:
            fn = compile_loss(self._make_graph(to_dtype(dtype)),
                              fuse=self._fuse, group=self._group)
            self._compiled[dtype] = fn
        return fn

    def _ddp_features(self, features):
        """`features` whose gradient is N times the global-mode one: the
        loss is compiled in global mode for the parameters it owns (dF/dW on
        every rank), and features follow the ddp contract (N * dF/dx_r)."""
        world = communicator(self._group).world_size
        return _ScaleGrad.apply(features, float(world))


def _scalar(value, like, name):
    """A loss parameter (logit scale, bias) as a 0-d tensor of `like`'s
    dtype, keeping autograd."""
    if not isinstance(value, torch.Tensor):
        return torch.tensor(float(value), dtype=like.dtype, device=like.device)
    if value.numel() != 1:
        raise make_error(
            "%s must be a single number, got a tensor of shape %s" %
            (name, list(value.shape)), "Pass a 0-d tensor or a float")
    return value.reshape(()).to(like.dtype)


def _say_exact(name, inexact):
    global _said_exact
    if inexact:
        log.warning(
            "dloss.%s: %s; dloss always computes the exact gradient of the "
            "global-batch loss (OpenCLIP's local_loss=True, "
            "gather_with_grad=True), whatever these are set to", name,
            ", ".join(inexact))
    elif not _said_exact:
        log.info("dloss.%s: exact gradients of the global-batch loss on any "
                 "number of ranks (OpenCLIP's local_loss, gather_with_grad, "
                 "cache_labels, rank and world_size are not needed)", name)
    _said_exact = True


class ClipLoss(_GraphLoss):
    """OpenCLIP's ``ClipLoss``: the mean of the image->text and text->image
    cross-entropies over the global batch, positives on the diagonal.

    The constructor takes OpenCLIP's arguments; ``local_loss``,
    ``gather_with_grad``, ``cache_labels``, ``rank`` and ``world_size`` need
    not be set: dloss is always exact and reads the rank and world size from
    the process group. Per-rank gradients equal OpenCLIP's exact mode
    (``local_loss=True, gather_with_grad=True``). The value is the global
    loss, the mean over ranks of OpenCLIP's per-rank values when batches are
    even; uneven batches are labelled by each rank's offset (OpenCLIP's
    ``n * rank`` mislabels them).

    Extra keyword arguments: ``group`` (a torch.distributed group; default
    the default group) and ``fuse`` (ring-tiled fused kernel, default True).
    """

    def __init__(self, local_loss=False, gather_with_grad=False,
                 cache_labels=False, rank=0, world_size=1, use_horovod=False,
                 group=None, fuse=True):
        super().__init__(group, fuse)
        if use_horovod:
            raise make_error(
                "dloss.ClipLoss runs on torch.distributed, not Horovod",
                "Initialise torch.distributed (or call dloss.init()) and "
                "drop use_horovod")
        self.local_loss, self.gather_with_grad = local_loss, gather_with_grad
        self.cache_labels, self.rank, self.world_size = (cache_labels, rank,
                                                         world_size)
        inexact = []
        if world_size > 1 and not (local_loss and gather_with_grad):
            inexact.append("local_loss=%s, gather_with_grad=%s would give "
                           "inexact gradients in OpenCLIP" %
                           (local_loss, gather_with_grad))
        _say_exact("ClipLoss", inexact)

    def _make_graph(self, dtype):
        return _C.clip_graph(-1, dtype, _C.GradMode.ddp)

    def forward(self, image_features, text_features, logit_scale,
                logit_bias=None, output_dict=False):
        """Returns the global loss (a 0-d tensor), or
        ``{"contrastive_loss": loss}`` with output_dict. `logit_scale` is
        already exponentiated, as in OpenCLIP. A `logit_bias` shifts every
        logit alike, which leaves softmax cross-entropy unchanged: it gets a
        zero gradient."""
        scale = _scalar(logit_scale, image_features, "logit_scale")
        loss = self._loss(image_features.dtype)(image_features, text_features,
                                                scale)
        if logit_bias is not None and isinstance(logit_bias, torch.Tensor):
            loss = loss + 0.0 * logit_bias.sum().to(loss.dtype)
        return {"contrastive_loss": loss} if output_dict else loss


class SigLipLoss(_GraphLoss):
    """OpenCLIP's ``SigLipLoss``: the pairwise sigmoid loss
    ``-1/B * sum_ij log sigmoid(z_ij (s x_i.y_j + b))`` over every pair of
    the global batch (z = 1 on the diagonal, -1 elsewhere), B the global
    batch. `logit_scale` is already exponentiated and `logit_bias` added, as
    in OpenCLIP. OpenCLIP's per-rank value divides its rank's share by the
    local batch; with even batches their mean over ranks is dloss's value.
    ``cache_labels``, ``rank``, ``world_size``, ``dist_impl`` and ``bidir``
    are accepted and not needed (any exchange OpenCLIP offers gives the same
    exact gradient; dloss uses a fused ring).
    """

    def __init__(self, cache_labels=False, rank=0, world_size=1,
                 dist_impl=None, bidir=True, use_horovod=False, group=None,
                 fuse=True):
        super().__init__(group, fuse)
        if use_horovod:
            raise make_error(
                "dloss.SigLipLoss runs on torch.distributed, not Horovod",
                "Initialise torch.distributed and drop use_horovod")
        self.cache_labels, self.rank, self.world_size = (cache_labels, rank,
                                                         world_size)
        self.dist_impl, self.bidir = dist_impl, bidir

    def _make_graph(self, dtype):
        return _C.siglip_graph(-1, dtype, _C.GradMode.ddp)

    def forward(self, image_features, text_features, logit_scale, logit_bias,
                output_dict=False):
        """Returns the global loss, or ``{"contrastive_loss": loss}``."""
        scale = _scalar(logit_scale, image_features, "logit_scale")
        bias = _scalar(logit_bias, image_features, "logit_bias")
        # The fused kernel takes the log-temperature: log(exp(t)) = t.
        loss = self._loss(image_features.dtype)(image_features, text_features,
                                                torch.log(scale), bias)
        return {"contrastive_loss": loss} if output_dict else loss


class _MarginLoss(_GraphLoss):
    """pytorch-metric-learning's LargeMarginSoftmaxLoss family."""

    _kind = ""

    def __init__(self, num_classes, embedding_size, margin, scale,
                 weight_init_func=None, group=None, fuse=True, **kwargs):
        super().__init__(group, fuse)
        unsupported = sorted(k for k, v in kwargs.items() if v is not None)
        if unsupported:
            raise make_error(
                "dloss.%s does not support %s" %
                (type(self).__name__, ", ".join(unsupported)),
                "Drop the argument(s); regularizers and reducers are applied "
                "outside the loss with dloss")
        self.num_classes = int(num_classes)
        self.embedding_size = int(embedding_size)
        self.scale = float(scale)
        self.W = torch.nn.Parameter(
            torch.empty(self.embedding_size, self.num_classes))
        if weight_init_func is None:
            torch.nn.init.normal_(self.W)
        else:
            weight_init_func(self.W)

    def _make_graph(self, dtype):
        return _C.margin_graph(self._kind, self.embedding_size,
                               self.num_classes, self.scale,
                               self._radians(), dtype, _C.GradMode.global_,
                               False, self._kind == "arcface")

    def forward(self, embeddings, labels, indices_tuple=None, ref_emb=None,
                ref_labels=None):
        """The mean over the global batch of the margin softmax loss.
        `labels` are class ids (any integer dtype)."""
        if indices_tuple is not None or ref_emb is not None or \
                ref_labels is not None:
            raise make_error(
                "dloss.%s takes no indices_tuple, ref_emb or ref_labels" %
                type(self).__name__,
                "Call it with (embeddings, labels); the global batch is "
                "every rank's embeddings")
        labels = _labels(labels)
        weights = self.W.t().contiguous().to(embeddings.dtype)
        return self._loss(embeddings.dtype)(self._ddp_features(embeddings),
                                            labels, weights)


def _labels(labels):
    if isinstance(labels, torch.Tensor) and labels.requires_grad:
        return labels  # The runtime's preflight names it on every rank.
    if isinstance(labels, torch.Tensor) and not labels.is_floating_point() \
            and labels.dtype != torch.bool and labels.dtype != torch.int64:
        return labels.long()
    return labels


class ArcFaceLoss(_MarginLoss):
    """pytorch-metric-learning's ``ArcFaceLoss``: additive angular margin.

    Same signature, units and parameters as PML: `margin` in degrees
    (28.6 ~ 0.5 rad), `scale` 64, ``W`` of shape
    ``[embedding_size, num_classes]`` initialised ``normal_`` (a PML state
    dict loads). Where theta > pi - m the target logit is
    ``cos(theta) - m sin(m)``, as in PML. ``W`` gets the global gradient on
    every rank, so it stays identical with or without DDP.
    """

    _kind = "arcface"

    def __init__(self, num_classes, embedding_size, margin=28.6, scale=64,
                 **kwargs):
        super().__init__(num_classes, embedding_size, margin, scale,
                         **kwargs)
        self.margin = math.radians(margin)  # As PML keeps it.

    def _radians(self):
        return self.margin


class CosFaceLoss(_MarginLoss):
    """pytorch-metric-learning's ``CosFaceLoss``: additive cosine margin
    ``s (cos(theta) - m)`` at the target class. Same signature and ``W`` as
    PML (margin 0.35, scale 64)."""

    _kind = "cosface"

    def __init__(self, num_classes, embedding_size, margin=0.35, scale=64,
                 **kwargs):
        super().__init__(num_classes, embedding_size, margin, scale,
                         **kwargs)
        self.margin = float(margin)

    def _radians(self):
        return self.margin


class CombinedMarginLoss(torch.nn.Module):
    """insightface's ``CombinedMarginLoss(s, m1, m2, m3)``: the target logit
    ``s (cos(m1 theta + m2) - m3)``. dloss.PartialFC reads its parameters
    (and those of insightface's own class); as a module, it applies the
    margin to `logits` (cosines) with the exact gradient, where insightface
    applies the angular margin under no_grad, for any m1, m2, m3.
    dloss.PartialFC supports ArcFace (m1 = 1, m3 = 0) and CosFace (m1 = 1,
    m2 = 0)."""

    def __init__(self, s, m1, m2, m3, interclass_filtering_threshold=0):
        super().__init__()
        self.s, self.m1, self.m2, self.m3 = s, m1, m2, m3
        self.interclass_filtering_threshold = interclass_filtering_threshold

    def forward(self, logits, labels):
        """`logits` (cosines, [B, C]) with the margin applied at each row's
        label (rows labelled -1 are left alone), times s."""
        rows = torch.nonzero(labels.view(-1) != -1).view(-1)
        cols = labels.view(-1)[rows]
        target = logits[rows, cols]
        if self.m1 != 1.0 or self.m2:
            theta = torch.acos(target.clamp(-1 + 1e-7, 1 - 1e-7))
            adjusted = torch.cos(self.m1 * theta + self.m2) - self.m3
        else:
            adjusted = target - self.m3
        logits = logits.index_put((rows, cols), adjusted)
        return logits * self.s


def _margin_kind(margin_loss):
    try:
        s, m1, m2, m3 = (float(getattr(margin_loss, a))
                         for a in ("s", "m1", "m2", "m3"))
    except (AttributeError, TypeError, ValueError):
        raise make_error(
            "margin_loss must be a dloss.CombinedMarginLoss (or insightface's "
            "CombinedMarginLoss), with attributes s, m1, m2, m3; got %s" %
            type(margin_loss).__name__,
            "Pass dloss.CombinedMarginLoss(64, 1.0, 0.5, 0.0) for ArcFace or "
            "(64, 1.0, 0.0, 0.4) for CosFace") from None
    if getattr(margin_loss, "interclass_filtering_threshold", 0):
        raise make_error(
            "dloss.PartialFC does not support interclass_filtering_threshold",
            "Set interclass_filtering_threshold=0")
    if m1 == 1.0 and m3 == 0.0 and m2 > 0:
        return "arcface", s, m2
    if m1 == 1.0 and m2 == 0.0:
        return "cosface", s, m3
    raise make_error(
        "dloss.PartialFC supports ArcFace (m1=1, m3=0) and CosFace (m1=1, "
        "m2=0) margins; got m1=%g, m2=%g, m3=%g" % (m1, m2, m3),
        "Use one of the two")


class PartialFC(_GraphLoss):
    """insightface's ``PartialFC_V2`` with the class-sharded softmax fused:
    rank r holds its block of the class weights (``weight``, shape
    ``[num_local, embedding_size]``, insightface's split: the first
    ``num_classes % world_size`` ranks hold one more class) and no rank
    builds the global-batch x all-classes logits.

    ``PartialFC(embedding_size, num_classes, margin_loss=...)``, or
    insightface's positional order ``PartialFC(margin_loss, embedding_size,
    num_classes, sample_rate=1.0, fp16=False)``. `margin_loss`: a
    dloss.CombinedMarginLoss or insightface's. forward(local_embeddings,
    local_labels) returns the mean loss over the global batch; labels are
    global class ids. Batches may differ between ranks (insightface asserts
    equal ones). Differences from insightface, all exact where it
    approximates: the margin's gradient is not straight-through, and no
    probability is clamped at 1e-30 (see docs/Migration.md). Only
    ``sample_rate=1.0``: every class is used in every step.
    """

    def __init__(self, *args, margin_loss=None, sample_rate=1.0, fp16=False,
                 group=None, fuse=True, **kwargs):
        super().__init__(group, fuse)
        args = list(args)
        if args and not isinstance(args[0], numbers.Integral):
            margin_loss = args.pop(0)  # insightface's order
        names = ["embedding_size", "num_classes", "sample_rate", "fp16"]
        unknown = sorted(set(kwargs) - set(names))
        if len(args) > len(names) or unknown:
            raise make_error(
                "dloss.PartialFC takes (margin_loss, embedding_size, "
                "num_classes, sample_rate, fp16); got %d positional "
                "argument(s)%s" % (len(args), "".join(
                    " and unknown keyword " + k for k in unknown)),
                "Call PartialFC(embedding_size, num_classes, margin_loss=...) "
                "or insightface's PartialFC(margin_loss, embedding_size, "
                "num_classes)")
        values = dict(zip(names, args))
        values.update(kwargs)
        if "embedding_size" not in values or "num_classes" not in values:
            raise make_error(
                "dloss.PartialFC needs embedding_size and num_classes",
                "Call PartialFC(embedding_size, num_classes, margin_loss=...)")
        sample_rate = values.get("sample_rate", sample_rate)
        fp16 = values.get("fp16", fp16)
        if margin_loss is None:
            raise make_error("dloss.PartialFC needs a margin_loss",
                             "Pass margin_loss=dloss.CombinedMarginLoss(64, "
                             "1.0, 0.5, 0.0)")
        if sample_rate != 1.0:
            raise make_error(
                "dloss.PartialFC uses every class (sample_rate=1.0); got "
                "sample_rate=%g" % sample_rate,
                "Pass sample_rate=1.0: the fused sharded softmax never "
                "builds the full logits, which is what sampling saved")
        self.margin_softmax = margin_loss
        self._kind, self._s, self._m = _margin_kind(margin_loss)
        self.embedding_size = int(values["embedding_size"])
        self.num_classes = int(values["num_classes"])
        self.sample_rate, self.fp16 = sample_rate, fp16
        comm = communicator(group)
        rank, world = comm.rank, comm.world_size
        if self.num_classes < world:
            raise make_error(
                "PartialFC shards %d classes over %d ranks: some rank would "
                "hold none" % (self.num_classes, world),
                "Use at least as many classes as ranks")
        self.num_local = self.num_classes // world + int(
            rank < self.num_classes % world)
        self.class_start = self.num_classes // world * rank + min(
            rank, self.num_classes % world)
        self.weight = torch.nn.Parameter(
            torch.normal(0, 0.01, (self.num_local, self.embedding_size)))

    def _make_graph(self, dtype):
        # Class blocks differ between ranks: the plan takes any block size.
        return _C.margin_graph(self._kind, self.embedding_size, -1, self._s,
                               self._m, dtype, _C.GradMode.global_, True,
                               False)

    def forward(self, local_embeddings, local_labels):
        """The mean margin-softmax loss over the global batch."""
        labels = _labels(local_labels)
        if isinstance(labels, torch.Tensor) and labels.dim() == 2 and \
                labels.shape[1] == 1:
            labels = labels.reshape(-1)
        weight = self.weight.to(local_embeddings.dtype)
        return self._loss(local_embeddings.dtype)(
            self._ddp_features(local_embeddings), labels, weight)
