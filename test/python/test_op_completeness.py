"""Every op users may build has its Python front ends: a dloss.Graph method
(a witness here builds each op through it) and a @dloss.loss trace rule
(dloss._trace.emitted_ops(), which test_trace_emits proves against traced
witnesses). The ops users never build are those the op table marks
internal (Dloss_Internal in their ODS definitions); nothing else is exempt.
One process, no group: the graphs are built, not compiled."""

import re
import unittest

import torch

import dloss
from dloss import _C
from dloss._trace import emitted_ops

HOW = ("Add a dloss.Graph method (python/dloss/graph.py, python/Module.cpp) "
       "and a witness in test/python/test_op_completeness.py, a trace rule "
       "in dloss/_trace (named in its module's EMITS, with a witness in "
       "test_trace_emits.py) and a dloss::Graph builder; or, if only passes "
       "produce the op, mark it Dloss_Internal in dialect/DlossOps.td")


def user_ops():
    """The dloss ops of the op table that users may build."""
    return sorted(op["name"] for op in _C.op_table()
                  if op["name"].startswith("dloss.") and not op["internal"])


def logits(g, i):
    return g.matmul(i["x"], i["w"], transpose_b=True)


# One witness per op users may build: it builds that op (among others).
WITNESSES = {
    "dloss.acos": lambda g, i: g.acos(i["x"]),
    "dloss.add": lambda g, i: i["x"] + i["y"],
    "dloss.all_gather": lambda g, i: g.all_gather(i["x"]),
    "dloss.all_reduce": lambda g, i: g.all_reduce(i["x"], "max"),
    "dloss.arange": lambda g, i: g.arange(g.size(0), g.dim(i["x"], 0)),
    "dloss.broadcast": lambda g, i: g.broadcast(i["w"], 0),
    "dloss.cast": lambda g, i: g.cast(i["x"], torch.float64),
    "dloss.clamp": lambda g, i: g.clamp(i["x"], -1.0, 1.0),
    "dloss.cos": lambda g, i: g.cos(i["x"]),
    "dloss.cross_entropy":
        lambda g, i: g.cross_entropy(logits(g, i), i["labels"]),
    "dloss.dim": lambda g, i: g.dim(i["x"], 1),
    "dloss.div": lambda g, i: i["x"] / i["y"],
    "dloss.eq": lambda g, i: g.eq(i["x"], i["y"]),
    "dloss.exp": lambda g, i: g.exp(i["x"]),
    "dloss.expand":
        lambda g, i: g.expand(g.logsumexp(i["x"], 1), [1], i["x"]),
    "dloss.global_size": lambda g, i: g.global_size(i["x"], 0),
    "dloss.l2_normalize": lambda g, i: g.l2_normalize(i["x"]),
    "dloss.log": lambda g, i: g.log(i["x"]),
    "dloss.log_sigmoid": lambda g, i: g.log_sigmoid(i["x"]),
    "dloss.logsumexp": lambda g, i: g.logsumexp(i["x"], 1),
    "dloss.matmul": lambda g, i: g.matmul(i["x"], i["y"], transpose_b=True),
    "dloss.mul": lambda g, i: i["x"] * i["y"],
    "dloss.neg": lambda g, i: -i["x"],
    "dloss.pad": lambda g, i: g.pad(i["x"], 1, g.size(1), g.size(2)),
    "dloss.put_along": lambda g, i: g.put_along(
        logits(g, i), i["labels"],
        g.take_along(logits(g, i), i["labels"], 1), 1),
    "dloss.rank": lambda g, i: g.rank(),
    "dloss.reduce": lambda g, i: g.reduce(i["x"], "max", [1]),
    "dloss.reduce_scatter": lambda g, i: g.reduce_scatter(
        g.all_gather(i["x"]), "sum", 0, g.dim(i["x"], 0)),
    "dloss.ring_shift": lambda g, i: g.ring_shift(i["x"], 1),
    "dloss.select": lambda g, i: g.select(g.eq(i["x"], i["y"]), i["x"],
                                          i["y"]),
    "dloss.shard_offset": lambda g, i: g.shard_offset(i["x"], 0),
    "dloss.sigmoid": lambda g, i: g.sigmoid(i["x"]),
    "dloss.sin": lambda g, i: g.sin(i["x"]),
    "dloss.slice": lambda g, i: g.slice(i["x"], 1, g.size(1), g.size(2)),
    "dloss.softplus": lambda g, i: g.softplus(i["x"]),
    "dloss.sqrt": lambda g, i: g.sqrt(i["x"]),
    "dloss.stop_gradient": lambda g, i: g.stop_gradient(i["x"]),
    "dloss.sub": lambda g, i: i["x"] - i["y"],
    "dloss.take_along":
        lambda g, i: g.take_along(logits(g, i), i["labels"], 1),
    "dloss.world_size": lambda g, i: g.world_size(),
    "dloss.zeros_like": lambda g, i: g.zeros_like(i["x"]),
}


def op_counts(mlir):
    """How many times each dloss op (not attribute) occurs in `mlir`."""
    counts = {}
    for name in re.findall(r"=\s*(dloss\.[a-z_0-9]+)\b", mlir):
        counts[name] = counts.get(name, 0) + 1
    return counts


def build_with(witness):
    """The MLIR of the inputs, `witness` and a fixed loss (the sum of x)."""
    g = dloss.Graph("witness")
    i = {"x": g.input("x", torch.float32, [-1, 4], grad=True),
         "y": g.input("y", torch.float32, [-1, 4]),
         "w": g.input("w", torch.float32, [8, 4], replicated=True),
         "labels": g.input("labels", torch.int64, [-1])}
    if witness is not None:
        witness(g, i)
    g.set_loss(g.all_reduce(g.reduce(i["x"], "sum", [0, 1])))
    return g.to_mlir()


class OpCompletenessTest(unittest.TestCase):

    def test_the_table_marks_ops_internal_and_fused(self):
        table = {op["name"]: op for op in _C.op_table()}
        self.assertGreater(len(user_ops()), 30)
        self.assertTrue(table["dloss.fused_similarity"]["fused"])
        self.assertTrue(table["dloss.fused_similarity"]["internal"])
        self.assertEqual(table["dloss.take_along"]["index"], (0, 1))
        self.assertFalse(table["dloss.take_along"]["internal"])
        self.assertIsNone(table["dloss.add"]["index"])
        self.assertTrue(table["dloss.ring_shift"]["collective"])
        self.assertFalse(table["dloss.add"]["collective"])
        self.assertFalse(table["dloss.l2_normalize_grad"]["fused"])
        self.assertTrue(table["dloss.l2_normalize_grad"]["internal"])

    def test_every_op_users_may_build_has_a_graph_witness(self):
        self.assertEqual(
            [op for op in user_ops() if op not in WITNESSES], [],
            "ops users may build with no dloss.Graph witness. " + HOW)

    def test_every_witness_is_of_an_op_users_may_build(self):
        self.assertEqual(
            sorted(set(WITNESSES) - set(user_ops())), [],
            "witnesses of ops that the op table lacks or marks internal: "
            "drop them, or the ops' Dloss_Internal marks")

    def test_each_witness_builds_its_op(self):
        baseline = op_counts(build_with(None))
        for name, witness in sorted(WITNESSES.items()):
            with self.subTest(op=name):
                mlir = build_with(witness)
                self.assertGreater(op_counts(mlir).get(name, 0),
                                   baseline.get(name, 0),
                                   "the witness of %s does not build it:\n%s"
                                   % (name, mlir))

    def test_every_op_users_may_build_has_a_trace_rule(self):
        self.assertEqual(
            sorted(set(user_ops()) - set(emitted_ops())), [],
            "ops users may build that no @dloss.loss trace rule emits. " +
            HOW)

    def test_op_counts_read_ops_not_attributes(self):
        mlir = ('func.func @f(%a: tensor<?xf32> {dloss.grad}) attributes '
                '{dloss.loss} {\n  %0 = dloss.exp %a : tensor<?xf32>\n'
                '  %1 = dloss.exp %0 : tensor<?xf32>\n}')
        self.assertEqual(op_counts(mlir), {"dloss.exp": 2})


if __name__ == "__main__":
    unittest.main()
