// Every op users may build has a dloss::Graph builder: each op of the op table
// that its ODS definition does not mark internal (Dloss_Internal) has a
// witness here, and each witness builds its op through the builder.
//
// Without this, an op added to the dialect would be reachable from MLIR text
// only, and the gap would show when a user first looked for the builder.
#include "frontend/Graph.h"
#include "runtime/kernels/OpTable.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

using dloss::DType;
using dloss::Graph;
using dloss::Reduction;
using dloss::Tensor;

/// The inputs every witness may use.
struct Inputs {
  Tensor x, y;   // f32 [?, 4]
  Tensor w;      // f32 [8, 4], replicated
  Tensor labels; // i64 [?]
};

Inputs addInputs(Graph &g) {
  Inputs in;
  in.x = g.input("x", DType::F32, {-1, 4}, {/*grad=*/true, false});
  in.y = g.input("y", DType::F32, {-1, 4});
  in.w = g.input("w", DType::F32, {8, 4}, {false, /*replicated=*/true});
  in.labels = g.input("labels", DType::I64, {-1});
  return in;
}

using Witness = std::function<void(Graph &, const Inputs &)>;

/// One witness per op users may build: it builds that op (among others).
const std::map<std::string, Witness> &witnesses() {
  static const std::map<std::string, Witness> table = {
      {"dloss.acos", [](Graph &g, const Inputs &in) { g.acos(in.x); }},
      {"dloss.add", [](Graph &g, const Inputs &in) { g.add(in.x, in.y); }},
      {"dloss.all_gather",
       [](Graph &g, const Inputs &in) { g.allGather(in.x, 0); }},
      {"dloss.all_reduce",
       [](Graph &g, const Inputs &in) { g.allReduce(in.x, Reduction::Max); }},
      {"dloss.arange",
       [](Graph &g, const Inputs &in) {
         g.arange(g.size(0), g.dim(in.x, 0), DType::I64);
       }},
      {"dloss.broadcast", [](Graph &g, const Inputs &in) { g.broadcast(in.w, 0); }},
      {"dloss.cast",
       [](Graph &g, const Inputs &in) { g.cast(in.x, DType::F64); }},
      {"dloss.clamp",
       [](Graph &g, const Inputs &in) { g.clamp(in.x, -1.0, 1.0); }},
      {"dloss.cos", [](Graph &g, const Inputs &in) { g.cos(in.x); }},
      {"dloss.cross_entropy",
       [](Graph &g, const Inputs &in) {
         g.crossEntropy(g.matmul(in.x, in.w, false, true), in.labels, 1);
       }},
      {"dloss.dim", [](Graph &g, const Inputs &in) { g.dim(in.x, 1); }},
      {"dloss.div", [](Graph &g, const Inputs &in) { g.div(in.x, in.y); }},
      {"dloss.eq", [](Graph &g, const Inputs &in) { g.eq(in.x, in.y); }},
      {"dloss.exp", [](Graph &g, const Inputs &in) { g.exp(in.x); }},
      {"dloss.expand",
       [](Graph &g, const Inputs &in) {
         g.expand(g.logsumexp(in.x, 1), {1}, in.x);
       }},
      {"dloss.global_size",
       [](Graph &g, const Inputs &in) { g.globalSize(in.x, 0); }},
      {"dloss.l2_normalize",
       [](Graph &g, const Inputs &in) { g.l2Normalize(in.x, 1); }},
      {"dloss.log", [](Graph &g, const Inputs &in) { g.log(in.x); }},
      {"dloss.log_sigmoid",
       [](Graph &g, const Inputs &in) { g.logSigmoid(in.x); }},
      {"dloss.logsumexp",
       [](Graph &g, const Inputs &in) { g.logsumexp(in.x, 1); }},
      {"dloss.matmul",
       [](Graph &g, const Inputs &in) { g.matmul(in.x, in.y, false, true); }},
      {"dloss.mul", [](Graph &g, const Inputs &in) { g.mul(in.x, in.y); }},
      {"dloss.neg", [](Graph &g, const Inputs &in) { g.neg(in.x); }},
      {"dloss.pad",
       [](Graph &g, const Inputs &in) {
         g.pad(in.x, 1, g.size(1), g.size(2));
       }},
      {"dloss.put_along",
       [](Graph &g, const Inputs &in) {
         Tensor logits = g.matmul(in.x, in.w, false, true);
         g.putAlong(logits, in.labels, g.takeAlong(logits, in.labels, 1), 1);
       }},
      {"dloss.rank", [](Graph &g, const Inputs &) { g.rank(); }},
      {"dloss.reduce",
       [](Graph &g, const Inputs &in) { g.reduce(in.x, Reduction::Max, {1}); }},
      {"dloss.reduce_scatter",
       [](Graph &g, const Inputs &in) {
         g.reduceScatter(g.allGather(in.x, 0), Reduction::Sum, 0,
                         g.dim(in.x, 0));
       }},
      {"dloss.ring_shift",
       [](Graph &g, const Inputs &in) { g.ringShift(in.x, 1); }},
      {"dloss.select",
       [](Graph &g, const Inputs &in) {
         g.select(g.eq(in.x, in.y), in.x, in.y);
       }},
      {"dloss.shard_offset",
       [](Graph &g, const Inputs &in) { g.shardOffset(in.x, 0); }},
      {"dloss.sigmoid", [](Graph &g, const Inputs &in) { g.sigmoid(in.x); }},
      {"dloss.sin", [](Graph &g, const Inputs &in) { g.sin(in.x); }},
      {"dloss.slice",
       [](Graph &g, const Inputs &in) {
         g.slice(in.x, 1, g.size(1), g.size(2));
       }},
      {"dloss.softplus", [](Graph &g, const Inputs &in) { g.softplus(in.x); }},
      {"dloss.sqrt", [](Graph &g, const Inputs &in) { g.sqrt(in.x); }},
      {"dloss.stop_gradient",
       [](Graph &g, const Inputs &in) { g.stopGradient(in.x); }},
      {"dloss.sub", [](Graph &g, const Inputs &in) { g.sub(in.x, in.y); }},
      {"dloss.take_along",
       [](Graph &g, const Inputs &in) {
         g.takeAlong(g.matmul(in.x, in.w, false, true), in.labels, 1);
       }},
      {"dloss.world_size", [](Graph &g, const Inputs &) { g.worldSize(); }},
      {"dloss.zeros_like",
       [](Graph &g, const Inputs &in) { g.zerosLike(in.x); }},
  };
  return table;
}

/// How many times each dloss op occurs in a module's text (results, not
/// attributes: `= dloss.add`).
std::map<std::string, int> opCounts(const std::string &mlir) {
  std::map<std::string, int> counts;
  static const std::regex op(R"(=\s*(dloss\.[a-z_0-9]+)\b)");
  for (auto it = std::sregex_iterator(mlir.begin(), mlir.end(), op);
       it != std::sregex_iterator(); ++it)
    ++counts[(*it)[1].str()];
  return counts;
}

/// The MLIR of the inputs, `witness` and a fixed loss (the sum of x).
std::string buildWith(const Witness &witness) {
  Graph g("witness");
  Inputs in = addInputs(g);
  if (witness)
    witness(g, in);
  g.setLoss(
      g.allReduce(g.reduce(in.x, Reduction::Sum, {0, 1}), Reduction::Sum));
  return g.toMlir();
}

bool isDlossOp(const dloss::OpSpec &spec) {
  return spec.name.rfind("dloss.", 0) == 0;
}

TEST(GraphCompleteness, EveryOpUsersMayBuildHasAWitness) {
  std::string missing;
  int userOps = 0;
  for (const dloss::OpSpec &spec : dloss::opSpecs()) {
    if (!isDlossOp(spec) || spec.internal)
      continue;
    ++userOps;
    if (!witnesses().count(spec.name))
      missing += "  " + spec.name + "\n";
  }
  EXPECT_GT(userOps, 30) << "the op table lists too few dloss ops";
  EXPECT_TRUE(missing.empty())
      << "ops users may build with no dloss::Graph witness:\n"
      << missing
      << "Add a builder to frontend/Graph.h (and dloss.Graph, and a trace "
         "rule), and a witness to test/ops/GraphCompletenessTest.cpp; or, "
         "if only passes produce the op, mark it Dloss_Internal in "
         "dialect/DlossOps.td";
}

TEST(GraphCompleteness, EveryWitnessIsOfAnOpUsersMayBuild) {
  for (const auto &[name, witness] : witnesses()) {
    const dloss::OpSpec *spec = dloss::findOpSpec(name);
    EXPECT_TRUE(spec && !spec->internal)
        << "test/ops/GraphCompletenessTest.cpp has a witness for " << name
        << ", which the op table " << (spec ? "marks internal" : "lacks")
        << ": drop the witness, or the op's Dloss_Internal mark";
  }
}

TEST(GraphCompleteness, EachWitnessBuildsItsOp) {
  std::map<std::string, int> baseline = opCounts(buildWith(nullptr));
  for (const auto &[name, witness] : witnesses()) {
    std::string mlir = buildWith(witness);
    EXPECT_GT(opCounts(mlir)[name], baseline[name])
        << "the witness of " << name << " does not build it:\n"
        << mlir;
  }
}

TEST(GraphCompleteness, OpCountsReadOpsNotAttributes) {
  std::map<std::string, int> counts =
      opCounts("func.func @f(%a: tensor<?xf32> {dloss.grad}) attributes "
               "{dloss.loss} {\n  %0 = dloss.exp %a : tensor<?xf32>\n  %1 "
               "= dloss.exp %0 : tensor<?xf32>\n}");
  EXPECT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts["dloss.exp"], 2);
}

} // namespace
