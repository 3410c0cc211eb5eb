"""dloss.SigLipLoss against the real OpenCLIP SigLipLoss (open_clip_torch, the
version test/requirements-no-deps.txt pins; its loss.py is loaded by path by
upstream.py where `import open_clip` fails for lack of torchvision).

- Even batches, world sizes 1-4: OpenCLIP's SigLipLoss runs on the same Gloo
  ranks as dloss with each of its exchanges, dist_impl 'bidir' (its
  default), 'shift', 'reduce' and 'gather'. dloss's value is the global
  loss, so it is compared with the mean over ranks of OpenCLIP's per-rank
  values; each rank's feature gradients and its shares of the gradients of
  the log-temperature t (OpenCLIP is passed logit_scale = t.exp()) and of
  logit_bias are compared with OpenCLIP's on that rank.
- Every case, uneven batches included (OpenCLIP's exchanges need equal
  batches): the real SigLipLoss on one process over the concatenated global
  batch; rank r's gradients / N against that gradient's block, the mean of
  the t and bias shares against their gradients.

dloss's loss is built with OpenCLIP's dist_impl values and chunk_size
(accepted, not needed); output_dict; float64 and float32, fused (default and
tiny tiles) and unfused; a rank with an empty batch."""

import math
import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import FUSE_MODES, TOL, fusion, offsets, rel, report

DIM = 16
# Per world size: the per-rank batches, even ones first.
SIZES = {
    1: [[6]],
    2: [[4, 4], [5, 2]],
    3: [[3, 3, 3], [1, 4, 2]],
    4: [[3, 3, 3, 3], [4, 0, 3, 2]],  # a rank with no rows
}
DIST_IMPLS = ("bidir", "shift", "reduce", "gather")


def even(sizes):
    return len(set(sizes)) == 1


def global_data(sizes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image = F.normalize(torch.randn(total, DIM, generator=g,
                                    dtype=torch.float64))
    text = F.normalize(torch.randn(total, DIM, generator=g,
                                   dtype=torch.float64))
    # Close to OpenCLIP's init (t = log 10, b = -10), moved off it so that
    # the positives and negatives both weigh in.
    t = torch.tensor(math.log(10.0) + (0.1 * seed) % 1, dtype=torch.float64)
    bias = torch.tensor(-5.0 + 0.01 * seed, dtype=torch.float64)
    # A few positives made similar, so that both signs of the logits occur.
    text[:total // 2] = F.normalize(text[:total // 2] + 2 * image[:total // 2])
    return image.to(dtype), text.to(dtype), t.to(dtype), bias.to(dtype)


def open_clip_call(loss_fn, image, text, t, bias):
    """One call of a real SigLipLoss: value and gradients (t's through
    logit_scale = t.exp())."""
    image, text, t, bias = (v.clone().requires_grad_()
                            for v in (image, text, t, bias))
    out = loss_fn(image, text, t.exp(), bias, output_dict=True)
    out["contrastive_loss"].backward()
    return (sorted(out), out["contrastive_loss"].detach(), image.grad,
            text.grad, t.grad, bias.grad)


def _siglip_rank(rank, world, cases):
    import dloss
    oc = upstream.open_clip_loss()
    results, refs = [], {}
    for k, (sizes, dtype, seed, fuse) in enumerate(cases):
        image, text, t, bias = global_data(sizes, dtype, seed)
        start, n = offsets(sizes)[rank], sizes[rank]
        rows = slice(start, start + n)
        loss_fn = dloss.SigLipLoss(rank=rank, world_size=world,
                                   dist_impl=DIST_IMPLS[k % 4],
                                   chunk_size=(None, 2)[k % 2],
                                   fuse=bool(fuse))
        x = image[rows].clone().requires_grad_()
        y = text[rows].clone().requires_grad_()
        tp = t.clone().requires_grad_()
        bp = bias.clone().requires_grad_()
        with fusion(fuse):
            loss = loss_fn(x, y, tp.exp(), bp)
            out = loss_fn(x.detach(), y.detach(), tp.exp().detach(),
                          bp.detach(), output_dict=True)
            loss.backward()
        got = dict(loss=loss.detach(), dict_loss=out["contrastive_loss"],
                   keys=sorted(out), x=x.grad, y=y.grad, t=tp.grad,
                   b=bp.grad, ref={})
        if even(sizes):
            # The real OpenCLIP on the same ranks, each exchange (once per
            # data set: it does not depend on dloss's fusion).
            key = (seed, dtype)
            if key not in refs:
                refs[key] = {
                    impl: open_clip_call(
                        oc.SigLipLoss(rank=rank, world_size=world,
                                      dist_impl=impl),
                        image[rows], text[rows], t, bias)
                    for impl in DIST_IMPLS}
            got["ref"] = refs[key]
        results.append(got)
    return results


def _cases(world):
    return [(sizes, dtype, 10 * world + i, fuse)
            for i, sizes in enumerate(SIZES[world])
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES]


class SigLipLossTest(unittest.TestCase):
    worst = {}

    def note(self, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)

    def check_world(self, world):
        oc = upstream.open_clip_loss()
        cases = _cases(world)
        per_rank = multiproc.run(world, _siglip_rank, cases)
        for i, (sizes, dtype, seed, fuse) in enumerate(cases):
            what = "world %d sizes %s %s fuse=%s" % (world, sizes, dtype, fuse)
            tol = TOL[dtype]
            name = str(dtype).replace("torch.", "")
            image, text, t, bias = global_data(sizes, dtype, seed)
            _, value, gx, gy, gt, gb = open_clip_call(
                oc.SigLipLoss(), image, text, t, bias)
            got = [r[i] for r in per_rank]
            one = "vs open_clip one process world=%d %s" % (world, name)
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertEqual(g["loss"].dim(), 0)
                    self.assertEqual(g["keys"], ["contrastive_loss"])
                    self.assertTrue(torch.equal(g["dict_loss"], g["loss"]))
                    err = rel(g["loss"], value)
                    self.note(one + " value", err)
                    self.assertLess(err, tol)
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    for mine, single, whole in ((g["x"], gx[lo:lo + n], gx),
                                                (g["y"], gy[lo:lo + n], gy)):
                        self.assertEqual(mine.dtype, dtype)
                        err = rel(mine / world, single, whole)
                        self.note(one + " grad", err)
                        self.assertLess(err, tol)
            for key, single in (("t", gt), ("b", gb)):
                err = rel(sum(g[key] for g in got) / world, single)
                self.note(one + " grad", err)
                self.assertLess(err, tol, "%s: %s" % (what, key))
            if not even(sizes):
                continue
            for impl in DIST_IMPLS:
                ranks = "vs open_clip ranks dist_impl=%s world=%d %s" % (
                    impl, world, name)
                refs = [g["ref"][impl] for g in got]
                ref_mean = sum(r[1] for r in refs) / world
                ref_x = torch.cat([r[2] for r in refs])
                ref_y = torch.cat([r[3] for r in refs])
                for rank, (g, ref) in enumerate(zip(got, refs)):
                    with self.subTest(what=what, rank=rank, dist_impl=impl):
                        self.assertEqual(ref[0], ["contrastive_loss"])
                        err = rel(g["loss"], ref_mean)
                        self.note(ranks + " value", err)
                        self.assertLess(err, tol)
                        for mine, theirs, whole in ((g["x"], ref[2], ref_x),
                                                    (g["y"], ref[3], ref_y)):
                            err = rel(mine, theirs, whole)
                            self.note(ranks + " grad", err)
                            self.assertLess(err, tol)
                        # This rank's shares of N * dF/dt and N * dF/db:
                        # what OpenCLIP's rank r gets.
                        for mine, theirs in ((g["t"], ref[4]),
                                             (g["b"], ref[5])):
                            err = rel(mine, theirs)
                            self.note(ranks + " grad", err)
                            self.assertLess(err, tol)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4(self):
        self.check_world(4)

    def test_dist_impl_default(self):
        """OpenCLIP's list of exchanges and its default, as dloss keeps
        them; a value OpenCLIP refuses, or a bad chunk_size, raises
        dloss.Error."""
        import dloss
        oc = upstream.open_clip_loss()
        self.assertEqual(oc.SigLipLoss().dist_impl, "bidir")
        self.assertEqual(dloss.SigLipLoss().dist_impl, "bidir")
        for impl in DIST_IMPLS:
            oc.SigLipLoss(dist_impl=impl)  # the real list
            self.assertEqual(dloss.SigLipLoss(dist_impl=impl).dist_impl, impl)
        with self.assertRaises(AssertionError):
            oc.SigLipLoss(dist_impl="ring")
        with self.assertRaisesRegex(dloss.Error, "unknown dist_impl 'ring'"):
            dloss.SigLipLoss(dist_impl="ring")
        for bad in (0, -4, 2.5, True):
            with self.assertRaisesRegex(dloss.Error, "chunk_size"):
                dloss.SigLipLoss(chunk_size=bad)
        self.assertEqual(dloss.SigLipLoss(chunk_size=4096).chunk_size, 4096)

    @classmethod
    def tearDownClass(cls):
        report("siglip", cls.worst)


if __name__ == "__main__":
    unittest.main()
