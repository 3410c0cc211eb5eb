"""dloss.ClipLoss against OpenCLIP's exact mode (local_loss=True,
gather_with_grad=True, written here in eager torch) on real Gloo ranks, and
against one process on the concatenated global batch: value on every rank,
per-rank gradients (the ddp contract), logit_scale's shares, logit_bias,
output_dict; world sizes 1, 2 and 4, even and uneven batches, float64 and
float32, fused (default and tiny tiles) and unfused; a rank with an empty
batch."""

import unittest

import torch
import torch.distributed as dist
import torch.nn.functional as F

import multiproc
from loss_reference import (FUSE_MODES, GatherWithGrad, PAIR_SIZES, TOL,
                            clip_loss, feature_pair, fusion, offsets, rel,
                            report)

DIM = 16
SIZES = PAIR_SIZES


def global_data(sizes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image, text = feature_pair(total, DIM, g)
    scale = torch.tensor(7.5, dtype=torch.float64)
    return image.to(dtype), text.to(dtype), scale.to(dtype)


def open_clip_exact(image, text, scale, sizes):
    """OpenCLIP's ClipLoss with local_loss=True, gather_with_grad=True, the
    labels fixed for uneven batches (this rank's offset + arange). OpenCLIP
    takes the mean over the local rows; with uneven batches the rank's loss is
    weighted by n_r * N / B so that the mean over ranks is the global loss
    (with even batches the weight is 1: OpenCLIP's own value)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    all_image = GatherWithGrad.apply(image, sizes)
    all_text = GatherWithGrad.apply(text, sizes)
    logits_per_image = scale * image @ all_text.T
    logits_per_text = scale * text @ all_image.T
    labels = offsets(sizes)[rank] + torch.arange(image.shape[0])
    # mean * n_r == sum, which stays finite on a rank with no rows (where
    # OpenCLIP's mean is nan).
    loss = (F.cross_entropy(logits_per_image, labels, reduction="sum") +
            F.cross_entropy(logits_per_text, labels, reduction="sum")) / 2
    return loss * (world / sum(sizes))


def single_process(image, text, scale):
    """The loss of the global batch in one process, and its gradients."""
    image = image.clone().requires_grad_()
    text = text.clone().requires_grad_()
    scale = scale.clone().requires_grad_()
    loss = clip_loss(image, text, scale)
    loss.backward()
    return loss.detach(), image.grad, text.grad, scale.grad


def _clip_rank(rank, world, cases):
    import dloss
    results = []
    for sizes, dtype, seed, fuse in cases:
        image, text, scale = global_data(sizes, dtype, seed)
        start, n = offsets(sizes)[rank], sizes[rank]
        loss_fn = dloss.ClipLoss(local_loss=True, gather_with_grad=True,
                                 rank=rank, world_size=world,
                                 fuse=bool(fuse))
        x = image[start:start + n].clone().requires_grad_()
        y = text[start:start + n].clone().requires_grad_()
        s = scale.clone().requires_grad_()
        bias = torch.tensor(-2.0, dtype=dtype, requires_grad=True)
        with fusion(fuse):
            out = loss_fn(x, y, s, logit_bias=bias, output_dict=True)
            loss = out["contrastive_loss"]
            loss.backward()
        # OpenCLIP's exact mode on the same ranks.
        xr = image[start:start + n].clone().requires_grad_()
        yr = text[start:start + n].clone().requires_grad_()
        sr = scale.clone().requires_grad_()
        ref = open_clip_exact(xr, yr, sr, sizes)
        ref.backward()
        ref_value = ref.detach().clone()
        dist.all_reduce(ref_value)
        results.append(dict(
            keys=sorted(out), loss=loss.detach(), x=x.grad, y=y.grad,
            s=s.grad, bias=bias.grad, ref_loss=ref_value / world,
            ref_x=xr.grad, ref_y=yr.grad, ref_s=sr.grad))
    return results


def _cases(world):
    return [(sizes, dtype, 10 * world + i, fuse)
            for i, sizes in enumerate(SIZES[world])
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES]


def _bfloat16_rank(rank, world):
    """CPU autocast's dtype: the loss's final all_reduce has no bfloat16
    arithmetic in Gloo; the engine sums in float32."""
    import dloss
    image, text, _ = global_data([3, 2], torch.float32, 7)
    rows = slice(0, 3) if rank == 0 else slice(3, 5)
    i = image[rows].bfloat16().requires_grad_()
    t = text[rows].bfloat16().requires_grad_()
    loss = dloss.ClipLoss()(i, t, torch.tensor(5.0))
    loss.backward()
    reference = dloss.ClipLoss()(image[rows], text[rows], torch.tensor(5.0))
    return loss.dtype, loss.float().item(), reference.item(), i.grad.dtype


class ClipLossTest(unittest.TestCase):
    worst = {}

    def check_world(self, world):
        cases = _cases(world)
        per_rank = multiproc.run(world, _clip_rank, cases)
        for i, (sizes, dtype, seed, fuse) in enumerate(cases):
            what = "world %d sizes %s %s fuse=%s" % (world, sizes, dtype, fuse)
            tol = TOL[dtype]
            image, text, scale = global_data(sizes, dtype, seed)
            value, gx, gy, gs = single_process(image, text, scale)
            got = [r[i] for r in per_rank]
            worst = 0.0
            share_sum = sum(g["s"] for g in got)
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertEqual(g["keys"], ["contrastive_loss"])
                    # The global loss, bit for bit the same on every rank.
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertEqual(g["loss"].dim(), 0)
                    self.assertLess(rel(g["loss"], value), tol)
                    self.assertLess(rel(g["ref_loss"], value), tol)
                    # ddp contract: N * dF/dx_r, OpenCLIP exact mode's grads.
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    for mine, single, ref, whole in (
                            (g["x"], gx[lo:lo + n], g["ref_x"], gx),
                            (g["y"], gy[lo:lo + n], g["ref_y"], gy)):
                        self.assertEqual(mine.dtype, dtype)
                        err = rel(mine / world, single, whole)
                        worst = max(worst, err)
                        self.assertLess(err, tol)
                        self.assertLess(rel(mine, ref, whole * world), tol)
                    # logit_scale: this rank's share of N * dF/ds, OpenCLIP's
                    # per-rank gradient.
                    self.assertLess(rel(g["s"], g["ref_s"]), tol)
                    # A bias shifts every logit alike: no gradient.
                    self.assertIsNotNone(g["bias"])
                    self.assertEqual(g["bias"].item(), 0.0)
            err = rel(share_sum / world, gs)
            worst = max(worst, err)
            self.assertLess(err, tol, what)
            key = (world, str(dtype).replace("torch.", ""))
            self.worst[key] = max(self.worst.get(key, 0.0), worst)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_4(self):
        self.check_world(4)

    @classmethod
    def tearDownClass(cls):
        report("clip grad", {"world=%d %s" % k: v
                             for k, v in cls.worst.items()})

    def test_bfloat16(self):
        for dtype, loss, reference, grad_dtype in multiproc.run(
                2, _bfloat16_rank):
            self.assertEqual(dtype, torch.bfloat16)
            self.assertEqual(grad_dtype, torch.bfloat16)
            self.assertLess(abs(loss - reference), 2e-2 * abs(reference))


if __name__ == "__main__":
    unittest.main()
