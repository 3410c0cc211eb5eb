"""Drop-in distributed losses: OpenCLIP's ClipLoss, SigLipLoss,
DistillClipLoss and CoCaLoss, pytorch-metric-learning's ArcFaceLoss and
CosFaceLoss, insightface's PartialFC. Same constructors, same forward
signatures, same conventions; every difference in value or units is listed
in docs/Migration.md.

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
import sys

import torch

from . import _C, _ops
from .compile import compile as compile_loss
from .compiled import call
from .errors import make_error
from .graph import to_dtype
from .group import communicator, world_size
from .schedule import check_schedule

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


class _GraphLoss(_ops.Registered, torch.nn.Module):
    """Compiles its graphs once per (part, dtype), for the module's group,
    and calls them through dloss's custom op (dloss/_ops.py), so that
    torch.compile traces its forward into one graph. A part names one of the
    module's graphs ("": the main one, from `_make_graph`)."""

    def __init__(self, group=None, fuse=True, schedule=None):
        super().__init__()
        self._group = group
        self._fuse = fuse
        self._schedule = check_schedule(schedule,
                                        "dloss." + type(self).__name__)
        self._compiled = {}
        self._register()

    # Compiled plans hold the group.
    _TRANSIENT = ("_compiled",)

    def _make_graph(self, dtype):
        raise NotImplementedError

    def _graph(self, part, dtype):
        """The dloss._C.Graph of `part` for `dtype` (a dloss._C.DType)."""
        return self._make_graph(dtype)

    def _loss(self, dtype, part=""):
        """The dloss.CompiledLoss of `part` for inputs of `dtype`, compiled
        on first use."""
        key = (part, dtype)
        fn = self._compiled.get(key)
        if fn is None:
            fn = compile_loss(self._graph(part, to_dtype(dtype)),
                              fuse=self._fuse, group=self._group,
                              schedule=self._schedule)
            self._compiled[key] = fn
        return fn

    def _op_target(self, part, inputs):
        """What dloss::loss runs for this module's key (dloss/_ops.py): the
        plan of `part` for the first input's dtype."""
        return self._loss(inputs[0].dtype, part)

    def _call(self, part, *tensors):
        """The global loss of `part` on `tensors` (its graph's inputs, the
        first of the plan's dtype), with autograd; errors name the user's
        line."""
        return call(self._op_key + "/" + part, list(tensors),
                    _ops.call_site())

    def _ddp_features(self, features):
        """`features` whose gradient is N times the global-mode one: the
        loss is compiled in global mode for the parameters it owns (dF/dW on
        every rank), and features follow the ddp contract (N * dF/dx_r)."""
        return _ScaleGrad.apply(features, float(world_size(self._group)))


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
    """Says, on rank 0 only, that the OpenCLIP flags which choose its
    exchange are not needed: a warning for each loss made with flags that
    would make OpenCLIP inexact, else a debug line once per process."""
    global _said_exact
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_rank():
        return
    if inexact:
        log.warning(
            "dloss.%s: %s; dloss always computes the exact gradient of the "
            "global-batch loss (OpenCLIP's local_loss=True, "
            "gather_with_grad=True), whatever these are set to", name,
            ", ".join(inexact))
    elif not _said_exact:
        log.debug("dloss.%s: exact gradients of the global-batch loss on any "
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
    the default group), ``fuse`` (ring-tiled fused kernel, default True)
    and ``schedule`` (how the fused kernel moves the columns between ranks:
    ``"auto"``, ``"ring"`` or ``"gather"``; default None, the process
    default, dloss.set_schedule).
    """

    def __init__(self, local_loss=False, gather_with_grad=False,
                 cache_labels=False, rank=0, world_size=1, use_horovod=False,
                 group=None, fuse=True, schedule=None):
        super().__init__(group, fuse, schedule)
        if use_horovod:
            raise make_error(
                "dloss.%s runs on torch.distributed, not Horovod" %
                type(self).__name__,
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
        _say_exact(type(self).__name__, inexact)

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
        loss = self._call("", image_features, text_features, scale)
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

    OpenCLIP 3.3's arguments ``cache_labels``, ``rank``, ``world_size`` and
    ``dist_impl`` (``'bidir'``, the default, ``'shift'``, ``'reduce'`` or
    ``'gather'``; another value raises dloss.Error, as OpenCLIP asserts) are
    accepted and not needed: every exchange OpenCLIP offers gives the same
    exact gradient, and dloss runs one fused ring. ``chunk_size`` (None or a
    positive int; OpenCLIP 3.3.0 itself has no such argument) is accepted
    for scripts that bound the memory of the logits with it: dloss never
    builds the logits matrix (its fused tiles bound the memory), so it
    changes nothing.
    ``bidir`` and ``use_horovod`` (OpenCLIP 2.x's arguments, which 3.3 no
    longer has) are accepted by keyword for older scripts; Horovod raises.

    Extra keyword arguments: ``group``, ``fuse`` and ``schedule``, as in
    dloss.ClipLoss.
    """

    _DIST_IMPLS = ("bidir", "shift", "reduce", "gather")

    def __init__(self, cache_labels=False, rank=0, world_size=1,
                 dist_impl=None, chunk_size=None, bidir=True,
                 use_horovod=False, group=None, fuse=True, schedule=None):
        super().__init__(group, fuse, schedule)
        if use_horovod:
            raise make_error(
                "dloss.SigLipLoss runs on torch.distributed, not Horovod",
                "Initialise torch.distributed and drop use_horovod")
        if dist_impl is not None and dist_impl not in self._DIST_IMPLS:
            raise make_error(
                "dloss.SigLipLoss: unknown dist_impl %r (OpenCLIP takes %s)"
                % (dist_impl, ", ".join(map(repr, self._DIST_IMPLS))),
                "Drop dist_impl: dloss's fused ring replaces every exchange")
        if chunk_size is not None and (
                isinstance(chunk_size, bool) or
                not isinstance(chunk_size, numbers.Integral) or
                chunk_size <= 0):
            raise make_error(
                "dloss.SigLipLoss: chunk_size must be None or a positive "
                "int, got %r" % (chunk_size,),
                "Drop chunk_size: dloss never builds the logits matrix, its "
                "fused tiles bound the memory")
        self.cache_labels, self.rank, self.world_size = (cache_labels, rank,
                                                         world_size)
        # As OpenCLIP keeps them (None means its default, 'bidir').
        self.dist_impl = dist_impl or "bidir"
        self.chunk_size, self.bidir = chunk_size, bidir

    def _make_graph(self, dtype):
        return _C.siglip_graph(-1, dtype, _C.GradMode.ddp)

    def forward(self, image_features, text_features, logit_scale, logit_bias,
                output_dict=False):
        """Returns the global loss, or ``{"contrastive_loss": loss}``."""
        scale = _scalar(logit_scale, image_features, "logit_scale")
        bias = _scalar(logit_bias, image_features, "logit_bias")
        # The fused kernel takes the log-temperature: log(exp(t)) = t.
        loss = self._call("", image_features, text_features,
                          torch.log(scale), bias)
        return {"contrastive_loss": loss} if output_dict else loss


def _here():
    """(file, line) of the line in this file that adds a graph op. The
    OpenCLIP graphs built here are located in dloss's source, the same for
    every caller, so each is compiled and cached once."""
    return "dloss/losses.py", sys._getframe(1).f_lineno


def _distill_graph(dtype, teacher_grad):
    """OpenCLIP's DistillClipLoss distillation term over the global batch:
    for each image row i (and each text row), the cross-entropy
    ``-sum_j softmax(t_i)_j log_softmax(s_i)_j`` of the student logits s
    (``scale * x_i . y_j``, j over the gathered batch) against the teacher
    logits t (the same with the teacher's features and scale), averaged
    over the global batch and over the two directions. `teacher_grad`:
    whether the teacher's features and scale are differentiated."""
    g = _C.Graph("openclip_distill")
    image = g.input("image", dtype, [-1, -1], True, False, *_here())
    text = g.input("text", dtype, [-1, -1], True, False, *_here())
    scale = g.input("scale", dtype, [], True, True, *_here())
    t_image = g.input("dist_image", dtype, [-1, -1], teacher_grad, False,
                      *_here())
    t_text = g.input("dist_text", dtype, [-1, -1], teacher_grad, False,
                     *_here())
    t_scale = g.input("dist_scale", dtype, [], teacher_grad, True, *_here())

    def logits(rows, cols, s):
        gathered = g.all_gather(cols, 0, _C.GatherGrad.exact, *_here())
        return g.matmul(rows, gathered, False, True, *_here()) * s

    def log_softmax(z):
        return z - g.expand(g.logsumexp(z, 1, *_here()), [1], z, *_here())

    def rows_sum(teacher, student):
        # sum over this rank's rows of sum_j softmax(t)_ij log_softmax(s)_ij
        p = g.unary("exp", log_softmax(teacher), *_here())
        per_row = g.reduce(p * log_softmax(student), "sum", [1], *_here())
        return g.reduce(per_row, "sum", [0], *_here())

    local = (rows_sum(logits(t_image, t_text, t_scale),
                      logits(image, text, scale)) +
             rows_sum(logits(t_text, t_image, t_scale),
                      logits(text, image, scale)))
    total = g.all_reduce(local, "sum", *_here())
    count = g.to_tensor(g.global_size(image, 0, *_here()), dtype, *_here())
    g.set_loss(-total / (count * 2.0), _C.GradMode.ddp, *_here())
    return g


def _caption_graph(dtype):
    """CoCa's caption loss over the global batch: the token cross-entropy
    summed over every rank's non-pad tokens, divided by their global count
    (``keep`` is 1 for a token that counts, 0 for a pad; a pad's label is
    any valid class)."""
    g = _C.Graph("openclip_caption")
    logits = g.input("logits", dtype, [-1, -1], True, False, *_here())
    labels = g.input("labels", _C.DType.i64, [-1], False, False, *_here())
    keep = g.input("keep", dtype, [-1], False, False, *_here())
    per_token = g.cross_entropy(logits, labels, 1, *_here()) * keep
    total = g.all_reduce(g.reduce(per_token, "sum", [0], *_here()), "sum",
                         *_here())
    count = g.all_reduce(g.reduce(keep, "sum", [0], *_here()), "sum",
                         *_here())
    g.set_loss(total / count, _C.GradMode.ddp, *_here())
    return g


class DistillClipLoss(ClipLoss):
    """OpenCLIP's ``DistillClipLoss``: ClipLoss's contrastive loss of the
    student plus the distillation loss, the cross-entropy of the student's
    logits against the softmax of the teacher's (``dist_*``), both over the
    global batch in both directions.

    Same constructor as dloss.ClipLoss (OpenCLIP's ClipLoss arguments, none
    of which is needed, plus ``group``, ``fuse`` and ``schedule``). forward
    takes OpenCLIP's arguments and returns ``(contrastive_loss,
    distill_loss)``, or the dict ``{"contrastive_loss", "distill_loss"}``
    with output_dict.
    Each is the global loss (the same value on every rank; with even batches
    the mean over ranks of OpenCLIP's per-rank values), with its own exact
    gradient: features follow the ddp contract (OpenCLIP's ``local_loss=True,
    gather_with_grad=True`` gradients), logit scales get this rank's share.
    The teacher's features and scale are differentiated when they require
    grad, as in OpenCLIP (which does not detach them); they are cast to the
    student's dtype. The contrastive term is ClipLoss's fused kernel; the
    distillation term compares two similarity matrices element-wise and
    runs unfused (it holds the B_local x B_global logits, as OpenCLIP
    does).
    """

    def _graph(self, part, dtype):
        if part.startswith("distill"):
            return _distill_graph(dtype, part == "distill-teacher")
        return super()._graph(part, dtype)

    def forward(self, image_features, text_features, logit_scale,
                dist_image_features, dist_text_features, dist_logit_scale,
                output_dict=False):
        """Returns ``(contrastive_loss, distill_loss)`` (0-d tensors), or
        ``{"contrastive_loss": ..., "distill_loss": ...}``."""
        dtype = image_features.dtype
        scale = _scalar(logit_scale, image_features, "logit_scale")
        teacher = [t.to(dtype) if isinstance(t, torch.Tensor) else t
                   for t in (dist_image_features, dist_text_features)]
        t_scale = _scalar(dist_logit_scale, image_features,
                          "dist_logit_scale")
        teacher_grad = any(isinstance(t, torch.Tensor) and t.requires_grad
                           for t in teacher + [t_scale])
        contrastive = self._call("", image_features, text_features, scale)
        distill = self._call("distill-teacher" if teacher_grad else "distill",
                             image_features, text_features, scale, teacher[0],
                             teacher[1], t_scale)
        if output_dict:
            return {"contrastive_loss": contrastive, "distill_loss": distill}
        return contrastive, distill


class CoCaLoss(ClipLoss):
    """OpenCLIP's ``CoCaLoss``: ``clip_loss_weight`` times ClipLoss's
    contrastive loss, and ``caption_loss_weight`` times the captioning
    cross-entropy of the text decoder's ``logits`` ([batch, tokens, vocab])
    against ``labels`` ([batch, tokens]), tokens equal to ``pad_id``
    ignored.

    Same constructor as OpenCLIP's (``caption_loss_weight,
    clip_loss_weight, pad_id=0``, then ClipLoss's arguments, none of which
    is needed), plus ``group``, ``fuse`` and ``schedule`` (as in
    dloss.ClipLoss). Both terms are global losses,
    the same value on every rank. The caption term is the mean over the
    global batch's non-pad tokens (the loss of the concatenated batch, as
    one process computes it), where OpenCLIP's rank averages its own
    tokens: the two agree (the mean over ranks of OpenCLIP's values, and
    its per-rank gradients) when every rank holds the same number of
    non-pad tokens; otherwise OpenCLIP's DDP-averaged gradient weighs the
    tokens of a rank with fewer of them more, and dloss's is the
    single-process one. Logits get the ddp contract's gradient
    (N * dF/dlogits_r). The caption term needs no gather: its two global
    sums (loss and token count) are one all-reduce each; it is not fused.
    With ``clip_loss_weight`` 0 the contrastive term is OpenCLIP's int64
    zero and nothing is gathered.
    """

    def __init__(self, caption_loss_weight, clip_loss_weight, pad_id=0,
                 local_loss=False, gather_with_grad=False, cache_labels=False,
                 rank=0, world_size=1, use_horovod=False, group=None,
                 fuse=True, schedule=None):
        super().__init__(local_loss=local_loss,
                         gather_with_grad=gather_with_grad,
                         cache_labels=cache_labels, rank=rank,
                         world_size=world_size, use_horovod=use_horovod,
                         group=group, fuse=fuse, schedule=schedule)
        self.clip_loss_weight = clip_loss_weight
        self.caption_loss_weight = caption_loss_weight
        self.pad_id = pad_id

    def _graph(self, part, dtype):
        if part == "caption":
            return _caption_graph(dtype)
        return super()._graph(part, dtype)

    def forward(self, image_features, text_features, logits, labels,
                logit_scale, output_dict=False):
        """Returns ``(clip_loss, caption_loss)``, each already weighted, or
        ``{"contrastive_loss": ..., "caption_loss": ...}``."""
        if self.clip_loss_weight:
            clip_loss = self.clip_loss_weight * super().forward(
                image_features, text_features, logit_scale)
        else:
            clip_loss = torch.tensor(0, device=logits.device)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or \
                not isinstance(labels, torch.Tensor) or \
                tuple(labels.shape) != tuple(logits.shape[:2]):
            raise make_error(
                "dloss.CoCaLoss takes caption logits of shape [batch, "
                "tokens, vocab] and labels of shape [batch, tokens]; got %s "
                "and %s" % tuple(
                    list(v.shape) if isinstance(v, torch.Tensor)
                    else type(v).__name__ for v in (logits, labels)),
                "Pass the text decoder's logits and the token ids, as to "
                "OpenCLIP's CoCaLoss")
        rows = logits.reshape(-1, logits.shape[-1])
        tokens = labels.reshape(-1).long()
        keep = tokens != self.pad_id
        # A pad's label may be outside the vocabulary (-100): any valid
        # class will do, its term is multiplied by 0.
        tokens = torch.where(keep, tokens, torch.zeros_like(tokens))
        caption_loss = self.caption_loss_weight * self._call(
            "caption", rows, tokens, keep.to(rows.dtype))
        if output_dict:
            return {"contrastive_loss": clip_loss,
                    "caption_loss": caption_loss}
        return clip_loss, caption_loss


class _MarginLoss(_GraphLoss):
    """pytorch-metric-learning's LargeMarginSoftmaxLoss family."""

    _kind = ""

    def __init__(self, num_classes, embedding_size, margin, scale,
                 weight_init_func=None, group=None, fuse=True, schedule=None,
                 distance=None, reducer=None, embedding_regularizer=None,
                 embedding_reg_weight=1, weight_regularizer=None,
                 weight_reg_weight=1, collect_stats=None):
        super().__init__(group, fuse, schedule)
        # PML's keywords (distance, reducer, regularizers, collect_stats):
        # accepted when they hold PML's defaults, an error otherwise.
        from .metric_learning import check_pml_options
        check_pml_options(type(self).__name__, dict(
            distance=distance, reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
            weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
            collect_stats=collect_stats))
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

    def forward(self, embeddings, labels=None, indices_tuple=None,
                ref_emb=None, ref_labels=None):
        """The mean over the global batch of the margin softmax loss.
        `labels` are class ids (any integer dtype), required as in PML."""
        if labels is None:
            raise make_error(
                "dloss.%s needs labels" % type(self).__name__,
                "Pass (embeddings, labels): class ids of this rank's rows")
        if indices_tuple is not None or ref_emb is not None or \
                ref_labels is not None:
            raise make_error(
                "dloss.%s takes no indices_tuple, ref_emb or ref_labels" %
                type(self).__name__,
                "Call it with (embeddings, labels); the global batch is "
                "every rank's embeddings")
        labels = _labels(labels)
        weights = self.W.t().contiguous().to(embeddings.dtype)
        return self._call("", self._ddp_features(embeddings), labels,
                          weights)


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

    Extra keyword arguments: ``group``, ``fuse`` and ``schedule``, as in
    dloss.ClipLoss (``W`` is replicated: no column chunk travels between
    ranks, so both schedules run the same steps).
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
    PML (margin 0.35, scale 64). Extra keyword arguments as for
    dloss.ArcFaceLoss."""

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

    Extra keyword arguments: ``group``, ``fuse`` and ``schedule``, as in
    dloss.ClipLoss (the class-sharded softmax combines its shards with
    all-reduces, which no schedule changes).
    """

    def __init__(self, *args, margin_loss=None, sample_rate=1.0, fp16=False,
                 group=None, fuse=True, schedule=None, **kwargs):
        super().__init__(group, fuse, schedule)
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
        self._shard = (rank, world)
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

    def _op_target(self, part, inputs):
        comm = communicator(self._group)
        if (comm.rank, comm.world_size) != self._shard:
            raise make_error(
                "dloss.PartialFC was made as rank %d of %d (it holds classes "
                "%d to %d) and now runs as rank %d of %d" % (
                    self._shard + (self.class_start, self.class_start +
                                   self.num_local - 1, comm.rank,
                                   comm.world_size)),
                "Make the PartialFC after torch.distributed."
                "init_process_group: its weight is this rank's block of the "
                "classes")
        return super()._op_target(part, inputs)

    def forward(self, local_embeddings, local_labels):
        """The mean margin-softmax loss over the global batch."""
        labels = _labels(local_labels)
        if isinstance(labels, torch.Tensor) and labels.dim() == 2 and \
                labels.shape[1] == 1:
            labels = labels.reshape(-1)
        weight = self.weight.to(local_embeddings.dtype)
        return self._call("", self._ddp_features(local_embeddings), labels,
                          weight)
