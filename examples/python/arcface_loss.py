"""ArcFace (additive angular margin) with replicated class weights, written
in plain PyTorch and compiled by dloss: the twin of examples/arcface.mlir.

Each rank passes its rows (embeddings and integer class labels); the class
weights W (classes x dim) are the same on every rank (dloss.Replicated).
logits = s * cos(theta + m) for the target class and s * cos(theta) for the
others; the loss is the mean cross-entropy over the global batch. W's
gradient follows the gradient contract (default "ddp": W is a DDP
parameter; @dloss.loss(grad_mode="global") gives every rank the full dF/dW).
No gather: each rank's logits need only its own rows and W, so nothing is
fused (as for the twin).

    from arcface_loss import arcface_loss
    loss = arcface_loss(embeddings, labels, W)
"""

import torch
import torch.nn.functional as F

import dloss


@dloss.loss
def arcface_loss(embeddings, labels, weights: dloss.Replicated,
                 scale=64.0, margin=0.5):
    cos = F.normalize(embeddings, dim=1) @ F.normalize(weights, dim=1).T
    # The margin on the target logit; clamp keeps acos's gradient finite.
    target = cos.gather(1, labels[:, None]).clamp(-0.9999999, 0.9999999)
    cos_m = cos.scatter(1, labels[:, None],
                        torch.cos(torch.acos(target) + margin))
    return F.cross_entropy(scale * cos_m, labels)   # the global mean


if __name__ == "__main__":
    dloss.init()
    x = torch.randn(8, 16, requires_grad=True)
    labels = torch.randint(0, 10, (8,))
    weights = torch.randn(10, 16, requires_grad=True)
    loss = arcface_loss(x, labels, weights)
    loss.backward()
    print("ArcFace loss %.6f" % loss.item())
