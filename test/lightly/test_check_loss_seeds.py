"""dloss.check_loss on the seeds' own code that needs torchvision, so in
.venv-cuda beside test_lightly: OpenCLIP's ClipLoss in its default mode
(gather without gradient, every rank computing the whole global loss) and
lightly's BarlowTwinsLoss(gather_distributed=True) (each rank's own batch
norm). Each must get the right verdict and kinds."""

import sys
import unittest

import torch.distributed as dist

import check_losses as losses


def open_clip_default(image, text, scale):
    from open_clip.loss import ClipLoss
    loss = ClipLoss(rank=dist.get_rank(), world_size=dist.get_world_size())
    return loss(image, text, scale)


def lightly_barlow_twins(z_a, z_b):
    from lightly.loss import BarlowTwinsLoss
    return BarlowTwinsLoss(gather_distributed=True)(z_a, z_b)


class CheckLossSeedsTest(unittest.TestCase):

    def check(self, fn, inputs):
        import dloss
        report = dloss.check_loss(fn, *inputs, timeout=30)
        print("\n%s" % report, file=sys.stderr)
        return report, {f.kind for f in report.failures}

    def test_open_clip_default_mode(self):
        # Each rank's gradient is its own rows' share of the global loss,
        # which DDP's average divides by the world size; its gather needs
        # equal batches.
        report, kinds = self.check(open_clip_default, losses.clip_inputs())
        self.assertEqual(kinds, {"grad_scale", "uneven"})
        self.assertIn("1/world", str(report))
        self.assertIn("open_clip", str(report))
        self.assertIn("dloss.ClipLoss", str(report))

    def test_lightly_barlow_twins(self):
        report, kinds = self.check(lightly_barlow_twins, losses.two_views())
        self.assertIn("value", kinds)
        self.assertNotIn("hang", kinds)


if __name__ == "__main__":
    unittest.main()
