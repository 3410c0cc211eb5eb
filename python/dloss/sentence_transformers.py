"""sentence-transformers' in-batch-negative losses as exact, fused
distributed drop-ins: swap the import, keep the training script.

    from dloss.sentence_transformers import MultipleNegativesRankingLoss
    loss = MultipleNegativesRankingLoss(model, gather_across_devices=True)

Each class subclasses sentence-transformers' own (same constructor, same
``forward(sentence_features, labels)``, same config, model card and
citation); only the loss computed from the embeddings is dloss's:

- ``gather_across_devices=True``: the loss of the global batch (every
  rank's anchors against every rank's documents), the same value on every
  rank, exact for batches of any size on each rank (sentence-transformers'
  gather needs equal batches, hence its forced ``dataloader_drop_last``).
  Embedding gradients follow the ddp contract: rank r gets N * dF/dx_r, so
  DDP's average is the single-process gradient of the global batch.
  Gather, similarity and log-sum-exp run as dloss's ring-tiled fused op for
  ``cos_sim`` and ``dot_score``, hardness weighting included: no rank holds
  a B_local x B_global matrix.
- ``gather_across_devices=False``: each rank's loss of its own batch, as
  sentence-transformers computes it, with no collective (DDP then averages
  the per-rank gradients).

``CachedMultipleNegativesRankingLoss`` keeps sentence-transformers'
GradCache (embedding in mini-batches without autograd, replaying each
mini-batch's RNG state for the backward) and runs the loss once over the
whole batch: one fused call per step, whatever the number of mini-batches.
What is not supported, and why, is in docs/Migration.md.
"""

import inspect
import logging
import re
import warnings

import torch
import torch.nn.functional as F

try:
    from sentence_transformers.sentence_transformer import losses as _st
    from sentence_transformers.util import cos_sim, dot_score
except ImportError as e:
    raise ImportError(
        "dloss.sentence_transformers needs sentence-transformers 6 (tested "
        "with 6.0.1), which is not installed or too old (%s): pip install "
        "'dloss[sentence-transformers]'" % e) from e

from .collectives import all_gather as _gather
from .errors import Error, make_error
from .group import ALONE, communicator, runs_alone
from .metric_learning import _MASKED, _logaddexp
from .schedule import check_schedule
from .trace import Loss, all_gather, global_size, shard_offset

__all__ = ["CachedMultipleNegativesRankingLoss",
           "CachedMultipleNegativesSymmetricRankingLoss",
           "MultipleNegativesRankingLoss",
           "MultipleNegativesSymmetricRankingLoss"]

log = logging.getLogger("dloss")

_NAME = "st_mnrl_%d_columns"


# ---------------------------------------------------------------------------
# The per-rank program: one per number of document columns.
# ---------------------------------------------------------------------------

# sentence-transformers' hardness modes: which query_to_doc logits get the
# penalty, in the positive column and in each hard-negative column: "own"
# (the row's own document), "others" (every other row's), "all", or None.
# The row's positive is never penalised.
_PENALISED = {
    None: (None, None),
    "hard_negatives": (None, "own"),
    "in_batch_negatives": ("others", "others"),
    "all_negatives": ("others", "all"),
}


def _hardness(loss):
    """Whether `loss` weights negatives by hardness (a penalty that is
    there at all)."""
    return loss.hardness_mode is not None and loss.hardness_strength > 0.0


def _mnrl(queries, docs, scale, directions, per_direction, cosine,
          hardness_mode, hardness_strength):
    """sentence-transformers' MNRL over the global batch, as the program
    one rank runs: this rank's queries (and positives) against every
    rank's documents. `docs`: the positive column, then the hard
    negatives'. Each direction is one fused similarity per column (a
    log-sum-exp per row; the softmax over several columns combines them),
    so no concatenated copy of the columns is made and each ring carries
    one column; the positive's logit is a local row-wise dot product.
    `hardness_mode` (None when off): query_to_doc's negative logits get
    hardness_strength * stop_gradient(similarity), unscaled, as
    sentence-transformers adds it; a stop_gradient of the tile is part of
    the fused program."""
    if cosine:
        queries = F.normalize(queries, dim=1)
        docs = [F.normalize(d, dim=1) for d in docs]
    positives = docs[0]

    def lse(rows, cols, own_masked=False, penalised=None):
        """The log-sum-exp per row of scale * rows . every rank's cols; with
        `own_masked`, without the row's own column (row j of a gathered
        column belongs to the query of global row j); `penalised`: which
        logits get the hardness penalty, "own" (the row's own column),
        "others" (every other) or "all"."""
        sims = rows @ all_gather(cols).T
        logits = scale * sims
        if own_masked or penalised in ("own", "others"):
            ids = torch.arange(rows.shape[0]) + shard_offset(rows)
            own = ids[:, None] == torch.arange(global_size(rows))[None, :]
        if penalised is not None:
            penalty = hardness_strength * sims.detach()
            if penalised != "all":
                penalty = torch.where(own if penalised == "own" else ~own,
                                      penalty, 0.0)
            logits = logits + penalty
        if own_masked:
            logits = logits.masked_fill(own, _MASKED)
        return torch.logsumexp(logits, dim=1)

    penalised = _PENALISED[hardness_mode]
    terms = {"query_to_doc": [lse(queries, d, penalised=penalised[c > 0])
                              for c, d in enumerate(docs)]}
    if "query_to_query" in directions:
        terms["query_to_query"] = [lse(queries, queries, own_masked=True)]
    if "doc_to_query" in directions:
        terms["doc_to_query"] = [lse(positives, queries)]
    if "doc_to_doc" in directions:
        # Not the row's own positive and hard negatives.
        terms["doc_to_doc"] = [lse(positives, d, own_masked=True)
                               for d in docs]
    if per_direction:
        log_z = sum(_logaddexp(t) for t in terms.values()) / len(terms)
    else:
        log_z = _logaddexp([v for t in terms.values() for v in t])
    positive = scale * (queries * positives).sum(dim=1)
    return (log_z - positive).mean()


def _program(columns):
    """`_mnrl` with one tensor parameter per document column, as
    @dloss.loss records it: the column count is part of the plan (and of
    its function's name), so a rank with another count is refused."""
    def program(*args):
        return _mnrl(args[0], list(args[1:1 + columns]), *args[1 + columns:])

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    names = ["queries", "positives"] + ["negatives_%d" % i
                                        for i in range(1, columns)]
    program.__signature__ = inspect.Signature(
        [inspect.Parameter(n, kind) for n in names + [
            "scale", "directions", "per_direction", "cosine",
            "hardness_mode", "hardness_strength"]])
    program.__name__ = program.__qualname__ = _NAME % columns
    return program


def _columns_differ(error):
    """The document-column counts of a preflight error between MNRL plans,
    as [(ranks text, count)], or None when `error` is about something
    else."""
    text = str(error)
    if "ranks ran different plans" not in text:
        return None
    found = re.findall(r"(rank[s]? [\d,]+) called @st_mnrl_(\d+)_columns",
                       text)
    return found if len(found) > 1 else None


# ---------------------------------------------------------------------------
# The unfused path: another similarity_fct.
# ---------------------------------------------------------------------------

def _per_row_unfused(loss, queries, docs, q_all, docs_all, offset):
    """sentence-transformers' per-row loss (its compute_loss_from_embeddings
    before the mean, hardness penalty included) with `loss`'s settings and
    this rank's rows at global `offset`; `q_all`, `docs_all`: the gathered
    columns (the local ones on one rank)."""
    sim, directions = loss.similarity_fct, loss.directions
    n, total = queries.shape[0], q_all.shape[0]
    local = torch.arange(offset, offset + n, device=queries.device)
    rows = torch.arange(n, device=queries.device)
    own = torch.zeros(n, total, dtype=torch.bool, device=queries.device)
    own[rows, local] = True
    every_doc = torch.cat(docs_all)
    sims = {"query_to_doc": sim(queries, every_doc)}
    if "query_to_query" in directions:
        sims["query_to_query"] = sim(queries, q_all).masked_fill(
            own, -torch.inf)
    if "doc_to_query" in directions:
        sims["doc_to_query"] = sim(q_all, docs[0]).T
    if "doc_to_doc" in directions:
        sims["doc_to_doc"] = sim(every_doc, docs[0]).T.masked_fill(
            own.repeat(1, len(docs)), -torch.inf)
    penalty = None
    if _hardness(loss):
        # hardness_strength * stop_grad(similarity) on the chosen negatives
        # of query_to_doc, not temperature-scaled.
        where = {None: torch.zeros_like(own), "own": own, "others": ~own,
                 "all": torch.ones_like(own)}
        first, rest = _PENALISED[loss.hardness_mode]
        keep = torch.cat([where[first]] + [where[rest]] * (len(docs) - 1),
                         dim=1)
        penalty = loss.hardness_strength * torch.where(
            keep, sims["query_to_doc"].detach(), 0.0)
    sims = {k: v * loss.scale for k, v in sims.items()}
    if penalty is not None:
        sims["query_to_doc"] = sims["query_to_doc"] + penalty
    positive = sims["query_to_doc"][rows, local]
    if loss.partition_mode == "per_direction":
        log_z = sum(torch.logsumexp(v, dim=1) for v in sims.values()) / \
            len(sims)
    else:
        log_z = torch.logsumexp(torch.cat(list(sims.values()), dim=1), dim=1)
    return log_z - positive


# ---------------------------------------------------------------------------
# The drop-ins.
# ---------------------------------------------------------------------------

class MultipleNegativesRankingLoss(_st.MultipleNegativesRankingLoss):
    """sentence-transformers' ``MultipleNegativesRankingLoss`` (InfoNCE with
    in-batch and hard negatives), exact and fused across ranks.

    Same constructor and forward; every ``directions`` and
    ``partition_mode`` value. Columns: anchor, positive, then any number of
    hard negatives (the same number on every rank). With
    ``gather_across_devices=True`` it returns the loss of the global batch,
    the same on every rank, exact for uneven batches; with False, each
    rank's own (sentence-transformers' meaning of the flag).
    ``similarity_fct``: ``cos_sim`` and ``dot_score`` run fused; any other
    callable runs unfused (exact, but builds the similarity matrix), with a
    one-time remark. ``hardness_mode`` (every mode) runs fused too: its
    penalty, ``hardness_strength`` times a stop-gradient copy of each
    negative's similarity, is part of the tile program.

    Extra keywords: ``group`` (a torch.distributed group; default the
    default group), ``fuse`` (the ring-tiled fused kernel, default True) and
    ``schedule`` (how the fused kernel moves the columns between ranks:
    ``"auto"``, ``"ring"`` or ``"gather"``; default None, the process
    default, dloss.set_schedule).
    """

    def __init__(self, model, scale=20.0, similarity_fct=cos_sim,
                 gather_across_devices=False,
                 directions=("query_to_doc",), partition_mode="joint",
                 hardness_mode=None, hardness_strength=0.0, group=None,
                 fuse=True, schedule=None):
        check_schedule(schedule, "dloss.sentence_transformers." +
                       type(self).__name__)
        super().__init__(model, scale=scale, similarity_fct=similarity_fct,
                         gather_across_devices=gather_across_devices,
                         directions=directions,
                         partition_mode=partition_mode,
                         hardness_mode=hardness_mode,
                         hardness_strength=hardness_strength)
        self._group = group
        self._fuse = fuse
        self._schedule = schedule
        self._programs = {}
        self._remarked = False

    def _program_for(self, columns, gathered):
        key = (columns, gathered)
        fn = self._programs.get(key)
        if fn is None:
            fn = Loss(_program(columns), grad_mode="ddp", fuse=self._fuse,
                      group=self._group if gathered else ALONE,
                      name=_NAME % columns, schedule=self._schedule)
            self._programs[key] = fn
        return fn

    def _gathered(self):
        """Whether the loss is the global batch's (a group of several
        ranks and gather_across_devices)."""
        return bool(self.gather_across_devices) and \
            not runs_alone(self._group)

    def _arguments(self, embeddings, cosine):
        """The fused program's arguments for `embeddings` (_program)."""
        hardness = _hardness(self)
        return (*embeddings, float(self.scale), tuple(self.directions),
                self.partition_mode == "per_direction", cosine,
                self.hardness_mode if hardness else None,
                float(self.hardness_strength) if hardness else 0.0)

    def compiled(self, embeddings):
        """The dloss.CompiledLoss that `embeddings` (anchor, positive, hard
        negatives...) run (``.fused_ops()``, ``.plan_text()``), or None for
        another similarity_fct than cos_sim and dot_score (unfused)."""
        cosine = self._similarity()
        if cosine is None:
            return None
        fn = self._program_for(len(embeddings) - 1, self._gathered())
        return fn.compiled(*self._arguments(embeddings, cosine))

    def _similarity(self):
        """True for cos_sim, False for dot_score, None for another."""
        if self.similarity_fct is cos_sim:
            return True
        if self.similarity_fct is dot_score:
            return False
        return None

    def compute_loss_from_embeddings(self, embeddings, labels=None):
        """The loss of (anchor, positive, negatives...) embeddings: the
        global batch's with gather_across_devices, else this rank's."""
        if len(embeddings) < 2:
            raise ValueError("Expected at least 2 embeddings, got %d" %
                             len(embeddings))
        gathered = self._gathered()
        cosine = self._similarity()
        if cosine is None:
            return self._unfused(embeddings, gathered, (
                "similarity_fct=%s is neither "
                "sentence_transformers.util.cos_sim nor dot_score" %
                getattr(self.similarity_fct, "__name__",
                        type(self.similarity_fct).__name__)),
                "Use cos_sim or dot_score for the fused kernel")
        fn = self._program_for(len(embeddings) - 1, gathered)
        try:
            return fn(*self._arguments(embeddings, cosine))
        except Error as e:
            counts = _columns_differ(e)
            if counts is None:
                raise
            raise make_error(
                "dloss.%s: the ranks passed different numbers of input "
                "columns: %s" % (type(self).__name__, ", ".join(
                    "%s passed %d" % (ranks, int(count) + 1)
                    for ranks, count in counts)),
                "Every rank's batch must have the same columns (anchor, "
                "positive and the same number of hard negatives): check the "
                "dataset's columns and the collator") from None

    def _unfused(self, embeddings, gathered, why, hint):
        """The loss where dloss does not fuse (`why` and `hint`, said once on
        rank 0): gathered with dloss.all_gather (exact gradients, uneven
        batches), the matrix built as sentence-transformers builds it."""
        if not self._remarked:
            self._remarked = True
            if not torch.distributed.is_initialized() or \
                    torch.distributed.get_rank() == 0:
                log.warning(
                    "dloss.%s: %s, so the loss runs unfused: each rank "
                    "builds its B_local x B_global similarity matrices "
                    "(still exact, uneven batches included). %s.",
                    type(self).__name__, why, hint)
        queries, docs = embeddings[0], list(embeddings[1:])
        if not gathered:
            return _per_row_unfused(self, queries, docs, queries, docs,
                                    0).mean()
        group = self._group
        sizes = _gather(torch.tensor([queries.shape[0]],
                                     device=queries.device), group)
        offset = int(sizes[:communicator(group).rank].sum())
        per_row = _per_row_unfused(
            self, queries, docs, _gather(queries, group),
            [_gather(d, group) for d in docs], offset)
        # Gathered, so that every rank's value is the global mean and each
        # rank's rows get N times their share (the ddp contract).
        return _gather(per_row, group).mean()


def _deprecated(name, base):
    """sentence-transformers' deprecation warning for its symmetric alias
    `name` of `base`."""
    warnings.warn(
        "The %s is deprecated and will be removed in a future release. "
        "Please use %s with `directions=('query_to_doc', 'doc_to_query')` "
        "and `partition_mode='per_direction'` instead." % (name, base),
        DeprecationWarning, stacklevel=3)


class MultipleNegativesSymmetricRankingLoss(MultipleNegativesRankingLoss):
    """sentence-transformers' deprecated
    ``MultipleNegativesSymmetricRankingLoss``: MultipleNegativesRankingLoss
    with ``directions=("query_to_doc", "doc_to_query")`` and
    ``partition_mode="per_direction"``, as sentence-transformers defines
    it (and warns, as it does, that it is deprecated). Extra keywords as
    for MultipleNegativesRankingLoss."""

    def __init__(self, model, scale=20.0, similarity_fct=cos_sim,
                 gather_across_devices=False, group=None, fuse=True,
                 schedule=None):
        _deprecated("MultipleNegativesSymmetricRankingLoss",
                    "MultipleNegativesRankingLoss")
        super().__init__(model, scale=scale, similarity_fct=similarity_fct,
                         gather_across_devices=gather_across_devices,
                         directions=("query_to_doc", "doc_to_query"),
                         partition_mode="per_direction", group=group,
                         fuse=fuse, schedule=schedule)


class CachedMultipleNegativesRankingLoss(
        _st.CachedMultipleNegativesRankingLoss):
    """sentence-transformers' ``CachedMultipleNegativesRankingLoss``
    (GradCache), with the loss stage run once over the whole batch.

    sentence-transformers' own caching is kept: every mini-batch is embedded
    without autograd (its RNG state saved), then re-embedded with autograd
    in the backward, the cached embedding gradients backpropagated. Between
    the two, dloss's MultipleNegativesRankingLoss runs once over all the
    embeddings (one fused call, so one ring across the ranks, not one
    gather per mini-batch and column), so value and gradients are
    MultipleNegativesRankingLoss's on the same batch. Peak memory: one
    mini-batch's activations plus O(B_local * d) for the loss.

    Extra keywords: ``group``, ``fuse`` and ``schedule``, as for
    MultipleNegativesRankingLoss.
    """

    def __init__(self, model, scale=20.0, similarity_fct=cos_sim,
                 mini_batch_size=32, mini_batch_num_tokens=None,
                 gather_across_devices=False,
                 directions=("query_to_doc",), partition_mode="joint",
                 show_progress_bar=False, hardness_mode=None,
                 hardness_strength=0.0, group=None, fuse=True,
                 schedule=None):
        check_schedule(schedule, "dloss.sentence_transformers." +
                       type(self).__name__)
        super().__init__(model, scale=scale, similarity_fct=similarity_fct,
                         mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens,
                         gather_across_devices=gather_across_devices,
                         directions=directions,
                         partition_mode=partition_mode,
                         show_progress_bar=show_progress_bar,
                         hardness_mode=hardness_mode,
                         hardness_strength=hardness_strength)
        # The wrapped loss owns the hyperparameters, as in
        # sentence-transformers: dloss's computes.
        self.loss = MultipleNegativesRankingLoss(
            model, scale=scale, similarity_fct=similarity_fct,
            gather_across_devices=gather_across_devices,
            directions=directions, partition_mode=partition_mode,
            hardness_mode=hardness_mode, hardness_strength=hardness_strength,
            group=group, fuse=fuse, schedule=schedule)

    # Of the mini-batches the backward re-embeds, how many are still to come
    # before the last (see embed_minibatch).
    _unsynced = 0

    def calculate_loss(self, reps, labels=None, *, with_backward=False):
        """The loss over every mini-batch's embeddings at once (`reps`: per
        column, its mini-batches); with_backward, their gradients (the
        cache) by one backward."""
        loss = self.loss.compute_loss_from_embeddings(
            [torch.cat(r) for r in reps], labels)
        if with_backward:
            loss.backward()
            loss = loss.detach()
            self._unsynced = sum(len(r) for r in reps) - 1
        return loss

    def embed_minibatch(self, sentence_feature, begin, end, with_grad,
                        copy_random_state, random_state=None):
        """sentence-transformers' embed_minibatch; under DDP (the trainer
        puts the DDP module in ``self.model``), the backward's re-embedding
        of every mini-batch but the last runs in ``no_sync``: one gradient
        all-reduce per step, not one per mini-batch. Each rank then makes
        the same collectives whatever its number of mini-batches, which an
        uneven last batch makes differ."""
        if with_grad and self._unsynced > 0 and \
                hasattr(self.model, "no_sync"):
            self._unsynced -= 1
            with self.model.no_sync():
                return super().embed_minibatch(
                    sentence_feature, begin, end, with_grad,
                    copy_random_state, random_state)
        return super().embed_minibatch(sentence_feature, begin, end,
                                       with_grad, copy_random_state,
                                       random_state)




class CachedMultipleNegativesSymmetricRankingLoss(
        CachedMultipleNegativesRankingLoss):
    """sentence-transformers' deprecated
    ``CachedMultipleNegativesSymmetricRankingLoss``: the cached loss with
    ``directions=("query_to_doc", "doc_to_query")`` and
    ``partition_mode="per_direction"``, as sentence-transformers defines
    it. Extra keywords as for MultipleNegativesRankingLoss."""

    def __init__(self, model, scale=20.0, similarity_fct=cos_sim,
                 mini_batch_size=32, mini_batch_num_tokens=None,
                 gather_across_devices=False, show_progress_bar=False,
                 group=None, fuse=True, schedule=None):
        _deprecated("CachedMultipleNegativesSymmetricRankingLoss",
                    "CachedMultipleNegativesRankingLoss")
        super().__init__(model, scale=scale, similarity_fct=similarity_fct,
                         mini_batch_size=mini_batch_size,
                         mini_batch_num_tokens=mini_batch_num_tokens,
                         gather_across_devices=gather_across_devices,
                         directions=("query_to_doc", "doc_to_query"),
                         partition_mode="per_direction",
                         show_progress_bar=show_progress_bar, group=group,
                         fuse=fuse, schedule=schedule)
