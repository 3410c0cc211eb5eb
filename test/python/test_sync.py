"""dloss.assert_grads_synced on 3 Gloo ranks: silent after DDP's backward
(gradients as bucket views too, and a dloss loss's own W kept outside DDP);
raising on every rank, naming the parameter and which ranks agree, for a
gradient nudged on one rank (one ulp, or a pattern of ulps that a
position-weighted byte sum misses), a loss parameter outside DDP trained on
per-rank data, a gradient missing on one rank, and ranks passing different
numbers of parameters."""

import unittest

import torch

import multiproc

WORLD = 3


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 4))


def _nudge(t, ulps):
    """`t` with element i moved by ulps[i] units in the last place."""
    bits = t.detach().clone().view(torch.int32)
    bits[:len(ulps)] += torch.tensor(ulps, dtype=torch.int32)
    return bits.view(torch.float32)



def _sync_rank(rank, world):
    import dloss
    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(3 + rank, 6, generator=g)
    out = {}

    def backward(extra=None):
        ddp.zero_grad()
        loss = ddp(x).pow(2).sum()
        if extra is not None:
            loss = loss * extra
        loss.backward()

    backward()
    out["ddp"] = multiproc.outcome(lambda: dloss.assert_grads_synced(ddp))
    out["ddp_list"] = multiproc.outcome(
        lambda: dloss.assert_grads_synced(list(ddp.parameters())))
    out["ddp_dict"] = multiproc.outcome(
        lambda: dloss.assert_grads_synced(dict(ddp.named_parameters())))

    # One ulp on one element of one gradient, on rank 1.
    backward()
    weight = model[2].weight
    if rank == 1:
        weight.grad = _nudge(weight.grad.reshape(-1), [1]).reshape(
            weight.shape)
    out["one_ulp"] = multiproc.outcome(lambda: dloss.assert_grads_synced(ddp))

    # +1, -1, -1, +1 ulps on four elements: the byte sum and the sum weighted
    # by position (1, 5, 9, 13 for these low bytes) both stay the same.
    backward()
    flat = model[0].weight.grad.reshape(-1)
    flat.copy_(1.0 + 100 * torch.finfo(torch.float32).eps / 2 *
               torch.ones_like(flat))
    if rank == 2:
        model[0].weight.grad = _nudge(flat, [1, -1, -1, 1]).reshape(
            model[0].weight.shape)
    out["ulp_pattern"] = multiproc.outcome(lambda: dloss.assert_grads_synced(ddp))

    # A temperature outside DDP, trained on each rank's own data.
    temperature = torch.nn.Parameter(torch.tensor(0.5))
    backward(temperature)
    params = list(ddp.named_parameters()) + [("temperature", temperature)]
    out["outside_ddp"] = multiproc.outcome(lambda: dloss.assert_grads_synced(params))

    # No gradient on rank 0 only.
    backward()
    if rank == 0:
        model[0].bias.grad = None
    out["missing"] = multiproc.outcome(lambda: dloss.assert_grads_synced(ddp))

    # Gradients that are views into DDP's buckets (at storage offsets).
    bucketed = torch.nn.parallel.DistributedDataParallel(
        _model(), gradient_as_bucket_view=True)
    bucketed(x).pow(2).sum().backward()
    out["bucket_view"] = multiproc.outcome(lambda: dloss.assert_grads_synced(bucketed))
    if rank == 0:
        grad = bucketed.module[2].bias.grad
        assert grad.storage_offset() > 0
        grad.view(torch.int32)[-1] += 1  # in the bucket, in place
    out["bucket_ulp"] = multiproc.outcome(lambda: dloss.assert_grads_synced(bucketed))

    # Different parameter lists.
    backward()
    mine = list(ddp.parameters())[:4 if rank == 2 else 3]
    out["count"] = multiproc.outcome(lambda: dloss.assert_grads_synced(mine))

    # dloss's ArcFace W outside DDP gets the global gradient: in sync.
    arcface = dloss.ArcFaceLoss(7, 4)
    with torch.no_grad():
        arcface.W.copy_(torch.randn(4, 7, generator=torch.Generator()
                                    .manual_seed(5)))
    ddp.zero_grad()
    labels = torch.arange(x.shape[0]) % 7
    arcface(ddp(x), labels).backward()
    params = list(ddp.named_parameters()) + list(arcface.named_parameters())
    out["arcface_w"] = multiproc.outcome(lambda: dloss.assert_grads_synced(params))
    # ... and the check is still in step with the other ranks afterwards.
    out["after"] = dloss.all_gather(torch.tensor([rank])).tolist()
    return out


class AssertGradsSyncedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = multiproc.run(WORLD, _sync_rank)

    def outcomes(self, key):
        return [r[key] for r in self.results]

    def test_in_sync(self):
        for key in ("ddp", "ddp_list", "ddp_dict", "bucket_view",
                    "arcface_w"):
            self.assertEqual(self.outcomes(key), [None] * WORLD, key)
        self.assertEqual(self.outcomes("after"), [[0, 1, 2]] * WORLD)

    def check_raised(self, key, *expected):
        for rank, message in enumerate(self.outcomes(key)):
            with self.subTest(key=key, rank=rank):
                self.assertIsNotNone(message)
                self.assertIn("dloss error [rank %d" % rank, message)
                for text in expected:
                    self.assertIn(text, message)

    def test_one_ulp(self):
        self.check_raised("one_ulp", "module.2.weight differs",
                          "ranks 0, 2 (one value) vs rank 1 (one value)",
                          "1 of 4 parameters")

    def test_ulp_pattern(self):
        self.check_raised("ulp_pattern", "module.0.weight differs",
                          "ranks 0, 1 (one value) vs rank 2 (one value)")

    def test_bucket_view(self):
        self.check_raised("bucket_ulp", "module.2.bias differs",
                          "rank 0 (one value) vs ranks 1, 2 (one value)")

    def test_parameter_outside_ddp(self):
        self.check_raised(
            "outside_ddp", "temperature differs",
            "rank 0 (one value) vs rank 1 (one value) vs rank 2")
        for message in self.outcomes("outside_ddp"):
            self.assertNotIn("module.", message)

    def test_missing_gradient(self):
        self.check_raised("missing", "module.0.bias differs",
                          "rank 0 (no gradient) vs ranks 1, 2 (one value)")

    def test_different_parameter_lists(self):
        self.check_raised("count", "different numbers of parameters",
                          "rank 0: 3, rank 1: 3, rank 2: 4")


if __name__ == "__main__":
    unittest.main()
