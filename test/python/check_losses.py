"""Distributed losses written the way real code writes them, for
test_check_loss.py: five wrong, two right, one that hangs, and the seeds'
own code (TorchMetrics' gather_all_tensors in a loss, OpenCLIP's ClipLoss
in its default mode, pytorch-metric-learning's ArcFaceLoss with its W
outside DDP). Module-level: dloss.check_loss imports them by name in its
processes."""

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F

ROWS, DIM = 12, 6


def clip_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(ROWS, DIM, generator=g), dim=1)
    text = F.normalize(image + 0.3 * torch.randn(ROWS, DIM, generator=g),
                       dim=1)
    return image, text, torch.tensor(5.0)


def two_views(seed=1):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(ROWS, DIM, generator=g)
    return a, a + 0.5 * torch.randn(ROWS, DIM, generator=g)


def _gather_no_grad(x):
    """OpenCLIP's gather_features without gather_with_grad: the others'
    rows carry no gradient; this rank's slot is its own tensor."""
    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)  # no-grad-gather
    out[dist.get_rank()] = x
    return torch.cat(out)


def _clip(image, text, scale, all_image, all_text, labels):
    return (F.cross_entropy(scale * image @ all_text.T, labels) +
            F.cross_entropy(scale * text @ all_image.T, labels)) / 2


# 1. Wrong: dist.all_gather carries no gradient to the other ranks' rows.
def clip_no_autograd_gather(image, text, scale):
    n = image.shape[0]
    labels = torch.arange(n) + n * dist.get_rank()
    return _clip(image, text, scale, _gather_no_grad(image),
                 _gather_no_grad(text), labels)


# 2. Wrong on uneven batches: labels n * rank (and an equal-size gather).
def clip_rank_times_n_labels(image, text, scale):
    n = image.shape[0]
    labels = torch.arange(n) + n * dist.get_rank()
    return _clip(image, text, scale,
                 torch.cat(dist_nn.all_gather(image)),
                 torch.cat(dist_nn.all_gather(text)), labels)


def _global_count(x):
    count = torch.tensor([float(x.shape[0])])
    dist.all_reduce(count)
    return count


def _global_batch_norm(z, n):
    mean = dist_nn.all_reduce(z.sum(0)) / n
    var = dist_nn.all_reduce(((z - mean) ** 2).sum(0)) / n
    return (z - mean) / torch.sqrt(var + 1e-5)


def _barlow(c):
    diagonal = torch.diagonal(c)
    return (diagonal - 1).pow(2).sum() + 5e-3 * (
        c.pow(2).sum() - diagonal.pow(2).sum())


# 3. Wrong: the official Barlow Twins' in-place all_reduce of c.
def barlow_in_place_all_reduce(z_a, z_b):
    n = _global_count(z_a)
    c = _global_batch_norm(z_a, n).T @ _global_batch_norm(z_b, n) / n
    dist.all_reduce(c)
    return _barlow(c)


# 4. Wrong: lightly's Barlow Twins, each rank batch-normalising its rows.
def barlow_local_batch_norm(z_a, z_b):
    def norm(z):
        return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5)
    c = norm(z_a).T @ norm(z_b) / z_a.shape[0]
    c = dist_nn.all_reduce(c) / dist.get_world_size()
    return _barlow(c)


# 5. Wrong on uneven batches: each rank's mean, which DDP averages.
def mse_per_rank_mean(z_a, z_b):
    return ((z_a - z_b) ** 2).sum(1).mean()


# 6. Right: CLIP with dloss.all_gather, offsets from the gathered sizes,
# and each rank's sum scaled so that DDP's average is the global mean.
def clip_right(image, text, scale):
    import dloss
    sizes = dloss.all_gather(torch.tensor(image.shape[0]))
    offset = int(sizes[:dist.get_rank()].sum())
    labels = torch.arange(image.shape[0]) + offset
    all_image, all_text = dloss.all_gather(image), dloss.all_gather(text)
    total = int(sizes.sum())
    return (F.cross_entropy(scale * image @ all_text.T, labels,
                            reduction="sum") +
            F.cross_entropy(scale * text @ all_image.T, labels,
                            reduction="sum")) / 2 * (
        dist.get_world_size() / total)


# 7. Right: the global mean through autograd all-reduces.
def mse_global_mean(z_a, z_b):
    n = _global_count(z_a)
    return dist_nn.all_reduce(((z_a - z_b) ** 2).sum(1).sum()) / n


# A hang: rank 0 alone logs a global statistic (Lightning's self.log on
# rank 0 with sync_dist).
def logs_on_rank_zero(z_a, z_b):
    loss = mse_global_mean(z_a, z_b)
    if dist.get_rank() == 0:
        dist.all_reduce(loss.detach().clone())
    return loss


# Seeds: the libraries' own code as users call it.
def torchmetrics_gather_in_a_loss(image, text, scale):
    """TorchMetrics' gather (uneven sizes padded, this rank's slot its own
    tensor) in a CLIP loss that is otherwise right."""
    from torchmetrics.utilities.distributed import gather_all_tensors
    images, texts = gather_all_tensors(image), gather_all_tensors(text)
    rank = dist.get_rank()
    offset = sum(t.shape[0] for t in images[:rank])
    labels = torch.arange(image.shape[0]) + offset
    total = sum(t.shape[0] for t in images)
    all_image, all_text = torch.cat(images), torch.cat(texts)
    return (F.cross_entropy(scale * image @ all_text.T, labels,
                            reduction="sum") +
            F.cross_entropy(scale * text @ all_image.T, labels,
                            reduction="sum")) / 2 * (
        dist.get_world_size() / total)


def open_clip_default(image, text, scale):
    from open_clip.loss import ClipLoss
    loss = ClipLoss(rank=dist.get_rank(), world_size=dist.get_world_size())
    return loss(image, text, scale)


def arcface_inputs(seed=2):
    g = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(ROWS, DIM, generator=g)
    labels = torch.randint(0, 4, (ROWS,), generator=g)
    return {"inputs": (embeddings, labels), "params": arcface_module()}


def arcface_module():
    from pytorch_metric_learning.losses import ArcFaceLoss
    torch.manual_seed(3)
    return ArcFaceLoss(num_classes=4, embedding_size=DIM)


def arcface_w_outside_ddp(embeddings, labels, module):
    """PML's ArcFaceLoss on each rank's rows; its W is a parameter of the
    loss, outside the DDP-wrapped model."""
    return module(embeddings, labels)


# dloss's own: a drop-in, and a loss written with @dloss.loss.
def dloss_clip_drop_in(image, text, scale):
    import dloss
    return dloss.ClipLoss()(image, text, scale)


def _traced_clip(image, text, scale):
    import dloss
    labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
    return (F.cross_entropy(scale * image @ dloss.all_gather(text).T,
                            labels) +
            F.cross_entropy(scale * text @ dloss.all_gather(image).T,
                            labels)) / 2


def dloss_traced_clip(image, text, scale):
    import dloss
    global _TRACED
    if _TRACED is None:
        _TRACED = dloss.loss(_traced_clip)
    return _TRACED(image, text, scale)


_TRACED = None


def dloss_siglip_drop_in(image, text, scale, bias):
    import dloss
    return dloss.SigLipLoss()(image, text, scale, bias)


def dloss_arcface_module():
    import dloss
    torch.manual_seed(3)
    return dloss.ArcFaceLoss(num_classes=4, embedding_size=DIM)


def dloss_arcface_drop_in(embeddings, labels, module):
    """dloss's ArcFaceLoss: its W replicated, the loss the global batch's."""
    return module(embeddings, labels)


def dloss_supcon_drop_in(embeddings, labels):
    import dloss
    return dloss.SupConLoss()(embeddings, labels)


def dloss_ntxent_drop_in(embeddings, labels):
    import dloss
    return dloss.NTXentLoss()(embeddings, labels)
