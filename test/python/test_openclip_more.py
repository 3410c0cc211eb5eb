"""dloss.DistillClipLoss and dloss.CoCaLoss against the real OpenCLIP classes
(open_clip_torch, the version test/requirements-no-deps.txt pins; its
loss.py is loaded by path by upstream.py where `import open_clip` fails for
lack of torchvision), and the signatures of all four OpenCLIP drop-ins.

- Even batches, world sizes 1-4: OpenCLIP's class in exact mode
  (local_loss=True, gather_with_grad=True, rank, world_size) on the same
  Gloo ranks as dloss. dloss's values are global losses, compared with the
  mean over ranks of OpenCLIP's per-rank values; each term's gradients
  (taken one term at a time) on each rank against OpenCLIP's on that rank:
  student and teacher features and logit scales (DistillClipLoss), features,
  logit_scale and caption logits (CoCaLoss).
- Every case, uneven batches included: the real class on one process over
  the concatenated global batch; rank r's gradients / N against that
  gradient's block, the mean of the logit-scale shares against theirs.
- CoCa's caption term is the mean over the global batch's non-pad tokens.
  It equals the mean of OpenCLIP's per-rank values when every rank holds as
  many non-pad tokens ("same" pads); with other counts ("skewed" pads) it
  is compared only with one process, and the test checks that OpenCLIP's
  mean over ranks does differ (docs/Migration.md documents it).
- Signatures: every parameter of OpenCLIP's __init__ and forward is dloss's,
  in the same order with the same default; dloss's extra ones are listed.

Float64 and float32; the contrastive terms fused (default and tiny tiles)
and unfused; teacher features with and without gradients; pad_id 0 and
-100; clip_loss_weight 0 (OpenCLIP's int64 zero); a rank with no rows."""

import inspect
import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import FUSE_MODES, TOL, fusion, offsets, rel, report

DIM = 8
TOKENS = 5
VOCAB = 7
# Per world size: the per-rank batches, even ones first.
SIZES = {
    1: [[5]],
    2: [[3, 3], [4, 1]],
    3: [[2, 2, 2], [1, 3, 2]],
    4: [[2, 2, 2, 2], [3, 0, 2, 2]],  # a rank with no rows
}


def even(sizes):
    return len(set(sizes)) == 1


def features(total, g):
    return F.normalize(torch.randn(total, DIM, generator=g,
                                   dtype=torch.float64))


def distill_data(sizes, dtype, seed):
    """Student and teacher image/text features and logit scales."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image, text = features(total, g), features(total, g)
    # The teacher agrees with the student in part.
    t_image = F.normalize(image + features(total, g))
    t_text = F.normalize(text + features(total, g))
    scale = torch.tensor(6.0 + 0.1 * seed, dtype=torch.float64)
    t_scale = torch.tensor(9.0 - 0.1 * seed, dtype=torch.float64)
    return [v.to(dtype) for v in (image, text, scale, t_image, t_text,
                                  t_scale)]


def coca_data(sizes, dtype, seed, pads, pad_id):
    """Image/text features, caption logits [B, TOKENS, VOCAB], labels with
    pad_id at the tail of each caption, logit_scale. "same": the caption at
    local index j of a rank has j % 3 pads (every rank of an even batch
    holds as many non-pad tokens); "skewed": rank r's captions have r % 4
    pads."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    image, text = features(total, g), features(total, g)
    logits = 2 * torch.randn(total, TOKENS, VOCAB, generator=g,
                             dtype=torch.float64)
    # Token ids from 1: 0 is a pad for pad_id=0.
    labels = torch.randint(1, VOCAB, (total, TOKENS), generator=g)
    starts = offsets(sizes)
    for r, n in enumerate(sizes):
        for j in range(n):
            count = j % 3 if pads == "same" else r % 4
            if count:
                labels[starts[r] + j, TOKENS - count:] = pad_id
    scale = torch.tensor(5.0 + 0.1 * seed, dtype=torch.float64)
    return ([v.to(dtype) for v in (image, text, logits)] +
            [labels, scale.to(dtype)])


def grads(outputs, inputs):
    """The gradient of each output with respect to `inputs`, one output at
    a time (each term's own gradient; None for an input it does not use)."""
    return [list(torch.autograd.grad(out, inputs, retain_graph=True,
                                     allow_unused=True))
            for out in outputs]


def run_distill(loss_fn, args, teacher_grad):
    args = [v.clone().requires_grad_(i < 3 or teacher_grad)
            for i, v in enumerate(args)]
    out = loss_fn(*args, output_dict=True)
    pair = loss_fn(*args)
    terms = [out["contrastive_loss"], out["distill_loss"]]
    wrt = [a for a in args if a.requires_grad]
    return dict(keys=sorted(out), values=[t.detach() for t in terms],
                tuple_values=[t.detach() for t in pair],
                grads=grads(terms, wrt))


def run_coca(loss_fn, image, text, logits, labels, scale):
    args = [v.clone().requires_grad_() for v in (image, text, logits, scale)]
    x, y, z, s = args
    out = loss_fn(x, y, z, labels, s, output_dict=True)
    pair = loss_fn(x, y, z, labels, s)
    terms = [out["contrastive_loss"], out["caption_loss"]]
    result = dict(keys=sorted(out), values=[t.detach() for t in terms],
                  tuple_values=[t.detach() for t in pair])
    clip_grads = ([None] * 4 if not terms[0].requires_grad else
                  list(torch.autograd.grad(terms[0], [x, y, s],
                                           retain_graph=True)) + [None])
    caption_grad = torch.autograd.grad(terms[1], [z])[0]
    # [clip: x, y, s], [caption: logits]
    result["grads"] = [clip_grads[:3], [caption_grad]]
    return result


def _distill_rank(rank, world, cases):
    import dloss
    oc = upstream.open_clip_loss()
    results = []
    for sizes, dtype, seed, fuse, teacher_grad in cases:
        data = distill_data(sizes, dtype, seed)
        start, n = offsets(sizes)[rank], sizes[rank]
        local = [v if v.dim() == 0 else v[start:start + n] for v in data]
        loss_fn = dloss.DistillClipLoss(local_loss=True,
                                        gather_with_grad=True, rank=rank,
                                        world_size=world, fuse=bool(fuse))
        with fusion(fuse):
            got = run_distill(loss_fn, local, teacher_grad)
        if even(sizes):
            got["ref"] = run_distill(
                oc.DistillClipLoss(local_loss=True, gather_with_grad=True,
                                   rank=rank, world_size=world),
                local, teacher_grad)
        results.append(got)
    return results


def _coca_rank(rank, world, cases):
    import dloss
    oc = upstream.open_clip_loss()
    results = []
    for sizes, dtype, seed, fuse, pads, pad_id, weights in cases:
        image, text, logits, labels, scale = coca_data(sizes, dtype, seed,
                                                       pads, pad_id)
        rows = slice(offsets(sizes)[rank], offsets(sizes)[rank] + sizes[rank])
        local = (image[rows], text[rows], logits[rows], labels[rows], scale)
        kwargs = dict(pad_id=pad_id, local_loss=True, gather_with_grad=True,
                      rank=rank, world_size=world)
        loss_fn = dloss.CoCaLoss(*weights, fuse=bool(fuse), **kwargs)
        with fusion(fuse):
            got = run_coca(loss_fn, *local)
        if even(sizes):
            got["ref"] = run_coca(oc.CoCaLoss(*weights, **kwargs), *local)
        results.append(got)
    return results


def _distill_cases(world):
    cases = []
    for i, sizes in enumerate(SIZES[world]):
        for dtype in (torch.float64, torch.float32):
            for k, fuse in enumerate(FUSE_MODES):
                cases.append((sizes, dtype, 10 * world + i, fuse, k != 1))
    return cases


def _coca_cases(world):
    cases = []
    for i, sizes in enumerate(SIZES[world]):
        for dtype in (torch.float64, torch.float32):
            for k, fuse in enumerate(FUSE_MODES):
                pad_id = (0, -100)[k % 2]
                weights = (2.0, 0.0 if k == 2 else 1.5)
                cases.append((sizes, dtype, 10 * world + i, fuse, "same",
                              pad_id, weights))
        if world > 1 and even(sizes):
            cases.append((sizes, torch.float64, 10 * world + i, True,
                          "skewed", 0, (2.0, 1.5)))
    return cases


class OpenClipMoreTest(unittest.TestCase):
    worst = {}

    def note(self, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)

    def compare(self, name, mine, single, world, tol, blocks=None):
        """mine: per-rank results; single: the one-process result (values
        and grads with respect to the global tensors); blocks: for each
        differentiated input, None (replicated: compare the mean of the
        shares) or the rank offsets of its rows."""
        for t, value in enumerate(single["values"]):
            for g in mine:
                self.assertTrue(torch.equal(g["values"][t],
                                            mine[0]["values"][t]))
                for v in (g["values"][t], g["tuple_values"][t]):
                    self.assertEqual(v.dim(), 0)
                    if value.dtype == torch.int64:
                        self.assertEqual(v.dtype, torch.int64)
                        self.assertEqual(v.item(), value.item())
                    else:
                        err = rel(v, value)
                        self.note(name + " value", err)
                        self.assertLess(err, tol)
            for a, whole in enumerate(single["grads"][t]):
                if whole is None:
                    continue
                starts = blocks[t][a]
                if starts is None:
                    err = rel(sum(g["grads"][t][a] for g in mine) / world,
                              whole)
                    self.note(name + " grad", err)
                    self.assertLess(err, tol)
                    continue
                for rank, g in enumerate(mine):
                    block = whole[starts[rank]:starts[rank + 1]]
                    err = rel(g["grads"][t][a] / world, block, whole)
                    self.note(name + " grad", err)
                    self.assertLess(err, tol)

    def compare_ranks(self, name, got, world, tol, replicated, terms=(0, 1)):
        """dloss on each rank against OpenCLIP on that rank."""
        refs = [g["ref"] for g in got]
        for t in terms:
            ref_mean = sum(r["values"][t] for r in refs) / world
            for g, ref in zip(got, refs):
                self.assertEqual(g["keys"], ref["keys"])
                err = rel(g["values"][t], ref_mean)
                self.note(name + " value", err)
                self.assertLess(err, tol)
                for a, theirs in enumerate(ref["grads"][t]):
                    if theirs is None:
                        # An input the term does not use (the teacher in
                        # the contrastive term): none in dloss either.
                        self.assertIsNone(g["grads"][t][a])
                        continue
                    whole = None if a in replicated[t] else torch.cat(
                        [r["grads"][t][a] for r in refs])
                    err = rel(g["grads"][t][a], theirs, whole)
                    self.note(name + " grad", err)
                    self.assertLess(err, tol)

    def check_distill(self, world):
        oc = upstream.open_clip_loss()
        cases = _distill_cases(world)
        per_rank = multiproc.run(world, _distill_rank, cases)
        for i, (sizes, dtype, seed, fuse, teacher_grad) in enumerate(cases):
            what = "world %d sizes %s %s fuse=%s teacher_grad=%s" % (
                world, sizes, dtype, fuse, teacher_grad)
            tol, name = TOL[dtype], str(dtype).replace("torch.", "")
            got = [r[i] for r in per_rank]
            single = run_distill(oc.DistillClipLoss(),
                                 distill_data(sizes, dtype, seed),
                                 teacher_grad)
            starts = offsets(sizes)
            layout = [starts, starts, None] + (
                [starts, starts, None] if teacher_grad else [])
            with self.subTest(what=what):
                for g in got:
                    self.assertEqual(g["keys"],
                                     ["contrastive_loss", "distill_loss"])
                self.compare("distill vs open_clip one process world=%d %s"
                             % (world, name), got, single, world, tol,
                             [layout, layout])
                if even(sizes):
                    self.compare_ranks(
                        "distill vs open_clip ranks world=%d %s" % (
                            world, name), got, world, tol, [{2, 5}, {2, 5}])

    def check_coca(self, world):
        oc = upstream.open_clip_loss()
        cases = _coca_cases(world)
        per_rank = multiproc.run(world, _coca_rank, cases)
        for i, (sizes, dtype, seed, fuse, pads, pad_id, weights) in \
                enumerate(cases):
            what = "world %d sizes %s %s fuse=%s pads=%s pad_id=%d %s" % (
                world, sizes, dtype, fuse, pads, pad_id, weights)
            tol, name = TOL[dtype], str(dtype).replace("torch.", "")
            got = [r[i] for r in per_rank]
            image, text, logits, labels, scale = coca_data(
                sizes, dtype, seed, pads, pad_id)
            single = run_coca(oc.CoCaLoss(*weights, pad_id=pad_id), image,
                              text, logits, labels, scale)
            starts = offsets(sizes)
            with self.subTest(what=what):
                for g in got:
                    self.assertEqual(g["keys"],
                                     ["caption_loss", "contrastive_loss"])
                self.compare("coca vs open_clip one process world=%d %s" % (
                    world, name), got, single, world, tol,
                    [[starts, starts, None], [starts]])
                if not even(sizes):
                    continue
                if pads == "same":
                    self.compare_ranks(
                        "coca vs open_clip ranks world=%d %s" % (world, name),
                        got, world, tol, [{2}, set()])
                else:
                    # Ranks with different numbers of tokens: OpenCLIP's
                    # mean of per-rank means is not the global token mean.
                    self.compare_ranks(
                        "coca vs open_clip ranks world=%d %s" % (world, name),
                        got, world, tol, [{2}, set()], terms=(0,))
                    ref_mean = sum(g["ref"]["values"][1] for g in got) / world
                    self.assertGreater(rel(got[0]["values"][1], ref_mean),
                                       1e-3)

    def test_distill_world_1(self):
        self.check_distill(1)

    def test_distill_world_2(self):
        self.check_distill(2)

    def test_distill_world_3(self):
        self.check_distill(3)

    def test_distill_world_4(self):
        self.check_distill(4)

    def test_coca_world_1(self):
        self.check_coca(1)

    def test_coca_world_2(self):
        self.check_coca(2)

    def test_coca_world_3(self):
        self.check_coca(3)

    def test_coca_world_4(self):
        self.check_coca(4)

    def test_signatures(self):
        """Every parameter of OpenCLIP's __init__ and forward is dloss's, in
        order, with OpenCLIP's default; dloss adds only these."""
        import dloss
        oc = upstream.open_clip_loss()
        extra = {
            "ClipLoss": (["group", "fuse", "schedule"], []),
            "SigLipLoss": (["chunk_size", "bidir", "use_horovod", "group",
                            "fuse", "schedule"], []),
            "DistillClipLoss": (["group", "fuse", "schedule"], []),
            "CoCaLoss": (["group", "fuse", "schedule"], []),
        }
        for cls, (init_extra, forward_extra) in extra.items():
            for method, added in (("__init__", init_extra),
                                  ("forward", forward_extra)):
                theirs = list(inspect.signature(
                    getattr(getattr(oc, cls), method)).parameters.values())
                mine = list(inspect.signature(
                    getattr(getattr(dloss, cls), method)).parameters.values())
                with self.subTest(cls=cls, method=method):
                    self.assertEqual(
                        [(p.name, p.kind, p.default) for p in theirs],
                        [(p.name, p.kind, p.default)
                         for p in mine[:len(theirs)]])
                    self.assertEqual([p.name for p in mine[len(theirs):]],
                                     added)

    def test_coca_bad_logits(self):
        import dloss
        with self.assertRaisesRegex(dloss.Error, r"\[batch, tokens, vocab\]"):
            dloss.CoCaLoss(1.0, 0.0)(None, None, torch.zeros(2, 3),
                                     torch.zeros(2, dtype=torch.long), 1.0)

    @classmethod
    def tearDownClass(cls):
        report("openclip", cls.worst)


if __name__ == "__main__":
    unittest.main()
