#!/usr/bin/env python3
"""Trains a small classifier with DDP and dloss.ArcFaceLoss, its W outside DDP.

    python3 launch.py --nproc 4 train_arcface.py
    torchrun --nproc_per_node 4 train_arcface.py    # the same

ArcFace's class weights W belong to the loss, not to the model: DDP does not
see them. The ranks train on uneven batches of a synthetic dataset. Three
trainings start from the same parameters and see the same samples:

1. dloss: the backbone in DDP, ``loss_fn = dloss.ArcFaceLoss(...)``, one
   optimizer over both. The loss is the ArcFace loss of the global batch,
   and W gets the global gradient on every rank, so it stays identical.
2. hand-written: pytorch-metric-learning's ArcFace, per rank, W outside DDP
   as in run 1: each rank's W follows its own batches.
3. one process (rank 0 only): the same ArcFace on the concatenated global
   batch. Training 1 must end with the same parameters (backbone and W);
   the script prints the largest difference, PASS or FAIL, and exits
   non-zero on FAIL.

It saves the loss curves and the distance from run 3 in
OUT/loss_arcface.png. The part a training script needs is `Backbone`,
`train` and run 1 in `main`; the rest is the demonstration.
"""

import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import dloss

import demo_utils

NUM_SAMPLES, IN_DIM, HIDDEN, EMBED_DIM, NUM_CLASSES = 1000, 32, 64, 16, 10
LEARNING_RATE, MOMENTUM = 0.01, 0.9


class Backbone(nn.Module):
    """A small MLP from inputs to embeddings."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.GELU(),
                                    nn.Linear(HIDDEN, EMBED_DIM))

    def forward(self, x):
        return self.layers(x)


def train(model, loss_fn, batches, on_step, check_synced=True):
    """The training loop: SGD with momentum over the backbone's and the
    loss's parameters; `batches` holds this rank's (inputs, labels) per
    step."""
    parameters = list(model.parameters()) + list(loss_fn.parameters())
    optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE,
                                momentum=MOMENTUM)
    for step, (inputs, labels) in enumerate(batches):
        start = time.perf_counter()
        loss = loss_fn(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        if step == 0 and check_synced:
            # W is outside DDP: check once that every rank got the same
            # gradient (raises dloss.Error on every rank if not).
            dloss.assert_grads_synced(loss_fn)
        optimizer.step()
        on_step(step, loss.item(), time.perf_counter() - start)


def synthetic_classes(num_samples, seed=0):
    """(inputs, labels): noisy points around one centre per class."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(NUM_CLASSES, IN_DIM, generator=g)
    labels = torch.randint(NUM_CLASSES, (num_samples,), generator=g)
    inputs = centres[labels] + torch.randn(num_samples, IN_DIM, generator=g)
    return inputs, labels


class PMLArcFaceLoss(nn.Module):
    """pytorch-metric-learning's ArcFaceLoss, written out in torch: W of
    shape [embedding_size, num_classes], margin in degrees, the target
    logit cos(theta + m), or cos(theta) - m sin(m) past theta = pi - m,
    all logits scaled, mean cross-entropy over the batch it is given."""

    def __init__(self, num_classes, embedding_size, margin=28.6, scale=64):
        super().__init__()
        self.margin, self.scale = math.radians(margin), scale
        self.W = nn.Parameter(torch.empty(embedding_size, num_classes))
        nn.init.normal_(self.W)  # As PML and dloss.ArcFaceLoss.

    def forward(self, embeddings, labels):
        cosine = F.normalize(embeddings, dim=1) @ F.normalize(self.W, dim=0)
        target = cosine.gather(1, labels[:, None])
        angles = torch.acos(target.clamp(-1, 1))
        target = torch.where(angles <= math.pi - self.margin,
                             torch.cos(angles + self.margin),
                             torch.cos(angles) -
                             self.margin * math.sin(self.margin))
        logits = self.scale * cosine.scatter(1, labels[:, None], target)
        return F.cross_entropy(logits, labels)


def spread_across_ranks(tensor):
    """The largest difference between this tensor on rank 0 and on any
    other rank."""
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, tensor.detach().contiguous())
    return max(float((c - copies[0]).abs().max()) for c in copies)


def main():
    args = demo_utils.arguments(__doc__.split("\n")[0])
    # torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE.
    rank, world = dloss.init()
    torch.set_num_threads(1)

    inputs, labels = synthetic_classes(NUM_SAMPLES)
    schedule = demo_utils.batch_schedule(NUM_SAMPLES, world, args.batch,
                                         args.steps, seed=1)
    my_batches = [(inputs[step[rank]], labels[step[rank]])
                  for step in schedule]

    # 3. One process on the concatenated global batch (rank 0 only): the
    # parameters that run 1 must reach.
    reference = None
    if rank == 0:
        torch.manual_seed(0)
        model = Backbone()
        loss_fn = PMLArcFaceLoss(NUM_CLASSES, EMBED_DIM)
        reference = demo_utils.Recorder(
            "one process", list(model.parameters()) + [loss_fn.W], schedule)
        global_batches = [(inputs[torch.cat(step)], labels[torch.cat(step)])
                          for step in schedule]
        train(model, loss_fn, global_batches, reference, check_synced=False)

    # 1. dloss: the backbone in DDP, W not.
    torch.manual_seed(0)
    model = DDP(Backbone())
    loss_fn = dloss.ArcFaceLoss(num_classes=NUM_CLASSES,
                                embedding_size=EMBED_DIM)
    exact = demo_utils.Recorder("arcface, dloss",
                                list(model.parameters()) + [loss_fn.W],
                                schedule, reference)
    train(model, loss_fn, my_batches, exact)
    exact_spread = spread_across_ranks(loss_fn.W)

    # 2. Hand-written: PML's ArcFace on each rank's own batch, W not in DDP.
    torch.manual_seed(0)
    model = DDP(Backbone())
    pml_loss = PMLArcFaceLoss(NUM_CLASSES, EMBED_DIM)
    by_hand = demo_utils.Recorder("arcface, hand-written",
                                  list(model.parameters()) + [pml_loss.W],
                                  schedule, reference, every=5)
    train(model, pml_loss, my_batches, by_hand, check_synced=False)
    hand_spread = spread_across_ranks(pml_loss.W)
    try:
        # The last step's gradients are still there.
        dloss.assert_grads_synced(pml_loss)
        caught = "no error"
    except dloss.Error as e:
        caught = str(e)

    if rank != 0:
        return 0
    demo_utils.timing_note(schedule, world)
    print("dloss.assert_grads_synced on the hand-written loss: " + caught)
    path = "%s/loss_arcface.png" % args.out
    demo_utils.plot(path, "ArcFace, %d ranks" % world, len(schedule),
                    {"dloss.ArcFaceLoss (global loss)": exact.losses,
                     "one process": reference.losses,
                     "hand-written (rank 0's loss)": by_hand.losses},
                    {"dloss.ArcFaceLoss": exact.diffs,
                     "hand-written": by_hand.diffs})
    ok = exact.diffs[-1] <= args.tolerance and exact_spread == 0
    print("ArcFace, %d steps on %d ranks: max |param - single-process "
          "param| (backbone and W) dloss %.2e, hand-written %.2e" %
          (len(schedule), world, exact.diffs[-1], by_hand.diffs[-1]))
    print("ArcFace W (outside DDP), max difference between ranks: dloss "
          "%.2e, hand-written %.2e" % (exact_spread, hand_spread))
    print("plot: %s" % path)
    print("ArcFace check (dloss equals one process within %.0e, W identical "
          "on every rank): %s" % (args.tolerance, "PASS" if ok else "FAIL"),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
