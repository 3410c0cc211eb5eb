#!/usr/bin/env python3
"""Self-supervised training with lightly's projection heads, Lightning's
Trainer (DDP) and dloss.lightly's losses: SimCLR (NTXentLoss), Barlow Twins
and DINO (a student, and a teacher that follows it by EMA; DINOLoss's
centre is loss state).

    python3 launch.py --nproc 4 train_ssl.py
    torchrun --nproc_per_node 4 train_ssl.py    # the same

Needs lightly (and its torchvision) and Lightning. The ranks train on uneven batches of a
synthetic dataset of two augmented views per sample, in float64 (so that the
check below sees whether the loss is exact, not how float32's rounding fell). For each loss, the
runs start from the same parameters and see the same samples:

1. dloss: a LightningModule trained by ``Trainer(strategy="ddp")`` with
   ``loss_fn = dloss.lightly.NTXentLoss(gather_distributed=True)`` (or
   ``BarlowTwinsLoss``, ``DINOLoss``). The loss is the global batch's,
   exact for any per-rank sizes.
2. lightly's own distributed form, ``lightly.loss.BarlowTwinsLoss(
   gather_distributed=True)`` or its DINOLoss, otherwise the same (not
   SimCLR: lightly's NT-Xent gathers into equal-sized buffers and labels
   positives ``rank * batch_size``, so it cannot run on uneven batches at
   all).
3. one process (rank 0 only, a plain loop of the same SGD): lightly's loss
   on the concatenated global batch. Run 1 must end with the same parameters; the script prints the
   largest difference of runs 1 and 2, PASS or FAIL, and exits non-zero on
   FAIL.
"""

import logging
import sys
import time
import warnings

import lightning.pytorch as pl
import torch
import torch.nn as nn
from lightly.loss import BarlowTwinsLoss as LightlyBarlowTwins
from lightly.loss import DINOLoss as LightlyDINO
from lightly.loss import NTXentLoss as LightlyNTXent
from lightly.models.modules import DINOProjectionHead, SimCLRProjectionHead
from lightly.models.utils import update_momentum

import dloss
import dloss.lightly

import demo_utils

# lightly's DINOProjectionHead uses torch.nn.utils.weight_norm, which
# warns that it is deprecated at every head made: lightly's to change.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message=".*weight_norm.* is deprecated")
# lightly's Barlow Twins calls torch.distributed.nn's all_reduce, which
# torch says is deprecated, at every step: lightly's to change.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message=".*all_reduce is deprecated")
# Lightning 2.6 on torch 2.14 uses a pytree API torch deprecates.
warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec")
# Lightning's advice for real data loaders; these batches are in memory.
warnings.filterwarnings("ignore", message=".*does not have many workers")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

NUM_SAMPLES, IN_DIM, HIDDEN, EMBED_DIM = 1000, 32, 64, 16
LEARNING_RATE, MOMENTUM = 0.05, 0.9
DINO_OUT, TEACHER_MOMENTUM = 64, 0.9


class Encoder(nn.Module):
    """A small backbone and lightly's SimCLR projection head (without batch
    norm: a model's BatchNorm1d normalises each rank's rows on its own,
    which no loss can make the global batch's)."""

    def __init__(self, dino=False):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU())
        self.head = DINOProjectionHead(HIDDEN, HIDDEN, EMBED_DIM, DINO_OUT) \
            if dino else SimCLRProjectionHead(HIDDEN, HIDDEN, EMBED_DIM,
                                              batch_norm=False)

    def forward(self, x):
        return self.head(self.backbone(x))


def two_views(model, loss_fn):
    """SimCLR's and Barlow Twins' step: the loss of both views'
    embeddings."""
    return lambda view0, view1: loss_fn(model(view0), model(view1))


def dino(student, loss_fn):
    """DINO's step: the teacher (a copy of the student at the start, then
    its EMA; no gradient) embeds both views, and the loss compares them
    with the student's (each view against the other)."""
    module = getattr(student, "module", student)
    # lightly's DINO head uses torch's old weight_norm, whose modules
    # deepcopy cannot copy: a new one, loaded with the student's state.
    teacher = Encoder(dino=True).requires_grad_(False)
    teacher.load_state_dict(module.state_dict())

    def step(view0, view1):
        update_momentum(module, teacher, TEACHER_MOMENTUM)
        return loss_fn([teacher(view0), teacher(view1)],
                       [student(view0), student(view1)])
    return step


def sgd(parameters):
    return torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=MOMENTUM)


class SelfSupervised(pl.LightningModule):
    """The LightningModule: `method`'s loss of the model on each batch's
    two views, SGD with momentum."""

    def __init__(self, model, loss_fn, method):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn
        self.loss_of = method(model, loss_fn)

    def training_step(self, batch, index):
        return self.loss_of(*batch)

    def configure_optimizers(self):
        return sgd(self.model.parameters())


class Progress(pl.Callback):
    """Calls `on_step(step, loss, seconds)` after each training step."""

    def __init__(self, on_step):
        self.on_step, self.start = on_step, 0.0

    def on_train_batch_start(self, trainer, module, batch, index):
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        self.on_step(index, outputs["loss"].item(),
                     time.perf_counter() - self.start)


def fit(model, loss_fn, method, batches, on_step, world):
    """The distributed run: Lightning's Trainer, DDP over the `world`
    ranks already started (dloss.init()), one step per batch of this
    rank's (view0, view1)."""
    trainer = pl.Trainer(
        accelerator="cpu", devices=world, strategy="ddp",
        max_steps=len(batches), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False, callbacks=[Progress(on_step)])
    trainer.fit(SelfSupervised(model, loss_fn, method),
                torch.utils.data.DataLoader(batches, batch_size=None))


def train(model, loss_fn, method, batches, on_step):
    """The one-process loop: SGD with momentum over `batches`, (view0,
    view1) per step; `method` makes a step's loss of the views."""
    optimizer = sgd(model.parameters())
    loss_of = method(model, loss_fn)
    for step, (view0, view1) in enumerate(batches):
        start = time.perf_counter()
        loss = loss_of(view0, view1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        on_step(step, loss.item(), time.perf_counter() - start)


def synthetic_views(num_samples, seed=0):
    """Two noisy views of each sample's 8-dim latent: what augmentations
    make of one image."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_samples, 8, generator=g)
    to_input = torch.randn(8, IN_DIM, generator=g)
    return [latent @ to_input + 0.5 * torch.randn(num_samples, IN_DIM,
                                                  generator=g)
            for _ in range(2)]


def main():
    args = demo_utils.arguments(__doc__.split("\n")[0])
    rank, world = dloss.init()
    torch.set_num_threads(1)
    # Double precision: DINO's teacher temperature (0.07) amplifies
    # float32's rounding, whatever the loss's order of sums, to about 1e-5
    # of a parameter after 20 steps, the size of the check's bound; in
    # float64 the check sees whether the loss is exact, not how the run's
    # rounding fell.
    torch.set_default_dtype(torch.float64)

    views = synthetic_views(NUM_SAMPLES)
    schedule = demo_utils.batch_schedule(NUM_SAMPLES, world, args.batch,
                                         args.steps)
    mine = [[v[step[rank]] for v in views] for step in schedule]
    everyone = [[v[torch.cat(step)] for v in views] for step in schedule]
    flag = {"gather_distributed": True}
    dino_loss = {"output_dim": DINO_OUT, "teacher_temp": 0.07,
                 "warmup_teacher_temp_epochs": 0}
    # Per method: its step, lightly's loss class, dloss's, the keywords
    # of the distributed form, and whether lightly's own runs on uneven
    # batches.
    runs = {
        "simclr": (two_views, LightlyNTXent, dloss.lightly.NTXentLoss, flag,
                   False),
        "barlow twins": (two_views, LightlyBarlowTwins,
                         dloss.lightly.BarlowTwinsLoss, flag, True),
        "dino": (dino, LightlyDINO, dloss.lightly.DINOLoss, dino_loss,
                 True),
    }
    ok = True
    for name, (method, single, exact, kwargs, theirs) in runs.items():
        is_dino = method is dino
        alone = dino_loss if is_dino else {}
        # 3. One process on the concatenated global batch (rank 0 only).
        reference = None
        if rank == 0:
            torch.manual_seed(0)
            model = Encoder(is_dino)
            reference = demo_utils.Recorder("one process", model.parameters(),
                                            schedule)
            loss_fn = single(**alone)
            if is_dino:
                # lightly's centre all-reduces whenever a process group
                # is up; on one device it is the batch's mean.
                loss_fn._center_fn = lambda x, dim: x.mean(dim, keepdim=True)
            train(model, loss_fn, method, everyone, reference)
        # 1. dloss.
        torch.manual_seed(0)
        model = Encoder(is_dino)
        ours = demo_utils.Recorder(name + ", dloss", model.parameters(),
                                   schedule, reference, every=5)
        fit(model, exact(**kwargs), method, mine, ours, world)
        line = "%s, %d steps on %d ranks: max |param - single-process " \
            "param| dloss %.2e" % (name, len(schedule), world,
                                   ours.diffs[-1] if rank == 0 else 0.0)
        # 2. lightly's own distributed form.
        if theirs:
            torch.manual_seed(0)
            model = Encoder(is_dino)
            lightly_run = demo_utils.Recorder(
                name + ", lightly", model.parameters(), schedule, reference,
                every=5)
            fit(model, single(**kwargs), method, mine, lightly_run, world)
            if rank == 0:
                line += ", lightly's %s %.2e" % (
                    "DINOLoss" if is_dino else "gather_distributed=True",
                    lightly_run.diffs[-1])
        if rank == 0:
            passed = ours.diffs[-1] <= args.tolerance
            ok &= passed
            print(line)
            print("%s check (dloss equals one process within %.0e): %s" %
                  (name, args.tolerance, "PASS" if passed else "FAIL"),
                  flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
