"""dloss.ArcFaceLoss and dloss.CosFaceLoss against pytorch-metric-learning
2.x's math (written here in eager torch as PML computes it) on one process
and on 2 and 4 Gloo ranks with uneven batches: the global loss on every
rank, embeddings gradients N * dF/dx_r (ddp contract), W's gradient the
global dF/dW on every rank, ArcFace's target angles past pi - m, PML's
state_dict, and W trained without DDP staying identical on every rank and
equal to the single-process run."""

import math
import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import (FUSE_MODES, TOL, fusion, offsets, pml_loss, rel,
                            report)

EMB, CLASSES = 16, 10
# (kind, constructor keywords): PML's defaults and one other setting each.
LOSSES = [
    ("arcface", {}),
    ("arcface", {"margin": 20.0, "scale": 30.0}),
    ("cosface", {}),
    ("cosface", {"margin": 0.2, "scale": 16.0}),
]
SIZES = {1: [[7]], 2: [[5, 2]], 4: [[5, 3, 6, 2], [3, 0, 4, 2]]}
STEPS, LR = 3, 0.5


def global_data(kind, kwargs, sizes, dtype, seed):
    """Embeddings, labels and W; for ArcFace, two rows whose target angle is
    past pi - m (embeddings nearly opposite their class's weights)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    emb = torch.randn(total, EMB, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (total,), generator=g)
    W = torch.randn(EMB, CLASSES, generator=g, dtype=torch.float64)
    if kind == "arcface":
        for i in (0, total - 1):
            emb[i] = -3 * W[:, labels[i]] + 0.1 * emb[i]
    return emb.to(dtype), labels, W.to(dtype)


def past_pi_minus_m(kind, kwargs, emb, labels, W):
    if kind != "arcface":
        return 0
    m = math.radians(kwargs.get("margin", 28.6))
    cos = (F.normalize(emb.double()) @ F.normalize(W.double(), dim=0))[
        torch.arange(len(labels)), labels]
    return int((torch.acos(cos) > math.pi - m).sum())


def single_process(kind, kwargs, emb, labels, W):
    emb = emb.clone().requires_grad_()
    W = W.clone().requires_grad_()
    loss = pml_loss(kind, emb, labels, W, **kwargs)
    loss.backward()
    return loss.detach(), emb.grad, W.grad


def make_loss(dloss, kind, kwargs, W, fuse=True):
    cls = dloss.ArcFaceLoss if kind == "arcface" else dloss.CosFaceLoss
    loss_fn = cls(CLASSES, EMB, fuse=bool(fuse), **kwargs).to(W.dtype)
    loss_fn.load_state_dict({"W": W.clone()})  # a PML state dict
    return loss_fn


def train(loss_fn_or_kind, kwargs, W, sizes, dtype, seed, rank=None):
    """STEPS of SGD (momentum) on W alone, each on new embeddings: with
    dloss (no DDP) on this rank's rows, or with PML's math on all rows."""
    if isinstance(loss_fn_or_kind, str):
        W = torch.nn.Parameter(W.clone())
        params = [W]
    else:
        params = list(loss_fn_or_kind.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * seed + step)
        emb = torch.randn(sum(sizes), EMB, generator=g, dtype=dtype)
        labels = torch.randint(0, CLASSES, (sum(sizes),), generator=g)
        opt.zero_grad()
        if rank is None:
            loss = pml_loss(loss_fn_or_kind, emb, labels, W, **kwargs)
        else:
            lo, n = offsets(sizes)[rank], sizes[rank]
            loss = loss_fn_or_kind(emb[lo:lo + n], labels[lo:lo + n])
        loss.backward()
        opt.step()
    return params[0].detach().clone()


def _cases(world):
    return [(kind, kwargs, sizes, dtype, 100 * world + 10 * i + j, fuse)
            for i, (kind, kwargs) in enumerate(LOSSES)
            for j, sizes in enumerate(SIZES[world])
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES]


def _margin_rank(rank, world, cases):
    import dloss
    results = []
    for kind, kwargs, sizes, dtype, seed, fuse in cases:
        emb, labels, W = global_data(kind, kwargs, sizes, dtype, seed)
        lo, n = offsets(sizes)[rank], sizes[rank]
        loss_fn = make_loss(dloss, kind, kwargs, W, fuse)
        x = emb[lo:lo + n].clone().requires_grad_()
        # Labels as a PML user passes them: any integer dtype.
        with fusion(fuse):
            loss = loss_fn(x, labels[lo:lo + n].to(torch.int32))
            loss.backward()
            trained = train(make_loss(dloss, kind, kwargs, W, fuse), kwargs,
                            W, sizes, dtype, seed, rank)
        results.append(dict(loss=loss.detach(), x=x.grad,
                            W=loss_fn.W.grad.clone(), trained=trained))
    return results


class MarginLossTest(unittest.TestCase):
    worst = {}

    def test_pml_interface(self):
        import dloss
        dloss.init()
        arc = dloss.ArcFaceLoss(CLASSES, EMB)
        self.assertEqual(list(arc.W.shape), [EMB, CLASSES])
        self.assertAlmostEqual(arc.margin, math.radians(28.6))
        self.assertEqual(arc.scale, 64)
        self.assertEqual(list(arc.state_dict()), ["W"])
        cos = dloss.CosFaceLoss(CLASSES, EMB)
        self.assertAlmostEqual(cos.margin, 0.35)
        self.assertEqual(cos.scale, 64)
        # PML's W init is normal_: unit variance, not a small init.
        big = dloss.ArcFaceLoss(1000, 64)
        self.assertAlmostEqual(big.W.std().item(), 1.0, delta=0.05)
        # A PML state dict loads strictly; a wrong shape does not.
        W = torch.randn(EMB, CLASSES)
        arc.load_state_dict({"W": W})
        self.assertTrue(torch.equal(arc.W.detach(), W))
        with self.assertRaises(RuntimeError):
            arc.load_state_dict({"W": torch.randn(CLASSES, EMB)})

    def check_world(self, world):
        cases = _cases(world)
        per_rank = multiproc.run(world, _margin_rank, cases, timeout=300)
        past = 0
        for i, (kind, kwargs, sizes, dtype, seed, fuse) in enumerate(cases):
            what = "%s %s world %d sizes %s %s fuse=%s" % (
                kind, kwargs, world, sizes, dtype, fuse)
            tol = TOL[dtype]
            emb, labels, W = global_data(kind, kwargs, sizes, dtype, seed)
            past += past_pi_minus_m(kind, kwargs, emb, labels, W)
            value, gx, gW = single_process(kind, kwargs, emb, labels, W)
            trained = train(kind, kwargs, W, sizes, dtype, seed)
            got = [r[i] for r in per_rank]
            worst = 0.0
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertLess(rel(g["loss"], value), tol)
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    err = max(rel(g["x"] / world, gx[lo:lo + n], gx),
                              rel(g["W"], gW))
                    worst = max(worst, err)
                    self.assertLess(err, tol)
                    # W without DDP: the same gradient, hence the same W
                    # after training, on every rank.
                    self.assertTrue(torch.equal(g["W"], got[0]["W"]))
                    self.assertTrue(torch.equal(g["trained"],
                                                got[0]["trained"]))
                    self.assertLess(rel(g["trained"], trained), tol)
            key = "%s world=%d %s" % (kind, world,
                                      str(dtype).replace("torch.", ""))
            self.worst[key] = max(self.worst.get(key, 0.0), worst)
        # The data reached ArcFace's other branch (cos(theta) - m sin m).
        self.assertGreater(past, 0)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_4(self):
        self.check_world(4)

    @classmethod
    def tearDownClass(cls):
        report("margin grad", cls.worst)


if __name__ == "__main__":
    unittest.main()
