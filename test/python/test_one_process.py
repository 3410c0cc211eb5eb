"""One process is a world: with no torch.distributed group (a one-GPU run, a
notebook, a unit test), every drop-in, dloss.compile, @dloss.loss,
dloss.all_gather and gather_all_tensors runs on the process's own batch and
gives the installed original's value and gradients there, with no error and
no warning per call. A loss made before init_process_group runs on the group
once it exists (and a PartialFC, whose class shard was fixed at
construction, says so instead of computing with the wrong shard)."""

import logging
import unittest
import warnings

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import TOL, feature_pair, pml_loss, rel, report
from test_partialfc import MARGINS, reference_loss

DTYPES = (torch.float64, torch.float32)
WORST = {}


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _run(fn, tensors):
    """fn's loss(es) on fresh leaves of `tensors`: (values, gradients)."""
    leaves = _leaves(*tensors)
    out = fn(*leaves)
    values = out if isinstance(out, (tuple, list)) else (out,)
    total = sum(v for v in values if v.requires_grad)
    total.backward()
    return ([v.detach() for v in values],
            [t.grad if t.grad is not None else torch.zeros_like(t)
             for t in leaves])


class OneProcess(unittest.TestCase):
    """In this test's own process, which never initialises a group."""

    @classmethod
    def setUpClass(cls):
        import dloss
        cls.dloss = dloss
        assert not torch.distributed.is_initialized()

    @classmethod
    def tearDownClass(cls):
        report("one_process", WORST)

    def compare(self, name, dtype, mine, original, tensors):
        got_values, got_grads = _run(mine, tensors)
        want_values, want_grads = _run(original, tensors)
        self.assertEqual(len(got_values), len(want_values))
        worst = 0.0
        for got, want in zip(got_values + got_grads,
                             want_values + want_grads):
            worst = max(worst, rel(got.to(want.dtype), want))
        key = "%s_%s" % (name, str(dtype).replace("torch.", ""))
        WORST[key] = worst
        self.assertLess(worst, TOL[dtype], key)

    def quiet(self, call, times=3):
        """Runs call() `times` times; fails on any warning or dloss log
        record at WARNING or above (a per-call message would flood a
        notebook)."""
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        handler.setLevel(logging.WARNING)
        logger = logging.getLogger("dloss")
        logger.addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(times):
                    call()
        finally:
            logger.removeHandler(handler)
        self.assertEqual([str(w.message) for w in caught], [])
        self.assertEqual([r.getMessage() for r in records], [])

    def test_openclip_losses(self):
        oc = upstream.open_clip_loss()
        dloss = self.dloss
        g = torch.Generator().manual_seed(0)
        for dtype in DTYPES:
            image, text = feature_pair(7, 8, g)
            t_image, t_text = feature_pair(7, 8, g)
            image, text, t_image, t_text = (x.to(dtype) for x in (
                image, text, t_image, t_text))
            scale = torch.tensor(9.0, dtype=dtype)
            bias = torch.tensor(-3.0, dtype=dtype)
            self.compare("clip", dtype, dloss.ClipLoss(), oc.ClipLoss(),
                         (image, text, scale))
            # What OpenCLIP's trainer passes at world size 1.
            self.compare("clip_trainer_args", dtype,
                         dloss.ClipLoss(local_loss=True, gather_with_grad=True,
                                        cache_labels=True, rank=0,
                                        world_size=1),
                         oc.ClipLoss(cache_labels=True), (image, text, scale))
            for impl in ("bidir", "shift", "reduce", "gather"):
                self.compare("siglip_" + impl, dtype,
                             dloss.SigLipLoss(dist_impl=impl),
                             oc.SigLipLoss(dist_impl=impl),
                             (image, text, scale, bias))
            self.compare("distill", dtype, dloss.DistillClipLoss(),
                         oc.DistillClipLoss(),
                         (image, text, scale, t_image, t_text,
                          torch.tensor(5.0, dtype=dtype)))
            logits = torch.randn(7, 5, 11, generator=g).to(dtype)
            labels = torch.randint(0, 11, (7, 5), generator=g)
            labels[:, -2:] = 0  # pad tokens
            mine = dloss.CoCaLoss(caption_loss_weight=2.0,
                                  clip_loss_weight=1.0)
            original = oc.CoCaLoss(caption_loss_weight=2.0,
                                   clip_loss_weight=1.0)
            self.compare("coca", dtype,
                         lambda i, t, lg, s: mine(i, t, lg, labels, s),
                         lambda i, t, lg, s: original(i, t, lg, labels, s),
                         (image, text, logits, scale))
            self.quiet(lambda: dloss.ClipLoss()(image, text, scale))

    def test_pml_losses(self):
        pml = upstream.pml()
        dloss = self.dloss
        g = torch.Generator().manual_seed(1)
        for dtype in DTYPES:
            emb = torch.randn(9, 6, generator=g, dtype=torch.float64).to(dtype)
            labels = torch.tensor([0, 1, 2, 0, 1, 3, 3, 2, 4])
            for name in ("NTXentLoss", "SupConLoss"):
                original = getattr(pml.losses, name)()
                mine = getattr(dloss, name)()
                self.compare(name.lower(), dtype, lambda e: mine(e, labels),
                             lambda e: original(e, labels), (emb,))
                wrapped = dloss.DistributedLossWrapper(original)
                self.compare(name.lower() + "_wrapper", dtype,
                             lambda e: wrapped(e, labels),
                             lambda e: original(e, labels), (emb,))
            for name in ("ArcFaceLoss", "CosFaceLoss"):
                original = getattr(pml.losses, name)(5, 6).to(dtype)
                mine = getattr(dloss, name)(5, 6).to(dtype)
                mine.load_state_dict(original.state_dict())
                W = original.W.detach()
                kind = name[:-4].lower()
                # The reference math, checked against PML's own class first.
                self.assertLess(rel(original(emb, labels),
                                    pml_loss(kind, emb, labels, W)),
                                TOL[dtype])
                self.compare(kind, dtype,
                             lambda e, w: _margin_call(mine, e, w, labels),
                             lambda e, w: pml_loss(kind, e, labels, w),
                             (emb, W))
            self.quiet(lambda: dloss.NTXentLoss()(emb, labels))

    def test_partialfc(self):
        dloss = self.dloss
        g = torch.Generator().manual_seed(2)
        for dtype in DTYPES:
            for kind, margin in MARGINS.items():
                emb = torch.randn(6, 5, generator=g).to(dtype)
                labels = torch.randint(0, 7, (6,), generator=g)
                weight = torch.randn(7, 5, generator=g).to(dtype)
                pfc = dloss.PartialFC(5, 7, margin_loss=dloss.CombinedMarginLoss(
                    *margin)).to(dtype)
                self.assertEqual((pfc.num_local, pfc.class_start), (7, 0))

                def mine(e, w):
                    _use_weight(pfc, "weight", w)
                    return pfc(e, labels)
                self.compare("partialfc_" + kind, dtype, mine,
                             lambda e, w: reference_loss(kind, e, labels, w),
                             (emb, weight))

    def test_copies_of_a_loss_that_ran(self):
        # Compiled state is dropped on copy and made again; each copy is
        # called by a key of its own (dloss/_ops.py).
        import copy
        dloss = self.dloss
        x, y = torch.randn(4, 3), torch.randn(4, 3)
        labels = torch.tensor([0, 1, 0, 1])
        for loss, args in ((dloss.ClipLoss(), (x, y, 5.0)),
                           (dloss.NTXentLoss(), (x, labels)),
                           (dloss.ArcFaceLoss(2, 3), (x, labels))):
            first = loss(*args)
            twin = copy.deepcopy(loss)
            keys = [getattr(m, "_op_key", None) or m._fn._op_key
                    for m in (loss, twin)]
            self.assertNotEqual(keys[0], keys[1])
            self.assertTrue(torch.equal(twin(*args), first))
            self.assertTrue(torch.equal(loss(*args), first))

    def test_gathers_are_the_identity(self):
        dloss = self.dloss
        x = torch.randn(3, 4, requires_grad=True)
        gathered = dloss.all_gather(x)
        self.assertTrue(torch.equal(gathered, x))
        (gathered * torch.arange(4.0)).sum().backward()
        self.assertTrue(torch.equal(x.grad, torch.arange(4.0).expand(3, 4)))
        parts = dloss.gather_all_tensors(x.detach())
        self.assertEqual(len(parts), 1)
        self.assertTrue(torch.equal(parts[0], x.detach()))
        scalar = dloss.gather_all_tensors(torch.tensor(2.5))
        self.assertEqual([p.shape for p in scalar], [torch.Size([])])
        self.quiet(lambda: dloss.all_gather(x))

    def test_own_losses(self):
        dloss = self.dloss

        @dloss.loss
        def infonce(q, k, t):
            keys = dloss.all_gather(k)
            logits = q @ keys.T / t
            targets = torch.arange(q.shape[0]) + dloss.shard_offset(q)
            return dloss.all_reduce(
                F.cross_entropy(logits, targets, reduction="sum")) / \
                dloss.global_size(q)

        def eager(q, k):
            logits = q @ k.T / 0.1
            return F.cross_entropy(logits, torch.arange(q.shape[0]))

        g = torch.Generator().manual_seed(3)
        for dtype in DTYPES:
            q, k = (x.to(dtype) for x in feature_pair(6, 5, g))
            self.compare("dloss_loss", dtype, lambda a, b: infonce(a, b, 0.1),
                         eager, (q, k))
        self.quiet(lambda: infonce(q, k, 0.1))


def _use_weight(loss, name, weight):
    """`loss` with the leaf `weight` as its parameter `name`, so that the
    gradient the loss gives it is compared too."""
    if name in loss._parameters:
        delattr(loss, name)
    setattr(loss, name, weight)


def _margin_call(loss, embeddings, W, labels):
    """The drop-in's loss with `W` (PML's layout, [embedding, classes]) as
    its weight."""
    _use_weight(loss, "W", W)
    return loss(embeddings, labels)


def _made_before_the_group(rank, world, sizes):
    """Every loss is made (and called once) before init_process_group; once
    the group exists the same objects compute the global loss."""
    import dloss
    import torch.distributed as dist
    g = torch.Generator().manual_seed(4)
    image, text = feature_pair(sum(sizes), 8, g)
    start = sum(sizes[:rank])
    mine = slice(start, start + sizes[rank])
    clip = dloss.ClipLoss()
    before = clip(image[mine], text[mine], 10.0)
    gathered_before = dloss.all_gather(image[mine]).shape[0]
    pfc = dloss.PartialFC(8, 5, margin_loss=dloss.CombinedMarginLoss(
        64.0, 1.0, 0.5, 0.0))
    dloss.init()
    after = clip(image[mine], text[mine], 10.0)
    gathered_after = dloss.all_gather(image[mine]).shape[0]
    pfc_error = multiproc.outcome(lambda: pfc(image[mine], torch.zeros(
        sizes[rank], dtype=torch.long)))
    assert dist.get_world_size() == world
    return before, after, gathered_before, gathered_after, pfc_error


class MadeBeforeTheGroup(unittest.TestCase):
    def test_a_group_made_later_is_used(self):
        from loss_reference import clip_loss
        sizes = [4, 2]
        ranks = multiproc.run(2, _made_before_the_group, sizes, init=False)
        g = torch.Generator().manual_seed(4)
        image, text = feature_pair(sum(sizes), 8, g)
        whole = clip_loss(image, text, 10.0)
        for rank, (before, after, n_before, n_after, pfc_error) in \
                enumerate(ranks):
            start = sum(sizes[:rank])
            mine = slice(start, start + sizes[rank])
            self.assertLess(rel(before, clip_loss(image[mine], text[mine],
                                                  10.0)), 1e-10)
            self.assertLess(rel(after, whole), 1e-10)
            self.assertEqual((n_before, n_after), (sizes[rank], sum(sizes)))
            self.assertIn("PartialFC", pfc_error)
            self.assertIn("init_process_group", pfc_error)


if __name__ == "__main__":
    unittest.main()
