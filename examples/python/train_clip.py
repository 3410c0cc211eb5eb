#!/usr/bin/env python3
"""Trains a small two-tower CLIP model with DDP and dloss.ClipLoss.

    python3 launch.py --nproc 4 train_clip.py
    torchrun --nproc_per_node 4 train_clip.py    # the same

The ranks train on uneven batches of a synthetic dataset (ranks hold
different numbers of samples at every step). Three trainings start from the
same parameters and see the same samples:

1. dloss: the model in DDP, ``loss_fn = dloss.ClipLoss()``. The loss is the
   CLIP loss of the global batch, exact for any per-rank sizes.
2. hand-written: the same, with the loss OpenCLIP-style code computes by
   hand (``torch.distributed.all_gather``, labels ``arange(n) + n * rank``).
3. one process (rank 0 only): the plain CLIP loss on the concatenated global
   batch. Training 1 must end with the same parameters; the script prints
   the largest difference, PASS or FAIL, and exits non-zero on FAIL.

It saves the loss curves and the distance from run 3 in
OUT/loss_clip.png. The part a training script needs is `TwoTower`, `train`
and run 1 in `main`; the rest is the demonstration.
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

NUM_SAMPLES, IN_DIM, HIDDEN, EMBED_DIM = 1000, 32, 64, 16
LEARNING_RATE, MOMENTUM = 0.01, 0.9


class TwoTower(nn.Module):
    """An image tower and a text tower, each a small MLP, and OpenCLIP's
    learnable temperature."""

    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.GELU(),
                                   nn.Linear(HIDDEN, EMBED_DIM))
        self.text = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.GELU(),
                                  nn.Linear(HIDDEN, EMBED_DIM))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, texts):
        return (F.normalize(self.image(images), dim=-1),
                F.normalize(self.text(texts), dim=-1),
                self.logit_scale.exp())


def train(model, loss_fn, batches, on_step):
    """The training loop: SGD with momentum over `batches`, this rank's
    (images, texts) per step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE,
                                momentum=MOMENTUM)
    for step, (images, texts) in enumerate(batches):
        start = time.perf_counter()
        image_features, text_features, logit_scale = model(images, texts)
        loss = loss_fn(image_features, text_features, logit_scale)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        on_step(step, loss.item(), time.perf_counter() - start)


def synthetic_pairs(num_samples, seed=0):
    """(images, texts): two noisy views of a shared 8-dim latent, the
    positives a CLIP model learns to match."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_samples, 8, generator=g)
    to_image = torch.randn(8, IN_DIM, generator=g)
    to_text = torch.randn(8, IN_DIM, generator=g)
    images = latent @ to_image + 0.5 * torch.randn(num_samples, IN_DIM,
                                                   generator=g)
    texts = latent @ to_text + 0.5 * torch.randn(num_samples, IN_DIM,
                                                 generator=g)
    return images, texts


def clip_loss(image_features, text_features, logit_scale):
    """The CLIP loss of one batch in one process (the single-device
    meaning of dloss.ClipLoss on the global batch)."""
    logits = logit_scale * image_features @ text_features.T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.T, labels)) / 2


def all_gather_padded(x):
    """Every rank's rows, as hand-written code gets them from
    torch.distributed.all_gather: without gradient (the gathered tensors
    are new tensors), and zero-padded to the largest local batch, since
    all_gather needs the same size on every rank."""
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(x)]))
    longest = max(int(n) for n in sizes)
    padded = F.pad(x.detach(), (0, 0, 0, longest - len(x)))
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    return torch.cat(gathered)


class HandwrittenClipLoss(nn.Module):
    """OpenCLIP's ``ClipLoss(local_loss=True, gather_with_grad=False)``,
    made to run on uneven batches by padding: each rank's rows against the
    gathered global batch, positives labelled ``arange(n) + n * rank``.
    Two silent errors: no gradient flows through the other ranks' features,
    and the labels are right only when every rank holds n rows."""

    def forward(self, image_features, text_features, logit_scale):
        all_image = all_gather_padded(image_features)
        all_text = all_gather_padded(text_features)
        logits_per_image = logit_scale * image_features @ all_text.T
        logits_per_text = logit_scale * text_features @ all_image.T
        n = len(image_features)
        labels = torch.arange(n) + n * dist.get_rank()
        return (F.cross_entropy(logits_per_image, labels) +
                F.cross_entropy(logits_per_text, labels)) / 2


def main():
    args = demo_utils.arguments(__doc__.split("\n")[0])
    # torchrun's variables: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE.
    rank, world = dloss.init()
    torch.set_num_threads(1)

    images, texts = synthetic_pairs(NUM_SAMPLES)
    schedule = demo_utils.batch_schedule(NUM_SAMPLES, world, args.batch,
                                         args.steps)
    my_batches = [(images[step[rank]], texts[step[rank]])
                  for step in schedule]

    # 3. One process on the concatenated global batch (rank 0 only): the
    # parameters that run 1 must reach.
    reference = None
    if rank == 0:
        torch.manual_seed(0)
        model = TwoTower()
        reference = demo_utils.Recorder("one process", model.parameters(),
                                        schedule)
        global_batches = [(images[torch.cat(step)], texts[torch.cat(step)])
                          for step in schedule]
        train(model, clip_loss, global_batches, reference)

    # 1. dloss. The same initial parameters on every rank (DDP would also
    # broadcast rank 0's).
    torch.manual_seed(0)
    model = DDP(TwoTower())
    loss_fn = dloss.ClipLoss()
    exact = demo_utils.Recorder("clip, dloss", model.parameters(), schedule,
                                reference)
    train(model, loss_fn, my_batches, exact)

    # 2. Hand-written gathering, otherwise the same.
    torch.manual_seed(0)
    model = DDP(TwoTower())
    by_hand = demo_utils.Recorder("clip, hand-written", model.parameters(),
                                  schedule, reference, every=5)
    train(model, HandwrittenClipLoss(), my_batches, by_hand)

    if rank != 0:
        return 0
    demo_utils.timing_note(schedule, world)
    path = "%s/loss_clip.png" % args.out
    demo_utils.plot(path, "CLIP, %d ranks" % world, len(schedule),
                    {"dloss.ClipLoss (global loss)": exact.losses,
                     "one process": reference.losses,
                     "hand-written (rank 0's loss)": by_hand.losses},
                    {"dloss.ClipLoss": exact.diffs,
                     "hand-written": by_hand.diffs})
    ok = exact.diffs[-1] <= args.tolerance
    print("CLIP, %d steps on %d ranks: max |param - single-process param| "
          "dloss %.2e, hand-written gathering %.2e" %
          (len(schedule), world, exact.diffs[-1], by_hand.diffs[-1]))
    print("plot: %s" % path)
    print("CLIP check (dloss equals one process within %.0e): %s" %
          (args.tolerance, "PASS" if ok else "FAIL"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
