"""What some drop-in loss tests compare dloss with: the originals' math in
eager torch (OpenCLIP's ClipLoss and PML's losses on one process; the
OpenCLIP drop-in tests use the real classes, upstream.py), and the helpers
the tests share (shard offsets, relative error, measured-error lines)."""

import contextlib
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


# The fusion settings each drop-in test runs: fused with the default tile,
# fused with 2 x 3 tiles (so that a few rows cross the tiles' edges and the
# ring's chunks split into several tiles), unfused.
FUSE_MODES = (True, "2x3", False)


@contextlib.contextmanager
def fusion(mode):
    """Runs the body with the fused kernels' tile of a FUSE_MODES entry
    (DLOSS_TILE, read at every call); pass bool(mode) as the loss's fuse."""
    old = os.environ.get("DLOSS_TILE")
    if isinstance(mode, str):
        os.environ["DLOSS_TILE"] = mode
    else:
        os.environ.pop("DLOSS_TILE", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DLOSS_TILE", None)
        else:
            os.environ["DLOSS_TILE"] = old


# The tolerance of a drop-in's loss and gradients against its reference.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}

# Per world size: the per-rank batches of the contrastive tests (even, then
# uneven ones).
PAIR_SIZES = {
    1: [[6]],
    2: [[4, 4], [5, 2]],
    4: [[3, 3, 3, 3], [5, 3, 6, 2], [4, 0, 3, 2]],  # a rank with no rows
}


def feature_pair(total, dim, generator):
    """`total` L2-normalised image and text rows of width `dim`, float64."""
    image = F.normalize(torch.randn(total, dim, generator=generator,
                                    dtype=torch.float64))
    text = F.normalize(torch.randn(total, dim, generator=generator,
                                   dtype=torch.float64))
    return image, text


def offsets(sizes):
    """[0, n_0, n_0 + n_1, ...]: where each rank's rows start."""
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out


def rel(a, b, whole=None):
    """max |a - b| / max |b|: the relative error of `a` against `b`. When `b`
    is one rank's block of a gradient, pass the `whole` gradient: the error
    is measured against its scale (a block of well-classified rows holds
    gradients 1e-10 of the largest, whose float32 rounding is no error)."""
    if a.shape != b.shape:
        return float("inf")
    if b.numel() == 0:
        return 0.0
    scale = (b if whole is None else whole).abs().max().item()
    error = (a - b).abs().max().item() / (scale if scale > 0 else 1.0)
    # A NaN would compare below every tolerance, and max() skips it.
    return error if math.isfinite(error) else float("inf")


def clip_loss(image, text, scale):
    """OpenCLIP's ClipLoss on one process: the mean of the image->text and
    text->image cross-entropies, positives on the diagonal."""
    logits = scale * image @ text.T
    labels = torch.arange(image.shape[0])
    return (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.T, labels)) / 2


def pml_loss(kind, embeddings, labels, W, margin=None, scale=64.0):
    """pytorch-metric-learning 2.x's ArcFaceLoss / CosFaceLoss on one
    process: LargeMarginSoftmaxLoss.compute_loss with the kind's
    modify_cosine_of_target_classes and the MeanReducer. `margin` in PML's
    units (ArcFace: degrees); None for PML's default."""
    mask = torch.zeros(labels.shape[0], W.shape[1], dtype=embeddings.dtype)
    mask[torch.arange(labels.shape[0]), labels] = 1
    # CosineSimilarity: both sides L2-normalised, then a matmul.
    cosine = torch.matmul(F.normalize(embeddings, p=2, dim=1),
                          F.normalize(W.t(), p=2, dim=1).t())
    target = cosine[mask == 1]
    if kind == "arcface":
        m = np.radians(28.6 if margin is None else margin)
        angles = torch.acos(torch.clamp(target, -1, 1))
        modified = torch.where(angles <= np.deg2rad(180) - m,
                               torch.cos(angles + m),
                               torch.cos(angles) - m * np.sin(m))
    else:
        modified = target - (0.35 if margin is None else margin)
    diff = (modified - target).unsqueeze(1)
    logits = (cosine + mask * diff) * scale
    return F.cross_entropy(logits, labels, reduction="none").mean()


def report(name, worst, measure="worst_rel"):
    """Prints the worst errors a test measured (relative ones unless
    `measure` says otherwise), one line per key, to stderr, so that ctest's
    log keeps them."""
    for key, err in sorted(worst.items()):
        print("METRIC %s %s %s=%.3g" % (name, key, measure, err),
              file=sys.stderr)
