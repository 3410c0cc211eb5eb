"""dloss.guard on 4 Gloo ranks: agreeing collectives (the user's, DDP's,
dloss's) run as without it; a shape mismatch, a rank that never comes, a
stray all_reduce on rank 0 against dloss.ClipLoss on ranks 1-3, a stray
all_gather of the very shape of dloss's first exchange, and one against
DDP's gradient all-reduce fail on every rank with the same text,
naming each rank's line of this file; after a refusal every collective is
refused at once. With the real Lightning, seed 002 (self.log(...,
sync_dist=True) under is_global_zero in on_validation_epoch_end): under
dloss.lightning.CollectiveGuard, and under DLOSS_GUARD, every rank fails
within the deadline naming that line; without a guard the job does not
finish (it is killed after a short bound); rank_zero_only=True runs clean
under the guard. Each scenario's time to fail is printed."""

import os
import re
import time
import unittest

import torch
import torch.distributed as dist

import multiproc

WORLD = 4
DEADLINE = 4.0
# allGatherInts' frame of int64 (ContractCommunicator.h: kIntsFrame), and the
# preflight's after one ClipLoss call on _clip_inputs: the fold's room holds
# the largest rank's rows and columns, 2 x (3 + WORLD - 1) x 8 float32.
FRAME = 512
FOLDED_FRAME = FRAME + 2 * (3 + WORLD - 1) * 8 * 4 // 8


def _where(marker):
    return "%s:%d" % (os.path.abspath(__file__),
                      multiproc.line_of(__file__, marker))


def _body(message):
    """The message without its first line's rank and location: the part
    that must be the same on every rank."""
    return re.sub(r"^dloss error \[rank \d+, op dloss.guard at [^\]]*\]: ",
                  "", message)


def _clip_inputs(rank):
    g = torch.Generator().manual_seed(rank)
    n = 3 + rank
    return (torch.randn(n, 8, generator=g, requires_grad=True),
            torch.randn(n, 8, generator=g, requires_grad=True),
            torch.tensor(2.0, requires_grad=True))


def _training(rank, world, guarded):
    """A DDP step, dloss.ClipLoss and user collectives; what they give."""
    import dloss
    guard = dloss.guard(timeout=DEADLINE) if guarded else None
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(),
                            torch.nn.Linear(8, 8)), bucket_cap_mb=1e-4)
    a, b, scale = _clip_inputs(rank)
    loss = dloss.ClipLoss()(model(a), b, scale)
    loss.backward()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank * 2.0]))
    dist.barrier()
    if guard is not None:
        group = dist.distributed_c10d._get_default_group()
        assert guard.group is group
        # torch dispatches the group's ops to the guard's backend, which
        # says it is the Gloo it wraps.
        backend = group._get_backend(torch.device("cpu"))
        assert type(backend).__name__ == "Backend", type(backend)
        assert backend.name() == "gloo"
        guard.close()
        assert guard.group is None
        assert type(group._get_backend(torch.device("cpu"))).__name__ == \
            "ProcessGroupGloo"
    return (loss.detach(), [p.grad.clone() for p in model.parameters()],
            b.grad.clone(), total, torch.cat(gathered))


def _refused(fn):
    import dloss
    start = time.monotonic()
    try:
        fn()
    except dloss.Error as e:
        return str(e), time.monotonic() - start
    return None, time.monotonic() - start


def _shape_mismatch(rank, world):
    import dloss
    dloss.guard(timeout=DEADLINE)
    dist.all_reduce(torch.ones(2))

    def step():
        dist.all_reduce(torch.ones(3 + (rank == 2)))  # shape-mismatch
    first = _refused(step)
    # The group is unusable once refused: the next collective is refused at
    # once on every rank, with the same text.
    again = _refused(lambda: dist.barrier())
    return first, again


def _missing_rank(rank, world):
    import dloss
    dloss.guard(timeout=DEADLINE)
    dist.barrier()
    if rank == 3:
        return None, 0.0  # rank 3 skips the barrier and stays alive
    return _refused(lambda: dist.barrier())  # missing-rank


def _stray_meets_clip(rank, world, guarded, stray="all_reduce"):
    import dloss
    if guarded:
        dloss.guard(timeout=DEADLINE)
    a, b, scale = _clip_inputs(rank)
    loss_fn = dloss.ClipLoss()
    loss_fn(a, b, scale)

    def step():
        if rank == 0 and stray == "all_reduce":
            dist.all_reduce(torch.ones(4))  # stray-all-reduce
        elif rank == 0:
            # The very op and shape of dloss's first exchange (the
            # preflight's frame of 512 int64 and the fold's room, which the
            # call above made: ContractCommunicator.h), which Gloo would
            # pair with it silently: who calls it tells them apart.
            from dloss.group import communicator
            n = FRAME + communicator().fold_capacity // 8
            out = [torch.zeros(n, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(out, torch.ones(n, dtype=torch.int64))  # stray-gather
        else:
            loss_fn(a, b, scale)  # clip-loss-call
    return _refused(step)


def _stray_meets_ddp(rank, world):
    import dloss
    dloss.guard(timeout=DEADLINE)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    numel = sum(p.numel() for p in model.parameters())

    def step():
        out = model(torch.randn(3, 4)).sum()
        if rank == 0:
            dist.all_reduce(torch.ones(numel))  # stray-like-a-bucket
        out.backward()  # ddp-backward
    return _refused(step)


class GuardTest(unittest.TestCase):

    def test_agreeing_collectives_run_as_without_guard(self):
        plain = multiproc.run(WORLD, _training, False)
        guarded = multiproc.run(WORLD, _training, True)
        for p, g in zip(plain, guarded):
            for x, y in zip(p, g):
                if isinstance(x, list):
                    for u, v in zip(x, y):
                        self.assertTrue(torch.equal(u, v))
                else:
                    self.assertTrue(torch.equal(x, y))

    def _same_everywhere(self, messages):
        bodies = {_body(m) for m in messages}
        self.assertEqual(len(bodies), 1, messages)
        return bodies.pop()

    def test_shape_mismatch(self):
        results = multiproc.run(WORLD, _shape_mismatch)
        firsts = [r[0][0] for r in results]
        for rank, message in enumerate(firsts):
            self.assertIn("[rank %d, op dloss.guard at %s]" %
                          (rank, _where("shape-mismatch")), message)
        body = self._same_everywhere(firsts)
        print("shape mismatch: failed after %.2f s" %
              max(r[0][1] for r in results))
        self.assertIn("the ranks reached different collectives as "
                      "collective #1 on the default group", body)
        self.assertIn("ranks 0, 1, 3: all_reduce float32[3] SUM at %s in "
                      "step" % _where("shape-mismatch"), body)
        self.assertIn("rank 2: all_reduce float32[4] SUM at %s in step" %
                      _where("shape-mismatch"), body)
        self.assertIn("call it on every rank", body)
        agains = [r[1] for r in results]
        self.assertEqual({_body(m) for m, _ in agains}, {body})
        self.assertLess(max(s for _, s in agains), 1.0)

    def test_missing_rank(self):
        results = multiproc.run(WORLD, _missing_rank)
        messages = [m for m, _ in results[:3]]
        self.assertNotIn(None, messages)
        body = self._same_everywhere(messages)
        self.assertIn("collective #1 on the default group: rank 3 never "
                      "reached it within %g s, while ranks 0, 1, 2: barrier "
                      "at %s in <lambda>" %
                      (DEADLINE, _where("missing-rank")), body)
        self.assertIn("raise the deadline", body)
        seconds = [s for _, s in results[:3]]
        print("missing rank: failed after %.2f-%.2f s (deadline %g s)" %
              (min(seconds), max(seconds), DEADLINE))
        # The store times its wait by socket polls, which may end a few ms
        # early: the ranks waited for the deadline, not for a fixed guess.
        self.assertGreaterEqual(min(seconds), DEADLINE * 0.95)

    def test_stray_all_reduce_meets_clip_loss(self):
        results = multiproc.run(WORLD, _stray_meets_clip, True)
        body = self._same_everywhere([m for m, _ in results])
        print("stray all_reduce vs ClipLoss under the guard: failed after "
              "%.2f s" % max(s for _, s in results))
        self.assertIn("rank 0: all_reduce float32[4] SUM at %s in step" %
                      _where("stray-all-reduce"), body)
        self.assertRegex(body, r"ranks 1, 2, 3: all_gather int64\[%d\] "
                         r"\(dloss @\w+, preflight\) at %s in step, through "
                         r"ClipLoss.forward" %
                         (FOLDED_FRAME, re.escape(_where("clip-loss-call"))))
        for rank, (message, _) in enumerate(results):
            self.assertIn("[rank %d, op dloss.guard at %s]" % (
                rank, _where("stray-all-reduce" if rank == 0 else
                             "clip-loss-call")), message)

    def test_stray_all_gather_like_dloss_exchange(self):
        results = multiproc.run(WORLD, _stray_meets_clip, True, "all_gather")
        body = self._same_everywhere([m for m, _ in results])
        self.assertIn("rank 0: all_gather int64[%d] at %s in step;" %
                      (FOLDED_FRAME, _where("stray-gather")), body)
        self.assertIn("ranks 1, 2, 3: all_gather int64[%d] (dloss @clip_grad, "
                      "preflight) at %s in step" % (
                          FOLDED_FRAME, _where("clip-loss-call")), body)

    def test_stray_all_reduce_meets_ddp_bucket(self):
        results = multiproc.run(WORLD, _stray_meets_ddp)
        body = self._same_everywhere([m for m, _ in results])
        self.assertIn("rank 0: all_reduce float32[10] SUM at %s in step" %
                      _where("stray-like-a-bucket"), body)
        self.assertIn("ranks 1, 2, 3: all_reduce float32[10] SUM (DDP "
                      "gradient all-reduce, bucket 0) at %s in step" %
                      _where("ddp-backward"), body)


# -- seed 002: a sync_dist log on rank 0 only, in the real Lightning --------

def _seed_002(rank, world, guard_with, rank_zero_only, deadline=DEADLINE):
    import lightning.pytorch as pl

    import dloss
    import dloss.lightning

    if guard_with == "call":
        dloss.guard(timeout=deadline)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 1)

        def training_step(self, batch, _):
            return self.net(batch[0]).pow(2).mean()

        def validation_step(self, batch, _):
            return None

        def on_validation_epoch_end(self):
            if self.trainer.is_global_zero:
                value = torch.tensor(1.0)
                if rank_zero_only:
                    self.log("val_metric", value, rank_zero_only=True)
                else:
                    self.log("val_metric", value, sync_dist=True)  # seed-002

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))),
        batch_size=2)
    callbacks = [dloss.lightning.CollectiveGuard(timeout=deadline)] \
        if guard_with == "callback" else []
    trainer = pl.Trainer(
        strategy="ddp", accelerator="cpu", devices=world, max_epochs=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=callbacks)
    return _refused(lambda: trainer.fit(Module(), data, data))


class Seed002Test(unittest.TestCase):

    def _fails_everywhere(self, results, how):
        messages = [m for m, _ in results]
        self.assertNotIn(None, messages)
        bodies = {_body(m) for m in messages}
        self.assertEqual(len(bodies), 1, messages)
        body = bodies.pop()
        self.assertIn("rank 0: barrier at %s in on_validation_epoch_end, "
                      "through self.log('val_metric', sync_dist=True), which "
                      "Lightning reduces at the end of on_validation_epoch_end"
                      % _where("seed-002"), body)
        self.assertIn("rank_zero_only=True", body)
        seconds = [s for _, s in results]
        print("seed 002 under %s: every rank failed after %.2f-%.2f s "
              "(deadline %g s)" % (how, min(seconds), max(seconds), DEADLINE))
        self.assertLess(max(seconds), 60)
        return body

    def test_callback(self):
        self._fails_everywhere(
            multiproc.run(WORLD, _seed_002, "callback", False), "the callback")

    def test_environment_variable(self):
        os.environ["DLOSS_GUARD"] = str(DEADLINE)
        try:
            results = multiproc.run(WORLD, _seed_002, None, False)
        finally:
            del os.environ["DLOSS_GUARD"]
        self._fails_everywhere(results, "DLOSS_GUARD")

    def test_rank_zero_only_runs_clean(self):
        # The guard's default deadline: a clean run must not fail however
        # late a loaded machine starts a rank (DEADLINE, 4 s, is for the
        # tests that expect the failure soon).
        results = multiproc.run(WORLD, _seed_002, "callback", True, 30.0)
        self.assertEqual([m for m, _ in results], [None] * WORLD)

    def test_without_guard_it_hangs(self):
        bound = 20
        start = time.monotonic()
        with self.assertRaisesRegex(AssertionError,
                                    "neither returned nor raised within"):
            multiproc.run(WORLD, _seed_002, None, False, timeout=bound)
        print("seed 002 without a guard: not finished after %.0f s, killed" %
              (time.monotonic() - start))


if __name__ == "__main__":
    unittest.main()
