"""CLIP's contrastive loss (OpenCLIP's ClipLoss) written in plain PyTorch
and compiled by dloss: the twin of examples/clip.mlir.

Each rank passes its own rows of L2-normalised image and text features
(uneven row counts are fine) and the replicated logit scale (already
exponentiated, as OpenCLIP's model returns it). The loss is the mean over
the global batch of the image->text and text->image cross-entropies,
averaged, and is the same on every rank. dloss fuses each gathered
similarity and its cross-entropy into one ring-tiled kernel
(dloss.ring_softmax_ce), which never builds the B_local x B_global logits.

    from clip_loss import clip_loss
    loss = clip_loss(image_features, text_features, logit_scale)
    loss.backward()
"""

import torch
import torch.nn.functional as F

import dloss


@dloss.loss
def clip_loss(image, text, scale):
    image_all = dloss.all_gather(image)
    text_all = dloss.all_gather(text)
    # The positive of local row i is global row offset + i: right for uneven
    # batches, where `n * rank` is not.
    labels = torch.arange(image.shape[0]) + dloss.shard_offset(image)
    # A mean over the batch is the mean over the global batch.
    loss_image = F.cross_entropy(image @ text_all.T * scale, labels)
    loss_text = F.cross_entropy(text @ image_all.T * scale, labels)
    return (loss_image + loss_text) / 2


if __name__ == "__main__":
    dloss.init()
    image = F.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    text = F.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    scale = torch.tensor(14.3, requires_grad=True)
    loss = clip_loss(image, text, scale)
    loss.backward()
    print("CLIP loss %.6f, fused ops %s" % (
        loss.item(), clip_loss.compiled(image, text, scale).fused_ops()))
