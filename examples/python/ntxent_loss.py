"""SimCLR's NT-Xent loss written in plain PyTorch and compiled by dloss:
the twin of examples/ntxent.mlir.

Each rank passes its rows of the two augmented views, z1 and z2 (uneven row
counts are fine). On one device SimCLR stacks all 2B embeddings, first
views then second views, and takes the cross-entropy of each row's cosine
similarities over temperature, with the row itself masked out and its other
view as the positive. Here each rank computes its own 2n rows against the
gathered 2B: its rows sit at global indices offset + i (first views) and
B + offset + i (second views). The loss is the mean over the 2B rows, the
same on every rank. The -inf mask is a dloss.select, exact in the gradient.
Not fused (no fused family matches a masked similarity yet), as the twin.

    from ntxent_loss import ntxent_loss
    loss = ntxent_loss(z1, z2)
"""

import torch
import torch.nn.functional as F

import dloss


@dloss.loss
def ntxent_loss(z1, z2, temperature=0.5):
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    # This rank's 2n rows against all 2B rows (first views, then second).
    mine = torch.cat([z1, z2])
    everyone = torch.cat([dloss.all_gather(z1), dloss.all_gather(z2)])
    logits = mine @ everyone.T / temperature
    # Global indices: of this rank's pairs, of its 2n rows, of each row's
    # other view (its positive).
    batch = dloss.global_size(z1)
    own = torch.arange(z1.shape[0]) + dloss.shard_offset(z1)
    rows = torch.cat([own, own + batch])
    positives = torch.cat([own + batch, own])
    # A row is not its own negative.
    is_self = rows[:, None] == torch.arange(2 * batch)[None, :]
    logits = logits.masked_fill(is_self, float("-inf"))
    return F.cross_entropy(logits, positives)   # the mean over the 2B rows

if __name__ == "__main__":
    dloss.init()
    z1 = torch.randn(8, 16, requires_grad=True)
    z2 = torch.randn(8, 16, requires_grad=True)
    loss = ntxent_loss(z1, z2)
    loss.backward()
    print("NT-Xent loss %.6f" % loss.item())
