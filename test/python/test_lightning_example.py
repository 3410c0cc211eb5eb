"""examples/lightning/clip_lightning.py on 4 Gloo ranks: a two-tower CLIP in
a Lightning Trainer(strategy="ddp") with dloss.ClipLoss on uneven per-rank
batches ends with the parameters of one process trained with the plain CLIP
loss on the concatenated global batches, and the loss it logs with a plain
self.log (no sync_dist) is the one-process loss, the same on every rank."""

import os
import sys
import unittest

import torch

import multiproc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples", "lightning"))
import clip_lightning  # noqa: E402

WORLD, STEPS, SEED = 4, 5, 0
TOL = 1e-5


def _rank(rank, world):
    # The processes and the default group exist: the Trainer reuses them
    # (LOCAL_RANK and the other torchrun variables are set).
    _, params, losses = clip_lightning.fit(STEPS, world, SEED)
    return params, losses


class LightningExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.per_rank = multiproc.run(WORLD, _rank, timeout=240)
        cls.params, cls.losses = clip_lightning.train_one_process(
            STEPS, WORLD, SEED)

    def test_batches_are_uneven(self):
        sizes = clip_lightning.batch_sizes(STEPS, WORLD, SEED)
        self.assertTrue(all(len(set(step)) > 1 for step in sizes), sizes)

    def test_parameters_equal_one_process(self):
        initial = dict(clip_lightning.make_model(SEED).named_parameters())
        worst = 0.0
        for rank, (params, _) in enumerate(self.per_rank):
            self.assertEqual(sorted(params), sorted(self.params))
            for key, value in params.items():
                with self.subTest(rank=rank, param=key):
                    # DDP keeps every rank identical.
                    self.assertTrue(torch.equal(value,
                                                self.per_rank[0][0][key]))
                    diff = (value - self.params[key]).abs().max().item()
                    worst = max(worst, diff)
                    self.assertLess(diff, TOL)
        # The training moved every parameter far beyond the tolerance, so
        # the comparison is not of initial values.
        for key, value in self.params.items():
            moved = (value - initial[key].detach()).abs().max().item()
            self.assertGreater(moved, 1000 * TOL, key)
        print("\nlightning example: max |param - one-process param| %.2e"
              % worst)

    def test_logged_loss_is_global(self):
        losses = self.per_rank[0][1]
        self.assertEqual(len(losses), STEPS)
        # The same value on every rank, without a collective in self.log.
        for rank, (_, logged) in enumerate(self.per_rank):
            self.assertEqual(logged, losses, "rank %d" % rank)
        diff = max(abs(a - b) for a, b in zip(losses, self.losses))
        self.assertLess(diff, TOL)
        print("\nlightning example: max |logged loss - one-process loss| "
              "%.2e" % diff)


if __name__ == "__main__":
    unittest.main()
