"""Training with dloss under DDP equals training on one process: a two-tower
model (learnable logit_scale inside it) in DistributedDataParallel on 4
Gloo ranks, trained with dloss.ClipLoss on uneven batches (the last one
smaller, a rank without rows), ends with the parameters of plain eager
CLIP training on the global batch; and a DDP backbone with
dloss.ArcFaceLoss's W outside DDP ends with W identical on every rank and
equal to eager PML training."""

import math
import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import clip_loss, offsets, pml_loss, report

WORLD = 4
# Per step, the per-rank batches: uneven, the last one small.
CLIP_STEPS = [[5, 3, 6, 2], [4, 4, 4, 4], [2, 6, 3, 5], [6, 1, 4, 2],
              [2, 1, 0, 3]]
ARC_STEPS = [[5, 3, 6, 2], [3, 4, 2, 5], [4, 2, 1, 3]]
IMAGE_IN, TEXT_IN, DIM, CLASSES = 12, 10, 16, 7
LR, MOMENTUM = 0.2, 0.9
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


class TwoTower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = torch.nn.Sequential(torch.nn.Linear(IMAGE_IN, 24),
                                         torch.nn.Tanh(),
                                         torch.nn.Linear(24, DIM))
        self.text = torch.nn.Linear(TEXT_IN, DIM)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))

    def forward(self, image, text):
        return (F.normalize(self.image(image)), F.normalize(self.text(text)),
                self.logit_scale.exp())


def _model(cls, dtype, *args):
    torch.manual_seed(1)
    return cls(*args).to(dtype)


def clip_batch(step, total, dtype):
    g = torch.Generator().manual_seed(100 + step)
    image = torch.randn(total, IMAGE_IN, generator=g, dtype=torch.float64)
    text = torch.randn(total, TEXT_IN, generator=g, dtype=torch.float64)
    return image.to(dtype), text.to(dtype)


def arc_batch(step, total, dtype):
    g = torch.Generator().manual_seed(200 + step)
    x = torch.randn(total, IMAGE_IN, generator=g, dtype=torch.float64)
    return x.to(dtype), torch.randint(0, CLASSES, (total,), generator=g)


def backbone():
    return torch.nn.Sequential(torch.nn.Linear(IMAGE_IN, 20),
                               torch.nn.Tanh(), torch.nn.Linear(20, DIM))


def train_clip_single(dtype):
    model = _model(TwoTower, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step, sizes in enumerate(CLIP_STEPS):
        image, text = clip_batch(step, sum(sizes), dtype)
        opt.zero_grad()
        clip_loss(*model(image, text)).backward()
        opt.step()
    return {k: v.detach() for k, v in model.named_parameters()}


def train_arc_single(dtype):
    net = _model(backbone, dtype)
    torch.manual_seed(2)
    W = torch.nn.Parameter(torch.randn(DIM, CLASSES, dtype=dtype))
    opt = torch.optim.SGD(list(net.parameters()) + [W], lr=LR,
                          momentum=MOMENTUM)
    for step, sizes in enumerate(ARC_STEPS):
        x, labels = arc_batch(step, sum(sizes), dtype)
        opt.zero_grad()
        pml_loss("arcface", net(x), labels, W).backward()
        opt.step()
    out = {"module." + k: v.detach() for k, v in net.named_parameters()}
    out["W"] = W.detach()
    return out


def _train_rank(rank, world, dtype):
    import dloss
    from torch.nn.parallel import DistributedDataParallel as DDP
    results = {}

    model = DDP(_model(TwoTower, dtype))
    loss_fn = dloss.ClipLoss()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step, sizes in enumerate(CLIP_STEPS):
        image, text = clip_batch(step, sum(sizes), dtype)
        lo, n = offsets(sizes)[rank], sizes[rank]
        opt.zero_grad()
        loss = loss_fn(*model(image[lo:lo + n], text[lo:lo + n]))
        loss.backward()
        dloss.assert_grads_synced(model)
        opt.step()
        losses.append(loss.item())
    results["clip"] = {k[len("module."):]: v.detach()
                       for k, v in model.named_parameters()}
    results["clip_losses"] = losses

    # ArcFace: the backbone in DDP, the loss's W outside it.
    net = DDP(_model(backbone, dtype))
    arcface = dloss.ArcFaceLoss(CLASSES, DIM).to(dtype)
    torch.manual_seed(2)
    with torch.no_grad():
        arcface.W.copy_(torch.randn(DIM, CLASSES, dtype=dtype))
    params = list(net.parameters()) + list(arcface.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    for step, sizes in enumerate(ARC_STEPS):
        x, labels = arc_batch(step, sum(sizes), dtype)
        lo, n = offsets(sizes)[rank], sizes[rank]
        opt.zero_grad()
        arcface(net(x[lo:lo + n]), labels[lo:lo + n]).backward()
        dloss.assert_grads_synced(list(net.named_parameters()) +
                                  list(arcface.named_parameters()))
        opt.step()
    results["arc"] = dict(net.named_parameters())
    results["arc"]["W"] = arcface.W
    results["arc"] = {k: v.detach() for k, v in results["arc"].items()}
    return results


class TrainingTest(unittest.TestCase):
    errors = {}

    def check(self, dtype):
        per_rank = multiproc.run(WORLD, _train_rank, dtype, timeout=300)
        name = str(dtype).replace("torch.", "")
        for what, single in (("clip", train_clip_single(dtype)),
                             ("arc", train_arc_single(dtype))):
            self.assertEqual(sorted(per_rank[0][what]), sorted(single))
            worst = 0.0
            for rank, result in enumerate(per_rank):
                for key, value in result[what].items():
                    with self.subTest(what=what, rank=rank, param=key):
                        # DDP (and dloss for W) keep every rank identical.
                        self.assertTrue(torch.equal(
                            value, per_rank[0][what][key]))
                        diff = (value - single[key]).abs().max().item()
                        worst = max(worst, diff)
                        self.assertLess(diff, TOL[dtype])
            self.errors["%s %s" % (what, name)] = worst
        # The parameters moved: the comparison is not of initial values.
        moved = (per_rank[0]["clip"]["logit_scale"] - math.log(10.0)).abs()
        self.assertGreater(moved.item(), 1e-3)
        losses = per_rank[0]["clip_losses"]
        self.assertTrue(all(r["clip_losses"] == losses for r in per_rank))

    def test_float64(self):
        self.check(torch.float64)

    def test_float32(self):
        self.check(torch.float32)

    @classmethod
    def tearDownClass(cls):
        report("training", cls.errors, "max_abs_param_diff")


if __name__ == "__main__":
    unittest.main()
