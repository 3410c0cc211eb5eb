"""dloss.all_gather and dloss.gather_all_tensors (TorchMetrics' signature)
on real Gloo ranks: values with uneven first dimensions (an empty rank
included), several dtypes and 0-d tensors; exact autograd (each rank's
gradient is the sum of every rank's cotangent for its block, checked
against the analytic value); and tensors that disagree in dtype, number of
dims or being 0-d (and, for all_gather, beyond the first dimension)
raising dloss.Error on every rank. test_torchmetrics.py compares
gather_all_tensors with TorchMetrics' own, uneven trailing dims included."""

import subprocess
import sys
import unittest

import torch

import multiproc
from loss_reference import offsets

TRAIL = (3, 2)


def rank_tensor(rank, n, dtype):
    """Rank r's rows: values that say whose they are."""
    x = torch.arange(n * 6, dtype=torch.float64).reshape((n,) + TRAIL)
    return (x + 100 * rank).to(dtype)


def cotangent_weights(rank, total):
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randn((total,) + TRAIL, generator=g, dtype=torch.float64)


def _values_rank(rank, world, sizes):
    import dloss
    out = {}
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32):
        x = rank_tensor(rank, sizes[rank], dtype)
        out["all_gather", dtype] = dloss.all_gather(x)
        out["gather_all_tensors", dtype] = dloss.gather_all_tensors(x)
    scalar = torch.tensor(float(rank) + 0.5)
    out["scalar"] = dloss.gather_all_tensors(scalar)
    # A 1-d tensor (no trailing dims), as TorchMetrics' states often are.
    out["1d"] = dloss.gather_all_tensors(torch.full((sizes[rank],), rank))

    # Exact autograd: rank q's loss is sum(W_q * f(gathered)), so rank r's
    # gradient is the sum over q of rank q's cotangent for r's block.
    total = sum(sizes)
    w = cotangent_weights(rank, total)
    x = rank_tensor(rank, sizes[rank], torch.float64).requires_grad_()
    (w * dloss.all_gather(x) ** 2).sum().backward()
    out["grad_all_gather"] = x.grad
    x = rank_tensor(rank, sizes[rank], torch.float64).requires_grad_()
    pieces = dloss.gather_all_tensors(x)
    lo = offsets(sizes)
    sum((w[lo[q]:lo[q + 1]] * p).sum()
        for q, p in enumerate(pieces)).backward()
    out["grad_gather_all_tensors"] = x.grad
    s = torch.tensor(1.0 + rank, dtype=torch.float64, requires_grad=True)
    sum(float(rank + 1) * (q + 1) * p
        for q, p in enumerate(dloss.gather_all_tensors(s))).backward()
    out["grad_scalar"] = s.grad
    return out


class ValuesTest(unittest.TestCase):
    def check(self, sizes):
        world = len(sizes)
        results = multiproc.run(world, _values_rank, sizes)
        lo = offsets(sizes)
        total = sum(sizes)
        for rank, out in enumerate(results):
            for dtype in (torch.float32, torch.float64, torch.int64,
                          torch.int32):
                expected = torch.cat([rank_tensor(q, n, dtype)
                                      for q, n in enumerate(sizes)])
                gathered = out["all_gather", dtype]
                self.assertEqual(gathered.dtype, dtype)
                self.assertTrue(torch.equal(gathered, expected))
                pieces = out["gather_all_tensors", dtype]
                self.assertIsInstance(pieces, list)
                self.assertEqual(len(pieces), world)
                for q, p in enumerate(pieces):
                    self.assertEqual(p.dtype, dtype)
                    self.assertTrue(torch.equal(
                        p, rank_tensor(q, sizes[q], dtype)))
            scalars = out["scalar"]
            self.assertEqual([p.shape for p in scalars],
                             [torch.Size([])] * world)
            self.assertEqual([p.item() for p in scalars],
                             [q + 0.5 for q in range(world)])
            self.assertEqual([p.tolist() for p in out["1d"]],
                             [[q] * n for q, n in enumerate(sizes)])
            # Analytic gradients.
            x = rank_tensor(rank, sizes[rank], torch.float64)
            block = slice(lo[rank], lo[rank + 1])
            ct = sum(cotangent_weights(q, total)[block] for q in range(world))
            self.assertTrue(torch.allclose(out["grad_all_gather"], 2 * ct * x,
                                           rtol=1e-13, atol=0))
            self.assertTrue(torch.allclose(out["grad_gather_all_tensors"], ct,
                                           rtol=1e-13, atol=0))
            self.assertEqual(out["grad_scalar"].item(),
                             sum((q + 1) * (rank + 1) for q in range(world)))

    def test_one_rank(self):
        self.check([3])

    def test_four_ranks_uneven(self):
        self.check([2, 0, 3, 1])


def _mismatch_rank(rank, world, case):
    """Passes a tensor that disagrees with the other ranks' on rank 1, as
    the process's first collective (so no earlier call has taught it
    anything)."""
    import dloss
    x = torch.ones(2 + rank, 3)
    if rank == 1:
        x = {"trailing": torch.ones(3, 4),
             "ndim": torch.ones(3, 3, 1),
             "dtype": torch.ones(3, 3, dtype=torch.float64),
             "0-d": torch.tensor(1.0)}[case]
    if case == "0-d" and rank != 1:
        x = torch.ones(1)
    if case == "trailing":
        # gather_all_tensors pads dims after the first (as TorchMetrics
        # does); the concatenation cannot.
        return dloss.all_gather(x)
    return dloss.gather_all_tensors(x)


def _mismatches_rank(rank, world):
    """Every mismatch in one process, each after the last one's error, and
    a good call at the end: an error leaves the ranks in step."""
    import dloss
    seen = []
    for case in ("dtype", "trailing", "ndim", "0-d"):
        try:
            _mismatch_rank(rank, world, case)
            seen.append((case, None))
        except dloss.Error as e:
            seen.append((case, str(e)))
    seen.append(("after", dloss.all_gather(torch.full((rank + 1, 2),
                                                      rank)).tolist()))
    return seen


class MismatchTest(unittest.TestCase):
    def test_first_call_every_rank_raises(self):
        for case in ("dtype", "0-d"):
            with self.subTest(case=case):
                out = multiproc.run(3, _mismatch_rank, case,
                                    expect_errors=True)
                for rank, (status, value, _) in enumerate(out):
                    self.assertEqual(status, "error", (rank, value))
                    type_name, message, _, is_dloss = value
                    self.assertTrue(is_dloss, message)
                    self.assertIn("rank %d" % rank, message)
                    self.assertIn("disagree in their number of dimensions "
                                  "or dtype", message)

    def test_errors_leave_ranks_in_step(self):
        out = multiproc.run(3, _mismatches_rank)
        for rank, seen in enumerate(out):
            for case, message in seen[:-1]:
                self.assertIsNotNone(message, (rank, case))
                self.assertIn("dloss error", message)
            self.assertEqual(seen[-1][1], [[0, 0], [1, 1], [1, 1], [2, 2],
                                           [2, 2], [2, 2]])


if __name__ == "__main__":
    unittest.main()


class DeviceTest(unittest.TestCase):
    """torch 2.x groups hold a backend per device type: a tensor on a device
    the group has no backend for is refused, naming the group's backends."""

    def test_device_without_backend_is_refused(self):
        out = subprocess.run(
            [sys.executable, "-c", (
                "import torch, torch.distributed as dist, dloss\n"
                "dist.init_process_group('gloo', store=dist.HashStore(), "
                "rank=0, world_size=1)\n"
                "try:\n"
                "    dloss.all_gather(torch.ones(2, device='meta'))\n"
                "except dloss.Error as e:\n"
                "    print('ERROR', e)\n"
                "print('OK', dloss.all_gather(torch.ones(2)).tolist())\n")],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("allGather got a tensor on meta", out.stdout)
        self.assertIn("the process group moves only CPU tensors (gloo)",
                      out.stdout)
        # The refusal leaves the group usable.
        self.assertIn("OK [1.0, 1.0]", out.stdout)
