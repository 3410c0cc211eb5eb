"""dloss.guard on 3 Gloo ranks, for the ops a Python ProcessGroup cannot
see: FSDP2 (fully_shard) steps under the guard give gradients bit-identical
to unguarded ones; a stray all_gather_into_tensor or reduce_scatter_tensor
on rank 0, or a rank that skips FSDP2's step, ends every rank within the
deadline naming the stray line and the FSDP2 all-gather it met; each op of
c10d's backend interface with a mismatched shape on one rank is refused on
every rank; a send and its recv that disagree are refused on both ends, and
a send with no recv at the deadline. Guards nest: an inner guard's
deadline ends with it. Guards installed and closed on one thread while
another runs collectives change nothing those collectives compute. Each
scenario's time to fail is printed."""

import os
import threading
import time
import unittest

import torch
import torch.distributed as dist

import multiproc
from test_guard import _body, _refused

WORLD = 3
DEADLINE = 4.0


def _where(marker):
    return "%s:%d" % (os.path.abspath(__file__),
                      multiproc.line_of(__file__, marker))


def _fsdp_model():
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 4))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    return model


def _fsdp_steps(rank, world, guarded, fault=None):
    """Three FSDP2 steps; before the third, rank 0 runs `fault`. Returns the
    full gradients, or (message, seconds) of the refusal."""
    import dloss
    if guarded:
        dloss.guard(timeout=DEADLINE)
    model = _fsdp_model()
    g = torch.Generator().manual_seed(rank)

    def step():
        model(torch.randn(5, 8, generator=g)).square().sum().backward()  # fsdp-forward
    step()
    step()

    def third():
        if rank == 0 and fault == "all_gather_into_tensor":
            out = torch.zeros(4 * world)
            dist.all_gather_into_tensor(out, torch.ones(4))  # stray-ag
        elif rank == 0 and fault == "reduce_scatter_tensor":
            out = torch.zeros(4)
            dist.reduce_scatter_tensor(out, torch.ones(4 * world))  # stray-rs
        elif rank == 0 and fault == "skip":
            dist.barrier()  # skips-the-step
            return
        step()
    if fault is not None:
        return _refused(third)
    third()
    return [p.grad.full_tensor().clone() for p in model.parameters()]


def _each_op(rank, world):
    """Every op with rank 2's tensor one row longer, each under a guard of
    its own (a refused group stays refused); what each raised."""
    import dloss
    n = 2 + (rank == 2)
    group = dist.distributed_c10d._get_default_group()
    ops = {
        "broadcast": lambda: dist.broadcast(torch.ones(n), 0),
        "all_reduce": lambda: dist.all_reduce(torch.ones(n)),
        "reduce": lambda: dist.reduce(torch.ones(n), 0),
        "all_gather": lambda: dist.all_gather(
            [torch.zeros(n) for _ in range(world)], torch.ones(n)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.zeros(n * world), torch.ones(n)),
        "all_gather_into_tensor_coalesced":
            lambda: group.allgather_into_tensor_coalesced(
                [torch.zeros(n * world)], [torch.ones(n)]).wait(),
        "gather": lambda: dist.gather(
            torch.ones(n), [torch.zeros(n) for _ in range(world)]
            if rank == 0 else None, 0),
        "scatter": lambda: dist.scatter(
            torch.zeros(n), [torch.ones(n) for _ in range(world)]
            if rank == 0 else None, 0),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.zeros(n), torch.ones(n * world)),
        "reduce_scatter_tensor_coalesced":
            lambda: group.reduce_scatter_tensor_coalesced(
                [torch.zeros(n)], [torch.ones(n * world)]).wait(),
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.zeros(n * world), torch.ones(n * world)),
        "barrier": lambda: (dist.barrier() if rank != 2 else
                            dist.all_reduce(torch.ones(1))),
    }
    out = {}
    for name, op in ops.items():
        guard = dloss.guard(timeout=DEADLINE)
        out[name] = _refused(op)
        guard.close()
    return out


def _pairs(rank, world, fault):
    """Rank 0 sends 4 floats to rank 1, which receives them as 2x2
    ("shape"), or never posts its recv ("no-recv"); rank 2 stays out."""
    import dloss
    dloss.guard(timeout=DEADLINE)
    if rank == 0:
        return _refused(lambda: dist.send(torch.ones(4), 1))  # the-send
    if rank == 1 and fault == "shape":
        return _refused(lambda: dist.recv(torch.zeros(2, 2), 0))  # the-recv
    return None, 0.0


def _nested(rank, world):
    """An inner guard with a long deadline, then, under the outer guard
    again, a barrier that rank 2 skips."""
    import dloss
    dloss.guard(timeout=DEADLINE)
    with dloss.guard(timeout=600):
        dist.all_reduce(torch.ones(1))
    if rank == 2:
        return None, 0.0
    return _refused(lambda: dist.barrier())  # after-nested


def _reguard(rank, world):
    """100 all_reduces on a thread of their own while the main thread
    installs and closes an inner guard 30 times (the same number on every
    rank); the sums."""
    import dloss
    dloss.guard(timeout=30)
    sums = []

    def ops():
        for i in range(100):
            t = torch.tensor([float(rank + i)])
            dist.all_reduce(t)
            sums.append(t.item())
    thread = threading.Thread(target=ops)
    thread.start()
    for _ in range(30):
        with dloss.guard(timeout=20):
            time.sleep(0.002)
    thread.join()
    return sums


def _doubling(rank, world):
    """Ten agreeing all_reduces, then one whose size differs on the last
    rank; the sums, and what the last op raised."""
    import dloss
    dloss.guard(timeout=DEADLINE)
    sums = []
    for i in range(10):
        t = torch.tensor([float(rank * i)])
        dist.all_reduce(t)
        sums.append(t.item())
    n = 2 + (rank == world - 1)
    refused = _refused(
        lambda: dist.all_reduce(torch.ones(n)))  # doubling-mismatch
    return sums, refused


class GuardOpsTest(unittest.TestCase):

    def _same_everywhere(self, messages):
        self.assertNotIn(None, messages)
        bodies = {_body(m) for m in messages}
        self.assertEqual(len(bodies), 1, messages)
        return bodies.pop()

    def test_fsdp2_steps_are_bit_identical_under_the_guard(self):
        plain = multiproc.run(WORLD, _fsdp_steps, False)
        guarded = multiproc.run(WORLD, _fsdp_steps, True)
        for p, g in zip(plain, guarded):
            self.assertEqual(len(p), 4)
            for u, v in zip(p, g):
                self.assertTrue(torch.equal(u, v))

    def _fsdp_fault(self, fault, marker, stray):
        results = multiproc.run(WORLD, _fsdp_steps, True, fault)
        body = self._same_everywhere([m for m, _ in results])
        seconds = [s for _, s in results]
        print("FSDP2, %s on rank 0: every rank failed after %.3f-%.3f s "
              "(deadline %g s)" % (fault, min(seconds), max(seconds),
                                   DEADLINE))
        self.assertLess(max(seconds), DEADLINE)
        self.assertIn("the ranks reached different collectives", body)
        self.assertIn("rank 0: %s at %s in third" % (stray, _where(marker)),
                      body)
        self.assertIn("ranks 1, 2: all_gather_into_tensor float32[", body)
        self.assertIn("(FSDP2 all-gather of module '0' (Linear)) at %s in "
                      "step" % _where("fsdp-forward"), body)
        for rank, (message, _) in enumerate(results):
            self.assertIn("[rank %d, op dloss.guard at " % rank, message)

    def test_fsdp2_stray_all_gather_into_tensor(self):
        self._fsdp_fault("all_gather_into_tensor", "stray-ag",
                         "all_gather_into_tensor float32[4] into [12]")

    def test_fsdp2_stray_reduce_scatter_tensor(self):
        self._fsdp_fault("reduce_scatter_tensor", "stray-rs",
                         "reduce_scatter_tensor float32[12] into [4] SUM")

    def test_fsdp2_rank_skips_the_step(self):
        self._fsdp_fault("skip", "skips-the-step", "barrier")

    def test_each_op_with_a_mismatched_shape(self):
        results = multiproc.run(WORLD, _each_op)
        for name in results[0]:
            messages = [r[name][0] for r in results]
            body = self._same_everywhere(messages)
            self.assertIn("the ranks reached different collectives", body,
                          name)
            expected = "ranks 0, 1: %s " % name if name != "barrier" else \
                "ranks 0, 1: barrier at"
            self.assertIn(expected, body)
            self.assertIn("rank 2: %s " % (name if name != "barrier" else
                                           "all_reduce"), body)
            self.assertLess(max(r[name][1] for r in results), DEADLINE)

    def test_a_send_and_its_recv_disagree(self):
        results = multiproc.run(WORLD, _pairs, "shape")
        body = self._same_everywhere([results[0][0], results[1][0]])
        self.assertIn("a send and its recv disagree on the default group: "
                      "rank 0: send float32[4] at %s" % _where("the-send"),
                      body)
        self.assertIn("rank 1: recv float32[2x2] at %s" % _where("the-recv"),
                      body)
        self.assertEqual(results[2], (None, 0.0))
        print("send against a recv of another shape: both ends failed "
              "after %.2f s" % max(results[0][1], results[1][1]))

    def test_a_send_with_no_recv(self):
        results = multiproc.run(WORLD, _pairs, "no-recv")
        message, seconds = results[0]
        self.assertIn("send #0 with rank 1 on the default group (send "
                      "float32[4] at %s in <lambda>) met no matching recv on "
                      "rank 1 within %g s" % (_where("the-send"), DEADLINE),
                      message)
        print("send with no recv: failed after %.2f s (deadline %g s)" %
              (seconds, DEADLINE))
        self.assertGreaterEqual(seconds, DEADLINE * 0.95)

    def test_nested_guard_gives_the_outer_deadline_back(self):
        results = multiproc.run(WORLD, _nested)
        body = self._same_everywhere([m for m, _ in results[:2]])
        self.assertIn("rank 2 never reached it within %g s, while ranks 0, "
                      "1: barrier at %s" % (DEADLINE, _where("after-nested")),
                      body)
        seconds = max(s for _, s in results[:2])
        print("missing rank after a nested guard closed: failed after "
              "%.2f s (outer deadline %g s, inner 600 s)" %
              (seconds, DEADLINE))
        self.assertLess(seconds, 60)

    def test_reguard_while_another_thread_runs_collectives(self):
        results = multiproc.run(WORLD, _reguard)
        expected = [float(sum(range(WORLD)) + WORLD * i) for i in range(100)]
        for sums in results:
            self.assertEqual(sums, expected)

    def test_recursive_doubling_on_five_ranks(self):
        os.environ["DLOSS_GUARD_EXCHANGE"] = "doubling"
        try:
            results = multiproc.run(5, _doubling)
        finally:
            del os.environ["DLOSS_GUARD_EXCHANGE"]
        expected = [float(sum(range(5)) * i) for i in range(10)]
        for sums, _ in results:
            self.assertEqual(sums, expected)
        body = self._same_everywhere([r[1][0] for r in results])
        self.assertIn("ranks 0, 1, 2, 3: all_reduce float32[2] SUM at %s" %
                      _where("doubling-mismatch"), body)
        self.assertIn("rank 4: all_reduce float32[3] SUM at", body)


if __name__ == "__main__":
    unittest.main()
