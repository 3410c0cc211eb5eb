"""The dloss ops that the @dloss.loss tracer says its rules emit
(dloss._trace.emitted_ops(), each rule module's EMITS) are the ops that
traced witnesses really emit: none declared and never emitted, none emitted
and not declared. One process, no group: the witnesses are traced, not
compiled."""

import unittest

import torch
import torch.nn.functional as F

import dloss
from dloss._trace import emitted_ops, trace_graph
from test_op_completeness import op_counts

DIM = 4


def witness(image, text, labels, scale):
    """Every rule that emits an op of its own, once."""
    text_all = dloss.all_gather(text)                      # all_gather
    sim = scale * image @ text_all.T                        # matmul, mul
    rows = torch.arange(image.shape[0]) + \
        dloss.shard_offset(image)                           # arange, dim
    cols = torch.arange(dloss.global_size(text))            # global_size
    is_self = rows[:, None] == cols[None, :]                # eq, expand
    masked = torch.where(is_self, 0.0, sim)                 # select
    ce = F.cross_entropy(sim, rows)                         # cross_entropy
    lse = torch.logsumexp(sim, dim=1)                       # logsumexp
    picked = sim.gather(1, rows.unsqueeze(1)).squeeze(1)    # take_along
    put = sim.scatter(1, rows.unsqueeze(1), 1.0)            # put_along
    both = torch.cat([image, text], dim=1)                  # pad, add
    part = both[:, 1:3]                                     # slice
    unit = F.normalize(image, dim=1)                        # l2_normalize
    bounded = torch.cos(torch.acos(picked.clamp(-0.9, 0.9)))  # clamp
    smooth = F.softplus(picked) + F.logsigmoid(picked) + \
        torch.sigmoid(picked) + torch.sin(picked)           # softplus...
    roots = torch.sqrt(torch.exp(-lse)).log()               # sqrt, neg, log
    zeros = torch.zeros_like(sim)                           # zeros_like
    held = picked.detach() * picked                         # stop_gradient
    sizes = (dloss.world_size() + dloss.rank()) / 2.0      # world_size,
    # rank, cast (a size as a tensor), div.
    local = (masked.sum() + lse.sum() + picked.sum() + put.sum() +
             part.sum() + unit.sum() + bounded.sum() + smooth.sum() +
             roots.sum() + zeros.sum() + held.sum() + labels.float().sum() -
             sizes)                                         # reduce, sub
    shifted = dloss.ring_shift(image)                       # ring_shift
    mine = dloss.reduce_scatter(dloss.all_gather(image),
                                size=image.shape[0])        # reduce_scatter
    even = dloss.reduce_scatter(text_all)
    root = dloss.broadcast(scale)                           # broadcast
    moved = (shifted.sum() + mine.sum() + even.sum()) * root
    return ce + dloss.all_reduce(local + moved, "sum")      # all_reduce


class TraceEmitsTest(unittest.TestCase):

    def test_the_declared_ops_are_the_ops_witnesses_emit(self):
        # (dtype, shape with -1 for a per-rank size, grad, replicated,
        # state).
        tensors = {"image": (torch.float32, (-1, DIM), True, False, False),
                   "text": (torch.float32, (-1, DIM), True, False, False),
                   "labels": (torch.int64, (-1,), False, False, False),
                   "scale": (torch.float32, (), True, True, False)}
        graph = trace_graph(witness, "witness", list(tensors), tensors, {},
                            "ddp")
        emitted = set(op_counts(graph.to_mlir()))
        declared = set(emitted_ops())
        self.assertEqual(
            sorted(declared - emitted), [],
            "declared in an EMITS of dloss/_trace but no witness emits them: "
            "add a witness here, or drop the op from EMITS")
        self.assertEqual(
            sorted(emitted - declared), [],
            "emitted by the tracer but declared in no EMITS of "
            "dloss/_trace: add each to the EMITS of the module whose rule "
            "emits it")


if __name__ == "__main__":
    unittest.main()
