"""dloss.NTXentLoss, dloss.SupConLoss and dloss.DistributedLossWrapper
against the real pytorch-metric-learning (the pinned version,
test/python/upstream.py).

On 1, 2, 3 and 4 Gloo ranks with uneven batches (a rank with no rows
included), dloss's value on every rank must equal PML's loss class run on
one process over the concatenated global batch, and each rank's embedding
gradient must be world_size times PML's gradient of its rows (the ddp
contract, as the other drop-ins), in float64 (TOL 1e-10) and float32, fused
with two tile sizes and unfused; batches without any positive or any
negative pair give PML's zero loss and zero gradient. The plans must hold
the fused op. On even batches dloss.DistributedLossWrapper(pml_loss) is
compared with PML's own DistributedLossWrapper run on the same Gloo ranks
(its value is world_size times the global loss, its gradients equal
dloss's; ArcFace's W gets world_size times dloss's). On one process: the
signatures, PML's keywords (defaults accepted, others a dloss.Error), the
miner and ref_emb errors, and the wrapper's unsupported-class error."""

import inspect
import unittest

import torch

import multiproc
import upstream
from loss_reference import FUSE_MODES, TOL, fusion, offsets, rel, report

EMB, CLASSES = 8, 10
# (class, constructor keywords): PML's default and another temperature.
LOSSES = [
    ("NTXentLoss", {}),
    ("NTXentLoss", {"temperature": 0.5}),
    ("SupConLoss", {}),
    ("SupConLoss", {"temperature": 0.3}),
]
SIZES = {1: [7], 2: [5, 3], 3: [4, 0, 5], 4: [3, 5, 0, 2]}
# Label patterns: few classes (positives and negatives across ranks; the
# last row alone in its class), one
# class only (no negative pair: PML's zero loss), all distinct (no
# positive pair: zero).
LABELS = ("mixed", "one class", "distinct")
# Even batches for PML's own DistributedLossWrapper (it needs equal sizes).
EVEN = {2: [4, 4], 3: [3, 3, 3], 4: [3, 3, 3, 3]}
WRAPPED = [("NTXentLoss", {"temperature": 0.2}), ("SupConLoss", {}),
           ("ArcFaceLoss", {"margin": 20.0, "scale": 16.0}),
           ("CosFaceLoss", {})]


def global_data(sizes, dtype, seed, labels="mixed"):
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    emb = torch.randn(total, EMB, generator=g, dtype=torch.float64)
    if labels == "mixed":
        y = torch.randint(0, 3, (total,), generator=g)
        y[-1] = 9  # a row without positives: SupCon's reducer skips it
    elif labels == "one class":
        y = torch.full((total,), 4)
    else:
        y = torch.arange(total) * 3 + 1
    return emb.to(dtype), y


def pml_loss(name, kwargs, W=None):
    """The real PML loss object (for ArcFace/CosFace holding W)."""
    losses = upstream.pml().losses
    if name in ("ArcFaceLoss", "CosFaceLoss"):
        module = getattr(losses, name)(CLASSES, EMB, **kwargs).to(W.dtype)
        module.load_state_dict({"W": W.clone()})
        return module
    return getattr(losses, name)(**kwargs)


def single_process(name, kwargs, emb, labels):
    """PML's value and embeddings gradient on one process."""
    x = emb.clone().requires_grad_()
    loss = pml_loss(name, kwargs)(x, labels)
    loss.backward()
    return loss.detach(), x.grad


def _cases(world):
    cases = []
    for i, (name, kwargs) in enumerate(LOSSES):
        for dtype in (torch.float64, torch.float32):
            for fuse in FUSE_MODES:
                cases.append((name, kwargs, dtype, fuse, "mixed",
                              100 * world + 10 * i))
        # Without positive or negative pairs: one setting each.
        for labels in LABELS[1:]:
            cases.append((name, kwargs, torch.float64, True, labels,
                          100 * world + 10 * i + 1))
    return cases


def _pml_rank(rank, world, cases):
    import dloss
    sizes = SIZES[world]
    lo, n = offsets(sizes)[rank], sizes[rank]
    modules, results = {}, []
    for name, kwargs, dtype, fuse, labels, seed in cases:
        key = (name, tuple(sorted(kwargs.items())), bool(fuse))
        if key not in modules:
            modules[key] = getattr(dloss, name)(fuse=bool(fuse), **kwargs)
        loss_fn = modules[key]
        emb, y = global_data(sizes, dtype, seed, labels)
        x = emb[lo:lo + n].clone().requires_grad_()
        with fusion(fuse):
            # Labels as a PML user may pass them: any integer dtype.
            loss = loss_fn(x, y[lo:lo + n].to(torch.int32))
            loss.backward()
        fused = loss_fn.compiled(x.detach(), y[lo:lo + n]).fused_ops()
        results.append(dict(loss=loss.detach(), x=x.grad, fused=fused))
    return results


def _wrapper_data(name, world, seed):
    emb, y = global_data(EVEN[world], torch.float64, seed)
    if name in ("ArcFaceLoss", "CosFaceLoss"):
        y = torch.randint(0, CLASSES, y.shape,
                          generator=torch.Generator().manual_seed(seed))
    W = torch.randn(EMB, CLASSES, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(seed + 1))
    return emb, y, W


def _wrapper_rank(rank, world, seed):
    """PML's DistributedLossWrapper and dloss's on the same even shards."""
    import dloss
    from pytorch_metric_learning.utils.distributed import \
        DistributedLossWrapper
    lo, n = offsets(EVEN[world])[rank], EVEN[world][rank]
    out = {}
    for name, kwargs in WRAPPED:
        emb, y, W = _wrapper_data(name, world, seed)
        got = {}
        for who in ("pml", "dloss"):
            original = pml_loss(name, kwargs, W)
            wrapped = DistributedLossWrapper(original) if who == "pml" \
                else dloss.DistributedLossWrapper(original)
            x = emb[lo:lo + n].clone().requires_grad_()
            loss = wrapped(x, y[lo:lo + n])
            loss.backward()
            W_grad = None
            if name in ("ArcFaceLoss", "CosFaceLoss"):
                W_grad = (original if who == "pml" else wrapped).W.grad
            got[who] = (loss.detach(), x.grad, W_grad, type(wrapped).__name__)
        out[name] = got
    return out


class PMLTest(unittest.TestCase):
    worst = {}

    def _note(self, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)

    def check_world(self, world):
        sizes = SIZES[world]
        cases = _cases(world)
        per_rank = multiproc.run(world, _pml_rank, cases, timeout=400)
        crossing = {"positive": 0, "negative": 0}
        for i, (name, kwargs, dtype, fuse, labels, seed) in enumerate(cases):
            what = "%s %s world %d sizes %s %s fuse=%s labels=%s" % (
                name, kwargs, world, sizes, dtype, fuse, labels)
            emb, y = global_data(sizes, dtype, seed, labels)
            if labels == "mixed" and world > 1:
                owner = torch.repeat_interleave(
                    torch.arange(world), torch.tensor(sizes))
                other = owner[:, None] != owner[None, :]
                same = y[:, None] == y[None, :]
                crossing["positive"] += int((same & other).sum())
                crossing["negative"] += int((~same & other).sum())
            value, grad = single_process(name, kwargs, emb, y)
            if labels != "mixed":
                # PML's zero loss: no positive or no negative pair.
                self.assertEqual(float(value), 0.0, what)
            worst = 0.0
            for rank, got in enumerate(r[i] for r in per_rank):
                with self.subTest(what=what, rank=rank):
                    self.assertTrue(torch.equal(got["loss"],
                                                per_rank[0][i]["loss"]))
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    err = max(abs(float(got["loss"]) - float(value)) /
                              max(abs(float(value)), 1.0),
                              rel(got["x"] / world, grad[lo:lo + n], grad))
                    self.assertTrue(torch.isfinite(got["x"]).all())
                    self.assertLess(err, TOL[dtype])
                    worst = max(worst, err)
                    if fuse:
                        self.assertIn("dloss.fused_similarity", got["fused"])
                    else:
                        self.assertEqual(got["fused"], [])
            self._note("%s world=%d %s" % (
                name, world, str(dtype).replace("torch.", "")), worst)
        if world > 1:
            # Pairs of both kinds between rows of different ranks.
            self.assertGreater(crossing["positive"], 0)
            self.assertGreater(crossing["negative"], 0)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4(self):
        self.check_world(4)

    def check_wrapper(self, world):
        seed = 7 + world
        per_rank = multiproc.run(world, _wrapper_rank, seed, timeout=300)
        for name, kwargs in WRAPPED:
            emb, y, W = _wrapper_data(name, world, seed)
            for rank, out in enumerate(r[name] for r in per_rank):
                with self.subTest(name=name, world=world, rank=rank):
                    pml_value, pml_x, pml_W, _ = out["pml"]
                    value, x, W_grad, cls = out["dloss"]
                    self.assertEqual(cls, name)  # the dloss drop-in
                    # PML's wrapper: world_size times the global loss, the
                    # same embeddings gradients; W's gradient world_size
                    # times the global one (dloss: the global one).
                    err = max(rel(value * world, pml_value), rel(x, pml_x))
                    if W_grad is not None:
                        err = max(err, rel(W_grad * world, pml_W))
                    self.assertLess(err, TOL[torch.float64])
                    self._note("wrapper %s world=%d float64" % (name, world),
                               err)

    def test_wrapper_world_2(self):
        self.check_wrapper(2)

    def test_wrapper_world_3(self):
        self.check_wrapper(3)

    def test_wrapper_world_4(self):
        self.check_wrapper(4)

    def test_wrapper_one_process(self):
        """The returned dloss loss holds the PML object's parameters and
        gives PML's value and gradients on one process."""
        import dloss
        dloss.init()
        emb, y = global_data([9], torch.float64, 3)
        ids = torch.randint(0, CLASSES, (9,),
                            generator=torch.Generator().manual_seed(3))
        W = torch.randn(EMB, CLASSES, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(4))
        for name, kwargs in LOSSES + WRAPPED:
            with self.subTest(name=name, kwargs=kwargs):
                original = pml_loss(name, kwargs, W)
                ours = dloss.DistributedLossWrapper(original)
                self.assertIsInstance(ours, getattr(dloss, name))
                self.assertIs(dloss.DistributedLossWrapper(ours), ours)
                labels = ids if hasattr(original, "W") else y
                for attr in ("temperature", "margin", "scale",
                             "num_classes"):
                    if hasattr(original, attr):
                        self.assertEqual(float(getattr(ours, attr)),
                                         float(getattr(original, attr)))
                x1 = emb.clone().requires_grad_()
                x2 = emb.clone().requires_grad_()
                want = original(x1, labels)
                want.backward()
                got = ours(x2, labels)
                got.backward()
                err = max(rel(got.detach(), want.detach()),
                          rel(x2.grad, x1.grad))
                if hasattr(original, "W"):
                    self.assertTrue(torch.equal(ours.W.detach(),
                                                original.W.detach()))
                    err = max(err, rel(ours.W.grad, original.W.grad))
                self.assertLess(err, TOL[torch.float64])
                self._note("wrapper %s world=1 float64" % name, err)

    def test_wrapper_refuses(self):
        import dloss
        from pytorch_metric_learning import reducers
        pml = upstream.pml()
        dloss.init()
        for loss in (pml.losses.TripletMarginLoss(),
                     pml.losses.ContrastiveLoss(), torch.nn.MSELoss()):
            with self.assertRaises(dloss.Error) as ctx:
                dloss.DistributedLossWrapper(loss)
            for name in ("NTXentLoss", "SupConLoss", "ArcFaceLoss",
                         "CosFaceLoss", type(loss).__name__):
                self.assertIn(name, str(ctx.exception))
        with self.assertRaises(dloss.Error) as ctx:
            dloss.DistributedLossWrapper(pml.losses.NTXentLoss(
                reducer=reducers.SumReducer()))
        self.assertIn("reducer", str(ctx.exception))

    def test_interface(self):
        """PML's signatures (keywords through **kwargs included), its
        default keywords accepted, everything that changes the loss and
        miners' indices_tuple refused."""
        import dloss
        from pytorch_metric_learning import (distances, miners, reducers,
                                             regularizers)
        pml = upstream.pml()
        dloss.init()
        for name, default in (("NTXentLoss", 0.07), ("SupConLoss", 0.1)):
            ours, theirs = getattr(dloss, name), getattr(pml.losses, name)
            mine = inspect.signature(ours.__init__).parameters
            for p in inspect.signature(theirs.__init__).parameters.values():
                self.assertIn(p.name, mine)
                self.assertEqual(mine[p.name].default, p.default)
            self.assertEqual(ours().temperature, default)
            self.assertEqual(ours().temperature, theirs().temperature)
            self.assertEqual(
                list(inspect.signature(ours.forward).parameters.items()),
                list(inspect.signature(theirs.forward).parameters.items()))
            reducer = reducers.AvgNonZeroReducer() if name == "SupConLoss" \
                else reducers.MeanReducer()
            ours(distance=distances.CosineSimilarity(), reducer=reducer,
                 embedding_regularizer=None, embedding_reg_weight=1,
                 collect_stats=False)
            for bad in (dict(distance=distances.LpDistance()),
                        dict(distance=distances.CosineSimilarity(power=2)),
                        dict(reducer=reducers.SumReducer()),
                        dict(reducer=reducers.AvgNonZeroReducer()
                             if name == "NTXentLoss" else
                             reducers.MeanReducer()),
                        dict(embedding_regularizer=(
                            regularizers.LpRegularizer())),
                        dict(collect_stats=True)):
                with self.subTest(name=name, bad=list(bad)):
                    with self.assertRaises(dloss.Error) as ctx:
                        ours(**bad)
                    self.assertIn(list(bad)[0], str(ctx.exception))
            # A keyword PML does not know: a TypeError, as PML raises.
            for fn in (ours, theirs):
                with self.assertRaisesRegex(TypeError, "margin"):
                    fn(margin=0.1)
            loss_fn = ours()
            emb, y = global_data([8], torch.float64, 5)
            pairs = miners.MultiSimilarityMiner()(emb, y)
            for extra in (dict(indices_tuple=pairs), dict(ref_emb=emb),
                          dict(ref_labels=y)):
                with self.subTest(name=name, extra=list(extra)):
                    with self.assertRaises(dloss.Error) as ctx:
                        loss_fn(emb, y, **extra)
                    self.assertIn(list(extra)[0], str(ctx.exception))
            with self.assertRaises(dloss.Error):
                loss_fn(emb)
        # The wrapper: PML's parameters (dloss adds group and fuse).
        mine = inspect.signature(dloss.DistributedLossWrapper).parameters
        theirs = inspect.signature(
            pml.utils.distributed.DistributedLossWrapper.__init__)
        for p in list(theirs.parameters.values())[1:]:
            self.assertEqual(mine[p.name].default, p.default)

    def test_fused_plans(self):
        """No similarity matrix in the plans: SupCon is one fused op,
        NTXent two (its negatives' log-sum-exp, then its pairs), forward and
        backward fused, no matmul left."""
        import dloss
        dloss.init()
        emb, y = global_data([9], torch.float64, 11)
        for name, ops in (("NTXentLoss", 2), ("SupConLoss", 1)):
            compiled = getattr(dloss, name)().compiled(emb, y)
            plan = compiled.plan_text()
            self.assertEqual(compiled.fused_ops(), [
                "dloss.fused_similarity", "dloss.fused_similarity_grad"])
            self.assertNotIn("dloss.matmul", plan)
            forward = plan.split("func @")[1]
            self.assertEqual(forward.count("dloss.fused_similarity("), ops,
                             name)

    @classmethod
    def tearDownClass(cls):
        report("pml", cls.worst)


if __name__ == "__main__":
    unittest.main()
