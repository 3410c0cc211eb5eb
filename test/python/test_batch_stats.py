"""Statistics of the global batch in @dloss.loss: Barlow Twins and VICReg
pasted from lightly's single-device code with only the all_reduce of their
cross-correlation added, var/std/F.batch_norm over the batch, and SwaV's
Sinkhorn-Knopp loop of no-grad all-reduces, on 1 and
3 real Gloo ranks with uneven batches (an empty one included), against
one process on the global batch in eager torch. They move statistics
(O(d) and O(d^2)), never rows."""

import sys
import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import offsets, rel

DIM = 5
TOLERANCE = 2e-5


# The single-device losses, as lightly writes them (eager, global batch).
def barlow_twins_eager(z_a, z_b, lambda_param=5e-3):
    z_a_norm = F.batch_norm(z_a, None, None, training=True)
    z_b_norm = F.batch_norm(z_b, None, None, training=True)
    c = z_a_norm.T @ z_b_norm / z_a.shape[0]
    on_diag = (torch.diagonal(c) - 1).pow(2).sum()
    n = c.shape[0]
    off_diag = c.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()
    return on_diag + lambda_param * off_diag.pow(2).sum()


def variance(x):  # VICReg's, unchanged in @dloss.loss
    std = torch.sqrt(x.var(dim=0) + 1e-4)
    return torch.mean(F.relu(1.0 - std))


def vicreg_eager(z_a, z_b):
    def covariance(x):
        x = x - x.mean(dim=0)
        dim = x.size(-1)
        off = ~torch.eye(dim, dtype=torch.bool)
        cov = torch.einsum("bc,bd->cd", x, x) / (x.size(0) - 1)
        return cov[off].pow(2).sum() / dim

    return (25.0 * F.mse_loss(z_a, z_b) +
            25.0 * 0.5 * (variance(z_a) + variance(z_b)) +
            covariance(z_a) + covariance(z_b))


def stats_eager(x, weight, bias):
    y = F.batch_norm(x, None, None, weight, bias, training=True, eps=1e-3)
    return ((y.sigmoid() * x).mean() +
            (x / x.std(0, keepdim=True)).pow(2).mean() +
            x.var(0, unbiased=False).sum() + x.var() +
            torch.std(x, dim=0, correction=0).mean())


def swav_eager(scores, other, iterations=3):
    """SwaV's prediction of one crop's Sinkhorn-Knopp codes from another's
    scores, on one process (lightly's sinkhorn, world size 1)."""
    with torch.no_grad():
        q = torch.exp(scores / 0.05).t()
        q /= torch.sum(q)
        b = q.shape[1]
        for _ in range(iterations):
            q /= torch.sum(q, dim=1, keepdim=True)
            q /= torch.sum(q, dim=0, keepdim=True)
            q /= b
        q = (q * b).t()
    return -torch.mean(torch.sum(q * F.log_softmax(other / 0.1, dim=1),
                                 dim=1))


EAGER = {"barlow_twins": barlow_twins_eager, "vicreg": vicreg_eager,
         "stats": stats_eager, "swav": swav_eager}


def traced_losses():
    """The same losses in @dloss.loss: each line as in the eager code but
    for the marked ones."""
    import dloss

    @dloss.loss
    def barlow_twins(z_a, z_b):
        z_a_norm = F.batch_norm(z_a, None, None, training=True)
        z_b_norm = F.batch_norm(z_b, None, None, training=True)
        # was: c = z_a_norm.T @ z_b_norm / z_a.shape[0]
        c = dloss.all_reduce(z_a_norm.T @ z_b_norm) / dloss.global_size(z_a)
        on_diag = (torch.diagonal(c) - 1).pow(2).sum()
        # was: the flatten/view trick (dloss has no reshape)
        off = ~torch.eye(c.shape[0], dtype=torch.bool)
        off_diag = torch.where(off, c, 0.0)
        return on_diag + 5e-3 * off_diag.pow(2).sum()

    @dloss.loss
    def vicreg(z_a, z_b):
        def covariance(x):
            x = x - x.mean(dim=0)
            dim = x.size(-1)
            off = ~torch.eye(dim, dtype=torch.bool)
            # was: einsum(...) / (x.size(0) - 1), then cov[off]
            cov = dloss.all_reduce(x.T @ x) / (dloss.global_size(x) - 1)
            return torch.where(off, cov, 0.0).pow(2).sum() / dim

        return (25.0 * F.mse_loss(z_a, z_b) +
                25.0 * 0.5 * (variance(z_a) + variance(z_b)) +
                covariance(z_a) + covariance(z_b))

    @dloss.loss
    def stats(x, weight: dloss.Replicated, bias: dloss.Replicated):
        return stats_eager(x, weight, bias)

    @dloss.loss
    def swav(scores, other):
        # The Sinkhorn-Knopp iterations: a Python loop of no-grad
        # all-reduces over the global batch, unrolled as it is recorded.
        q = torch.exp(scores.detach() / 0.05)
        q = q / dloss.all_reduce(q.sum())
        b = dloss.global_size(q)
        for _ in range(3):
            q = q / dloss.all_reduce(q.sum(0, keepdim=True))
            q = q / q.sum(1, keepdim=True) / b
        q = q * b
        return -torch.mean(torch.sum(q * F.log_softmax(other / 0.1, dim=1),
                                     dim=1))

    return {"barlow_twins": barlow_twins, "vicreg": vicreg, "stats": stats,
            "swav": swav}


def global_inputs(case, total):
    g = torch.Generator().manual_seed(5)
    if case == "swav":  # cosine-like scores against prototypes
        return [torch.tanh(torch.randn(total, DIM + 2, generator=g))
                for _ in range(2)]
    if case == "stats":
        return [torch.randn(total, DIM, generator=g) * 2 + 1,
                torch.rand(DIM, generator=g) + 0.5,
                torch.randn(DIM, generator=g)]
    return [torch.randn(total, DIM, generator=g),
            torch.randn(total, DIM, generator=g) + 0.3]


REPLICATED = {"stats": (1, 2)}


def run_rank(rank, world, sizes):
    starts = offsets(sizes)
    mine = slice(starts[rank], starts[rank + 1])
    out = {}
    for case, fn in traced_losses().items():
        full = global_inputs(case, sum(sizes))
        args = [v.clone() if i in REPLICATED.get(case, ()) else
                v[mine].clone() for i, v in enumerate(full)]
        args = [v.requires_grad_() for v in args]
        loss = fn(*args)
        loss.backward()
        ir = fn.to_mlir(*[a.detach() for a in args])
        collectives = sorted({w for w in ir.split() if w in (
            "dloss.all_gather", "dloss.all_reduce", "dloss.ring_shift",
            "dloss.reduce_scatter", "dloss.broadcast")})
        out[case] = (loss.detach(), [a.grad for a in args], collectives)
    return out


# ---------------------------------------------------------------------------
# Loss state: DINO's centre, an EMA of the teacher's global batch mean.
# ---------------------------------------------------------------------------

def dino_eager(teacher, student, center):
    """DINO's loss on one process and the centre's update (lightly's
    DINOLoss with one view each): the new centre is returned."""
    t = F.softmax((teacher - center) / 0.04, dim=-1)
    s = F.log_softmax(student / 0.1, dim=-1)
    loss = -(t * s).sum(-1).mean()
    return loss, 0.9 * center + 0.1 * teacher.mean(0, keepdim=True)


def run_state(rank, world, sizes):
    """Two calls of the traced DINO loss on this rank's rows: each call's
    loss and student gradient, and the centre after each call."""
    import dloss

    @dloss.loss
    def dino(teacher, student, center: dloss.State):
        t = F.softmax((teacher.detach() - center) / 0.04, dim=-1)
        s = F.log_softmax(student / 0.1, dim=-1)
        loss = -(t * s).sum(-1).mean()
        return loss, 0.9 * center + 0.1 * teacher.detach().mean(
            0, keepdim=True)

    starts = offsets(sizes)
    mine = slice(starts[rank], starts[rank + 1])
    center = torch.zeros(1, DIM)
    out = []
    for call in range(2):
        teacher, student = state_inputs(sum(sizes), call)
        student = student[mine].clone().requires_grad_()
        loss = dino(teacher[mine], student, center)
        loss.backward()
        out.append((loss.detach(), student.grad, center.clone()))
    return out


def state_inputs(total, call):
    g = torch.Generator().manual_seed(100 + call)
    return (torch.randn(total, DIM, generator=g),
            torch.randn(total, DIM, generator=g))


class LossStateTest(unittest.TestCase):

    def check(self, sizes):
        world = len(sizes)
        results = multiproc.run(world, run_state, sizes, timeout=300)
        starts = offsets(sizes)
        center = torch.zeros(1, DIM)
        worst = 0.0
        for call in range(2):
            teacher, student = state_inputs(sum(sizes), call)
            student.requires_grad_()
            ref, center = dino_eager(teacher, student, center)
            ref.backward()
            for r, per_call in enumerate(results):
                loss, grad, got_center = per_call[call]
                worst = max(worst, rel(loss, ref.detach()),
                            rel(got_center, center))
                block = student.grad[starts[r]:starts[r + 1]]
                worst = max(worst, rel(grad / world, block, student.grad))
                # The same state on every rank, bit for bit.
                self.assertTrue(torch.equal(got_center,
                                            results[0][call][2]))
        print("METRIC batch_stats case=state sizes=%s traced_vs_eager=%.3g"
              % (sizes, worst), file=sys.stderr)
        self.assertLess(worst, TOLERANCE)

    def test_one_rank(self):
        self.check([6])

    def test_three_uneven_ranks(self):
        self.check([4, 1, 6])

    def test_state_errors(self):
        import dloss

        @dloss.loss
        def per_rank_state(x, c: dloss.State):
            return x.mean(), c + x.sum(0)  # ERROR: varying state

        @dloss.loss
        def missing_state(x, c: dloss.State):
            return x.mean()

        x, c = torch.randn(3, DIM), torch.zeros(DIM)
        for fn, words in ((per_rank_state, ["state argument 'c' varies",
                                            "all-reduced statistics"]),
                          (missing_state, ["0 value(s) after the loss",
                                           "1 state argument(s) (c)"])):
            with self.assertRaises(dloss.Error) as caught:
                fn(x, c)
            for w in words:
                self.assertIn(w, str(caught.exception))
        self.assertTrue(torch.equal(c, torch.zeros(DIM)))


class GlobalStatisticsTest(unittest.TestCase):

    def check(self, sizes):
        world = len(sizes)
        results = multiproc.run(world, run_rank, sizes, timeout=300)
        starts = offsets(sizes)
        for case, eager in EAGER.items():
            full = [v.requires_grad_() for v in
                    global_inputs(case, sum(sizes))]
            ref = eager(*full)
            ref.backward()
            worst = 0.0
            summed = {}
            for r, per_case in enumerate(results):
                loss, grads, collectives = per_case[case]
                # Statistics travel, rows never do.
                self.assertEqual(collectives, ["dloss.all_reduce"], case)
                worst = max(worst, rel(loss, ref.detach()))
                for i, (got, want) in enumerate(zip(grads, full)):
                    if i in REPLICATED.get(case, ()):
                        # ddp: each rank holds its share of N * dF/dtheta.
                        summed[i] = summed.get(i, 0) + got / world
                        continue
                    if want.grad is None:  # reached only through detach
                        self.assertFalse(got is not None and got.any(), case)
                        continue
                    block = want.grad[starts[r]:starts[r + 1]]
                    worst = max(worst, rel(got / world, block, want.grad))
            for i, got in summed.items():
                worst = max(worst, rel(got, full[i].grad))
            print("METRIC batch_stats case=%s sizes=%s traced_vs_eager=%.3g"
                  % (case, sizes, worst), file=sys.stderr)
            self.assertLess(worst, TOLERANCE, case)

    def test_one_rank(self):
        self.check([6])

    def test_three_uneven_ranks(self):
        self.check([4, 1, 6])

    def test_an_empty_rank(self):
        self.check([3, 0, 5])

    def test_per_rank_statistics_would_fail(self):
        # lightly's distributed Barlow Twins (each rank batch-normalises its
        # own rows, then the cross-correlations are averaged) is not the
        # global loss: the comparison above can fail.
        full = global_inputs("barlow_twins", 12)
        whole = barlow_twins_eager(*full)
        starts = offsets([4, 2, 6])
        parts = []
        for r in range(3):
            mine = [v[starts[r]:starts[r + 1]] for v in full]
            a, b = (F.batch_norm(v, None, None, training=True) for v in mine)
            parts.append(a.T @ b / a.shape[0] / 3)
        c = sum(parts)
        n = c.shape[0]
        per_rank = ((torch.diagonal(c) - 1).pow(2).sum() + 5e-3 * (
            c.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()
            .pow(2).sum()))
        self.assertGreater(rel(per_rank, whole), 1e-2)


if __name__ == "__main__":
    unittest.main()
