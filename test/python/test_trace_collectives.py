"""dloss.ring_shift, dloss.reduce_scatter and dloss.broadcast in a
@dloss.loss function: traced, compiled and run on 1 to 3 ranks with even
and uneven batches, the loss and the gradients match a single-process
reference on the global batch (ddp contract: rank r gets N * dF/dx_r)."""

import unittest

import torch

import multiproc

WORLDS = {"one": [3], "two even": [2, 2], "three uneven": [2, 3, 1]}
DIM = 4


def global_x(rows):
    return torch.randn(rows, DIM, generator=torch.Generator().manual_seed(7),
                       dtype=torch.float64)


def shares(x, sizes):
    return list(torch.split(x, sizes))


def reference(xs):
    """The global loss of the per-rank blocks `xs`, as the traced loss
    defines it."""
    world = len(xs)
    # ring_shift: rank r holds rank r - 1's block, weighted by r + 1.
    shifted = sum((r + 1) * (xs[(r - 1) % world] ** 2).sum()
                  for r in range(world))
    # reduce_scatter of every rank's (q + 1) * all_gather(x): rank r keeps
    # S * x_r, S = sum of q + 1.
    s = world * (world + 1) / 2
    scattered = sum(s * (x ** 2).sum() for x in xs)
    even = sum(s * (x ** 2).sum() for x in xs) if len(set(
        x.shape[0] for x in xs)) == 1 else 0.0
    # broadcast: every rank gets rank 0's column sums.
    root = xs[0].sum(0)
    broadcast = sum((root * x.sum(0)).sum() for x in xs)
    return shifted + scattered + even + broadcast


def run_rank(rank, world, sizes):
    import dloss

    even_split = len(set(sizes)) == 1

    @dloss.loss
    def moved(x):
        weight = dloss.rank() + 1
        prev = dloss.ring_shift(x, 1)
        local = weight * (prev * prev).sum()
        gathered = dloss.all_gather(x) * weight
        mine = dloss.reduce_scatter(gathered, size=x.shape[0])
        local = local + (mine * x).sum()
        if even_split:  # the even share, where the blocks are even
            local = local + (dloss.reduce_scatter(gathered) * x).sum()
        columns = x.sum(0)
        local = local + (dloss.broadcast(columns, 0) * columns).sum()
        return dloss.all_reduce(local, "sum")

    x = shares(global_x(sum(sizes)), sizes)[rank].clone().requires_grad_()
    loss = moved(x)
    loss.backward()
    plan = moved.compiled(x.detach()).plan_text()
    return loss.detach(), x.grad, plan


class TraceCollectivesTest(unittest.TestCase):

    def check(self, case):
        sizes = WORLDS[case]
        world = len(sizes)
        xs = [x.clone().requires_grad_()
              for x in shares(global_x(sum(sizes)), sizes)]
        ref = reference(xs)
        ref.backward()
        ranks = multiproc.run(world, run_rank, sizes, timeout=300)
        for r, (loss, grad, plan) in enumerate(ranks):
            for op in ("dloss.ring_shift", "dloss.reduce_scatter",
                       "dloss.broadcast"):
                self.assertIn(op, plan)
            torch.testing.assert_close(loss, ref.detach(), rtol=1e-12,
                                       atol=1e-12)
            torch.testing.assert_close(grad, world * xs[r].grad, rtol=1e-12,
                                       atol=1e-12)

    def test_one_rank(self):
        self.check("one")

    def test_two_ranks_even(self):
        self.check("two even")

    def test_three_ranks_uneven(self):
        self.check("three uneven")


if __name__ == "__main__":
    unittest.main()
