"""dloss.sentence_transformers against the real sentence-transformers (the
version test/requirements.txt pins), on a tiny BERT made offline
(st_fixture.py) and real Gloo ranks.

Columns: anchor, positive, one hard negative. Errors are relative, over
all parameters' gradients together (the norm of the difference over the
norm of the reference): attention's key-bias gradient is analytically zero,
so a per-parameter ratio would compare rounding noise with rounding noise.
Float32, TOL 1e-5.

- Uneven batches 5/2/4 on 3 ranks, gather_across_devices=True: the value on
  every rank and the gradients averaged over the ranks (what DDP does)
  equal sentence-transformers' MultipleNegativesRankingLoss run on one
  process over the global batch, for every directions / partition_mode
  combination, cos_sim and dot_score and each hardness_mode fused (the
  plan's forward and backward are fused ops, with no dloss.matmul: no
  B_local x B_global matrix), a custom similarity unfused (with and
  without hardness); the cached loss with mini_batch_size=2 too, and it
  starts as many dloss collectives per step as with one mini-batch (one
  fused call, not one per chunk). The hardness penalty moves the
  gradients far more than TOL, so a dropped penalty would fail.
- Equal batches: each rank's gradients equal sentence-transformers' own
  gather_across_devices=True run on the same ranks (the same contract), and
  the value is the mean of its per-rank values (hardness weighting too); with
  gather_across_devices=False each rank's value and gradients equal
  sentence-transformers' local loss.
- A rank with another number of columns: the same dloss.Error on every rank.
- On one process: every hardness_mode runs fused, with no remark, and
  equals sentence-transformers'; a custom similarity says once why it runs
  unfused; the symmetric aliases (plain and cached) equal sentence-transformers'; without
  sentence-transformers the import says what to install.
"""

import logging
import sys
import unittest
import warnings

import torch

import multiproc
import st_fixture as fx
from loss_reference import offsets, report

TOL = 1e-5
UNEVEN = [5, 2, 4]
EVEN = [4, 4, 4]
# Every valid (directions, partition_mode): per_direction needs every
# direction's pool to hold the positive (sentence-transformers refuses
# query_to_query and doc_to_doc there).
_OPTIONAL = ("query_to_query", "doc_to_query", "doc_to_doc")
COMBOS = [(("query_to_doc",) + tuple(d for i, d in enumerate(_OPTIONAL)
                                     if mask >> i & 1), "joint")
          for mask in range(8)] + [
    (("query_to_doc",), "per_direction"),
    (("query_to_doc", "doc_to_query"), "per_direction")]
GTE = (("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"),
       "joint")


def _scaled_cos(a, b):
    """A similarity dloss does not fuse: cos_sim times 2."""
    from sentence_transformers.util import cos_sim
    return cos_sim(a, b) * 2


def _cases():
    """(name, loss keywords) of the uneven-batch comparison."""
    from sentence_transformers.util import dot_score
    cases = [("%s/%s" % ("+".join(d), mode),
              dict(directions=d, partition_mode=mode)) for d, mode in COMBOS]
    cases.append(("dot_score", dict(similarity_fct=dot_score, scale=1.0,
                                    directions=GTE[0])))
    cases.append(("unfused", dict(similarity_fct=_scaled_cos,
                                  directions=GTE[0])))
    cases.append(("unfused/hardness", dict(
        similarity_fct=_scaled_cos, hardness_mode="all_negatives",
        hardness_strength=3.0)))
    # Hardness weighting runs fused (a stop-gradient penalty in the tile).
    cases.append(("hardness/hard_negatives", dict(
        hardness_mode="hard_negatives", hardness_strength=5.0)))
    cases.append(("hardness/in_batch_negatives", dict(
        hardness_mode="in_batch_negatives", hardness_strength=9.0,
        directions=GTE[0])))
    cases.append(("hardness/all_negatives", dict(
        hardness_mode="all_negatives", hardness_strength=3.0,
        directions=COMBOS[-1][0], partition_mode="per_direction")))
    cases.append(("hardness/dot_score", dict(
        similarity_fct=dot_score, scale=1.0, hardness_mode="all_negatives",
        hardness_strength=0.5, directions=GTE[0])))
    return cases


def _plan(loss, model, cols):
    """(fused ops, whether a dloss.matmul is left) of the plan `loss` runs
    for `cols`, or None where it runs unfused."""
    compiled = loss.compiled([model(fx.features(model, c))[
        "sentence_embedding"] for c in cols])
    if compiled is None:
        return None
    return compiled.fused_ops(), "dloss.matmul" in compiled.plan_text()


def _st_loss(name, model, **kwargs):
    from sentence_transformers.sentence_transformer import losses
    return getattr(losses, name)(model, **kwargs)


def _step(model, loss, cols):
    """(value, flat gradients) of one forward and backward of `loss`."""
    model.zero_grad()
    value = loss([fx.features(model, c) for c in cols], None)
    value.backward()
    return value.detach(), fx.flat_grads(model).clone()


def _shard(cols, sizes, rank):
    lo = offsets(sizes)[rank]
    return [c[lo:lo + sizes[rank]] for c in cols]


def _rank_uneven(rank, world, path, sizes, seed):
    import dloss
    from dloss.group import communicator
    from dloss.sentence_transformers import (
        CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss)
    model = fx.load(path)
    cols = _shard(fx.columns(sum(sizes), seed), sizes, rank)
    out = {}
    for name, kwargs in _cases():
        loss = MultipleNegativesRankingLoss(model, gather_across_devices=True,
                                            **kwargs)
        out[name] = _step(model, loss, cols)
        out[name + "/plan"] = _plan(loss, model, cols)
    comm = communicator()
    for name, (dirs, mode) in (("cached", COMBOS[0]), ("cached/gte", GTE)):
        loss = MultipleNegativesRankingLoss(
            model, gather_across_devices=True, directions=dirs,
            partition_mode=mode)
        before = comm.collectives_started
        _step(model, loss, cols)
        out["%s/uncached/collectives" % name] = \
            comm.collectives_started - before
    for mini in (2, 64):
        for name, (dirs, mode) in (("cached", COMBOS[0]), ("cached/gte", GTE)):
            loss = CachedMultipleNegativesRankingLoss(
                model, mini_batch_size=mini, gather_across_devices=True,
                directions=dirs, partition_mode=mode)
            _step(model, loss, cols)  # compiles
            before = comm.collectives_started
            value, grads = _step(model, loss, cols)
            out["%s/%d" % (name, mini)] = (value, grads)
            out["%s/%d/collectives" % (name, mini)] = \
                comm.collectives_started - before
    del dloss
    return out


def _rank_even(rank, world, path, sizes, seed):
    from dloss.sentence_transformers import MultipleNegativesRankingLoss
    model = fx.load(path)
    cols = _shard(fx.columns(sum(sizes), seed), sizes, rank)
    out = {}
    hard = dict(hardness_mode="in_batch_negatives", hardness_strength=9.0)
    for name, (dirs, mode), extra in (("default", COMBOS[0], {}),
                                      ("gte", GTE, {}),
                                      ("symmetric", COMBOS[-1], {}),
                                      ("hardness", GTE, hard)):
        for gather in (True, False):
            kwargs = dict(gather_across_devices=gather, directions=dirs,
                          partition_mode=mode, **extra)
            ours = _step(model, MultipleNegativesRankingLoss(model, **kwargs),
                         cols)
            theirs = _step(model, _st_loss("MultipleNegativesRankingLoss",
                                           model, **kwargs), cols)
            out["%s/%s" % (name, gather)] = (ours, theirs)
    return out


def _rank_columns_differ(rank, world, path):
    from dloss.sentence_transformers import MultipleNegativesRankingLoss
    model = fx.load(path)
    cols = fx.columns(3, rank, n_columns=2 if rank == 1 else 3)
    loss = MultipleNegativesRankingLoss(model, gather_across_devices=True)
    return multiproc.outcome(lambda: _step(model, loss, cols))


def _err(a, b):
    return float((a - b).norm() / b.norm())


class SentenceTransformersTest(fx.ModelTestCase):

    def _reference(self, cols, **kwargs):
        """sentence-transformers' MNRL on one process, no group."""
        model = fx.load(self.path)
        return _step(model, _st_loss("MultipleNegativesRankingLoss", model,
                                     **kwargs), cols)

    def test_uneven_batches_equal_one_process(self):
        seed = 3
        results = multiproc.run(3, _rank_uneven, self.path, UNEVEN, seed,
                                timeout=900, dloss_timeout=300)
        cols = fx.columns(sum(UNEVEN), seed)
        worst = {}
        cases = _cases()
        refs = {name: self._reference(cols, **kwargs)
                for name, kwargs in cases}
        refs["cached/2"] = refs["cached/64"] = refs[
            "query_to_doc/joint"]
        refs["cached/gte/2"] = refs["cached/gte/64"] = refs[
            "+".join(GTE[0]) + "/joint"]
        for name, (ref_value, ref_grads) in refs.items():
            values = [r[name][0] for r in results]
            grads = torch.stack([r[name][1] for r in results]).mean(0)
            worst[name + "/value"] = max(
                abs(float(v - ref_value)) / abs(float(ref_value))
                for v in values)
            worst[name + "/grads"] = _err(grads, ref_grads)
        report("st_uneven", worst)
        for key, err in worst.items():
            self.assertLess(err, TOL, key)
        fused = ["dloss.fused_similarity", "dloss.fused_similarity_grad"]
        for name, _ in cases:
            for rank, r in enumerate(results):
                if name.startswith("unfused"):
                    self.assertIsNone(r[name + "/plan"], name)
                else:
                    # Forward and backward fused, no similarity matrix.
                    self.assertEqual(r[name + "/plan"], (fused, False),
                                     (name, rank))
        # The penalty matters: without it the gradients differ by far more
        # than TOL.
        for name in ("hardness/hard_negatives", "hardness/all_negatives"):
            plain = "query_to_doc/joint" if name.endswith("hard_negatives") \
                else "+".join(COMBOS[-1][0]) + "/per_direction"
            self.assertGreater(_err(refs[name][1], refs[plain][1]),
                               100 * TOL, name)
        for name in ("cached", "cached/gte"):
            counts = [r["%s/%s/collectives" % (name, mini)]
                      for r in results for mini in (2, 64, "uncached")]
            # mini_batch_size=2 makes 3, 1 and 2 mini-batches per column on
            # the ranks; the count is that of one mini-batch, and of the
            # uncached loss: one fused call.
            self.assertEqual(len(set(counts)), 1, (name, counts))
            self.assertGreater(counts[0], 0)
            print("METRIC st_uneven %s collectives_per_step=%d" %
                  (name, counts[0]), file=sys.stderr)

    def test_equal_batches_match_sentence_transformers_on_ranks(self):
        results = multiproc.run(3, _rank_even, self.path, EVEN, 5,
                                timeout=600, dloss_timeout=300)
        worst = {}
        for name in results[0]:
            ours = [r[name][0] for r in results]
            theirs = [r[name][1] for r in results]
            gather = name.endswith("True")
            if gather:
                # sentence-transformers returns each rank's mean; with equal
                # batches their mean is the global loss, dloss's value.
                mean = sum(float(t[0]) for t in theirs) / len(theirs)
                worst[name + "/value"] = max(
                    abs(float(o[0]) - mean) / abs(mean) for o in ours)
            else:
                worst[name + "/value"] = max(
                    abs(float(o[0] - t[0])) / abs(float(t[0]))
                    for o, t in zip(ours, theirs))
            worst[name + "/grads"] = max(_err(o[1], t[1])
                                         for o, t in zip(ours, theirs))
        report("st_even", worst)
        for key, err in worst.items():
            self.assertLess(err, TOL, key)

    def test_ranks_with_other_columns_refused_on_every_rank(self):
        results = multiproc.run(3, _rank_columns_differ, self.path,
                                timeout=300, dloss_timeout=120)
        for rank, text in enumerate(results):
            self.assertIsNotNone(text, rank)
            self.assertIn("different numbers of input columns", text)
            self.assertIn("rank 1 passed 2", text)
            self.assertIn("ranks 0,2 passed 3", text)

    def test_hardness_modes_run_fused_on_one_process(self):
        from dloss.sentence_transformers import MultipleNegativesRankingLoss
        model = fx.load(self.path)
        cols = fx.columns(5, 11)
        for mode in ("hard_negatives", "in_batch_negatives", "all_negatives"):
            kwargs = dict(hardness_mode=mode, hardness_strength=5.0)
            loss = MultipleNegativesRankingLoss(model, **kwargs)
            with self.assertNoLogs("dloss", logging.WARNING):
                ours = _step(model, loss, cols)
            self.assertEqual(_plan(loss, model, cols), ([
                "dloss.fused_similarity", "dloss.fused_similarity_grad"],
                False), mode)
            theirs = self._reference(cols, **kwargs)
            self.assertLess(abs(float(ours[0] - theirs[0])) /
                            float(theirs[0]), TOL, mode)
            self.assertLess(_err(ours[1], theirs[1]), TOL, mode)

    def test_symmetric_aliases_on_one_process(self):
        import dloss.sentence_transformers as dst
        cols = fx.columns(6, 7, n_columns=2)
        model = fx.load(self.path)
        for name, kwargs in (
                ("MultipleNegativesSymmetricRankingLoss", {}),
                ("CachedMultipleNegativesSymmetricRankingLoss",
                 dict(mini_batch_size=4))):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ours = _step(model, getattr(dst, name)(
                    model, gather_across_devices=True, **kwargs), cols)
                theirs = _step(model, _st_loss(name, model, **kwargs), cols)
            self.assertTrue(any(
                issubclass(w.category, DeprecationWarning) and
                "%s is deprecated" % name in str(w.message)
                for w in caught), name)
            self.assertLess(abs(float(ours[0] - theirs[0])) /
                            float(theirs[0]), TOL, name)
            self.assertLess(_err(ours[1], theirs[1]), TOL, name)

    def test_import_without_sentence_transformers_says_what_to_install(self):
        import importlib
        import sys as _sys
        saved = {k: v for k, v in _sys.modules.items()
                 if k == "dloss.sentence_transformers" or
                 k.split(".")[0] == "sentence_transformers"}
        for k in saved:
            del _sys.modules[k]
        _sys.modules["sentence_transformers"] = None  # as if not installed
        try:
            with self.assertRaises(ImportError) as caught:
                importlib.import_module("dloss.sentence_transformers")
        finally:
            del _sys.modules["sentence_transformers"]
            _sys.modules.update(saved)
        self.assertIn("needs sentence-transformers", str(caught.exception))
        self.assertIn("pip install 'dloss[sentence-transformers]'",
                      str(caught.exception))

    def test_unfused_similarity_says_why_once(self):
        from dloss.sentence_transformers import MultipleNegativesRankingLoss
        model = fx.load(self.path)
        loss = MultipleNegativesRankingLoss(model, similarity_fct=_scaled_cos)
        cols = fx.columns(4, 9)
        with self.assertLogs("dloss", logging.WARNING) as logs:
            _step(model, loss, cols)
            _step(model, loss, cols)
        self.assertEqual(len(logs.records), 1)
        self.assertIn("runs unfused", logs.output[0])
        self.assertIn("_scaled_cos", logs.output[0])


if __name__ == "__main__":
    unittest.main()
