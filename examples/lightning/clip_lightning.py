#!/usr/bin/env python3
"""A two-tower CLIP trained with dloss.ClipLoss in a Lightning Trainer (DDP,
4 CPU ranks, uneven per-rank batches), checked against one process.

    python examples/lightning/clip_lightning.py [--steps 5] [--devices 4]

Lightning starts the ranks itself (it runs this script again for ranks
1..3). Every step, rank r trains on its own number of samples (a per-rank
batch sampler, deterministic from --seed). Rank 0 then trains the same model
in one process on the concatenated global batches (rank 0's samples, then
rank 1's, ...) with the plain CLIP loss, prints the largest parameter and
loss differences, and exits non-zero if they exceed --tolerance.
test/python/test_lightning_example.py imports `fit` and `train_one_process`.
"""

import argparse
import math
import os
import sys

# Before torch is imported: the ranks share this machine's cores, and the
# ranks Lightning starts inherit the environment.
os.environ["OMP_NUM_THREADS"] = "1"

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dloss  # noqa: E402

IN_DIM, HIDDEN, EMBED_DIM, LATENT = 16, 32, 8, 4
LEARNING_RATE = 0.2


def batch_sizes(steps, world, seed=0):
    """Per step, each rank's number of samples: 1 to 8, uneven. (A rank
    with no samples is fine for dloss, but the DataLoader's default collate
    refuses an empty batch.)"""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 9, (steps, world), generator=g).tolist()


def synthetic_pairs(num_samples, seed=0):
    """(images, texts): two noisy views of a shared latent, the positive
    pairs a CLIP model learns to match."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(num_samples, LATENT, generator=g)
    to_image = torch.randn(LATENT, IN_DIM, generator=g)
    to_text = torch.randn(LATENT, IN_DIM, generator=g)
    images = latent @ to_image + 0.5 * torch.randn(num_samples, IN_DIM,
                                                   generator=g)
    texts = latent @ to_text + 0.5 * torch.randn(num_samples, IN_DIM,
                                                 generator=g)
    return images, texts


def global_batches(sizes):
    """Per step, the dataset indices of each rank's samples. The global
    batch of a step is rank 0's samples, then rank 1's, ...: dloss's global
    order, whose offsets it derives from the per-rank sizes."""
    out, start = [], 0
    for step in sizes:
        ranks = []
        for n in step:
            ranks.append(list(range(start, start + n)))
            start += n
        out.append(ranks)
    return out


class RankBatches(torch.utils.data.Sampler):
    """A batch sampler that yields one rank's indices for each step."""

    def __init__(self, sizes, rank):
        self.batches = [step[rank] for step in global_batches(sizes)]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class TwoTower(nn.Module):
    """An image tower and a text tower (small MLPs) and OpenCLIP's learnable
    temperature."""

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


def make_model(seed=0):
    torch.manual_seed(seed)
    return TwoTower()


class ClipModule(pl.LightningModule):
    def __init__(self, sizes, seed=0, lr=LEARNING_RATE):
        super().__init__()
        self.sizes, self.seed, self.lr = sizes, seed, lr
        self.model = make_model(seed)
        # The default group, which Lightning's DDP strategy initialises
        # before the first step.
        self.loss_fn = dloss.ClipLoss()

    def train_dataloader(self):
        images, texts = synthetic_pairs(sum(map(sum, self.sizes)), self.seed)
        data = torch.utils.data.TensorDataset(images, texts)
        return torch.utils.data.DataLoader(
            data, batch_sampler=RankBatches(self.sizes, self.global_rank))

    def training_step(self, batch, batch_idx):
        images, texts = batch
        # The CLIP loss of the global batch, the same value on every rank.
        # Rank r's feature gradients are world * dF/dx_r and logit_scale
        # gets its share of world * dF/dscale (dloss's "ddp" gradient
        # contract), so DDP's average over the ranks is exactly the
        # one-process gradient of the global batch, uneven sizes included:
        # no factor to correct.
        loss = self.loss_fn(*self.model(images, texts))
        # No sync_dist: the value is already global and identical on every
        # rank, so logging needs no collective. That is also the fix for
        # the classic hang of `if self.trainer.is_global_zero:
        # self.log(..., sync_dist=True)`, whose all-reduce only rank 0
        # reaches.
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LoggedLoss(pl.Callback):
    """Records the value logged as "loss" after every step."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch,
                           batch_idx):
        self.losses.append(trainer.callback_metrics["loss"].item())


def fit(steps=5, devices=4, seed=0, lr=LEARNING_RATE):
    """Trains on `devices` CPU ranks with DDP. Run it on every rank (or
    once, from a script, and Lightning starts the other ranks). Returns
    (trainer, {name: parameter}, [logged loss per step])."""
    sizes = batch_sizes(steps, devices, seed)
    module = ClipModule(sizes, seed, lr)
    logged = LoggedLoss()
    trainer = pl.Trainer(
        strategy="ddp", accelerator="cpu", devices=devices, max_steps=steps,
        # Each rank's DataLoader is already its shard: Lightning must not
        # wrap it in a DistributedSampler.
        use_distributed_sampler=False,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[logged])
    trainer.fit(module)
    params = {k: v.detach().clone()
              for k, v in module.model.named_parameters()}
    return trainer, params, logged.losses


def clip_loss(image_features, text_features, logit_scale):
    """OpenCLIP's CLIP loss of one batch in one process: what
    dloss.ClipLoss means on the global batch."""
    logits = logit_scale * image_features @ text_features.T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.T, labels)) / 2


def train_one_process(steps=5, world=4, seed=0, lr=LEARNING_RATE):
    """The same training in one process on the global batches, with plain
    torch. Returns ({name: parameter}, [loss per step])."""
    sizes = batch_sizes(steps, world, seed)
    images, texts = synthetic_pairs(sum(map(sum, sizes)), seed)
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for ranks in global_batches(sizes):
        index = [i for rank in ranks for i in rank]
        loss = clip_loss(*model(images[index], texts[index]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return params, losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--devices", type=int, default=4,
                        help="number of CPU ranks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=LEARNING_RATE)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    trainer, params, losses = fit(args.steps, args.devices, args.seed,
                                  args.lr)
    if not trainer.is_global_zero:
        return 0
    reference, reference_losses = train_one_process(
        args.steps, args.devices, args.seed, args.lr)
    sizes = batch_sizes(args.steps, args.devices, args.seed)
    for step, (n, loss, ref) in enumerate(zip(sizes, losses,
                                              reference_losses)):
        print("step %d  per-rank batches %s  loss %.6f  (one process %.6f)"
              % (step, n, loss, ref))
    param_diff = max((params[k] - reference[k]).abs().max().item()
                     for k in reference)
    loss_diff = max(abs(a - b) for a, b in zip(losses, reference_losses))
    ok = param_diff <= args.tolerance and loss_diff <= args.tolerance
    print("max |param - one-process param| %.2e, max |loss - one-process "
          "loss| %.2e: %s" % (param_diff, loss_diff, "PASS" if ok else "FAIL"),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
