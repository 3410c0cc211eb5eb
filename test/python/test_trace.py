"""@dloss.loss: losses written in plain PyTorch (examples/python/*_loss.py),
each against its .mlir twin and against one process on the global batch in
eager torch, on 1-4 real Gloo ranks with uneven batches (an empty one
included), fused where the twin is fused; OpenCLIP's ClipLoss.forward pasted
with only the gather and the labels' offset changed; and every error the
front end raises, each naming the user's file and line."""

import math
import os
import sys
import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import offsets, rel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, os.path.join(EXAMPLES, "python"))

DIM, CLASSES = 6, 7
# Per-rank batch sizes: uneven, and at 4 ranks one rank holds no rows.
WORLDS = {1: [5], 2: [4, 2], 3: [4, 1, 6], 4: [3, 5, 0, 2]}
# Worst relative error allowed (float32, against float32 eager torch).
TOLERANCE = 2e-5


def open_clip_pasted():
    """OpenCLIP's ClipLoss.forward (local_loss=True, gather_with_grad=True)
    with its helpers inlined as a user pastes them; only the gather and the
    labels' offset are dloss's."""
    import dloss

    @dloss.loss
    def open_clip_loss(image_features, text_features, logit_scale):
        device = image_features.device
        # was: all_image_features, all_text_features = gather_features(...)
        all_image_features = dloss.all_gather(image_features)
        all_text_features = dloss.all_gather(text_features)
        logits_per_image = logit_scale * image_features @ all_text_features.T
        logits_per_text = logit_scale * text_features @ all_image_features.T
        num_logits = logits_per_image.shape[0]
        labels = torch.arange(num_logits, device=device, dtype=torch.long)
        # was: labels = labels + num_logits * self.rank
        labels = labels + dloss.shard_offset(image_features)
        total_loss = (
            F.cross_entropy(logits_per_image, labels) +
            F.cross_entropy(logits_per_text, labels)
        ) / 2
        return total_loss

    return open_clip_loss


def features_loss():
    """The other ops the issue lists, in one loss: logsumexp, exp/log,
    F.logsigmoid, max, where with an index mask, .float(), clamp/acos/cos,
    ** 2, gather/unsqueeze/squeeze, a 0-d divisor, all_reduce over a sum."""
    import dloss

    @dloss.loss
    def features(image, text, temperature):
        sim = image @ dloss.all_gather(text).T / temperature
        rows = torch.arange(image.shape[0]) + dloss.shard_offset(image)
        positive = sim.gather(1, rows.unsqueeze(1)).squeeze(1)
        cols = torch.arange(dloss.global_size(text))
        is_self = rows[:, None] == cols[None, :]
        hardest = torch.where(is_self, float("-inf"), sim).max(dim=1).values
        margin = F.logsigmoid(positive - hardest)
        lse = torch.logsumexp(sim, dim=1)
        spread = sim.exp().sum(1).log() - lse
        diagonal = (is_self.float() * sim).sum(1)
        bounded = torch.cos(torch.acos(positive.clamp(-0.999, 0.999)))
        return ((lse - positive).mean()
                - dloss.all_reduce(margin.sum(), "sum") /
                dloss.global_size(image)
                + (spread ** 2).mean() + ((diagonal - positive) ** 2).mean()
                + bounded.mean())

    return features


def global_inputs(case, batch):
    """The global batch of a case, the same in every process."""
    g = torch.Generator().manual_seed(11)
    features = [F.normalize(torch.randn(batch, DIM, generator=g), dim=1)
                for _ in range(2)]
    if case in ("clip", "open_clip"):
        return {"image": features[0], "text": features[1],
                "scale": torch.tensor(6.0)}
    if case == "features":
        return {"image": features[0], "text": features[1],
                "temperature": torch.tensor(0.5)}
    if case == "siglip":
        return {"image": features[0], "text": features[1],
                "log_t": torch.tensor(math.log(10.0)),
                "bias": torch.tensor(-3.0)}
    if case == "arcface":
        return {"embeddings": torch.randn(batch, DIM, generator=g),
                "labels": torch.randint(0, CLASSES, (batch,), generator=g),
                "weights": torch.randn(CLASSES, DIM, generator=g)}
    if case == "ntxent":
        return {"z1": torch.randn(batch, DIM, generator=g),
                "z2": torch.randn(batch, DIM, generator=g)}
    raise KeyError(case)


REPLICATED = {"scale", "log_t", "bias", "weights", "temperature"}


def reference(case, x):
    """The single-process loss on the global batch, in eager torch, as the
    original libraries write it."""
    if case in ("clip", "open_clip"):
        logits = x["scale"] * x["image"] @ x["text"].T
        labels = torch.arange(logits.shape[0])
        return (F.cross_entropy(logits, labels) +
                F.cross_entropy(logits.T, labels)) / 2
    if case == "siglip":  # OpenCLIP's SigLipLoss on one device
        logits = x["log_t"].exp() * x["image"] @ x["text"].T + x["bias"]
        n = logits.shape[0]
        labels = 2 * torch.eye(n) - torch.ones(n, n)
        return -F.logsigmoid(labels * logits).sum() / n
    if case == "arcface":
        cos = F.normalize(x["embeddings"]) @ F.normalize(x["weights"]).T
        target = cos.gather(1, x["labels"][:, None]).clamp(-0.9999999,
                                                           0.9999999)
        one_hot = F.one_hot(x["labels"], CLASSES).bool()
        logits = torch.where(one_hot, torch.cos(torch.acos(target) + 0.5),
                             cos)
        return F.cross_entropy(64.0 * logits, x["labels"])
    if case == "features":
        sim = x["image"] @ x["text"].T / x["temperature"]
        eye = torch.eye(sim.shape[0], dtype=torch.bool)
        positive = sim.diag()
        hardest = sim.masked_fill(eye, float("-inf")).max(dim=1).values
        lse = torch.logsumexp(sim, dim=1)
        spread = sim.exp().sum(1).log() - lse
        diagonal = (eye.float() * sim).sum(1)
        bounded = torch.cos(torch.acos(positive.clamp(-0.999, 0.999)))
        return ((lse - positive).mean()
                - F.logsigmoid(positive - hardest).mean()
                + (spread ** 2).mean() + ((diagonal - positive) ** 2).mean()
                + bounded.mean())
    if case == "ntxent":  # SimCLR on one device
        z = F.normalize(torch.cat([x["z1"], x["z2"]]), dim=1)
        n = x["z1"].shape[0]
        sim = (z @ z.T / 0.5).masked_fill(torch.eye(2 * n, dtype=torch.bool),
                                          float("-inf"))
        positives = torch.cat([torch.arange(n) + n, torch.arange(n)])
        return F.cross_entropy(sim, positives)
    raise KeyError(case)


def reference_grads(case, batch):
    x = {k: v.clone().requires_grad_(v.is_floating_point())
         for k, v in global_inputs(case, batch).items()}
    loss = reference(case, x)
    loss.backward()
    return loss.detach(), {k: v.grad for k, v in x.items()
                           if v.is_floating_point()}


def traced_losses():
    from arcface_loss import arcface_loss
    from clip_loss import clip_loss
    from ntxent_loss import ntxent_loss
    from siglip_loss import siglip_loss
    return {"clip": clip_loss, "siglip": siglip_loss,
            "arcface": arcface_loss, "ntxent": ntxent_loss,
            "open_clip": open_clip_pasted(), "features": features_loss()}


TWINS = {"clip": "clip.mlir", "siglip": "siglip.mlir",
         "arcface": "arcface.mlir", "ntxent": "ntxent.mlir",
         "open_clip": "clip.mlir", "features": None}
FUSED = {"clip": "dloss.ring_softmax_ce", "open_clip": "dloss.ring_softmax_ce",
         "siglip": "dloss.ring_sigmoid_pairs",
         "arcface": "dloss.fused_similarity",
         "ntxent": "dloss.fused_similarity"}


def run_rank(rank, world, sizes):
    """Every case on this rank, traced and twin: loss, gradients, fused
    ops."""
    import dloss
    starts = offsets(sizes)
    mine = slice(starts[rank], starts[rank + 1])
    out = {}
    for case, traced in traced_losses().items():
        x = global_inputs(case, sum(sizes))
        args = {k: v if k in REPLICATED else v[mine] for k, v in x.items()}
        kinds = [("traced", traced)]
        if TWINS[case]:
            kinds.append(("twin", dloss.compile(os.path.join(EXAMPLES,
                                                             TWINS[case]))))
        for kind, fn in kinds:
            inputs = {k: v.clone().requires_grad_(v.is_floating_point())
                      for k, v in args.items()}
            loss = fn(*inputs.values())
            loss.backward()
            compiled = fn.compiled(*inputs.values()) if kind == "traced" \
                else fn
            out[case, kind] = (loss.detach(),
                               {k: v.grad for k, v in inputs.items()
                                if v.is_floating_point()},
                               compiled.fused_ops())
    # dloss.compile(fn) is @dloss.loss; grad_mode="global" gives dF/dx_r and
    # the whole dF/dW on every rank (ArcFace's W kept outside DDP).
    fn = dloss.compile(traced_losses()["arcface"].fn, grad_mode="global")
    x = global_inputs("arcface", sum(sizes))
    emb = x["embeddings"][mine].clone().requires_grad_()
    w = x["weights"].clone().requires_grad_()
    loss = fn(emb, x["labels"][mine], w)
    loss.backward()
    out["arcface", "global"] = (loss.detach(), emb.grad, w.grad)
    return out


class TracedExamplesTest(unittest.TestCase):

    def check_world(self, world):
        sizes = WORLDS[world]
        ranks = multiproc.run(world, run_rank, sizes, timeout=300)
        starts = offsets(sizes)
        for case in TWINS:
            ref_loss, ref_grads = reference_grads(case, sum(sizes))
            worst = {"traced": 0.0, "twin": 0.0, "traced-twin": 0.0}
            twin = TWINS[case] is not None
            for kind in ("traced", "twin") if twin else ("traced",):
                shares = {}
                for r, out in enumerate(ranks):
                    loss, grads, fused = out[case, kind]
                    worst[kind] = max(worst[kind], rel(loss, ref_loss))
                    twin_loss, twin_grads, twin_fused = out[
                        case, "twin" if twin else "traced"]
                    worst["traced-twin"] = max(worst["traced-twin"],
                                               rel(loss, twin_loss))
                    for name, g in grads.items():
                        worst["traced-twin"] = max(
                            worst["traced-twin"],
                            rel(g, twin_grads[name], twin_grads[name]))
                        if name in REPLICATED:
                            # ddp: each rank holds its share of N * dF/dW.
                            shares[name] = shares.get(name, 0) + g / world
                        else:
                            # ddp: rank r gets N * dF/dx_r.
                            whole = ref_grads[name]
                            block = whole[starts[r]:starts[r + 1]]
                            worst[kind] = max(worst[kind],
                                              rel(g / world, block, whole))
                    # Fused exactly where the twin is.
                    self.assertEqual(fused, twin_fused, (case, kind))
                    if case in FUSED:
                        self.assertIn(FUSED[case], fused, case)
                    else:
                        self.assertEqual(fused, [], case)
                for name, total in shares.items():
                    worst[kind] = max(worst[kind],
                                      rel(total, ref_grads[name]))
            print("METRIC trace case=%s world=%d sizes=%s "
                  "traced_vs_eager=%.3g%s" % (
                      case, world, sizes, worst["traced"],
                      " twin_vs_eager=%.3g traced_vs_twin=%.3g" % (
                          worst["twin"], worst["traced-twin"])
                      if twin else " (no twin)"), file=sys.stderr)
            for key, value in worst.items():
                self.assertLess(value, TOLERANCE, (case, world, key))
        ref_loss, ref_grads = reference_grads("arcface", sum(sizes))
        for r, out in enumerate(ranks):
            loss, emb_grad, w_grad = out["arcface", "global"]
            whole = ref_grads["embeddings"]
            self.assertLess(rel(loss, ref_loss), TOLERANCE)
            self.assertLess(rel(emb_grad, whole[starts[r]:starts[r + 1]],
                                whole), TOLERANCE)
            self.assertLess(rel(w_grad, ref_grads["weights"]), TOLERANCE)

    def test_world_1(self):
        self.check_world(1)

    def test_world_2(self):
        self.check_world(2)

    def test_world_3(self):
        self.check_world(3)

    def test_world_4_with_an_empty_rank(self):
        self.check_world(4)


def more_torch(x, y, w, tmp):
    """More of the supported torch, for one rank (where a per-rank program
    and one process agree): t/transpose/mm, log_softmax/softmax, keepdim,
    view, *_like, new_*, masks with & | ~ !=, slices, a 0-d torch constant,
    a branch on a fixed size, vectors broadcast against matrices."""
    n = x.shape[0]
    if x.shape[1] == DIM:  # fixed sizes are plain ints
        x = x * 1.0
    sim = x @ y.t() / tmp
    ls = F.log_softmax(sim, dim=1)
    sm = torch.softmax(x.mm(y.transpose(0, 1)), dim=1)
    centered = sim - sim.max(dim=1, keepdim=True).values
    labels = torch.arange(n)
    halves = torch.ones_like(sim) * 0.5 + torch.full_like(sim, 0.25)
    mask = labels[:, None] == torch.arange(y.shape[0])[None, :]
    both = (mask | ~mask) & mask
    picked = torch.where(both, centered, halves)
    differ = torch.where(mask != ~mask, 1.0, sim * 0).sum()
    return (ls.sum() + sm.sum() * torch.tensor(2.0) + picked.mean() +
            sim[1:3].sum() + sim.gather(1, labels.view(-1, 1)).sum() +
            differ + F.normalize(w, dim=1).sum() + (x ** 2).mean() +
            torch.clamp(sim, min=0.1).sum() + sim.square().sum() +
            # A vector against a matrix is a row, as in torch (sim is
            # square here, so a column would give another number).
            (sim - sim.logsumexp(1)).square().sum() +
            (x - x.sum(0)).square().mean() +
            # new_* of a size, in the source's dtype.
            (w.sum(0) * w.new_ones(DIM) + w.new_zeros(DIM) +
             w.new_full((DIM,), 0.5)).sum())


def run_more_torch(rank, world):
    import dloss

    @dloss.loss
    def more(x, y, w: dloss.Input(shape=(3, DIM), replicated=True), tmp):
        return dloss.all_reduce(more_torch(x, y, w, tmp), "sum")

    g = torch.Generator().manual_seed(5)
    values = [torch.randn(5, DIM, generator=g), torch.randn(5, DIM,
                                                             generator=g),
              torch.randn(3, DIM, generator=g), torch.tensor(0.7)]
    out = []
    for fn in (more, more_torch):
        inputs = [v.clone().requires_grad_() for v in values]
        loss = fn(*inputs)
        loss.backward()
        out.append((loss.detach(), [v.grad for v in inputs]))
    return out


class MoreTorchTest(unittest.TestCase):

    def test_more_torch_on_one_rank_matches_eager(self):
        (loss, grads), (ref, ref_grads) = multiproc.run(1, run_more_torch)[0]
        worst = max([rel(loss, ref)] + [rel(g, r) for g, r in
                                        zip(grads, ref_grads)])
        print("METRIC trace case=more_torch world=1 traced_vs_eager=%.3g" %
              worst, file=sys.stderr)
        self.assertLess(worst, TOLERANCE)


# ---------------------------------------------------------------------------
# .detach(): the value flows on, its gradient does not (dloss.stop_gradient).
# ---------------------------------------------------------------------------

def detached_eager(image, text, scale):
    """One process over the global batch: a hardness weighting computed from
    the detached logits (sentence-transformers' hardness modes), a centre
    of the batch that carries no gradient (DINO's), and a detached scale."""
    n = image.shape[0]
    sim = scale * image @ text.T
    weights = torch.softmax(sim.detach(), dim=1)
    labels = torch.arange(n)
    centre = image.mean(0).detach()
    spread = ((image - centre) ** 2).sum() / n
    return (F.cross_entropy(sim, labels) + (weights * sim).sum() / n +
            spread * scale.detach() + labels.detach().float().mean())


def run_detached(rank, world, sizes):
    import dloss

    @dloss.loss
    def detached(image, text, scale: dloss.Input(replicated=True)):
        n = dloss.global_size(image)
        sim = scale * image @ dloss.all_gather(text).T
        weights = torch.softmax(sim.detach(), dim=1)
        labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
        centre = (dloss.all_reduce(image.sum(0), "sum") / n).detach()
        spread = dloss.all_reduce(((image - centre) ** 2).sum(), "sum") / n
        ce = dloss.all_reduce(F.cross_entropy(sim, labels, reduction="sum"),
                              "sum") / n
        hard = dloss.all_reduce((weights * sim).sum(), "sum") / n
        mean_label = dloss.all_reduce(labels.detach().float().sum(),
                                      "sum") / n
        return ce + hard + spread * scale.detach() + mean_label

    starts = offsets(sizes)
    mine = slice(starts[rank], starts[rank + 1])
    g = torch.Generator().manual_seed(11)
    total = sum(sizes)
    image = F.normalize(torch.randn(total, DIM, generator=g), dim=1)
    text = F.normalize(torch.randn(total, DIM, generator=g), dim=1)
    inputs = [image[mine].clone().requires_grad_(),
              text[mine].clone().requires_grad_(),
              torch.tensor(3.0, requires_grad=True)]
    loss = detached(*inputs)
    loss.backward()
    return loss.detach(), [v.grad for v in inputs]


class DetachTest(unittest.TestCase):

    def check(self, world, sizes):
        g = torch.Generator().manual_seed(11)
        total = sum(sizes)
        image = F.normalize(torch.randn(total, DIM, generator=g), dim=1)
        text = F.normalize(torch.randn(total, DIM, generator=g), dim=1)
        ref_inputs = [image.requires_grad_(), text.requires_grad_(),
                      torch.tensor(3.0, requires_grad=True)]
        ref = detached_eager(*ref_inputs)
        ref.backward()
        # Had the detached terms their gradient, the text's and the scale's
        # would differ by this much (the check below can fail).
        starts = offsets(sizes)
        worst = 0.0
        scale_grad = 0.0
        for r, (loss, grads) in enumerate(
                multiproc.run(world, run_detached, sizes, timeout=300)):
            worst = max(worst, rel(loss, ref.detach()))
            for got, want in zip(grads[:2], ref_inputs[:2]):
                # ddp: rank r holds N * dF/dx_r.
                block = want.grad[starts[r]:starts[r + 1]]
                worst = max(worst, rel(got / world, block, want.grad))
            scale_grad = scale_grad + grads[2] / world
        worst = max(worst, rel(scale_grad, ref_inputs[2].grad))
        print("METRIC trace case=detach world=%d sizes=%s traced_vs_eager="
              "%.3g" % (world, sizes, worst), file=sys.stderr)
        self.assertLess(worst, TOLERANCE)

    def test_one_rank(self):
        self.check(1, [5])

    def test_three_uneven_ranks(self):
        self.check(3, [4, 1, 6])

    def test_the_detached_terms_change_the_gradients(self):
        # The eager loss without its detaches has other gradients, so a
        # stop_gradient that let the gradient through would fail check().
        g = torch.Generator().manual_seed(11)
        image = F.normalize(torch.randn(5, DIM, generator=g), dim=1)
        text = F.normalize(torch.randn(5, DIM, generator=g), dim=1)
        grads = []
        for detach in (True, False):
            inputs = [image.clone().requires_grad_(),
                      text.clone().requires_grad_(),
                      torch.tensor(3.0, requires_grad=True)]
            if detach:
                loss = detached_eager(*inputs)
            else:
                with _no_detach():
                    loss = detached_eager(*inputs)
            loss.backward()
            grads.append([v.grad for v in inputs])
        for with_detach, without in zip(*grads):
            self.assertGreater(rel(without, with_detach), 1e-2)


class _no_detach:
    """Makes torch.Tensor.detach the identity for a block."""

    def __enter__(self):
        self.saved = torch.Tensor.detach
        torch.Tensor.detach = lambda x: x

    def __exit__(self, *exc):
        torch.Tensor.detach = self.saved


# ---------------------------------------------------------------------------
# Errors: each bad loss below marks the line the message must name.
# ---------------------------------------------------------------------------

def bad_losses():
    import torch.distributed as dist

    import dloss

    def unsupported_op(image, text):
        sim = image @ dloss.all_gather(text).T
        top = torch.topk(sim, 2).values  # ERROR: unsupported
        return dloss.all_reduce(top.sum(), "sum")

    def control_flow(image, text):
        sim = image @ dloss.all_gather(text).T
        if sim.max() > 0:  # ERROR: control-flow
            sim = sim * 2
        return sim.mean()

    def rank_conditional_collective(image, text):
        total = (image * text).sum()
        if dloss.rank() == 0:  # ERROR: rank-condition
            total = dloss.all_reduce(total, "sum")  # COLLECTIVE: rank-condition
        return total

    def varying_result(image, text):
        labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
        logits = image @ dloss.all_gather(text).T
        return F.cross_entropy(logits, labels, reduction="sum")  # ERROR: varying

    def seeds_gather(image, text):
        gathered = [torch.zeros_like(text) for _ in range(2)]
        dist.all_gather(gathered, text)  # ERROR: seeds-gather
        return (image @ torch.cat(gathered).T).mean()

    def seeds_labels(image, text):
        n = image.shape[0]
        labels = torch.arange(n) + n * dist.get_rank()  # ERROR: seeds-labels
        logits = image @ dloss.all_gather(text).T
        return F.cross_entropy(logits, labels)

    def rank_times_size(image, text):
        n = image.shape[0]
        labels = torch.arange(n) + n * dloss.rank()  # ERROR: rank-times-size
        logits = image @ dloss.all_gather(text).T
        return F.cross_entropy(logits, labels)

    def local_statistic(image, text):
        # Barlow Twins' cross-correlation pasted without its all_reduce.
        c = image.T @ text / image.shape[0]  # ERROR: local-statistic
        return (c ** 2).sum()

    def no_grad_block(image, text):
        with torch.no_grad():
            centre = image.mean(0)  # ERROR: no-grad
        return ((image - centre) ** 2).mean()

    return {name: fn for name, fn in locals().items() if callable(fn) and
            name not in ("dist", "dloss")}


# What each message must say besides the file and line.
EXPECTED = {
    "unsupported": ["torch.topk", "not supported", "Supported:",
                    "cross_entropy"],
    "control-flow": ["Python control flow", "torch.where"],
    "rank-condition": ["depends on the rank", "all_reduce", "hangs"],
    "varying": ["varies across ranks", "sums over this rank's rows only",
                "all_reduce is missing"],
    "seeds-gather": ["torch.distributed.all_gather", "dloss.all_gather(x)"],
    "seeds-labels": ["torch.distributed.get_rank()", "shard_offset"],
    "rank-times-size": ["multiplies a batch size by the rank",
                        "dloss.shard_offset(x)"],
    "local-statistic": ["varies across ranks",
                        "sums over this rank's rows only",
                        "all_reduce is missing"],
    "no-grad": ["torch.no_grad()", "would still pass gradients",
                ".detach()"],
}
CASES = {"unsupported_op": "unsupported", "control_flow": "control-flow",
         "rank_conditional_collective": "rank-condition",
         "varying_result": "varying", "seeds_gather": "seeds-gather",
         "seeds_labels": "seeds-labels", "rank_times_size": "rank-times-size",
         "no_grad_block": "no-grad", "local_statistic": "local-statistic"}


def marked_line(marker):
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker) and "MARK" not in text:
                return number
    raise AssertionError("no line marked " + marker)


def trace_errors(rank, world):
    """Each bad loss's message (dloss.Error's str) on this rank."""
    import dloss
    image, text = torch.randn(3, DIM), torch.randn(3, DIM)
    messages = {}
    for name, fn in bad_losses().items():
        try:
            dloss.loss(fn)(image, text)
            messages[name] = None
        except dloss.Error as e:
            messages[name] = ("dloss.Error", str(e))
        except Exception as e:  # noqa: B902 - reported as a failure
            messages[name] = (type(e).__name__, str(e))
    return messages


class TraceErrorTest(unittest.TestCase):

    def test_errors_name_the_users_line_and_what_to_write(self):
        # Two ranks: the rank-dependent ones must fail the same way on both.
        for messages in multiproc.run(2, trace_errors):
            for name, key in CASES.items():
                self.assertIsNotNone(messages[name], name + " raised nothing")
                kind, text = messages[name]
                self.assertEqual(kind, "dloss.Error", "%s: %s" % (name, text))
                where = "%s:%d" % (__file__, marked_line("ERROR: " + key))
                self.assertIn(where, text, name)
                for words in EXPECTED[key]:
                    self.assertIn(words, text, name)
            # The collective inside the rank-dependent branch is named too.
            self.assertIn(":%d" % marked_line("COLLECTIVE: rank-condition"),
                          messages["rank_conditional_collective"][1])


if __name__ == "__main__":
    unittest.main()
