"""dloss inside torch.compile, on real Gloo ranks with uneven batches.

Every loss is one opaque node (the custom op dloss::loss, dloss/_ops.py):
- every drop-in and a @dloss.loss program compile with fullgraph=True (a
  model and the loss; DDP cannot be traced with fullgraph, so the gradients
  are averaged as DDP does), with zero graph breaks (torch._dynamo.explain)
  and no Dynamo warning, and equal the eager step and one process on the
  global batch;
- three batch sizes in a row compile at most twice, once with mark_dynamic;
- torch.compile (default) of a DDP step, of an FSDP2 (fully_shard) step,
  under bf16 autocast, and DDP no_sync accumulation, each against one
  process;
- an error under torch.compile (ranks whose shapes disagree) names the
  user's line of the loss call;
- dloss.all_gather in a compiled step (fullgraph, no break), and
  gather_all_tensors, which is not an op, saying why under fullgraph;
- torch.library.opcheck of dloss::loss and dloss::all_gather.
"""

import contextlib
import logging
import os
import unittest
import warnings

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import rel, report

SIZES = [5, 3]  # per rank: uneven
DIM, EMB, CLASSES = 8, 4, 5
BACKEND = "inductor"
# Inductor compiles on each rank before its first collective: under a loaded
# machine one rank may wait long for its peer, so the test's and dloss's
# deadlines leave room for it.
RUN = dict(timeout=600, dloss_timeout=300.0)
WORST = {}
COUNTS = {}


def _batch(sizes, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = torch.randn(total, DIM, generator=g)
    y = torch.randn(total, DIM, generator=g)
    labels = torch.randint(0, 3, (total,), generator=g)
    tokens = torch.randint(1, 11, (total, 4), generator=g)
    return x, y, labels, tokens


def _shard(t, sizes, rank):
    start = sum(sizes[:rank])
    return t[start:start + sizes[rank]]


def _cases():
    """name -> (make the loss, call it on (loss, a, b, labels, tokens, lin)).
    `a`, `b` are the model's features; every case's loss depends on them."""
    import dloss

    @dloss.loss
    def infonce(q, k, t):
        keys = dloss.all_gather(k)
        targets = torch.arange(q.shape[0]) + dloss.shard_offset(q)
        return F.cross_entropy(q @ keys.T / t, targets)

    def pml_ntxent():
        return dloss.DistributedLossWrapper(
            upstream.pml().losses.NTXentLoss(temperature=0.2))

    def coca(loss, a, b, labels, tokens, lin):
        logits = (a[:, None, :] * b[:, None, :]).repeat(1, 4, 3)[..., :11]
        clip, caption = loss(a, b, logits, tokens, 10.0)
        return clip + caption

    return {
        "clip": (dloss.ClipLoss, lambda l, a, b, y, t, m: l(a, b, 10.0)),
        "siglip": (dloss.SigLipLoss,
                   lambda l, a, b, y, t, m: l(a, b, 10.0, -5.0)),
        "distill": (dloss.DistillClipLoss, lambda l, a, b, y, t, m: sum(
            l(a, b, 10.0, b.detach() * 2, a.detach(), 5.0))),
        "coca": (lambda: dloss.CoCaLoss(caption_loss_weight=2.0,
                                        clip_loss_weight=1.0), coca),
        "arcface": (lambda: dloss.ArcFaceLoss(CLASSES, EMB),
                    lambda l, a, b, y, t, m: l(a, y)),
        "cosface": (lambda: dloss.CosFaceLoss(CLASSES, EMB),
                    lambda l, a, b, y, t, m: l(a, y)),
        "partialfc": (lambda: dloss.PartialFC(
            EMB, CLASSES, margin_loss=dloss.CombinedMarginLoss(
                64.0, 1.0, 0.5, 0.0)), lambda l, a, b, y, t, m: l(a, y)),
        "ntxent": (dloss.NTXentLoss, lambda l, a, b, y, t, m: l(a, y)),
        "supcon": (dloss.SupConLoss, lambda l, a, b, y, t, m: l(a, y)),
        "wrapper": (pml_ntxent, lambda l, a, b, y, t, m: l(a, y)),
        "dloss_loss": (lambda: infonce,
                       lambda l, a, b, y, t, m: l(a, b, 0.5)),
    }


@contextlib.contextmanager
def _dynamo_messages(found):
    """Collects every warning and every torch log record at WARNING or
    above while the body runs (Dynamo's graph-break and recompile
    messages among them)."""
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: found.append(record.getMessage())
    logger = logging.getLogger("torch")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        logger.removeHandler(handler)
        found.extend(str(w.message) for w in caught)


def _grads(params, world, shared):
    """The gradients after DDP's average (for the model; `shared`:
    parameters whose gradient is the same on every rank already)."""
    import torch.distributed as dist
    out = []
    for p in params:
        g = p.grad.detach().clone()
        if p not in shared and world > 1:
            dist.all_reduce(g)
            g /= world
        out.append(g)
        p.grad = None
    return out


def _step_parts(name):
    """(loss module, model, step function) of a case, seeded alike on every
    rank and in the one-process reference."""
    make, call = _cases()[name]
    torch.manual_seed(1)
    loss = make()
    torch.manual_seed(2)  # the same model whatever the loss drew
    lin = torch.nn.Linear(DIM, EMB)

    def step(x, y, labels, tokens):
        return call(loss, lin(x), lin(y), labels, tokens, lin)
    return loss, lin, step


def _params(loss, lin):
    own = [p for p in (loss.parameters() if isinstance(
        loss, torch.nn.Module) else [])]
    return list(lin.parameters()) + own, set(own)


def _warm_up():
    """A first torch.compile without dloss: its one-time imports warn (torch
    2.13's inductor imports deprecated torch.jit names), which are torch's
    own and not about the code it compiles."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(lambda t: t * 2, backend=BACKEND)(torch.ones(2))
    torch._dynamo.reset()


def _dropins_rank(rank, world, sizes):
    import dloss  # noqa: F401
    _warm_up()
    x, y, labels, tokens = (_shard(t, sizes, rank) for t in _batch(sizes, 0))
    results = {}
    for name in _cases():
        loss, lin, step = _step_parts(name)
        params, shared = _params(loss, lin)
        eager = step(x, y, labels, tokens)
        eager.backward()
        eager_grads = _grads(params, world, shared)
        messages = []
        with _dynamo_messages(messages):
            compiled = torch.compile(step, fullgraph=True, backend=BACKEND)
            value = compiled(x, y, labels, tokens)
            value.backward()
            explained = torch._dynamo.explain(step)(x, y, labels, tokens)
        grads = _grads(params, world, shared)
        results[name] = dict(eager=eager.detach(), value=value.detach(),
                             eager_grads=eager_grads, grads=grads,
                             breaks=explained.graph_break_count,
                             graphs=explained.graph_count,
                             messages=messages)
        torch._dynamo.reset()
    return results


def _one_process(name, sizes):
    """The loss and DDP-averaged gradients of one process on the global
    batch (no process group: dloss runs as one process)."""
    x, y, labels, tokens = _batch(sizes, 0)
    loss, lin, step = _step_parts(name)
    if name == "partialfc":
        # Every rank's block of the class weights, in rank order.
        blocks = []
        for r in range(len(sizes)):
            torch.manual_seed(1)
            blocks.append(torch.normal(0, 0.01, (
                CLASSES // len(sizes) + int(r < CLASSES % len(sizes)), EMB)))
        with torch.no_grad():
            loss.weight = torch.nn.Parameter(torch.cat(blocks))
    params, _ = _params(loss, lin)
    value = step(x, y, labels, tokens)
    value.backward()
    return value.detach(), [p.grad for p in params]


class CompiledDropIns(unittest.TestCase):
    """fullgraph=True: one graph, no break, no warning, exact."""

    @classmethod
    def setUpClass(cls):
        assert not torch.distributed.is_initialized()
        cls.ranks = multiproc.run(len(SIZES), _dropins_rank, SIZES,
                                  **RUN)

    def test_every_loss(self):
        for name in _cases():
            with self.subTest(name):
                value, grads = _one_process(name, SIZES)
                for rank, results in enumerate(self.ranks):
                    got = results[name]
                    self.assertEqual(got["breaks"], 0, name)
                    self.assertEqual(got["graphs"], 1, name)
                    self.assertEqual(got["messages"], [], name)
                    worst_eager = rel(got["value"], got["eager"])
                    worst_one = rel(got["value"], value)
                    for i, g in enumerate(got["grads"]):
                        want = grads[i]
                        if name == "partialfc" and g.shape != want.shape:
                            start = 0 if rank == 0 else 3
                            want = want[start:start + g.shape[0]]
                        worst_eager = max(worst_eager,
                                          rel(g, got["eager_grads"][i]))
                        worst_one = max(worst_one, rel(g, want, grads[i]))
                    WORST["%s_vs_eager" % name] = max(
                        WORST.get("%s_vs_eager" % name, 0), worst_eager)
                    WORST["%s_vs_one_process" % name] = max(
                        WORST.get("%s_vs_one_process" % name, 0), worst_one)
                    self.assertLess(worst_eager, 1e-5, name)
                    self.assertLess(worst_one, 2e-5, name)


def _recompiles_rank(rank, world):
    """Compilations for three per-rank batch sizes in a row: by default,
    then with the batch dimension marked dynamic."""
    import dloss
    from torch._dynamo.testing import CompileCounterWithBackend
    _warm_up()
    loss = dloss.ClipLoss()
    lin = torch.nn.Linear(DIM, EMB)

    def step(x, y):
        return loss(lin(x), lin(y), 10.0)
    counts, messages = {}, []
    sizes = [(5, 6, 7), (3, 2, 4)][rank]
    for mode in ("default", "mark_dynamic"):
        torch._dynamo.reset()
        counter = CompileCounterWithBackend(BACKEND)
        compiled = torch.compile(step, fullgraph=True, backend=counter)
        with _dynamo_messages(messages):
            for n in sizes:
                x, y = torch.randn(n, DIM), torch.randn(n, DIM)
                if mode == "mark_dynamic":
                    torch._dynamo.mark_dynamic(x, 0)
                    torch._dynamo.mark_dynamic(y, 0)
                compiled(x, y).backward()
        counts[mode] = counter.frame_count
    return counts, messages


class DynamicBatch(unittest.TestCase):
    def test_three_batch_sizes(self):
        for counts, messages in multiproc.run(2, _recompiles_rank, **RUN):
            self.assertLessEqual(counts["default"], 2)
            self.assertEqual(counts["mark_dynamic"], 1)
            self.assertEqual(messages, [])
            COUNTS["compilations_default"] = counts["default"]
            COUNTS["compilations_mark_dynamic"] = counts["mark_dynamic"]


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, EMB))


def _halves(t, sizes):
    """The two micro-batches of an accumulated step: every rank's first
    half of its rows, then every rank's second half."""
    return (torch.cat([_shard(t, sizes, r)[:n // 2]
                       for r, n in enumerate(sizes)]),
            torch.cat([_shard(t, sizes, r)[n // 2:]
                       for r, n in enumerate(sizes)]))


SETTINGS = ("ddp", "fsdp2", "autocast", "no_sync")


def _trainings_rank(rank, world, sizes):
    """The model's gradients after a compiled (default settings) step in
    each setting, as the wrapper leaves them (DDP: averaged; FSDP2: each
    rank's shard of the averaged gradient, gathered here whole)."""
    import dloss
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP
    _warm_up()
    x, y, _, _ = (_shard(t, sizes, rank) for t in _batch(sizes, 0))
    half = x.shape[0] // 2
    results = {}
    for setting in SETTINGS:
        torch._dynamo.reset()
        model = _model()
        loss = dloss.ClipLoss()
        if setting == "fsdp2":
            fully_shard(model)
            wrapped = model
        else:
            wrapped = DDP(model)

        def step(a, b):
            if setting == "autocast":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return loss(wrapped(a), wrapped(b), 10.0)
            return loss(wrapped(a), wrapped(b), 10.0)
        compiled = torch.compile(step, backend=BACKEND)
        if setting == "no_sync":
            # Two micro-batches, DDP's all-reduce after the second only.
            with wrapped.no_sync():
                (compiled(x[:half], y[:half]) / 2).backward()
            (compiled(x[half:], y[half:]) / 2).backward()
        else:
            compiled(x, y).backward()
        results[setting] = [
            (p.grad.full_tensor() if hasattr(p.grad, "full_tensor")
             else p.grad).detach().clone() for p in model.parameters()]
    return results


class CompiledTraining(unittest.TestCase):
    """torch.compile's default settings around DDP, FSDP2, bf16 autocast and
    no_sync accumulation: the gradients equal one process's."""

    def test_against_one_process(self):
        import dloss
        sizes = [6, 4]
        ranks = multiproc.run(2, _trainings_rank, sizes, **RUN)
        x, y, _, _ = _batch(sizes, 0)
        for setting in SETTINGS:
            model = _model()
            loss = dloss.ClipLoss()
            if setting == "no_sync":
                (x1, x2), (y1, y2) = _halves(x, sizes), _halves(y, sizes)
                value = (loss(model(x1), model(y1), 10.0) +
                         loss(model(x2), model(y2), 10.0)) / 2
            elif setting == "autocast":
                # The same autocast in one process: the ranks' sums differ
                # from its only in order, bf16's rounding (2^-8) apart.
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    value = loss(model(x), model(y), 10.0)
            else:
                value = loss(model(x), model(y), 10.0)
            value.backward()
            tol = 3e-2 if setting == "autocast" else 2e-5
            for results in ranks:
                worst = max(rel(got, p.grad) for got, p in
                            zip(results[setting], model.parameters()))
                WORST["training_%s" % setting] = max(
                    WORST.get("training_%s" % setting, 0), worst)
                self.assertLess(worst, tol, setting)


def _gather_rank(rank, world, sizes):
    """dloss.all_gather in a compiled step, outside any dloss loss: each
    rank's rows against every rank's (a per-rank value, not a global
    loss), eager and compiled."""
    import dloss
    _warm_up()
    x, _, _, _ = (_shard(t, sizes, rank) for t in _batch(sizes, 0))
    torch.manual_seed(2)
    lin = torch.nn.Linear(DIM, EMB)

    def step(a):
        features = lin(a)
        return (features @ dloss.all_gather(features).T).logsumexp(1).sum()
    results = []
    messages = []
    # The gathered rows are data-dependent (every rank's batch): Dynamo
    # captures such an op only when told to.
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    for run in ("eager", "compiled"):
        fn = step
        if run == "compiled":
            fn = torch.compile(step, fullgraph=True, backend=BACKEND)
        with _dynamo_messages(messages):
            value = fn(x)
            value.backward()
        results.append((value.detach(), lin.weight.grad.clone()))
        lin.weight.grad = None
    explained = torch._dynamo.explain(step)(x)
    return results, explained.graph_break_count, messages


class CompiledAllGather(unittest.TestCase):
    def test_all_gather_in_a_compiled_step(self):
        for rank, (results, breaks, messages) in enumerate(
                multiproc.run(2, _gather_rank, SIZES, **RUN)):
            (eager, eager_grad), (value, grad) = results
            self.assertEqual(breaks, 0)
            self.assertEqual(messages, [])
            worst = max(rel(value, eager), rel(grad, eager_grad))
            WORST["all_gather_vs_eager"] = max(
                WORST.get("all_gather_vs_eager", 0), worst)
            self.assertLess(worst, 1e-5)


def _mismatch_rank(rank, world):
    import dloss
    _warm_up()
    loss = dloss.ClipLoss()

    def step(x, y):
        return loss(x, y, 10.0)  # compiled loss call
    compiled = torch.compile(step, fullgraph=True, backend=BACKEND)
    width = 4 if rank == 0 else 6  # the ranks' features disagree
    return multiproc.outcome(lambda: compiled(torch.randn(3, width),
                                              torch.randn(3, width)))


class CompiledErrors(unittest.TestCase):
    def test_names_the_users_line(self):
        line = multiproc.line_of(__file__, "compiled loss call")
        for rank, text in enumerate(multiproc.run(2, _mismatch_rank, **RUN)):
            self.assertIsNotNone(text, rank)
            self.assertIn("%s:%d" % (os.path.abspath(__file__), line), text)
            self.assertIn("rank %d" % rank, text)


class NotAnOp(unittest.TestCase):
    def test_gather_all_tensors_says_why(self):
        # In this process, which has no group: [x].
        import dloss

        def step(x):
            return dloss.gather_all_tensors(x * 2)[0] + 1
        torch._dynamo.reset()
        self.assertTrue(torch.equal(torch.compile(step, backend=BACKEND)(
            torch.ones(3)), torch.full((3,), 3.0)))
        torch._dynamo.reset()
        with self.assertRaises(torch._dynamo.exc.Unsupported) as caught:
            torch.compile(step, fullgraph=True, backend=BACKEND)(
                torch.ones(3))
        self.assertIn("dloss.gather_all_tensors returns one tensor per rank",
                      str(caught.exception))
        torch._dynamo.reset()


class OpCheck(unittest.TestCase):
    def test_opcheck(self):
        # In this process, which has no group: a world of one.
        import dloss
        from dloss import _ops
        loss = dloss.ClipLoss()
        x = torch.randn(4, 3, requires_grad=True)
        y = torch.randn(4, 3, requires_grad=True)
        s = torch.tensor(2.0, requires_grad=True)
        loss(x, y, s)  # compiled before opcheck's fake tensors see it
        key = loss._op_key + "/"
        torch.library.opcheck(_ops.loss, ([x, y, s], key, [True] * 3, ""))
        torch.library.opcheck(_ops.loss, ([x.detach(), y.detach(),
                                           s.detach()], key, [False] * 3,
                                          ""))
        from dloss.collectives import _all_gather_op
        torch.library.opcheck(_all_gather_op, (x, "", ""))


def tearDownModule():
    report("torch_compile", WORST)
    report("torch_compile", COUNTS, "count")


if __name__ == "__main__":
    unittest.main()
