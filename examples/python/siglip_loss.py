"""SigLIP's sigmoid loss (OpenCLIP's SigLipLoss) written in plain PyTorch
and compiled by dloss: the twin of examples/siglip.mlir.

Every (image, text) pair of the global batch is a binary problem: positive
on the global diagonal, negative elsewhere. With l = t * <x_i, y_j> + b and
t = exp(log_t), OpenCLIP's -log sigmoid(z * l) (z = +1 on the diagonal, -1
elsewhere) is softplus(l) - l on the positives and softplus(l) elsewhere, so
the loss is (sum softplus(l) - sum of the positives' l) / B: no B x B label
matrix. dloss fuses it into one ring-tiled kernel (dloss.ring_sigmoid_pairs).

    from siglip_loss import siglip_loss
    loss = siglip_loss(image_features, text_features, log_t, bias)
"""

import torch
import torch.nn.functional as F

import dloss


@dloss.loss
def siglip_loss(image, text, log_t, bias):
    text_all = dloss.all_gather(text)
    # This rank's rows against every rank's texts.
    logits = log_t.exp() * image @ text_all.T + bias
    positives = torch.arange(image.shape[0]) + dloss.shard_offset(image)
    pairs = F.softplus(logits).sum()
    diagonal = logits.gather(1, positives[:, None]).sum()
    return dloss.all_reduce(pairs - diagonal, "sum") / dloss.global_size(image)


if __name__ == "__main__":
    dloss.init()
    image = F.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    text = F.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    log_t = torch.tensor(2.3, requires_grad=True)
    bias = torch.tensor(-10.0, requires_grad=True)
    loss = siglip_loss(image, text, log_t, bias)
    loss.backward()
    print("SigLIP loss %.6f, fused ops %s" % (
        loss.item(),
        siglip_loss.compiled(image, text, log_t, bias).fused_ops()))
