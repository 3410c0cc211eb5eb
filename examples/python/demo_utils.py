"""What train_clip.py and train_arcface.py share and a real training script
would not need: the synthetic data's uneven batch schedule, parameter
comparisons against the single-process run, the progress line, the line on
timing and the plot.
"""

import argparse
import os

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def arguments(description):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=30,
                        help="training steps (default 30)")
    parser.add_argument("--batch", type=int, default=32,
                        help="samples per rank before filtering (default 32)")
    parser.add_argument("--out", default=os.path.join(REPO, "build",
                                                      "demo-python"),
                        help="folder for the loss-curve plot "
                        "(default build/demo-python)")
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest accepted |parameter - single-process "
                        "parameter| after training (default 1e-5)")
    return parser.parse_args()


def batch_schedule(num_samples, world, per_rank, steps, seed=0, keep=0.85):
    """Which samples each rank trains on at each step: a list over steps of
    a list over ranks of index tensors.

    Every epoch shuffles the dataset (seeded) and cuts it into global
    batches of world * per_rank samples; the last global batch of an epoch
    is smaller, and is dealt in per_rank slices (the last rank gets the
    remainder). Each rank's loader then skips the samples it cannot use (a
    fixed 15% of the dataset, as a webdataset pipeline skips undecodable
    images), so at every step the ranks hold different numbers of samples.
    The single-process run trains on the concatenation, in rank order.
    """
    g = torch.Generator().manual_seed(seed)
    usable = torch.rand(num_samples, generator=g) < keep
    schedule = []
    while len(schedule) < steps:
        order = torch.randperm(num_samples, generator=g)
        for start in range(0, num_samples, world * per_rank):
            if len(schedule) == steps:
                break
            step = []
            for rank in range(world):
                lo = min(start + rank * per_rank, num_samples)
                hi = min(lo + per_rank, num_samples)
                idx = order[lo:hi]
                step.append(idx[usable[idx]])
            if min(len(idx) for idx in step) == 0:
                continue  # Every rank needs at least one sample.
            schedule.append(step)
    return schedule


def snapshot(parameters):
    return [p.detach().clone() for p in parameters]


def max_diff(a, b):
    """Largest |a - b| over two equal-length lists of tensors."""
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def progress(label, step, steps, loss, sizes, seconds, diff):
    print("[%s] step %2d/%d  loss %7.4f  batch %s=%3d  %5.1f ms  "
          "max|param - 1 process| %.1e" %
          (label, step + 1, steps, loss, "+".join(str(n) for n in sizes),
           sum(sizes), seconds * 1e3, diff), flush=True)


def timing_note(schedule, world):
    """Prints, under the step lines, why dloss's step times can exceed the
    hand-written loss's at the demo's size (bench/README.md has the
    measurements at small and large batches)."""
    per_rank = sum(len(idx) for step in schedule for idx in step) / (
        world * len(schedule))
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count())
    print("timing: at this size (about %d samples per process, %d processes "
          "on %d cores) a dloss step can take longer than a hand-written "
          "one: each dloss call first checks that every process passes "
          "matching sizes and types (so that a mistake stops them all with "
          "one error instead of a hang), then exchanges its data; these "
          "fixed costs dominate small batches, and dloss's fused kernels pay "
          "off at large ones (bench/README.md)" %
          (round(per_rank), world, cores), flush=True)


def plot(path, title, steps, losses, diffs):
    """Two panels: the loss per step, and the largest parameter difference
    from the single-process run per step (both on log scales). `losses`
    and `diffs` map a curve's label to its values."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = list(range(1, steps + 1))
    styles = {"one process": dict(linestyle="--", color="black")}
    for label, values in losses.items():
        left.plot(x, values, label=label, **styles.get(label, {}))
    left.set(xlabel="step", ylabel="loss", title=title + ": loss",
             yscale="log")
    left.legend()
    for label, values in diffs.items():
        # A difference of exactly 0 has no place on a log scale.
        right.plot(x, [max(v, 1e-12) for v in values], label=label)
    right.set(xlabel="step", ylabel="max |param - single-process param|",
              title=title + ": distance from one process", yscale="log")
    right.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Recorder:
    """The `on_step` callback of a training loop: keeps the loss and the
    largest parameter difference from the single-process run (`reference`,
    another Recorder, which only rank 0 has) at each step, and prints a
    progress line every `every` steps where there is a reference."""

    def __init__(self, label, parameters, schedule, reference=None, every=1):
        self.label, self.parameters = label, list(parameters)
        self.schedule, self.reference, self.every = schedule, reference, every
        self.losses, self.params, self.diffs = [], [], []

    def __call__(self, step, loss, seconds):
        self.losses.append(loss)
        params = snapshot(self.parameters)
        self.params.append(params)
        if self.reference is None:
            return
        self.diffs.append(max_diff(params, self.reference.params[step]))
        steps = len(self.schedule)
        if (step + 1) % self.every == 0 or step + 1 == steps:
            progress(self.label, step, steps, loss,
                     [len(idx) for idx in self.schedule[step]], seconds,
                     self.diffs[-1])
