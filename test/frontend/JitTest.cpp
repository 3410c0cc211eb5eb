// The C++ graph builder, the LibTorch JIT and the ready-made losses, against
// ATen references with autograd.
#include "frontend/Jit.h"
#include "frontend/Graph.h"
#include "frontend/Losses.h"
#include "runtime/comm/Engines.h"
#include "runtime/plan/PlanText.h"
#include "runtime/support/Error.h"
#include "test/runtime/MultiProcess.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

namespace {

using namespace dloss;
using namespace dloss::test;

std::shared_ptr<Communicator> single() {
  return makeSingleProcessCommunicator();
}

/// Relative error at the scale of the reference.
double relativeError(const at::Tensor &got, const at::Tensor &want) {
  double scale = want.abs().max().item<double>();
  return (got.to(at::kDouble) - want.to(at::kDouble))
             .abs()
             .max()
             .item<double>() /
         std::max(scale, 1e-30);
}

at::Tensor normalizedRows(int64_t rows, int64_t dim, uint64_t seed) {
  at::Tensor x = at::randn({rows, dim}, at::TensorOptions().dtype(at::kFloat))
                     .mul(1.0 + static_cast<double>(seed % 3));
  return x / x.norm(2, 1, true);
}

//===----------------------------------------------------------------------===//
// Graph: errors at the op that is wrong, naming the C++ line
//===----------------------------------------------------------------------===//

TEST(GraphTest, ReportsTheOpAndTheCallerOnBadOperands) {
  Graph g("bad");
  Tensor a = g.input("a", DType::F32, {-1, 8});
  Tensor b = g.input("b", DType::F32, {-1, 16});
  int line = __LINE__ + 2;
  try {
    g.matmul(a, b, false, true);
    FAIL() << "a matmul with inner dimensions 8 and 16 was accepted";
  } catch (const Error &e) {
    std::string message = e.what();
    EXPECT_NE(message.find("dloss.matmul"), std::string::npos) << message;
    EXPECT_NE(message.find("inner dimensions differ: 8"), std::string::npos)
        << message;
    EXPECT_NE(message.find("JitTest.cpp:" + std::to_string(line)),
              std::string::npos)
        << message;
  }
  // The graph is still usable after the error.
  Tensor s = g.reduce(g.matmul(a, a, false, true), Reduction::Sum, {0, 1});
  g.setLoss(g.allReduce(s, Reduction::Sum));
  EXPECT_NE(g.toMlir().find("dloss.matmul"), std::string::npos);
}

TEST(GraphTest, RejectsMisuse) {
  Graph g("misuse"), other("other");
  Tensor x = g.input("x", DType::F32, {-1, 4});
  Tensor y = other.input("y", DType::F32, {-1, 4});
  EXPECT_THROW(g.add(x, y), Error);                   // another graph's tensor
  EXPECT_THROW(g.input("x", DType::F32, {3}), Error); // duplicate name
  EXPECT_THROW(g.input("i", DType::I64, {3}, {true}),
               Error);             // gradient of integers
  EXPECT_THROW(g.toMlir(), Error); // no loss yet
  try {
    g.setLoss(x); // not a scalar
    FAIL() << "a non-scalar loss was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("0-d floating-point tensor"),
              std::string::npos)
        << e.what();
  }
}

TEST(GraphTest, PrintsVerifiedDlossMlir) {
  Graph g = losses::clip({16});
  std::string text = g.toMlir();
  for (const char *piece :
       {"func.func @clip", "dloss.loss", "dloss.name = \"image\"",
        "dloss.all_gather", "dloss.shard_offset", "dloss.cross_entropy",
        "dloss.all_reduce sum"})
    EXPECT_NE(text.find(piece), std::string::npos) << piece << " missing in\n"
                                                   << text;
}

//===----------------------------------------------------------------------===//
// JIT: the compiled losses against ATen with autograd (one process)
//===----------------------------------------------------------------------===//

/// CLIP as OpenCLIP computes it, with ATen autograd.
at::Tensor clipReference(const at::Tensor &image, const at::Tensor &text,
                         const at::Tensor &scale) {
  at::Tensor labels = at::arange(image.size(0), at::kLong);
  at::Tensor logits = scale * image.matmul(text.t());
  return (at::cross_entropy_loss(logits, labels) +
          at::cross_entropy_loss(logits.t(), labels)) /
         2;
}

TEST(JitTest, ClipMatchesAtenAutograd) {
  torch::manual_seed(0);
  CompiledLoss loss = jit::compile(losses::clip({32}), {single()});
  EXPECT_EQ(loss.argumentNames(),
            (std::vector<std::string>{"image", "text", "scale"}));

  at::Tensor image = normalizedRows(12, 32, 1).requires_grad_();
  at::Tensor text = normalizedRows(12, 32, 2).requires_grad_();
  at::Tensor scale = at::scalar_tensor(14.28, at::kFloat).requires_grad_();
  at::Tensor value = loss({image, text, scale});
  ASSERT_TRUE(value.grad_fn()) << "the loss has no grad_fn";
  value.backward();

  at::Tensor i2 = image.detach().clone().requires_grad_();
  at::Tensor t2 = text.detach().clone().requires_grad_();
  at::Tensor s2 = scale.detach().clone().requires_grad_();
  at::Tensor want = clipReference(i2, t2, s2);
  want.backward();
  EXPECT_LT(relativeError(value.detach(), want.detach()), 1e-6);
  EXPECT_LT(relativeError(image.grad(), i2.grad()), 1e-5);
  EXPECT_LT(relativeError(text.grad(), t2.grad()), 1e-5);
  EXPECT_LT(relativeError(scale.grad(), s2.grad()), 1e-5);

  // Without requires_grad: the forward plan, no graph.
  at::Tensor plain = loss({image.detach(), text.detach(), scale.detach()});
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_LT(relativeError(plain, want.detach()), 1e-6);
}

TEST(JitTest, SiglipArcFaceCosFaceMatchAtenAutograd) {
  torch::manual_seed(1);
  {
    SCOPED_TRACE("siglip");
    CompiledLoss loss = jit::compile(losses::siglip({16}), {single()});
    at::Tensor x = normalizedRows(9, 16, 3).requires_grad_();
    at::Tensor y = normalizedRows(9, 16, 4).requires_grad_();
    at::Tensor logT = at::scalar_tensor(2.3, at::kFloat).requires_grad_();
    at::Tensor bias = at::scalar_tensor(-10.0, at::kFloat).requires_grad_();
    loss({x, y, logT, bias}).backward();

    auto x2 = x.detach().clone().requires_grad_(),
         y2 = y.detach().clone().requires_grad_();
    auto t2 = logT.detach().clone().requires_grad_(),
         b2 = bias.detach().clone().requires_grad_();
    at::Tensor logits = x2.matmul(y2.t()) * t2.exp() + b2;
    at::Tensor z = 2 * at::eye(9) - 1;
    at::Tensor want = -at::log_sigmoid(z * logits).sum() / 9;
    want.backward();
    EXPECT_LT(relativeError(x.grad(), x2.grad()), 1e-5);
    EXPECT_LT(relativeError(y.grad(), y2.grad()), 1e-5);
    EXPECT_LT(relativeError(logT.grad(), t2.grad()), 1e-5);
    EXPECT_LT(relativeError(bias.grad(), b2.grad()), 1e-5);
  }
  for (auto kind :
       {losses::MarginOptions::ArcFace, losses::MarginOptions::CosFace}) {
    SCOPED_TRACE(kind == losses::MarginOptions::ArcFace ? "arcface"
                                                        : "cosface");
    losses::MarginOptions options;
    options.kind = kind;
    options.dim = 16;
    options.classes = 7;
    options.scale = 30.0;
    options.margin = kind == losses::MarginOptions::ArcFace ? 0.5 : 0.35;
    CompiledLoss loss = jit::compile(losses::margin(options), {single()});
    at::Tensor x = at::randn({10, 16}).requires_grad_();
    at::Tensor labels = at::randint(0, 7, {10}, at::kLong);
    at::Tensor w = at::randn({7, 16}).requires_grad_();
    loss({x, labels, w}).backward();

    auto x2 = x.detach().clone().requires_grad_(),
         w2 = w.detach().clone().requires_grad_();
    at::Tensor cos =
        at::matmul(x2 / x2.norm(2, 1, true), (w2 / w2.norm(2, 1, true)).t());
    at::Tensor target = cos.gather(1, labels.unsqueeze(1)).squeeze(1);
    at::Tensor adjusted =
        kind == losses::MarginOptions::ArcFace
            ? at::cos(at::acos(target.clamp(-1 + 1e-7, 1 - 1e-7)) +
                      options.margin)
            : target - options.margin;
    at::Tensor logits =
        cos.scatter(1, labels.unsqueeze(1), adjusted.unsqueeze(1)) *
        options.scale;
    at::Tensor want = at::cross_entropy_loss(logits, labels);
    want.backward();
    EXPECT_LT(relativeError(x.grad(), x2.grad()), 1e-4);
    EXPECT_LT(relativeError(w.grad(), w2.grad()), 1e-4);
  }
}

/// Loss and gradients of `graph` on `inputs` (fresh leaves), one process.
std::vector<at::Tensor>
lossAndGrads(const Graph &graph, std::vector<at::Tensor> inputs, bool fuse) {
  jit::Options options{single()};
  options.fuse = fuse;
  CompiledLoss loss = jit::compile(graph, options);
  std::vector<at::Tensor> leaves;
  for (const at::Tensor &input : inputs)
    leaves.push_back(input.is_floating_point() ? input.clone().requires_grad_()
                                               : input);
  at::Tensor value = loss(leaves);
  value.backward();
  std::vector<at::Tensor> result = {value.detach()};
  for (const at::Tensor &leaf : leaves)
    if (leaf.requires_grad())
      result.push_back(leaf.grad());
  return result;
}

TEST(JitTest, FusedAndUnfusedLossesAgree) {
  // The library's CLIP and SigLIP graphs match the fusion patterns; fused and
  // unfused (Options::fuse) plans give the same loss and gradients.
  at::manual_seed(3);
  at::Tensor image = normalizedRows(9, 8, 1), text = normalizedRows(9, 8, 2);
  struct Case {
    const char *name;
    Graph graph;
    std::vector<at::Tensor> inputs;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"clip", losses::clip({8}), {image, text, at::scalar_tensor(7.0)}});
  cases.push_back(
      {"siglip",
       losses::siglip({8}),
       {image, text, at::scalar_tensor(2.3), at::scalar_tensor(-5.0)}});
  for (Case &c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_NE(plan::toText(jit::compilePlan(c.graph.toMlir())->plan())
                  .find("dloss.ring_"),
              std::string::npos)
        << "the library's " << c.name << " was not fused";
    auto fused = lossAndGrads(c.graph, c.inputs, true);
    auto unfused = lossAndGrads(c.graph, c.inputs, false);
    ASSERT_EQ(fused.size(), unfused.size());
    for (size_t i = 0; i < fused.size(); ++i)
      EXPECT_LT(relativeError(fused[i], unfused[i]), 1e-5) << "output " << i;
  }
}

TEST(JitTest, ClassShardedMarginOnOneRankIsTheReplicatedLoss) {
  // With one rank the single shard holds every class: the PartialFC graph
  // (fused to dloss.sharded_softmax) equals the replicated-W loss.
  for (auto kind :
       {losses::MarginOptions::ArcFace, losses::MarginOptions::CosFace}) {
    SCOPED_TRACE(kind == losses::MarginOptions::ArcFace ? "arcface"
                                                        : "cosface");
    losses::MarginOptions options;
    options.kind = kind;
    options.dim = 16;
    options.classes = 7;
    options.scale = 30.0;
    Graph replicated = losses::margin(options);
    options.shardedClasses = true;
    Graph sharded = losses::margin(options);
    EXPECT_NE(plan::toText(jit::compilePlan(sharded.toMlir())->plan())
                  .find("dloss.sharded_softmax"),
              std::string::npos);
    std::vector<at::Tensor> inputs = {at::randn({10, 16}),
                                      at::randint(0, 7, {10}, at::kLong),
                                      at::randn({7, 16})};
    auto want = lossAndGrads(replicated, inputs, false);
    auto got = lossAndGrads(sharded, inputs, true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(relativeError(got[i], want[i]), 1e-5) << "output " << i;
  }
}

TEST(JitTest, CachesPlansAndReportsCompileErrors) {
  jit::clearPlanCache();
  Graph g = losses::clip({8});
  std::string text = g.toMlir();
  auto first = jit::compilePlan(text);
  auto second = jit::compilePlan(text);
  EXPECT_EQ(first.get(), second.get()) << "the same IR compiled twice";
  EXPECT_EQ(jit::cachedPlans(), 1u);
  auto global = jit::compilePlan(text, "global");
  EXPECT_NE(first.get(), global.get());
  EXPECT_EQ(jit::cachedPlans(), 2u);

  // A loss that forgot its all_reduce: the compiler's message, with its
  // location.
  const char *varying = R"(
func.func @bad(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0] : tensor<?xf32>
  return %s : tensor<f32>
})";
  try {
    jit::compilePlan(varying, "", "bad.mlir");
    FAIL() << "a varying loss compiled";
  } catch (const Error &e) {
    std::string message = e.what();
    EXPECT_NE(message.find("bad.mlir:4:3"), std::string::npos) << message;
    EXPECT_NE(message.find("varies across ranks"), std::string::npos)
        << message;
  }
}

//===----------------------------------------------------------------------===//
// A training loop on 2 ranks matches the same loop on one process
//===----------------------------------------------------------------------===//

/// Per-rank batches of a small two-tower model's inputs, fixed by a seed.
struct Batch {
  at::Tensor a, b;
};
Batch batchOf(int step, int rank, int64_t rows) {
  at::manual_seed(1000 * step + rank);
  return {at::randn({rows, 6}), at::randn({rows, 6})};
}

/// Trains a linear "image" tower and a linear "text" tower with the compiled
/// CLIP loss and SGD for a few steps. On N ranks each rank sees its own rows
/// and averages parameter gradients over ranks (as DDP does); on one
/// process the same rows are concatenated. Returns the final weights.
std::vector<at::Tensor> train(CompiledLoss &loss, Communicator &comm,
                              const std::vector<int64_t> &rowsPerRank,
                              bool global) {
  at::manual_seed(7);
  torch::nn::Linear imageTower(6, 4), textTower(6, 4);
  at::Tensor scale = at::scalar_tensor(5.0, at::kFloat).requires_grad_();
  std::vector<at::Tensor> params = {imageTower->weight, imageTower->bias,
                                    textTower->weight, textTower->bias, scale};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.5));
  for (int step = 0; step < 4; ++step) {
    std::vector<at::Tensor> as, bs;
    for (int r = 0; r < static_cast<int>(rowsPerRank.size()); ++r) {
      if (!global && r != comm.rank())
        continue;
      Batch batch = batchOf(step, r, rowsPerRank[r]);
      as.push_back(batch.a);
      bs.push_back(batch.b);
    }
    sgd.zero_grad();
    at::Tensor image = torch::nn::functional::normalize(
        imageTower(at::cat(as)),
        torch::nn::functional::NormalizeFuncOptions().dim(1));
    at::Tensor text = torch::nn::functional::normalize(
        textTower(at::cat(bs)),
        torch::nn::functional::NormalizeFuncOptions().dim(1));
    loss({image, text, scale}).backward();
    // DDP's part: average the parameter gradients over the ranks.
    for (at::Tensor &p : params)
      p.mutable_grad() = comm.allReduce(p.grad(), Reduction::Mean);
    sgd.step();
  }
  std::vector<at::Tensor> result;
  for (at::Tensor &p : params)
    result.push_back(p.detach().clone());
  return result;
}

TEST(JitTest, TwoRankTrainingMatchesOneProcess) {
  const std::vector<int64_t> rows = {5, 3}; // uneven on purpose
  int port = freePort();
  auto outcomes = runChildren({0, 1}, [&](int rank) {
    auto comm = std::shared_ptr<Communicator>(connectProcessGroup(
        loopbackOptions(port, rank, 2, kCollectiveTimeout)));
    CompiledLoss distributed = jit::compile(losses::clip({4}), {comm});
    std::vector<at::Tensor> got = train(distributed, *comm, rows, false);

    auto one = std::shared_ptr<Communicator>(makeSingleProcessCommunicator());
    CompiledLoss reference = jit::compile(losses::clip({4}), {one});
    std::vector<at::Tensor> want = train(reference, *one, rows, true);
    for (size_t i = 0; i < got.size(); ++i) {
      double err = relativeError(got[i], want[i]);
      CHILD_CHECK(err < 1e-5,
                  "parameter " << i << " differs from one process by " << err);
    }
    // And the training moved the parameters: the test can fail.
    at::manual_seed(7);
    torch::nn::Linear initial(6, 4);
    CHILD_CHECK(relativeError(got[0], initial->weight.detach()) > 1e-3,
                "training did not change the weights");
  });
  expectAllSucceeded(outcomes, "2-rank training");
}

} // namespace
