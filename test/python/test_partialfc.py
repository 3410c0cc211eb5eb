"""dloss.PartialFC against insightface's PartialFC_V2 on 1-4 Gloo ranks:
its class split (num_classes not divisible by the world size), both
constructor orders, uneven batches, and the value and gradients of one
process on the global batch with the full W (every rank's block
concatenated) and the exact margin (cos(acos(t) + m), where insightface's
gradient is straight-through): the loss on every rank, embeddings gradients
N * dF/dx_r, each rank's weight gradient its block of dF/dW. Also the bad
arguments that must raise dloss.Error, and dloss.CombinedMarginLoss as a
module."""

import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import FUSE_MODES, TOL, fusion, offsets, rel, report

EMB, CLASSES = 16, 11
MARGINS = {"arcface": (64.0, 1.0, 0.5, 0.0), "cosface": (64.0, 1.0, 0.0, 0.4)}
SIZES = {1: [7], 2: [5, 2], 3: [4, 0, 3], 4: [5, 3, 6, 2]}  # 3: an empty rank


def insightface_split(num_classes, rank, world):
    """PartialFC_V2's num_local and class_start."""
    num_local = num_classes // world + int(rank < num_classes % world)
    class_start = num_classes // world * rank + min(rank, num_classes % world)
    return num_local, class_start


def reference_loss(kind, embeddings, labels, weight):
    """insightface's logits (normalised embeddings x normalised weight rows)
    and CombinedMarginLoss, with the exact margin gradient, then the mean
    cross-entropy over the global batch (without DistCrossEntropy's clamp of
    each probability at 1e-30)."""
    s, m1, m2, m3 = MARGINS[kind]
    logits = F.linear(F.normalize(embeddings), F.normalize(weight))
    rows = torch.arange(labels.shape[0])
    target = logits[rows, labels]
    if kind == "arcface":
        adjusted = torch.cos(torch.acos(target.clamp(-1, 1)) + m2)
    else:
        adjusted = target - m3
    logits = logits.index_put((rows, labels), adjusted) * s
    return F.cross_entropy(logits, labels)


def global_data(sizes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    emb = torch.randn(total, EMB, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (total,), generator=g)
    weight = torch.randn(CLASSES, EMB, generator=g, dtype=torch.float64)
    # Half the rows near their class: the loss is neither tiny nor huge.
    half = total // 2
    emb[:half] += 2 * F.normalize(weight[labels[:half]]) * EMB ** 0.5
    return emb.to(dtype), labels, weight.to(dtype)


def single_process(kind, emb, labels, weight):
    emb = emb.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    loss = reference_loss(kind, emb, labels, weight)
    loss.backward()
    return loss.detach(), emb.grad, weight.grad


def _cases():
    return [(kind, dtype, seed, fuse, order)
            for seed, kind in enumerate(MARGINS)
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES
            for order in ("dloss", "insightface")]


def _partialfc_rank(rank, world, sizes):
    import dloss
    results = []
    for kind, dtype, seed, fuse, order in _cases():
        emb, labels, weight = global_data(sizes, dtype, seed)
        margin = dloss.CombinedMarginLoss(*MARGINS[kind])
        if order == "dloss":
            pfc = dloss.PartialFC(EMB, CLASSES, margin_loss=margin,
                                  fuse=bool(fuse))
        else:
            pfc = dloss.PartialFC(margin, EMB, CLASSES, 1.0, False,
                                  fuse=bool(fuse))
        pfc = pfc.to(dtype)
        with torch.no_grad():
            pfc.weight.copy_(weight[pfc.class_start:pfc.class_start +
                                    pfc.num_local])
        lo, n = offsets(sizes)[rank], sizes[rank]
        x = emb[lo:lo + n].clone().requires_grad_()
        # insightface's callers pass [B] or [B, 1] labels, often int32.
        local_labels = labels[lo:lo + n]
        if order == "insightface":
            local_labels = local_labels.view(-1, 1).to(torch.int32)
        with fusion(fuse):
            loss = pfc(x, local_labels)
            loss.backward()
        results.append(dict(
            loss=loss.detach(), x=x.grad, weight=pfc.weight.grad,
            num_local=pfc.num_local, class_start=pfc.class_start,
            keys=list(pfc.state_dict()), shape=list(pfc.weight.shape)))
    return results


class PartialFCTest(unittest.TestCase):
    worst = {}

    def check_world(self, world):
        sizes = SIZES[world]
        per_rank = multiproc.run(world, _partialfc_rank, sizes, timeout=300)
        for i, (kind, dtype, seed, fuse, order) in enumerate(_cases()):
            what = "%s world %d sizes %s %s fuse=%s order=%s" % (
                kind, world, sizes, dtype, fuse, order)
            tol = TOL[dtype]
            emb, labels, weight = global_data(sizes, dtype, seed)
            value, gx, gw = single_process(kind, emb, labels, weight)
            got = [r[i] for r in per_rank]
            worst = 0.0
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    num_local, start = insightface_split(CLASSES, rank, world)
                    self.assertEqual((g["num_local"], g["class_start"]),
                                     (num_local, start))
                    self.assertEqual(g["shape"], [num_local, EMB])
                    self.assertEqual(g["keys"], ["weight"])
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertLess(rel(g["loss"], value), tol)
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    block = slice(start, start + num_local)
                    err = max(rel(g["x"] / world, gx[lo:lo + n], gx),
                              rel(g["weight"], gw[block], gw))
                    worst = max(worst, err)
                    self.assertLess(err, tol)
            key = "%s world=%d %s" % (kind, world,
                                      str(dtype).replace("torch.", ""))
            self.worst[key] = max(self.worst.get(key, 0.0), worst)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4(self):
        self.check_world(4)

    def test_bad_arguments(self):
        import dloss
        dloss.init()
        arc = dloss.CombinedMarginLoss(64, 1.0, 0.5, 0.0)
        bad = [
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=arc,
                                    sample_rate=0.5),
            lambda: dloss.PartialFC(arc, EMB, CLASSES, 0.5),
            lambda: dloss.PartialFC(EMB, CLASSES),
            lambda: dloss.PartialFC(arc, EMB),
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=arc, rate=1.0),
            lambda: dloss.PartialFC(arc, EMB, CLASSES, 1.0, False, 3),
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=object()),
            # Combined margins, SphereFace's m1 and interclass filtering.
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=dloss.
                                    CombinedMarginLoss(64, 1.0, 0.3, 0.2)),
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=dloss.
                                    CombinedMarginLoss(64, 1.35, 0.0, 0.0)),
            lambda: dloss.PartialFC(EMB, CLASSES, margin_loss=dloss.
                                    CombinedMarginLoss(64, 1.0, 0.5, 0.0,
                                                       0.2)),
        ]
        for i, make in enumerate(bad):
            with self.subTest(case=i):
                with self.assertRaises(dloss.Error):
                    make()

    def test_sizes_of_any_integer_type(self):
        import dloss
        import numpy as np
        dloss.init()
        arc = dloss.CombinedMarginLoss(64, 1.0, 0.5, 0.0)
        for make in (lambda: dloss.PartialFC(np.int64(EMB), CLASSES,
                                             margin_loss=arc),
                     lambda: dloss.PartialFC(arc, np.int64(EMB), CLASSES)):
            pfc = make()
            self.assertEqual(list(pfc.weight.shape), [CLASSES, EMB])
            self.assertIs(pfc.margin_softmax, arc)

    def test_combined_margin_module(self):
        """dloss.CombinedMarginLoss applied to cosines: the exact margin
        s (cos(m1 theta + m2) - m3), value and gradient; rows labelled -1
        (another rank's class, as in insightface) are left alone."""
        import dloss
        g = torch.Generator().manual_seed(3)
        cos = torch.rand(6, CLASSES, generator=g,
                         dtype=torch.float64) * 1.8 - 0.9
        labels = torch.tensor([3, -1, 0, 10, -1, 7])
        # PartialFC's two, SphereFace's m1 and a combined margin.
        margins = list(MARGINS.values()) + [(30.0, 1.35, 0.0, 0.0),
                                            (64.0, 1.0, 0.3, 0.2)]
        for s, m1, m2, m3 in margins:
            with self.subTest(margins=(s, m1, m2, m3)):
                mine = cos.clone().requires_grad_()
                ref = cos.clone().requires_grad_()
                out = dloss.CombinedMarginLoss(s, m1, m2, m3)(mine, labels)
                rows = torch.nonzero(labels != -1).view(-1)
                t = ref[rows, labels[rows]]
                adjusted = torch.cos(m1 * torch.acos(t) + m2) - m3
                expected = ref.index_put((rows, labels[rows]), adjusted) * s
                self.assertLess(rel(out, expected), 1e-12)
                weights = torch.randn(out.shape, generator=g,
                                      dtype=torch.float64)
                (out * weights).sum().backward()
                (expected * weights).sum().backward()
                self.assertLess(rel(mine.grad, ref.grad), 1e-12)

    @classmethod
    def tearDownClass(cls):
        report("partialfc grad", cls.worst)


if __name__ == "__main__":
    unittest.main()
