"""dloss.ClipLoss against the real OpenCLIP ClipLoss (open_clip_torch, the
version test/requirements-no-deps.txt pins; its loss.py is loaded by path by
upstream.py where `import open_clip` fails for lack of torchvision).

- Even batches, world sizes 1-4: OpenCLIP's exact mode (local_loss=True,
  gather_with_grad=True, rank, world_size) runs on the same Gloo ranks as
  dloss. dloss's value is the global loss, so it is compared with the mean
  over ranks of OpenCLIP's per-rank values; each rank's image, text and
  logit_scale gradients are compared with OpenCLIP's on that rank (the ddp
  contract).
- Every case, uneven batches included (OpenCLIP's `arange(n) + n * rank`
  labels and its equal-size all_gather do not allow them on ranks): the real
  ClipLoss on one process over the concatenated global batch; rank r's
  gradients / N against that gradient's block, the mean of the
  logit_scale shares against its gradient.

Also: logit_bias (OpenCLIP adds it to every logit: no change, a zero
gradient), output_dict; float64 and float32, fused (default and tiny tiles)
and unfused; a rank with an empty batch; bfloat16."""

import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import (FUSE_MODES, TOL, fusion, offsets, rel, report)

DIM = 16
# Per world size: the per-rank batches, even ones first.
SIZES = {
    1: [[6]],
    2: [[4, 4], [5, 2]],
    3: [[3, 3, 3], [1, 4, 2]],
    4: [[3, 3, 3, 3], [4, 0, 3, 2]],  # a rank with no rows
}


def even(sizes):
    return len(set(sizes)) == 1


def global_data(sizes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image = F.normalize(torch.randn(total, DIM, generator=g,
                                    dtype=torch.float64))
    text = F.normalize(torch.randn(total, DIM, generator=g,
                                   dtype=torch.float64))
    scale = torch.tensor(7.5, dtype=torch.float64)
    return image.to(dtype), text.to(dtype), scale.to(dtype)


def open_clip_one_process(image, text, scale):
    """The real ClipLoss (world_size=1) on the global batch: value and
    gradients."""
    oc = upstream.open_clip_loss()
    image, text, scale = (v.clone().requires_grad_()
                          for v in (image, text, scale))
    loss = oc.ClipLoss()(image, text, scale)
    loss.backward()
    return loss.detach(), image.grad, text.grad, scale.grad


def _clip_rank(rank, world, cases):
    import dloss
    oc = upstream.open_clip_loss()
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
        got = dict(keys=sorted(out), loss=loss.detach(), x=x.grad, y=y.grad,
                   s=s.grad, bias=bias.grad)
        if even(sizes):
            # The real OpenCLIP, exact mode, on the same ranks.
            ref_fn = oc.ClipLoss(local_loss=True, gather_with_grad=True,
                                 rank=rank, world_size=world)
            xr = image[start:start + n].clone().requires_grad_()
            yr = text[start:start + n].clone().requires_grad_()
            sr = scale.clone().requires_grad_()
            br = torch.tensor(-2.0, dtype=dtype, requires_grad=True)
            ref = ref_fn(xr, yr, sr, logit_bias=br, output_dict=True)
            ref["contrastive_loss"].backward()
            got.update(ref_keys=sorted(ref),
                       ref_loss=ref["contrastive_loss"].detach(),
                       ref_x=xr.grad, ref_y=yr.grad, ref_s=sr.grad,
                       ref_bias=br.grad)
        results.append(got)
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

    def note(self, what, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)

    def check_world(self, world):
        cases = _cases(world)
        per_rank = multiproc.run(world, _clip_rank, cases)
        for i, (sizes, dtype, seed, fuse) in enumerate(cases):
            what = "world %d sizes %s %s fuse=%s" % (world, sizes, dtype, fuse)
            tol = TOL[dtype]
            name = str(dtype).replace("torch.", "")
            image, text, scale = global_data(sizes, dtype, seed)
            value, gx, gy, gs = open_clip_one_process(image, text, scale)
            got = [r[i] for r in per_rank]
            one = "vs open_clip one process world=%d %s" % (world, name)
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertEqual(g["keys"], ["contrastive_loss"])
                    # The global loss, bit for bit the same on every rank.
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertEqual(g["loss"].dim(), 0)
                    err = rel(g["loss"], value)
                    self.note(what, one + " value", err)
                    self.assertLess(err, tol)
                    # ddp contract: N * dF/dx_r.
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    for mine, single, whole in ((g["x"], gx[lo:lo + n], gx),
                                                (g["y"], gy[lo:lo + n], gy)):
                        self.assertEqual(mine.dtype, dtype)
                        err = rel(mine / world, single, whole)
                        self.note(what, one + " grad", err)
                        self.assertLess(err, tol)
                    # A bias shifts every logit alike: no gradient.
                    self.assertIsNotNone(g["bias"])
                    self.assertEqual(g["bias"].item(), 0.0)
            err = rel(sum(g["s"] for g in got) / world, gs)
            self.note(what, one + " grad", err)
            self.assertLess(err, tol, what)
            if not even(sizes):
                continue
            ranks = "vs open_clip ranks world=%d %s" % (world, name)
            ref_x = torch.cat([g["ref_x"] for g in got])
            ref_y = torch.cat([g["ref_y"] for g in got])
            ref_mean = sum(g["ref_loss"] for g in got) / world
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank, ref="ranks"):
                    self.assertEqual(g["ref_keys"], ["contrastive_loss"])
                    # dloss's global value: the mean of OpenCLIP's.
                    err = rel(g["loss"], ref_mean)
                    self.note(what, ranks + " value", err)
                    self.assertLess(err, tol)
                    for mine, ref, whole in ((g["x"], g["ref_x"], ref_x),
                                             (g["y"], g["ref_y"], ref_y)):
                        err = rel(mine, ref, whole)
                        self.note(what, ranks + " grad", err)
                        self.assertLess(err, tol)
                    # logit_scale: this rank's share, OpenCLIP's gradient.
                    err = rel(g["s"], g["ref_s"])
                    self.note(what, ranks + " grad", err)
                    self.assertLess(err, tol)
                    # OpenCLIP's bias gradient is zero up to rounding.
                    self.assertLess(abs(g["ref_bias"].item()), tol)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4(self):
        self.check_world(4)

    @classmethod
    def tearDownClass(cls):
        report("clip", cls.worst)

    def test_bfloat16(self):
        for dtype, loss, reference, grad_dtype in multiproc.run(
                2, _bfloat16_rank):
            self.assertEqual(dtype, torch.bfloat16)
            self.assertEqual(grad_dtype, torch.bfloat16)
            self.assertLess(abs(loss - reference), 2e-2 * abs(reference))


if __name__ == "__main__":
    unittest.main()
