"""SimCLR's NT-Xent loss written in plain PyTorch and compiled by dloss:
the twin of examples/ntxent.mlir.

Each rank passes its rows of the two augmented views, z1 and z2 (uneven row
counts are fine). On one device SimCLR stacks all 2B embeddings, first
views then second views, and takes the cross-entropy of each row's cosine
similarities over temperature, with the row itself masked out and its other
view as the positive. Here each rank stacks its own two views (2n rows) and
gathers everyone's stacks in one all_gather: its rows sit at global indices
2 * offset + i (first views) and 2 * offset + n + i (second views), where
2 * offset is the shard offset of the stack. The columns are ordered by
rank rather than by view, which a softmax does not notice: the loss is
SimCLR's, the mean over the 2B rows, the same on every rank. The -inf mask
is a dloss.select, exact in the gradient. Fused (dloss.fused_similarity),
as the twin.

    from ntxent_loss import ntxent_loss
    loss = ntxent_loss(z1, z2)
"""

import torch
import torch.nn.functional as F

import dloss


@dloss.loss
def ntxent_loss(z1, z2, temperature=0.5):
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    # This rank's 2n rows against every rank's, gathered in one piece.
    mine = torch.cat([z1, z2])
    everyone = dloss.all_gather(mine)
    logits = mine @ everyone.T / temperature
    # Global indices: of this rank's 2n rows (contiguous from the stack's
    # shard offset, twice z1's) and of each row's other view (its positive).
    n = z1.shape[0]
    firsts = torch.arange(n) + 2 * dloss.shard_offset(z1)
    rows = torch.cat([firsts, firsts + n])
    positives = torch.cat([firsts + n, firsts])
    # A row is not its own negative.
    is_self = rows[:, None] == torch.arange(2 * dloss.global_size(z1))[None, :]
    logits = logits.masked_fill(is_self, float("-inf"))
    return F.cross_entropy(logits, positives)   # the mean over the 2B rows

if __name__ == "__main__":
    dloss.init()
    z1 = torch.randn(8, 16, requires_grad=True)
    z2 = torch.randn(8, 16, requires_grad=True)
    loss = ntxent_loss(z1, z2)
    loss.backward()
    print("NT-Xent loss %.6f" % loss.item())
