"""dloss against the real TorchMetrics 1.9 on Gloo ranks (world sizes 2, 3
and 4, uneven batches, an empty rank): dloss.gather_all_tensors returns
what torchmetrics.utilities.distributed.gather_all_tensors returns (uneven
first and trailing dims, several dtypes, 0-d tensors) with the exact
gradient where TorchMetrics keeps only the local slot's; and a real
torchmetrics.Metric used as a contrastive loss through forward() with
dist_sync_on_step=True gives the single-process value and, with
dist_sync_fn=dloss.gather_all_tensors, DDP's single-process gradient,
where TorchMetrics' own gather gives 1/N of it."""

import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import TOL, offsets, rel, report

# Per world size: the per-rank rows of every case (uneven, one rank empty
# from 3 ranks on).
SIZES = {2: [3, 1], 3: [2, 0, 4], 4: [1, 3, 0, 2]}
DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64,
          torch.int32, torch.uint8, torch.bool)


def rank_tensor(rank, shape, dtype):
    """Rank r's tensor: values that say whose they are and where."""
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float64)
    x = (x.reshape(shape) + 7 * rank) % 100
    return (x % 2 if dtype == torch.bool else x).to(dtype)


def gather_cases(rank, world):
    """Shapes on rank r: name -> shape. TorchMetrics pads every dim, so the
    trailing dims differ too; 'equal' takes its no-padding branch."""
    n = SIZES[world][rank]
    return {
        "rows": (n, 3, 2),
        "trailing": (n, 1 + rank % 3, 2 + rank // 2),
        "zero-width": (2, rank),  # rank 0's rows are empty vectors
        "1d": (n,),
        "0d": (),
        "equal": (2, 3),
    }


def cotangent(rank, q, shape):
    """Rank `rank`'s weight on the piece of rank q."""
    g = torch.Generator().manual_seed(1000 * rank + q)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _gather_rank(rank, world):
    import dloss
    tm = upstream.torchmetrics().utilities.distributed.gather_all_tensors
    out = {}
    for name, shape in gather_cases(rank, world).items():
        for dtype in DTYPES:
            x = rank_tensor(rank, shape, dtype)
            out[name, dtype] = (tm(x), dloss.gather_all_tensors(x))
    # Autograd: rank s's loss is sum_q <W_sq, piece_q>, so dloss gives rank
    # r the sum over s of W_sr; TorchMetrics gives the local slot only.
    for name in ("rows", "trailing", "0d"):
        shape = gather_cases(rank, world)[name]
        for label, fn in (("torchmetrics", tm),
                          ("dloss", dloss.gather_all_tensors)):
            x = rank_tensor(rank, shape, torch.float64).requires_grad_()
            pieces = fn(x)
            sum((cotangent(rank, q, p.shape) * p).sum()
                for q, p in enumerate(pieces)).backward()
            out["grad", name, label] = (
                x.grad, [p.requires_grad for p in pieces],
                pieces[rank] is x)
    return out


def metric_class():
    """A contrastive loss as a user writes it with TorchMetrics: per-sample
    image and text rows, L2-normalised in update(), as "cat" list states;
    CLIP's symmetric cross-entropy of the whole (synced) batch in
    compute()."""
    torchmetrics = upstream.torchmetrics()
    from torchmetrics.utilities import dim_zero_cat

    class ContrastiveLoss(torchmetrics.Metric):
        is_differentiable = True
        higher_is_better = False
        # dist_sync_on_step=True takes the full-state forward regardless.
        full_state_update = False

        def __init__(self, temperature=0.5, **kwargs):
            super().__init__(**kwargs)
            self.temperature = temperature
            self.add_state("image", default=[], dist_reduce_fx="cat")
            self.add_state("text", default=[], dist_reduce_fx="cat")

        def update(self, image, text):
            self.image.append(F.normalize(image))
            self.text.append(F.normalize(text))

        def compute(self):
            return contrastive(dim_zero_cat(self.image),
                               dim_zero_cat(self.text), self.temperature)

    return ContrastiveLoss


def contrastive(image, text, temperature):
    logits = image @ text.T / temperature
    labels = torch.arange(len(image))
    return (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.T, labels)) / 2


IN, DIM, STEPS = 5, 4, 2


def step_data(total, step):
    g = torch.Generator().manual_seed(50 + step)
    return (torch.randn(total, IN, generator=g, dtype=torch.float64),
            torch.randn(total, DIM, generator=g, dtype=torch.float64))


def make_model():
    torch.manual_seed(3)
    return torch.nn.Linear(IN, DIM, dtype=torch.float64)


def train_step(model, loss_fn, u, t):
    """The loss and the gradients of the text rows and of the model."""
    t = t.clone().requires_grad_()
    model.zero_grad()
    loss = loss_fn(model(u), t)
    loss.backward()
    params = [p.grad.clone() for p in model.parameters()]
    return loss.detach(), t.grad, params


def reference(world, step):
    """One process, the global batch."""
    sizes = SIZES[world]
    u, t = step_data(sum(sizes), step)
    return train_step(
        make_model(),
        lambda a, b: contrastive(F.normalize(a), F.normalize(b), 0.5), u, t)


def _metric_rank(rank, world):
    import dloss
    from torch.nn.parallel import DistributedDataParallel
    ContrastiveLoss = metric_class()
    sizes = SIZES[world]
    lo = offsets(sizes)
    rows = slice(lo[rank], lo[rank + 1])
    out = {}
    for label, kwargs in (
            ("dloss", {"dist_sync_fn": dloss.gather_all_tensors}),
            ("torchmetrics", {})):
        model = DistributedDataParallel(make_model())
        metric = ContrastiveLoss(dist_sync_on_step=True, **kwargs)
        for step in range(STEPS):
            u, t = step_data(sum(sizes), step)
            out[label, step] = train_step(model, metric, u[rows], t[rows])
        # The update()/compute() path: TorchMetrics runs update() under
        # torch.set_grad_enabled(False) outside forward(), so the states
        # update() computes, and compute()'s value, carry no graph.
        metric.reset()
        u, t = step_data(sum(sizes), 0)
        metric.update(model(u[rows]), t[rows].clone().requires_grad_())
        value = metric.compute()
        out[label, "compute"] = (value.detach(), value.requires_grad)
    return out


def _rank(rank, world):
    return {"gather": _gather_rank(rank, world),
            "metric": _metric_rank(rank, world)}


_CACHE = {}


def run(world, part):
    """Each rank's results of `part` ("gather" or "metric"): one run of
    processes per world size serves every test."""
    if world not in _CACHE:
        _CACHE[world] = multiproc.run(world, _rank, timeout=240)
    return [out[part] for out in _CACHE[world]]


class GatherAllTensorsTest(unittest.TestCase):
    def test_same_list_as_torchmetrics(self):
        for world in SIZES:
            results = run(world, "gather")
            cases = [gather_cases(q, world) for q in range(world)]
            for rank, out in enumerate(results):
                for name in cases[0]:
                    for dtype in DTYPES:
                        with self.subTest(world=world, rank=rank, case=name,
                                          dtype=dtype):
                            tm, dl = out[name, dtype]
                            self.assertIsInstance(dl, list)
                            self.assertEqual(len(tm), world)
                            self.assertEqual(len(dl), world)
                            for q in range(world):
                                want = rank_tensor(q, cases[q][name], dtype)
                                for got in (tm[q], dl[q]):
                                    self.assertEqual(got.dtype, dtype)
                                    self.assertEqual(got.shape, want.shape)
                                    self.assertTrue(torch.equal(got, want))

    def test_exact_gradient_where_torchmetrics_keeps_local_slot(self):
        worst = {}
        for world in SIZES:
            results = run(world, "gather")
            for rank, out in enumerate(results):
                for name in ("rows", "trailing", "0d"):
                    shape = gather_cases(rank, world)[name]
                    # TorchMetrics (utilities/distributed.py): the others'
                    # pieces are gathered under no_grad, and the local slot
                    # is the input itself.
                    grad, live, is_input = out["grad", name, "torchmetrics"]
                    self.assertEqual(live, [q == rank for q in range(world)])
                    self.assertTrue(is_input)
                    self.assertTrue(torch.equal(
                        grad, cotangent(rank, rank, shape)))
                    # dloss: every rank's use of this rank's piece.
                    grad, live, is_input = out["grad", name, "dloss"]
                    self.assertEqual(live, [True] * world)
                    self.assertFalse(is_input)
                    exact = sum(cotangent(s, rank, shape)
                                for s in range(world))
                    err = rel(grad, exact)
                    worst[name] = max(worst.get(name, 0.0), err)
                    self.assertLess(err, 1e-13, (world, rank, name))
        report("gather_all_tensors_grad_vs_analytic", worst)


class MetricAsLossTest(unittest.TestCase):
    """ContrastiveLoss(dist_sync_on_step=True) called as metric(image, text)
    in a DDP training step, against one process on the global batch."""

    def test_value_and_ddp_gradient(self):
        worst = {}
        tol = TOL[torch.float64]
        for world in SIZES:
            results = run(world, "metric")
            lo = offsets(SIZES[world])
            for step in range(STEPS):
                ref_loss, ref_text, ref_params = reference(world, step)
                for rank, out in enumerate(results):
                    rows = slice(lo[rank], lo[rank + 1])
                    for label in ("dloss", "torchmetrics"):
                        loss, text, params = out[label, step]
                        # The value: the global batch's loss on every rank.
                        err = rel(loss, ref_loss)
                        worst["value"] = max(worst.get("value", 0.0), err)
                        self.assertLess(err, tol, (world, step, rank, label))
                    # dloss: rank r's rows get N * dL/dx_r (the ddp
                    # contract), DDP's average of the model's gradient is
                    # the single-process one.
                    loss, text, params = out["dloss", step]
                    err = rel(text, world * ref_text[rows],
                              whole=world * ref_text)
                    worst["grad_rows"] = max(worst.get("grad_rows", 0.0),
                                             err)
                    self.assertLess(err, tol, (world, step, rank))
                    for got, want in zip(params, ref_params):
                        err = rel(got, want)
                        worst["grad_model"] = max(
                            worst.get("grad_model", 0.0), err)
                        self.assertLess(err, tol, (world, step, rank))
                    # TorchMetrics' own gather: only the local slot carries
                    # the graph, so rank r gets dL/dx_r from its own copy of
                    # the loss and nothing from the other N - 1 ranks'
                    # copies; after DDP's average the model's gradient is
                    # 1/N of the single-process one.
                    loss, text, params = out["torchmetrics", step]
                    err = rel(text, ref_text[rows], whole=ref_text)
                    worst["tm_grad_rows_vs_1/N"] = max(
                        worst.get("tm_grad_rows_vs_1/N", 0.0), err)
                    self.assertLess(err, tol, (world, step, rank))
                    for got, want in zip(params, ref_params):
                        err = rel(got, want / world)
                        worst["tm_grad_model_vs_1/N"] = max(
                            worst.get("tm_grad_model_vs_1/N", 0.0), err)
                        self.assertLess(err, tol, (world, step, rank))
                        self.assertGreater(rel(got, want),
                                           (world - 1) / world - tol)
        report("torchmetrics_metric_vs_single_process", worst)

    def test_update_compute_has_no_graph(self):
        for world in SIZES:
            ref_loss = reference(world, 0)[0]
            for out in run(world, "metric"):
                for label in ("dloss", "torchmetrics"):
                    value, requires_grad = out[label, "compute"]
                    # sync_on_compute still syncs (dloss or TorchMetrics'
                    # gather): the global value, without a graph.
                    self.assertFalse(requires_grad)
                    self.assertLess(rel(value, ref_loss), TOL[torch.float64])


if __name__ == "__main__":
    unittest.main()
