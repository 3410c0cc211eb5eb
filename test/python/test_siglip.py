"""dloss.SigLipLoss against OpenCLIP's SigLipLoss math (written here in
eager torch, the text features gathered with gradients, as its neighbour
exchange does) on real Gloo ranks, and against one process on the
concatenated global batch: value on every rank, per-rank feature gradients
(the ddp contract), the shares of the log-temperature t (OpenCLIP passes
logit_scale = t.exp()) and of logit_bias; world sizes 1, 2 and 4, even and
uneven batches, float64 and float32, fused (default and tiny tiles) and
unfused."""

import math
import unittest

import torch
import torch.distributed as dist
import torch.nn.functional as F

import multiproc
from loss_reference import (FUSE_MODES, GatherWithGrad, PAIR_SIZES, TOL,
                            feature_pair, fusion, offsets, rel, report)

DIM = 16
SIZES = PAIR_SIZES


def global_data(sizes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image, text = feature_pair(total, DIM, g)
    # Close to OpenCLIP's init (t = log 10, b = -10), moved off it so that
    # the positives and negatives both weigh in.
    t = torch.tensor(math.log(10.0) + (0.1 * seed) % 1, dtype=torch.float64)
    bias = torch.tensor(-5.0 + 0.01 * seed, dtype=torch.float64)
    # A few positives made similar, so that both signs of the logits occur.
    text[:total // 2] = F.normalize(text[:total // 2] + 2 * image[:total // 2])
    return image.to(dtype), text.to(dtype), t.to(dtype), bias.to(dtype)


def siglip_pairs(image, text, logit_scale, logit_bias, labels):
    """OpenCLIP's SigLipLoss._loss before its division by the batch."""
    logits = logit_scale * image @ text.T + logit_bias
    return -F.logsigmoid(labels * logits).sum()


def open_clip_ranks(image, text, t, bias, sizes):
    """This rank's OpenCLIP SigLipLoss: its images against every rank's
    texts (the neighbour exchange carries gradients, here a gather does),
    labels 2 * eye - 1 on its own block. OpenCLIP divides by the local
    batch; here by B / N so that the mean over ranks is the global loss (the
    same with even batches)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    all_text = GatherWithGrad.apply(text, sizes)
    n, start = image.shape[0], offsets(sizes)[rank]
    labels = -torch.ones(n, sum(sizes), dtype=image.dtype)
    labels[:, start:start + n] += 2 * torch.eye(n, dtype=image.dtype)
    return siglip_pairs(image, all_text, t.exp(), bias, labels) * (
        world / sum(sizes))


def single_process(image, text, t, bias):
    image, text, t, bias = (v.clone().requires_grad_()
                            for v in (image, text, t, bias))
    b = image.shape[0]
    labels = 2 * torch.eye(b, dtype=image.dtype) - torch.ones(
        b, b, dtype=image.dtype)
    loss = siglip_pairs(image, text, t.exp(), bias, labels) / b
    loss.backward()
    return loss.detach(), image.grad, text.grad, t.grad, bias.grad


def _siglip_rank(rank, world, cases):
    import dloss
    results = []
    for sizes, dtype, seed, fuse in cases:
        image, text, t, bias = global_data(sizes, dtype, seed)
        start, n = offsets(sizes)[rank], sizes[rank]
        loss_fn = dloss.SigLipLoss(rank=rank, world_size=world,
                                   fuse=bool(fuse))
        x = image[start:start + n].clone().requires_grad_()
        y = text[start:start + n].clone().requires_grad_()
        tp = t.clone().requires_grad_()
        bp = bias.clone().requires_grad_()
        with fusion(fuse):
            loss = loss_fn(x, y, tp.exp(), bp)
            out = loss_fn(x.detach(), y.detach(), tp.exp().detach(),
                          bp.detach(), output_dict=True)
            loss.backward()
        xr = image[start:start + n].clone().requires_grad_()
        yr = text[start:start + n].clone().requires_grad_()
        tr = t.clone().requires_grad_()
        br = bias.clone().requires_grad_()
        ref = open_clip_ranks(xr, yr, tr, br, sizes)
        ref.backward()
        ref_value = ref.detach().clone()
        dist.all_reduce(ref_value)
        results.append(dict(
            loss=loss.detach(), dict_loss=out["contrastive_loss"],
            keys=sorted(out), x=x.grad, y=y.grad, t=tp.grad, b=bp.grad,
            ref_loss=ref_value / world, ref_x=xr.grad, ref_y=yr.grad,
            ref_t=tr.grad, ref_b=br.grad))
    return results


def _cases(world):
    return [(sizes, dtype, 10 * world + i, fuse)
            for i, sizes in enumerate(SIZES[world])
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES]


class SigLipLossTest(unittest.TestCase):
    worst = {}

    def check_world(self, world):
        cases = _cases(world)
        per_rank = multiproc.run(world, _siglip_rank, cases)
        for i, (sizes, dtype, seed, fuse) in enumerate(cases):
            what = "world %d sizes %s %s fuse=%s" % (world, sizes, dtype, fuse)
            tol = TOL[dtype]
            image, text, t, bias = global_data(sizes, dtype, seed)
            value, gx, gy, gt, gb = single_process(image, text, t, bias)
            got = [r[i] for r in per_rank]
            worst = 0.0
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertEqual(g["loss"].dim(), 0)
                    self.assertLess(rel(g["loss"], value), tol)
                    self.assertLess(rel(g["ref_loss"], value), tol)
                    self.assertEqual(g["keys"], ["contrastive_loss"])
                    self.assertTrue(torch.equal(g["dict_loss"], g["loss"]))
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    for mine, single, ref, whole in (
                            (g["x"], gx[lo:lo + n], g["ref_x"], gx),
                            (g["y"], gy[lo:lo + n], g["ref_y"], gy)):
                        self.assertEqual(mine.dtype, dtype)
                        err = rel(mine / world, single, whole)
                        worst = max(worst, err)
                        self.assertLess(err, tol)
                        self.assertLess(rel(mine, ref, whole * world), tol)
                    # This rank's shares of N * dF/dt and N * dF/db: what
                    # OpenCLIP's rank r gets.
                    self.assertLess(rel(g["t"], g["ref_t"]), tol)
                    self.assertLess(rel(g["b"], g["ref_b"]), tol)
            for key, single in (("t", gt), ("b", gb)):
                err = rel(sum(g[key] for g in got) / world, single)
                worst = max(worst, err)
                self.assertLess(err, tol, "%s: %s" % (what, key))
            key = "world=%d %s" % (world, str(dtype).replace("torch.", ""))
            self.worst[key] = max(self.worst.get(key, 0.0), worst)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_4(self):
        self.check_world(4)

    @classmethod
    def tearDownClass(cls):
        report("siglip grad", cls.worst)


if __name__ == "__main__":
    unittest.main()
