"""The fused ops' two schedules, "ring" and "gather", and "auto", which
chooses between them per call: the setting of one loss (``schedule=``), of
the process (``dloss.set_schedule``, ``DLOSS_SCHEDULE``), and the preflight's
check that every rank runs with the same one. On real Gloo ranks.

- dloss.ClipLoss, SigLipLoss, ArcFaceLoss (W replicated) and NTXentLoss on 2
  and 3 ranks with uneven batches (a rank with one row; on 3 ranks, one with
  none), float64, default and 2 x 3 tiles, with schedule "ring", "gather"
  and "auto": the value and every gradient agree across the schedules within
  1e-10 relative (the gather visits the chunks and merges the carries in the
  ring's order), and with the original (OpenCLIP's and PML's classes,
  test/python/upstream.py) run on one process over the concatenated global
  batch: rank r's feature gradient / N is the reference's block (the ddp
  contract), the replicated scalars' per-rank shares sum to N times theirs,
  and ArcFace's W gets the global gradient on every rank. Which schedule ran
  shows in the number of dloss collectives a call starts (the ring is one
  exchange per pass, the gather an all-gather and, where the pass has column
  carries and does not gather both sides, an exchange of them; the loss's
  all-reduce rides on the call's next all-gather): for the three losses
  whose fused op passes
  columns between ranks, "ring" and "gather" start different numbers, and
  "auto" starts the gather's (these batches are far below
  dloss._C.gather_crossover_bytes).
- Ranks with different settings (rank 0 ring, rank 1 gather), through every
  way a loss is made (each drop-in, DistributedLossWrapper, dloss.compile of
  a graph, of a .mlir file and of a function, @dloss.loss,
  sentence-transformers' losses), and through dloss.set_schedule: the same
  dloss.Error on every rank, naming "different schedule settings" and each
  rank's setting, and no rank hangs (multiproc fails a rank that does); the
  group then runs a call with equal settings. A loss's own setting wins
  over differing process defaults.
- dloss.set_schedule / dloss.get_schedule round trip; DLOSS_SCHEDULE in
  the ranks' environment is the process default (a bad value raises
  dloss.Error naming it on every rank); a bad name (set_schedule("fast"),
  ClipLoss(schedule="fast"), ...) raises dloss.Error where it is given.
"""

import os
import unittest

import torch
import torch.nn.functional as F

import multiproc
import upstream
from loss_reference import TOL, fusion, offsets, rel, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CLIP_MLIR = os.path.join(ROOT, "examples", "clip.mlir")

DIM, CLASSES = 8, 5
# Per world size: the per-rank batches: a rank with a single row, and on 3
# ranks one with none (its chunk, empty, still travels).
SIZES = {2: [3, 1], 3: [3, 0, 1]}
SCHEDULES = ("ring", "gather", "auto")
# The fused kernels' tiles (loss_reference.fusion): the default one, and
# 2 x 3, so that a chunk spans several tiles.
TILES = (True, "2x3")
LOSSES = ("ClipLoss", "SigLipLoss", "ArcFaceLoss", "NTXentLoss")
# The losses whose fused op passes column chunks between ranks, where the
# schedule shows in the number of collectives. ArcFace's classes (W) are
# replicated: its fused op scores each rank's rows against every class where
# they are, so ring and gather run the same steps.
PASSES_COLUMNS = ("ClipLoss", "SigLipLoss", "NTXentLoss")
# Fused passes of one call and its backward (a forward and a backward per
# fused op; NT-Xent's plan has two), and the dloss collectives they make
# under the gather schedule.
PASSES = {"ClipLoss": 2, "SigLipLoss": 2, "NTXentLoss": 4}
GATHER_COLLECTIVES = {"ClipLoss": 3, "SigLipLoss": 3, "NTXentLoss": 6}
# Backward passes that read the similarity their forward kept
# (fused::keepSimilarity: CLIP's and SigLIP's, at these sizes under every
# schedule; NT-Xent's general op keeps none).
KEPT = {"ClipLoss": 1, "SigLipLoss": 1}
# The losses whose first fused op gathers the call's own arguments, which the
# preflight then carries when the call before made room (a gather call: the
# calls run ring, gather, auto, so auto's preflight folds the gather in).
# NT-Xent's op gathers the normalised rows, computed after the preflight.
FOLDS = ("ClipLoss", "SigLipLoss")
# How each gradient compares with the one-process reference: "rows" (the
# ddp contract: rank r's gradient / N is the reference's block of its rows),
# "shares" (a replicated scalar: the ranks' shares sum to N times the
# reference) or "global" (every rank holds the reference gradient).
CONTRACT = {"x": "rows", "y": "rows", "scale": "shares", "bias": "shares",
            "W": "global"}
# The cross-schedule tolerance: the one-sided gather sums in the ring's
# order; CLIP's and SigLIP's gather of both sides sums a column's terms over
# the gathered rows, in another order, to rounding (1e-16 in float64).
SAME = 1e-10


def global_data(sizes, seed):
    """Every input of the four losses over the global batch, float64."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = F.normalize(torch.randn(total, DIM, generator=g, dtype=torch.float64))
    y = F.normalize(torch.randn(total, DIM, generator=g, dtype=torch.float64))
    # A few positives made similar, so that SigLIP's logits take both signs.
    y[:total // 2] = F.normalize(y[:total // 2] + 2 * x[:total // 2])
    return dict(
        x=x, y=y,
        scale=torch.tensor(7.5, dtype=torch.float64),
        bias=torch.tensor(-4.0, dtype=torch.float64),
        W=torch.randn(DIM, CLASSES, generator=g, dtype=torch.float64),
        classes=torch.randint(0, CLASSES, (total,), generator=g),
        # Positives across ranks, every row with one.
        pairs=torch.arange(total) % 2)


def _leaves(data, names, rows):
    """Fresh leaves of `names`, requiring grad: features cut to `rows`."""
    return {name: (data[name][rows] if CONTRACT[name] == "rows"
                   else data[name]).clone().requires_grad_()
            for name in names}


def dloss_call(name, schedule, data, rows):
    """(the loss dloss.<name> returns on this rank's `rows`, its leaves)."""
    import dloss
    if name == "ClipLoss":
        v = _leaves(data, ("x", "y", "scale"), rows)
        return dloss.ClipLoss(schedule=schedule)(v["x"], v["y"],
                                                 v["scale"]), v
    if name == "SigLipLoss":
        v = _leaves(data, ("x", "y", "scale", "bias"), rows)
        return dloss.SigLipLoss(schedule=schedule)(
            v["x"], v["y"], v["scale"], v["bias"]), v
    if name == "ArcFaceLoss":
        fn = dloss.ArcFaceLoss(CLASSES, DIM, schedule=schedule).double()
        fn.load_state_dict({"W": data["W"]})
        v = _leaves(data, ("x",), rows)
        loss = fn(v["x"], data["classes"][rows])
        v["W"] = fn.W
        return loss, v
    v = _leaves(data, ("x",), rows)
    return dloss.NTXentLoss(schedule=schedule)(v["x"],
                                               data["pairs"][rows]), v


def reference(name, data):
    """(value, {leaf: gradient}) of the original loss on one process over
    the global batch."""
    if name in ("ClipLoss", "SigLipLoss"):
        oc = upstream.open_clip_loss()
        names = ("x", "y", "scale") + (("bias",) if name == "SigLipLoss"
                                       else ())
        v = _leaves(data, names, slice(None))
        loss = getattr(oc, name)()(*(v[n] for n in names))
    elif name == "ArcFaceLoss":
        fn = upstream.pml().losses.ArcFaceLoss(CLASSES, DIM).double()
        fn.load_state_dict({"W": data["W"]})
        v = _leaves(data, ("x",), slice(None))
        loss = fn(v["x"], data["classes"])
        v["W"] = fn.W
    else:
        v = _leaves(data, ("x",), slice(None))
        loss = upstream.pml().losses.NTXentLoss()(v["x"], data["pairs"])
    loss.backward()
    return loss.detach(), {n: t.grad for n, t in v.items()}


def _schedules_rank(rank, world, sizes, seed):
    """Each loss, tile and schedule on this rank: value, gradients, the
    number of dloss collectives the call started and the fused passes it ran
    as the ring and as the gather."""
    import dloss
    from dloss.group import communicator
    comm = communicator()
    lo = offsets(sizes)[rank]
    rows = slice(lo, lo + sizes[rank])
    data = global_data(sizes, seed)
    out = {}
    for name in LOSSES:
        for tile in TILES:
            for schedule in SCHEDULES:
                before = comm.collectives_started
                passes = dloss._C.fused_passes()
                with fusion(tile):
                    loss, leaves = dloss_call(name, schedule, data, rows)
                    loss.backward()
                after = dloss._C.fused_passes()
                out[(name, tile, schedule)] = dict(
                    collectives=comm.collectives_started - before,
                    passes={k: after[k] - passes[k] for k in after},
                    loss=loss.detach(),
                    grads={n: t.grad for n, t in leaves.items()})
    return out


def _clip(image, text, scale):
    """CLIP as @dloss.loss records it (dloss/trace.py)."""
    import dloss
    image_all, text_all = dloss.all_gather(image), dloss.all_gather(text)
    labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
    return (F.cross_entropy(scale * image @ text_all.T, labels) +
            F.cross_entropy(scale * text @ image_all.T, labels)) / 2


def _made_with(rank, schedule):
    """{label: a call of a loss made with `schedule`, by every way there is
    to make one, on this rank's inputs}."""
    import dloss
    from dloss import sentence_transformers as dst
    data = global_data(SIZES[2], 5)
    lo = offsets(SIZES[2])[rank]
    rows = slice(lo, lo + SIZES[2][rank])
    x, y, s, b = data["x"][rows], data["y"][rows], data["scale"], data["bias"]
    n = x.shape[0]
    classes, pairs = data["classes"][rows], data["pairs"][rows]
    f32 = (x.float(), y.float(), s.float())
    pml = upstream.pml().losses
    arcface = dloss.CombinedMarginLoss(64, 1.0, 0.5, 0.0)
    kw = dict(schedule=schedule)
    # The cached losses look at the model's first module; no model is run.
    model = torch.nn.Sequential(torch.nn.Identity())
    return {
        "ClipLoss": lambda: dloss.ClipLoss(**kw)(x, y, s),
        "SigLipLoss": lambda: dloss.SigLipLoss(**kw)(x, y, s, b),
        "DistillClipLoss": lambda: dloss.DistillClipLoss(**kw)(
            x, y, s, x, y, s),
        "CoCaLoss": lambda: dloss.CoCaLoss(1.0, 1.0, **kw)(
            x, y, torch.randn(n, 2, 4, dtype=x.dtype),
            torch.zeros(n, 2, dtype=torch.long), s),
        "ArcFaceLoss": lambda: dloss.ArcFaceLoss(
            CLASSES, DIM, **kw).double()(x, classes),
        "CosFaceLoss": lambda: dloss.CosFaceLoss(
            CLASSES, DIM, **kw).double()(x, classes),
        "PartialFC": lambda: dloss.PartialFC(
            DIM, CLASSES, margin_loss=arcface, **kw).double()(x, classes),
        "NTXentLoss": lambda: dloss.NTXentLoss(**kw)(x, pairs),
        "SupConLoss": lambda: dloss.SupConLoss(**kw)(x, pairs),
        "DistributedLossWrapper": lambda: dloss.DistributedLossWrapper(
            pml.NTXentLoss(), **kw)(x, pairs),
        "compile(graph)": lambda: dloss.compile(dloss._C.clip_graph(
            -1, dloss._C.DType.f64, dloss._C.GradMode.ddp), **kw)(x, y, s),
        "compile(.mlir)": lambda: dloss.compile(CLIP_MLIR, **kw)(*f32),
        "compile(function)": lambda: dloss.compile(_clip, **kw)(x, y, s),
        "@dloss.loss": lambda: dloss.loss(**kw)(_clip)(x, y, s),
        "MultipleNegativesRankingLoss":
            lambda: dst.MultipleNegativesRankingLoss(
                None, gather_across_devices=True,
                **kw).compute_loss_from_embeddings([x, y]),
        "MultipleNegativesSymmetricRankingLoss":
            lambda: dst.MultipleNegativesSymmetricRankingLoss(
                None, gather_across_devices=True,
                **kw).compute_loss_from_embeddings([x, y]),
        "CachedMultipleNegativesRankingLoss":
            lambda: dst.CachedMultipleNegativesRankingLoss(
                model, gather_across_devices=True, **kw).calculate_loss(
                    [[x], [y]]),
        "CachedMultipleNegativesSymmetricRankingLoss":
            lambda: dst.CachedMultipleNegativesSymmetricRankingLoss(
                model, gather_across_devices=True, **kw).calculate_loss(
                    [[x], [y]]),
    }


def _mismatch_rank(rank, world):
    """What each call did (multiproc.outcome: the error's text, or None)
    with rank 0 ring and rank 1 gather, then with other settings."""
    import warnings

    import dloss
    warnings.simplefilter("ignore", DeprecationWarning)  # the Symmetric ones
    mine = ("ring", "gather")[rank]
    out = {label: multiproc.outcome(call)
           for label, call in _made_with(rank, mine).items()}
    # The settings must agree, not only the choices auto makes: at this size
    # auto runs the gather.
    clip = _made_with(rank, ("auto", "gather")[rank])["ClipLoss"]
    out["auto vs gather"] = multiproc.outcome(clip)
    # The process defaults, for losses that follow them.
    dloss.set_schedule(mine)
    out["set_schedule"] = multiproc.outcome(
        _made_with(rank, None)["ClipLoss"])
    # A loss's own setting wins over the differing defaults.
    out["own setting"] = multiproc.outcome(
        _made_with(rank, "gather")["ClipLoss"])
    # The group still runs a call whose settings agree.
    dloss.set_schedule("ring")
    out["agreed default"] = multiproc.outcome(
        _made_with(rank, None)["NTXentLoss"])
    return out


def _count(schedule):
    """The dloss collectives one ClipLoss call and its backward start."""
    import dloss
    from dloss.group import communicator
    data = global_data(SIZES[2], 9)
    rank = communicator().rank
    lo = offsets(SIZES[2])[rank]
    rows = slice(lo, lo + SIZES[2][rank])
    before = communicator().collectives_started
    loss, _ = dloss_call("ClipLoss", schedule, data, rows)
    loss.backward()
    return communicator().collectives_started - before


def _environment_rank(rank, world):
    """The default the rank started with (DLOSS_SCHEDULE), and the
    collectives of ClipLoss calls under it and under dloss.set_schedule."""
    import dloss
    got = {"default": dloss.get_schedule()}
    for schedule in (None, "ring", "gather"):
        got[schedule] = _count(schedule)
    dloss.set_schedule("ring")
    got["set"] = dloss.get_schedule()
    got["None after set"] = _count(None)
    return got


def _bad_environment_rank(rank, world):
    import dloss
    return (multiproc.outcome(dloss.get_schedule),
            multiproc.outcome(lambda: _count(None)))


class _Environment:
    """DLOSS_SCHEDULE set to `value` (None: unset) for the ranks started in
    the body (multiproc passes them the caller's environment)."""

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.old = os.environ.get("DLOSS_SCHEDULE")
        if self.value is None:
            os.environ.pop("DLOSS_SCHEDULE", None)
        else:
            os.environ["DLOSS_SCHEDULE"] = self.value

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("DLOSS_SCHEDULE", None)
        else:
            os.environ["DLOSS_SCHEDULE"] = self.old


class ScheduleTest(unittest.TestCase):
    worst = {}

    def note(self, key, err):
        self.worst[key] = max(self.worst.get(key, 0.0), err)

    def check_world(self, world):
        import dloss
        sizes = SIZES[world]
        seed = 40 + world
        data = global_data(sizes, seed)
        # Every operand of these batches is far below the size up to which
        # auto gathers: auto must run the gather.
        self.assertGreater(dloss._C.gather_crossover_bytes(world),
                           100 * 8 * sum(sizes) * (2 * DIM + 2))
        with _Environment(None):
            per_rank = multiproc.run(world, _schedules_rank, sizes, seed)
        for name in LOSSES:
            value, grads = reference(name, data)
            for tile in TILES:
                runs = {s: [r[(name, tile, s)] for r in per_rank]
                        for s in SCHEDULES}
                what = "%s world %d sizes %s tile %s" % (name, world, sizes,
                                                         tile)
                self.check_schedules_agree(what, runs)
                for schedule in SCHEDULES:
                    self.check_reference(what + " " + schedule, world,
                                         sizes, runs[schedule], value, grads)
                counts = {s: [g["collectives"] for g in runs[s]]
                          for s in SCHEDULES}
                passes = {s: [g["passes"] for g in runs[s]]
                          for s in SCHEDULES}
                for rank in range(world) if name in PASSES_COLUMNS else ():
                    with self.subTest(what=what, rank=rank,
                                      collectives=counts, passes=passes):
                        # Every pass as scheduled; auto gathers at these
                        # sizes.
                        kept = KEPT.get(name, 0)
                        self.assertEqual(passes["ring"][rank],
                                         {"ring": PASSES[name], "gather": 0,
                                          "kept": kept})
                        self.assertEqual(passes["gather"][rank],
                                         {"ring": 0, "gather": PASSES[name],
                                          "kept": kept})
                        self.assertEqual(passes["auto"][rank],
                                         passes["gather"][rank])
                        self.assertEqual(counts["auto"][rank],
                                         counts["gather"][rank]
                                         - (name in FOLDS))
                        # The gather's collectives. CLIP and SigLIP (the
                        # gather of both sides): the preflight, the
                        # forward's gather and the backward's gather of
                        # every row's and column's statistics, cotangents
                        # and targets, which also carries the loss's
                        # deferred all-reduce; nothing travels home.
                        # The ring call before it left the preflight no
                        # room to carry the gather's rows.
                        # NT-Xent (one side): the preflight, the forward's
                        # gather and its carries' exchange, the loss's
                        # all-reduce, the backward's exchange; its second
                        # op reuses the first's columns and labels.
                        self.assertEqual(counts["gather"][rank],
                                         GATHER_COLLECTIVES[name])

    def check_schedules_agree(self, what, runs):
        for schedule in ("gather", "auto"):
            for rank, (got, ring) in enumerate(zip(runs[schedule],
                                                   runs["ring"])):
                with self.subTest(what=what, schedule=schedule, rank=rank):
                    pairs = [("loss", got["loss"], ring["loss"])] + [
                        (n, got["grads"][n], ring["grads"][n])
                        for n in ring["grads"]]
                    for part, mine, theirs in pairs:
                        err = rel(mine, theirs)
                        self.note("%s vs ring %s" % (schedule, part), err)
                        self.assertLess(err, SAME, part)

    def check_reference(self, what, world, sizes, got, value, grads):
        for rank, g in enumerate(got):
            with self.subTest(what=what, rank=rank):
                # The global loss, bit for bit the same on every rank.
                self.assertTrue(torch.equal(g["loss"], got[0]["loss"]))
                err = rel(g["loss"], value)
                self.note("vs original value", err)
                self.assertLess(err, TOL[torch.float64])
                lo, n = offsets(sizes)[rank], sizes[rank]
                for part, whole in grads.items():
                    if CONTRACT[part] == "rows":
                        err = rel(g["grads"][part] / world, whole[lo:lo + n],
                                  whole)
                    elif CONTRACT[part] == "global":
                        err = rel(g["grads"][part], whole)
                    else:
                        continue
                    self.note("vs original grad", err)
                    self.assertLess(err, TOL[torch.float64], part)
        for part, whole in grads.items():
            if CONTRACT[part] == "shares":
                with self.subTest(what=what, part=part):
                    err = rel(sum(g["grads"][part] for g in got) / world,
                              whole)
                    self.note("vs original grad", err)
                    self.assertLess(err, TOL[torch.float64])

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_mismatch_raises_on_every_rank(self):
        with _Environment(None):
            ranks = multiproc.run(2, _mismatch_rank, timeout=120)
        agreed = ("own setting", "agreed default")
        # Every way of making a loss (_made_with), then the process default.
        labels = [label for label in ranks[0] if label not in agreed]
        self.assertEqual(len(labels), 20, labels)
        settings = {"auto vs gather": ("auto", "gather")}
        for label in labels:
            first, second = settings.get(label, ("ring", "gather"))
            for rank, out in enumerate(ranks):
                with self.subTest(label=label, rank=rank):
                    text = out[label]
                    self.assertIsNotNone(text, "no error")
                    self.assertIn("ranks run with different schedule "
                                  "settings", text)
                    self.assertRegex(text, r"\brank 0 with %s\b" % first)
                    self.assertRegex(text, r"\brank 1 with %s\b" % second)
                    # The same text on every rank.
                    self.assertEqual(text, ranks[0][label])
        for label in agreed:
            for rank, out in enumerate(ranks):
                with self.subTest(label=label, rank=rank):
                    self.assertIsNone(out[label])

    def test_environment(self):
        with _Environment("gather"):
            ranks = multiproc.run(2, _environment_rank)
        for rank, got in enumerate(ranks):
            with self.subTest(rank=rank, got=got):
                self.assertEqual(got["default"], "gather")
                self.assertNotEqual(got["ring"], got["gather"])
                self.assertEqual(got[None], got["gather"])
                self.assertEqual(got["set"], "ring")
                self.assertEqual(got["None after set"], got["ring"])

    def test_bad_environment(self):
        with _Environment("fast"):
            ranks = multiproc.run(2, _bad_environment_rank)
        for rank, texts in enumerate(ranks):
            for text in texts:
                with self.subTest(rank=rank, text=text):
                    self.assertIsNotNone(text, "no error")
                    self.assertIn("DLOSS_SCHEDULE", text)
                    self.assertIn("'fast'", text)

    def test_set_and_get(self):
        import dloss
        start = dloss.get_schedule()
        try:
            for schedule in ("ring", "gather", "auto", "ring"):
                dloss.set_schedule(schedule)
                self.assertEqual(dloss.get_schedule(), schedule)
        finally:
            dloss.set_schedule(start)
        self.assertIn("set_schedule", dloss.__all__)
        self.assertIn("get_schedule", dloss.__all__)

    def test_bad_names(self):
        import dloss
        start = dloss.get_schedule()
        for bad in ("fast", "Ring", "", 1, None):
            with self.subTest(bad=bad):
                with self.assertRaises(dloss.Error) as caught:
                    dloss.set_schedule(bad)
                self.assertIn("dloss.set_schedule", caught.exception.problem)
                self.assertIn(repr(bad), caught.exception.problem)
                self.assertTrue(caught.exception.hint)
                self.assertEqual(dloss.get_schedule(), start)
        pml = upstream.pml().losses
        arcface = dloss.CombinedMarginLoss(64, 1.0, 0.5, 0.0)
        makers = {
            "dloss.ClipLoss": lambda s: dloss.ClipLoss(schedule=s),
            "dloss.SigLipLoss": lambda s: dloss.SigLipLoss(schedule=s),
            "dloss.DistillClipLoss": lambda s: dloss.DistillClipLoss(
                schedule=s),
            "dloss.CoCaLoss": lambda s: dloss.CoCaLoss(1.0, 1.0, schedule=s),
            "dloss.ArcFaceLoss": lambda s: dloss.ArcFaceLoss(
                CLASSES, DIM, schedule=s),
            "dloss.CosFaceLoss": lambda s: dloss.CosFaceLoss(
                CLASSES, DIM, schedule=s),
            "dloss.PartialFC": lambda s: dloss.PartialFC(
                DIM, CLASSES, margin_loss=arcface, schedule=s),
            "dloss.NTXentLoss": lambda s: dloss.NTXentLoss(schedule=s),
            "dloss.SupConLoss": lambda s: dloss.SupConLoss(schedule=s),
            "dloss.DistributedLossWrapper":
                lambda s: dloss.DistributedLossWrapper(pml.NTXentLoss(),
                                                       schedule=s),
            "dloss.compile": lambda s: dloss.compile(CLIP_MLIR, schedule=s),
            "dloss.loss": lambda s: dloss.loss(schedule=s),
        }
        for owner, make in makers.items():
            for bad in ("fast", "", 2):
                with self.subTest(owner=owner, bad=bad):
                    with self.assertRaises(dloss.Error) as caught:
                        make(bad)
                    problem = caught.exception.problem
                    self.assertTrue(problem.startswith(owner + ": schedule"),
                                    problem)
                    self.assertIn(repr(bad), problem)
                    self.assertIn("docs/Fusion.md", caught.exception.hint)

    @classmethod
    def tearDownClass(cls):
        report("schedule", cls.worst)


if __name__ == "__main__":
    unittest.main()
