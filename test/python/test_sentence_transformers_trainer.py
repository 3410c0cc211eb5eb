"""sentence-transformers' own SentenceTransformerTrainer (the pinned
version) with dloss's losses, on 2 Gloo ranks (use_cpu=True) and a tiny
offline BERT (st_fixture.py): 11 (anchor, positive, negative) rows, 3 per
rank per step, so the second step is uneven (3 rows on rank 0, 2 on rank
1), with dataloader_drop_last=False (sentence-transformers forces it to
True under DDP; the docs say how to set it) and accelerate's
even_batches=False (so the last batch is not padded with repeated rows).
After one epoch (2 steps, plain SGD) the parameters must equal those of
the same trainer on one process with 6 rows per step: the update's
relative error over all parameters together below 1e-5. Run for
MultipleNegativesRankingLoss and CachedMultipleNegativesRankingLoss.

SGD, not AdamW: Adam divides each gradient by its own magnitude, so a
gradient that is analytically zero (attention's key bias) but rounds to
1e-9 moves its parameter by a whole learning rate; the comparison would
then measure rounding, not dloss."""

import os
import sys
import unittest

import torch

import multiproc
import st_fixture as fx

ROWS, PER_RANK, WORLD, SEED = 11, 3, 2, 4
TOL = 1e-5


def _train(path, out_dir, batch_size, cached):
    """Trains the model at `path` for one epoch; its parameters after, and
    before, as flat tensors."""
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)

    from dloss.sentence_transformers import (
        CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss)

    model = fx.load(path)
    before = torch.cat([p.detach().reshape(-1).clone()
                        for p in model.parameters()])
    cols = fx.columns(ROWS, SEED)
    data = Dataset.from_dict({"anchor": cols[0], "positive": cols[1],
                              "negative": cols[2]})
    args = SentenceTransformerTrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=batch_size,
        num_train_epochs=1, learning_rate=0.5, optim="sgd",
        lr_scheduler_type="constant", use_cpu=True, seed=0, report_to=[],
        save_strategy="no", logging_steps=1, dataloader_num_workers=0,
        accelerator_config={"even_batches": False},
        disable_tqdm=True)
    # What sentence-transformers forces to True under DDP: with dloss the
    # uneven last batch is exact, so it is kept.
    args.dataloader_drop_last = False
    if cached:
        loss = CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=2, gather_across_devices=True)
    else:
        loss = MultipleNegativesRankingLoss(model,
                                            gather_across_devices=True)
    trainer = SentenceTransformerTrainer(model=model, args=args,
                                         train_dataset=data, loss=loss)
    result = trainer.train()
    after = torch.cat([p.detach().reshape(-1).clone()
                       for p in model.parameters()])
    return before, after, result.global_step


def _rank(rank, world, path, out_dir, cached):
    return _train(path, os.path.join(out_dir, "rank%d" % rank), PER_RANK,
                  cached)


class TrainerTest(fx.ModelTestCase):

    def _check(self, cached):
        ranks = multiproc.run(WORLD, _rank, self.path, self.dir, cached,
                              timeout=420, dloss_timeout=300, init=False)
        before, after, steps = _train(self.path,
                                      os.path.join(self.dir, "one"),
                                      WORLD * PER_RANK, cached)
        self.assertEqual(steps, 2)
        update = after - before
        self.assertGreater(float(update.norm()), 0.0)
        for r, (b, a, s) in enumerate(ranks):
            self.assertEqual(s, steps, r)
            self.assertTrue(torch.equal(b, before), r)
            err = float(((a - b) - update).norm() / update.norm())
            print("METRIC st_trainer %s rank%d update_rel=%.3g" %
                  ("cached" if cached else "mnrl", r, err), file=sys.stderr)
            self.assertLess(err, TOL, r)

    def test_uneven_last_batch_equals_one_process(self):
        self._check(cached=False)

    def test_cached_loss_in_the_trainer(self):
        self._check(cached=True)


if __name__ == "__main__":
    unittest.main()
