"""What the drop-in loss tests compare dloss with: the originals' math in
eager torch (an all_gather with gradients for uneven batches, as
torch.distributed.nn and OpenCLIP's gather_with_grad do), and the helpers
the tests share (shard offsets, relative error, measured-error lines)."""

import sys

import torch
import torch.distributed as dist


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
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


class GatherWithGrad(torch.autograd.Function):
    """torch.distributed.nn's all_gather, for uneven first dimensions: the
    backward sums every rank's cotangent and keeps this rank's block (what
    OpenCLIP's gather_with_grad=True does)."""

    @staticmethod
    def forward(ctx, x, sizes):
        ctx.sizes = sizes
        padded = x.new_zeros((max(sizes),) + tuple(x.shape[1:]))
        padded[:x.shape[0]] = x
        blocks = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(blocks, padded)
        return torch.cat([b[:n] for b, n in zip(blocks, sizes)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        start = offsets(ctx.sizes)[dist.get_rank()]
        return grad[start:start + ctx.sizes[dist.get_rank()]], None


def report(name, worst):
    """Prints the worst relative errors a test measured, one line per key
    (stderr, so that ctest's log keeps them)."""
    for key, err in sorted(worst.items()):
        print("METRIC %s %s worst_rel=%.3g" % (name, key, err),
              file=sys.stderr)
