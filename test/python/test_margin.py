"""dloss.ArcFaceLoss and dloss.CosFaceLoss against the real
pytorch-metric-learning ArcFaceLoss and CosFaceLoss (the pinned version,
test/python/upstream.py) run on one process over the global batch, with dloss on
1, 2, 3 and 4 Gloo ranks with uneven batches: the global loss on every rank,
embeddings gradients N * dF/dx_r (ddp contract), W's gradient the global
dF/dW on every rank, ArcFace's target angles past pi - m, W loaded from the
real PML module's state_dict, and W trained without DDP staying identical
on every rank and equal to PML's single-process run. On one process also:
state dicts both ways, PML's attributes, and PML's constructor keywords
(defaults accepted, anything else refused)."""

import inspect
import math
import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import FUSE_MODES, TOL, fusion, offsets, rel, report

EMB, CLASSES = 16, 10
# (kind, constructor keywords): PML's defaults and one other setting each.
LOSSES = [
    ("arcface", {}),
    ("arcface", {"margin": 20.0, "scale": 30.0}),
    ("cosface", {}),
    ("cosface", {"margin": 0.2, "scale": 16.0}),
]
SIZES = {1: [[7]], 2: [[5, 2]], 3: [[1, 4, 2]],
         4: [[5, 3, 6, 2], [3, 0, 4, 2]]}
STEPS, LR = 3, 0.5


def global_data(kind, kwargs, sizes, dtype, seed):
    """Embeddings, labels and W; for ArcFace, two rows whose target angle is
    past pi - m (embeddings nearly opposite their class's weights)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    emb = torch.randn(total, EMB, generator=g, dtype=torch.float64)
    labels = torch.randint(0, CLASSES, (total,), generator=g)
    W = torch.randn(EMB, CLASSES, generator=g, dtype=torch.float64)
    if kind == "arcface":
        for i in (0, total - 1):
            emb[i] = -3 * W[:, labels[i]] + 0.1 * emb[i]
    return emb.to(dtype), labels, W.to(dtype)


def past_pi_minus_m(kind, kwargs, emb, labels, W):
    if kind != "arcface":
        return 0
    m = math.radians(kwargs.get("margin", 28.6))
    cos = (F.normalize(emb.double()) @ F.normalize(W.double(), dim=0))[
        torch.arange(len(labels)), labels]
    return int((torch.acos(cos) > math.pi - m).sum())


def pml_module(kind, kwargs, W):
    """The real PML loss (kind, kwargs) holding the weights W, in W's
    dtype (PML's own W is float32 until its first call)."""
    losses = upstream.pml().losses
    cls = losses.ArcFaceLoss if kind == "arcface" else losses.CosFaceLoss
    module = cls(CLASSES, EMB, **kwargs).to(W.dtype)
    module.load_state_dict({"W": W.clone()})
    return module


def single_process(kind, kwargs, emb, labels, W):
    """PML's value and gradients (embeddings, W) on one process."""
    module = pml_module(kind, kwargs, W)
    emb = emb.clone().requires_grad_()
    loss = module(emb, labels)
    loss.backward()
    return loss.detach(), emb.grad, module.W.grad


def make_loss(dloss, kind, kwargs, W, fuse=True):
    """The dloss loss with W loaded from the real PML module's state
    dict."""
    cls = dloss.ArcFaceLoss if kind == "arcface" else dloss.CosFaceLoss
    loss_fn = cls(CLASSES, EMB, fuse=bool(fuse), **kwargs).to(W.dtype)
    loss_fn.load_state_dict(pml_module(kind, kwargs, W).state_dict())
    return loss_fn


def train(loss_fn_or_kind, kwargs, W, sizes, dtype, seed, rank=None):
    """STEPS of SGD (momentum) on W alone, each on new embeddings: with
    dloss (no DDP) on this rank's rows, or with the real PML module on all
    rows."""
    if isinstance(loss_fn_or_kind, str):
        loss_fn_or_kind = pml_module(loss_fn_or_kind, kwargs, W)
    params = list(loss_fn_or_kind.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * seed + step)
        emb = torch.randn(sum(sizes), EMB, generator=g, dtype=dtype)
        labels = torch.randint(0, CLASSES, (sum(sizes),), generator=g)
        opt.zero_grad()
        if rank is None:
            loss = loss_fn_or_kind(emb, labels)
        else:
            lo, n = offsets(sizes)[rank], sizes[rank]
            loss = loss_fn_or_kind(emb[lo:lo + n], labels[lo:lo + n])
        loss.backward()
        opt.step()
    return params[0].detach().clone()


def _cases(world):
    return [(kind, kwargs, sizes, dtype, 100 * world + 10 * i + j, fuse)
            for i, (kind, kwargs) in enumerate(LOSSES)
            for j, sizes in enumerate(SIZES[world])
            for dtype in (torch.float64, torch.float32)
            for fuse in FUSE_MODES]


def _margin_rank(rank, world, cases):
    import dloss
    results = []
    for kind, kwargs, sizes, dtype, seed, fuse in cases:
        emb, labels, W = global_data(kind, kwargs, sizes, dtype, seed)
        lo, n = offsets(sizes)[rank], sizes[rank]
        loss_fn = make_loss(dloss, kind, kwargs, W, fuse)
        x = emb[lo:lo + n].clone().requires_grad_()
        # Labels as a PML user passes them: any integer dtype.
        with fusion(fuse):
            loss = loss_fn(x, labels[lo:lo + n].to(torch.int32))
            loss.backward()
            trained = train(make_loss(dloss, kind, kwargs, W, fuse), kwargs,
                            W, sizes, dtype, seed, rank)
        results.append(dict(loss=loss.detach(), x=x.grad,
                            W=loss_fn.W.grad.clone(), trained=trained))
    return results


class MarginLossTest(unittest.TestCase):
    worst = {}

    def test_pml_interface(self):
        import dloss
        dloss.init()
        arc = dloss.ArcFaceLoss(CLASSES, EMB)
        self.assertEqual(list(arc.W.shape), [EMB, CLASSES])
        self.assertAlmostEqual(arc.margin, math.radians(28.6))
        self.assertEqual(arc.scale, 64)
        self.assertEqual(list(arc.state_dict()), ["W"])
        cos = dloss.CosFaceLoss(CLASSES, EMB)
        self.assertAlmostEqual(cos.margin, 0.35)
        self.assertEqual(cos.scale, 64)
        # PML's W init is normal_: unit variance, not a small init.
        big = dloss.ArcFaceLoss(1000, 64)
        self.assertAlmostEqual(big.W.std().item(), 1.0, delta=0.05)
        # A PML state dict loads strictly; a wrong shape does not.
        W = torch.randn(EMB, CLASSES)
        arc.load_state_dict({"W": W})
        self.assertTrue(torch.equal(arc.W.detach(), W))
        with self.assertRaises(RuntimeError):
            arc.load_state_dict({"W": torch.randn(CLASSES, EMB)})

    def test_against_pml_module(self):
        """State dicts both ways with the real PML modules (their own random
        W), equal values and gradients, PML's attributes and signatures."""
        import dloss
        dloss.init()
        losses = upstream.pml().losses
        g = torch.Generator().manual_seed(7)
        emb = torch.randn(9, EMB, generator=g, dtype=torch.float64)
        labels = torch.randint(0, CLASSES, (9,), generator=g)
        for kind, kwargs in LOSSES:
            pml_cls = losses.ArcFaceLoss if kind == "arcface" else \
                losses.CosFaceLoss
            cls = dloss.ArcFaceLoss if kind == "arcface" else \
                dloss.CosFaceLoss
            with self.subTest(kind=kind, kwargs=kwargs):
                pml = pml_cls(CLASSES, EMB, **kwargs).double()
                ours = cls(CLASSES, EMB, **kwargs).double()
                for attr in ("num_classes", "margin", "scale"):
                    self.assertEqual(float(getattr(ours, attr)),
                                     float(getattr(pml, attr)), attr)
                self.assertEqual(list(ours.state_dict()),
                                 list(pml.state_dict()))
                # PML -> dloss, then dloss (new W) -> PML.
                ours.load_state_dict(pml.state_dict())
                for direction in ("pml->dloss", "dloss->pml"):
                    if direction == "dloss->pml":
                        with torch.no_grad():
                            ours.W.normal_(generator=g)
                        pml.load_state_dict(ours.state_dict())
                    ours.zero_grad()
                    pml.zero_grad()
                    x1 = emb.clone().requires_grad_()
                    x2 = emb.clone().requires_grad_()
                    want = pml(x1, labels)
                    want.backward()
                    got = ours(x2, labels)
                    got.backward()
                    err = max(rel(got.detach(), want.detach()),
                              rel(x2.grad, x1.grad),
                              rel(ours.W.grad, pml.W.grad))
                    self.assertLess(err, TOL[torch.float64], direction)
                    key = "%s one-process %s float64" % (kind, direction)
                    self.worst[key] = max(self.worst.get(key, 0.0), err)
        # The signatures: PML's parameters, in PML's order, with PML's
        # defaults (dloss adds group and fuse, keyword-only in use).
        for name in ("ArcFaceLoss", "CosFaceLoss"):
            mine = inspect.signature(getattr(dloss, name).__init__)
            theirs = inspect.signature(getattr(losses, name).__init__)
            for p in theirs.parameters.values():
                if p.kind is p.VAR_POSITIONAL:
                    continue  # CosFace's *args: num_classes, embedding_size
                if p.kind is p.VAR_KEYWORD:
                    self.assertIn("kwargs", mine.parameters)
                    continue
                self.assertEqual(mine.parameters[p.name].default, p.default,
                                 "%s %s" % (name, p.name))
            self.assertEqual(
                list(inspect.signature(getattr(dloss, name).forward)
                     .parameters.items())[1:],
                list(inspect.signature(getattr(losses, name).forward)
                     .parameters.items())[1:])

    def test_pml_keywords(self):
        """PML's keywords through **kwargs: its defaults are accepted, any
        setting that changes the loss is a dloss.Error."""
        import dloss
        from pytorch_metric_learning import distances, reducers, regularizers
        upstream.pml()
        dloss.init()
        for cls in (dloss.ArcFaceLoss, dloss.CosFaceLoss):
            cls(CLASSES, EMB, distance=distances.CosineSimilarity(),
                reducer=reducers.MeanReducer(), embedding_regularizer=None,
                embedding_reg_weight=1, weight_regularizer=None,
                weight_reg_weight=1, collect_stats=False,
                weight_init_func=torch.nn.init.normal_)
            for bad in (dict(distance=distances.LpDistance()),
                        dict(reducer=reducers.AvgNonZeroReducer()),
                        dict(weight_regularizer=regularizers.LpRegularizer()),
                        dict(embedding_regularizer=(
                            regularizers.LpRegularizer())),
                        dict(collect_stats=True)):
                with self.subTest(cls=cls.__name__, bad=list(bad)):
                    with self.assertRaises(dloss.Error) as ctx:
                        cls(CLASSES, EMB, **bad)
                    self.assertIn(list(bad)[0], str(ctx.exception))
            # A keyword PML does not know: a TypeError, as PML raises.
            from pytorch_metric_learning import losses as pml_losses
            for fn in (cls, getattr(pml_losses, cls.__name__)):
                with self.assertRaisesRegex(TypeError, "not_pml"):
                    fn(num_classes=CLASSES, embedding_size=EMB, not_pml=1)
            loss_fn = cls(CLASSES, EMB)
            emb, labels = torch.randn(4, EMB), torch.tensor([0, 1, 2, 3])
            for extra in (dict(indices_tuple=(labels, labels, labels)),
                          dict(ref_emb=emb), dict(ref_labels=labels)):
                with self.assertRaises(dloss.Error):
                    loss_fn(emb, labels, **extra)
            with self.assertRaises(dloss.Error):
                loss_fn(emb)

    def check_world(self, world):
        cases = _cases(world)
        per_rank = multiproc.run(world, _margin_rank, cases, timeout=300)
        past = 0
        for i, (kind, kwargs, sizes, dtype, seed, fuse) in enumerate(cases):
            what = "%s %s world %d sizes %s %s fuse=%s" % (
                kind, kwargs, world, sizes, dtype, fuse)
            tol = TOL[dtype]
            emb, labels, W = global_data(kind, kwargs, sizes, dtype, seed)
            past += past_pi_minus_m(kind, kwargs, emb, labels, W)
            value, gx, gW = single_process(kind, kwargs, emb, labels, W)
            trained = train(kind, kwargs, W, sizes, dtype, seed)
            got = [r[i] for r in per_rank]
            worst = 0.0
            for rank, g in enumerate(got):
                with self.subTest(what=what, rank=rank):
                    self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                    self.assertLess(rel(g["loss"], value), tol)
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    err = max(rel(g["loss"], value),
                              rel(g["x"] / world, gx[lo:lo + n], gx),
                              rel(g["W"], gW))
                    worst = max(worst, err)
                    self.assertLess(err, tol)
                    # W without DDP: the same gradient, hence the same W
                    # after training, on every rank.
                    self.assertTrue(torch.equal(g["W"], got[0]["W"]))
                    self.assertTrue(torch.equal(g["trained"],
                                                got[0]["trained"]))
                    self.assertLess(rel(g["trained"], trained), tol)
            key = "%s world=%d %s" % (kind, world,
                                      str(dtype).replace("torch.", ""))
            self.worst[key] = max(self.worst.get(key, 0.0), worst)
        # The data reached ArcFace's other branch (cos(theta) - m sin m).
        self.assertGreater(past, 0)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4(self):
        self.check_world(4)

    @classmethod
    def tearDownClass(cls):
        report("margin grad", cls.worst)


if __name__ == "__main__":
    unittest.main()
