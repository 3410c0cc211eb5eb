// The fused ring-tiled kernels on real Gloo processes, against ATen (and its
// autograd) on the global matrices.
#include "PlanTestUtil.h"

#include "runtime/fused/FusedKernels.h"
#include "runtime/fused/Schedule.h"
#include "runtime/fused/TileMath.h"
#include "runtime/support/Error.h"
#include "test/runtime/MultiProcess.h"

#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

namespace {

using namespace dloss::test;
using dloss::Communicator;
using dloss::Error;
using dloss::Executor;
namespace fused = dloss::fused;

constexpr int64_t kWidth = 6;
constexpr double kInfinity = std::numeric_limits<double>::infinity();

/// How results are compared: f64 absolutely, f32 relative to the largest
/// magnitude of the reference.
struct Precision {
  at::ScalarType type;
  double forward;
  double gradient;
  bool relative;
};
const Precision kF64{at::kDouble, 1e-10, 1e-9, false};
const Precision kF32{at::kFloat, 1e-5, 1e-5, true};

/// Every rank's size along axis 0 of the two sharded operands.
struct Layout {
  std::vector<int64_t> rows, cols;
};

std::vector<int64_t> firstOf(std::vector<int64_t> sizes, int worldSize) {
  sizes.resize(worldSize);
  return sizes;
}

/// Uneven shards, then uneven shards where a rank holds none (N >= 2).
std::vector<Layout> layouts(int worldSize) {
  return {{firstOf({5, 3, 7, 1}, worldSize), firstOf({4, 6, 2, 5}, worldSize)},
          {firstOf({4, 0, 6, 2}, worldSize), firstOf({3, 5, 0, 4}, worldSize)}};
}

std::string describe(const Layout &layout) {
  auto list = [](const std::vector<int64_t> &sizes) {
    std::string out;
    for (int64_t size : sizes) {
      if (!out.empty())
        out += ',';
      out += std::to_string(size);
    }
    return out;
  };
  return "rows {" + list(layout.rows) + "} cols {" + list(layout.cols) + "}";
}

// Tiny tiles cross every block edge; the default one (DLOSS_TILE unset)
// covers these problems in one tile.
const std::vector<std::string> kTiles = {"3x4", "1x1", ""};

/// Standard normal values of the tested precision, held in f64 so that the
/// reference sees exactly the kernel's inputs.
at::Tensor randn(std::vector<int64_t> shape, const Precision &precision) {
  return at::randn(shape, at::TensorOptions(at::kDouble))
      .to(precision.type)
      .to(at::kDouble);
}

at::Tensor leaf(const at::Tensor &value) {
  return value.clone().requires_grad_(true);
}

/// `got` (in the tested type) against the f64 reference `want`.
void expectClose(const at::Tensor &got, const at::Tensor &want, double tol,
                 const Precision &precision, const std::string &what) {
  CHILD_CHECK(got.scalar_type() == precision.type,
              what << ": dtype " << got.scalar_type());
  CHILD_CHECK(got.sizes() == want.sizes(), what << ": shape " << got.sizes()
                                                << ", expected "
                                                << want.sizes());
  at::Tensor actual = got.to(at::kDouble), expected = want.detach();
  if (precision.relative && expected.numel() > 0)
    tol *= std::max(1.0, expected.abs().max().item<double>());
  // Equal infinities are close; the error is over the other elements.
  at::Tensor differ = actual != expected;
  double error =
      differ.any().item<bool>()
          ? (actual - expected).abs().masked_select(differ).max().item<double>()
          : 0.0;
  CHILD_CHECK(at::allclose(actual, expected, 0, tol),
              what << ": max error " << error << " > " << tol << "\ngot\n"
                   << actual << "\nexpected\n"
                   << expected);
}

/// The sum of every rank's `partial`.
at::Tensor summed(Communicator &comm, const at::Tensor &partial) {
  return comm.allReduce(partial, dloss::Reduction::Sum);
}

/// How a result is compared with its reference.
enum class Compare {
  Forward,  ///< at the forward tolerance
  Gradient, ///< at the gradient tolerance
  Summed,   ///< summed over ranks, at the gradient tolerance
};

/// One result's reference.
struct Want {
  at::Tensor value;
  std::string what;
  Compare how = Compare::Forward;
};

/// One case: this rank's shards of the global inputs, and the comparisons.
struct Case {
  Communicator &comm;
  const Layout &layout;
  const Precision &precision;
  std::string context;

  int rank() const { return comm.rank(); }
  at::Tensor byRow(const at::Tensor &t) const {
    return shard(t, layout.rows, rank());
  }
  at::Tensor byCol(const at::Tensor &t) const {
    return shard(t, layout.cols, rank());
  }
  /// A float input of the tested type.
  at::Tensor in(const at::Tensor &t) const { return t.to(precision.type); }

  void expectForward(const at::Tensor &got, const at::Tensor &want,
                     const std::string &what) const {
    expectClose(got, want, precision.forward, precision, context + ": " + what);
  }
  void expectGradient(const at::Tensor &got, const at::Tensor &want,
                      const std::string &what) const {
    expectClose(got, want, precision.gradient, precision,
                context + ": " + what);
  }
  /// Every rank's partial gradient `got`, summed, against `want`.
  void expectSummed(const at::Tensor &got, const at::Tensor &want,
                    const std::string &what) const {
    expectGradient(summed(comm, got), want, what + " summed over ranks");
  }

  /// Runs `op` (see runFused) with one result per entry of `wants`, checks
  /// each against its reference and returns them.
  std::vector<at::Tensor>
  run(const std::string &op, const std::vector<at::Tensor> &operands,
      const std::vector<Want> &wants,
      const std::vector<size_t> &replicated = {}) const {
    std::vector<at::Tensor> results = runFused(
        comm, op, operands, static_cast<int>(wants.size()), replicated);
    for (size_t k = 0; k < wants.size(); ++k) {
      const Want &want = wants[k];
      switch (want.how) {
      case Compare::Forward:
        expectForward(results[k], want.value, want.what);
        break;
      case Compare::Gradient:
        expectGradient(results[k], want.value, want.what);
        break;
      case Compare::Summed:
        expectSummed(results[k], want.value, want.what);
        break;
      }
    }
    return results;
  }
};

/// Runs `check(case)` for every layout and tile.
template <typename Check>
void forEachCase(Communicator &comm, const Precision &precision,
                 const std::vector<std::string> &tiles, Check &&check) {
  for (const Layout &layout : layouts(comm.worldSize()))
    for (const std::string &tile : tiles) {
      TileEnv env(tile);
      check(Case{comm, layout, precision,
                 "rank " + std::to_string(comm.rank()) + ", " +
                     describe(layout) + ", tile '" + tile + "'"});
    }
}

//===----------------------------------------------------------------------===//
// The checks, one per forward/backward pair
//===----------------------------------------------------------------------===//

void checkRingSoftmaxCE(const Case &c) {
  const int64_t numRows = total(c.layout.rows), numCols = total(c.layout.cols);
  at::manual_seed(11);
  at::Tensor rows = randn({numRows, kWidth}, c.precision);
  at::Tensor cols = randn({numCols, kWidth}, c.precision);
  at::Tensor scale = at::scalar_tensor(1.75, at::kDouble);
  at::Tensor rowTargets = at::randint(numCols, {numRows}, at::kLong);
  at::Tensor colTargets = at::randint(numRows, {numCols}, at::kLong);
  at::Tensor ctRow = randn({numRows}, c.precision);
  at::Tensor ctCol = randn({numCols}, c.precision);

  at::Tensor R = leaf(rows), C = leaf(cols), s = leaf(scale);
  at::Tensor L = s * R.mm(C.t());
  at::Tensor rowLse = L.logsumexp(1), colLse = L.logsumexp(0);
  at::Tensor rowCe = rowLse - L.gather(1, rowTargets.unsqueeze(1)).squeeze(1);
  at::Tensor colCe = colLse - L.gather(0, colTargets.unsqueeze(0)).squeeze(0);
  ((ctRow * rowCe).sum() + (ctCol * colCe).sum())
      .backward({}, /*retain_graph=*/true);

  std::vector<at::Tensor> operands = {c.in(c.byRow(rows)), c.in(c.byCol(cols)),
                                      c.in(scale), c.byRow(rowTargets),
                                      c.byCol(colTargets)};
  std::vector<at::Tensor> forward = c.run("dloss.ring_softmax_ce", operands,
                                          {{c.byRow(rowCe), "row_ce"},
                                           {c.byCol(colCe), "col_ce"},
                                           {c.byRow(rowLse), "row_lse"},
                                           {c.byCol(colLse), "col_lse"}});

  operands.insert(operands.end(), {forward[2], forward[3], c.in(c.byRow(ctRow)),
                                   c.in(c.byCol(ctCol))});
  std::vector<at::Tensor> backward =
      c.run("dloss.ring_softmax_ce_grad", operands,
            {{c.byRow(R.grad()), "d_rows", Compare::Gradient},
             {c.byCol(C.grad()), "d_cols", Compare::Gradient},
             {s.grad(), "d_scale", Compare::Summed}});

  // Each rank's own share of d_scale is the gradient of its own rows' and
  // columns' losses, as in the unfused plan (each rank differentiates the
  // cross-entropies of the rows it holds).
  at::Tensor rowMine = at::zeros({numRows}, at::kDouble);
  at::Tensor colMine = at::zeros({numCols}, at::kDouble);
  shard(rowMine, c.layout.rows, c.rank()).fill_(1);
  shard(colMine, c.layout.cols, c.rank()).fill_(1);
  at::Tensor share = torch::autograd::grad(
      {(ctRow * rowMine * rowCe).sum() + (ctCol * colMine * colCe).sum()}, {s},
      {}, /*retain_graph=*/false)[0];
  c.expectGradient(backward[2], share, "d_scale share");
}

void checkRingSigmoidPairs(const Case &c) {
  const int64_t numRows = total(c.layout.rows), numCols = total(c.layout.cols);
  at::manual_seed(12);
  // A large scale: many |L| > 20, where a naive softplus loses digits.
  at::Tensor rows = randn({numRows, kWidth}, c.precision);
  at::Tensor cols = randn({numCols, kWidth}, c.precision);
  at::Tensor scale = at::scalar_tensor(4.5, at::kDouble);
  at::Tensor bias = at::scalar_tensor(-2.25, at::kDouble);
  at::Tensor targets = at::randint(numCols, {numRows}, at::kLong);
  at::Tensor ctPair = randn({numRows}, c.precision);
  at::Tensor ctPositive = randn({numRows}, c.precision);

  at::Tensor R = leaf(rows), C = leaf(cols), s = leaf(scale), b = leaf(bias);
  at::Tensor L = s * R.mm(C.t()) + b;
  at::Tensor pairSum = (L.clamp_min(0) + (-L.abs()).exp().log1p()).sum(1);
  at::Tensor positive = L.gather(1, targets.unsqueeze(1)).squeeze(1);
  ((ctPair * pairSum).sum() + (ctPositive * positive).sum()).backward();

  std::vector<at::Tensor> operands = {c.in(c.byRow(rows)), c.in(c.byCol(cols)),
                                      c.in(scale), c.in(bias),
                                      c.byRow(targets)};
  c.run("dloss.ring_sigmoid_pairs", operands,
        {{c.byRow(pairSum), "pair_sum"}, {c.byRow(positive), "positive"}});

  operands.insert(operands.end(),
                  {c.in(c.byRow(ctPair)), c.in(c.byRow(ctPositive))});
  c.run("dloss.ring_sigmoid_pairs_grad", operands,
        {{c.byRow(R.grad()), "d_rows", Compare::Gradient},
         {c.byCol(C.grad()), "d_cols", Compare::Gradient},
         {s.grad(), "d_scale", Compare::Summed},
         {b.grad(), "d_bias", Compare::Summed}});
}

/// The layout's `cols` are the class shards; the batch (7 rows) is the same
/// on every rank.
void checkShardedSoftmax(const Case &c) {
  const int64_t batch = 7, classes = total(c.layout.cols);
  at::manual_seed(13);
  at::Tensor rows = randn({batch, kWidth}, c.precision);
  at::Tensor weights = randn({classes, kWidth}, c.precision);
  at::Tensor scale = at::scalar_tensor(2.5, at::kDouble);
  at::Tensor targets = at::randint(classes, {batch}, at::kLong);
  at::Tensor ctLse = randn({batch}, c.precision);
  at::Tensor ctTarget = randn({batch}, c.precision);

  at::Tensor R = leaf(rows), W = leaf(weights), s = leaf(scale);
  at::Tensor L = s * R.mm(W.t());
  at::Tensor isTarget =
      at::zeros_like(L, at::kBool).scatter_(1, targets.unsqueeze(1), true);
  at::Tensor lseRest =
      L.masked_fill(isTarget, -std::numeric_limits<double>::infinity())
          .logsumexp(1);
  at::Tensor targetDot = (R * W.index_select(0, targets)).sum(1);
  ((ctLse * lseRest).sum() + (ctTarget * targetDot).sum()).backward();

  // rows, scale and targets (and the backward's vectors) are replicated.
  std::vector<at::Tensor> operands = {c.in(rows), c.in(c.byCol(weights)),
                                      c.in(scale), targets};
  std::vector<at::Tensor> forward =
      c.run("dloss.sharded_softmax", operands,
            {{lseRest, "lse_rest"}, {targetDot, "target_dot"}}, {0, 2, 3});

  operands.insert(operands.end(), {forward[0], c.in(ctLse), c.in(ctTarget)});
  c.run("dloss.sharded_softmax_grad", operands,
        {{R.grad(), "d_rows", Compare::Summed},
         {c.byCol(W.grad()), "d_weights", Compare::Gradient},
         {s.grad(), "d_scale", Compare::Summed}},
        {0, 2, 3, 4, 5, 6});
}

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

/// (world size, schedule): every kernel runs as the ring and as the gather
/// (fused/Schedule.h), each against the same global reference.
class FusedKernelTest
    : public ::testing::TestWithParam<std::tuple<int, fused::Schedule>> {
protected:
  int worldSize() const { return std::get<0>(GetParam()); }
  fused::Schedule schedule() const { return std::get<1>(GetParam()); }
};

TEST_P(FusedKernelTest, RingSoftmaxCEMatchesGlobalReference) {
  runGloo(worldSize(), [schedule = schedule()](Communicator &comm) {
    fused::ScheduleScope scope(schedule);
    forEachCase(comm, kF64, kTiles, checkRingSoftmaxCE);
  });
}

TEST_P(FusedKernelTest, RingSigmoidPairsMatchesGlobalReference) {
  runGloo(worldSize(), [schedule = schedule()](Communicator &comm) {
    fused::ScheduleScope scope(schedule);
    forEachCase(comm, kF64, kTiles, checkRingSigmoidPairs);
  });
}

TEST_P(FusedKernelTest, ShardedSoftmaxMatchesGlobalReference) {
  runGloo(worldSize(), [schedule = schedule()](Communicator &comm) {
    fused::ScheduleScope scope(schedule);
    forEachCase(comm, kF64, kTiles, checkShardedSoftmax);
  });
}

// One class in all (on rank 0, none elsewhere): nothing but the target is
// left, so lse_rest is -inf, and the target dot is still exact.
TEST_P(FusedKernelTest, ShardedSoftmaxWithOneClassGivesMinusInfinity) {
  runGloo(worldSize(), [&](Communicator &comm) {
    fused::ScheduleScope scope(schedule());
    at::manual_seed(14);
    at::Tensor rows = at::randn({4, kWidth}, at::kDouble);
    at::Tensor weight = at::randn({1, kWidth}, at::kDouble);
    at::Tensor mine = comm.rank() == 0 ? weight : weight.narrow(0, 0, 0);
    at::Tensor targets = at::zeros({4}, at::kLong);
    std::vector<at::Tensor> forward =
        runFused(comm, "dloss.sharded_softmax",
                 {rows, mine, at::scalar_tensor(3.0, at::kDouble), targets}, 2,
                 {0, 2, 3});
    double inf = std::numeric_limits<double>::infinity();
    expectClose(forward[0], at::full({4}, -inf, at::kDouble), 0, kF64,
                "lse_rest");
    expectClose(forward[1], rows.mv(weight[0]), 1e-12, kF64, "target_dot");
  });
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, FusedKernelTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(fused::Schedule::Ring,
                                         fused::Schedule::Gather)),
    [](const ::testing::TestParamInfo<FusedKernelTest::ParamType> &info) {
      return "N" + std::to_string(std::get<0>(info.param)) + "_" +
             fused::scheduleName(std::get<1>(info.param));
    });

//===----------------------------------------------------------------------===//
// Choosing the schedule
//===----------------------------------------------------------------------===//

TEST(ScheduleTest, NamesParseAndBadOnesSayWhatIsExpected) {
  for (fused::Schedule s :
       {fused::Schedule::Auto, fused::Schedule::Ring, fused::Schedule::Gather})
    EXPECT_EQ(fused::parseSchedule(fused::scheduleName(s), "test"), s);
  try {
    fused::parseSchedule("fast", "DLOSS_SCHEDULE");
    FAIL() << "a bad name was accepted";
  } catch (const Error &error) {
    std::string text = error.what();
    EXPECT_NE(text.find("DLOSS_SCHEDULE='fast'"), std::string::npos) << text;
    EXPECT_NE(text.find("auto, ring or gather"), std::string::npos) << text;
  }
}

TEST(ScheduleTest, AutoGathersUpToTheCrossoverAndForcedSettingsHold) {
  using fused::Schedule;
  for (c10::DeviceType device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    for (int world : {2, 4, 64}) {
      int64_t crossover = fused::gatherCrossoverBytes(world, device);
      EXPECT_GT(crossover, 0);
      EXPECT_LE(crossover,
                dloss::schedule::engineCosts(fused::engineFor(device))
                    .gatherMemoryCap);
      fused::PassSize small{world, crossover, device};
      fused::PassSize large{world, crossover + 1, device};
      EXPECT_EQ(fused::chooseSchedule(Schedule::Auto, small), Schedule::Gather);
      EXPECT_EQ(fused::chooseSchedule(Schedule::Auto, large), Schedule::Ring);
      EXPECT_EQ(fused::chooseSchedule(Schedule::Ring, small), Schedule::Ring);
      EXPECT_EQ(fused::chooseSchedule(Schedule::Gather, large),
                Schedule::Gather);
    }
    // More ranks, more hops for the ring: the crossover grows until the
    // memory cap holds it.
    EXPECT_LE(fused::gatherCrossoverBytes(2, device),
              fused::gatherCrossoverBytes(4, device));
    // One rank moves nothing: the ring's single step.
    EXPECT_EQ(fused::chooseSchedule(Schedule::Auto, {1, 0, device}),
              Schedule::Ring);
  }
}

// CLIP's gather of both sides (its similarity computed twice, two exchanges
// saved) pays at 4 Gloo ranks, d 256, up to B_local of about 180: auto
// takes it at 128 and the one-sided gather or the ring at 512, as measured
// (docs/Fusion.md). One rank saves nothing.
TEST(ScheduleTest, BothSidesPayWhileTheirArithmeticCostsLessThanTheExchanges) {
  using dloss::schedule::bothSidesPay;
  using dloss::schedule::Engine;
  auto extra = [](double bLocal, int world) {
    // Two similarity-sized products: 2 (R / N) C d with R = C = N B_local.
    return 2 * bLocal * bLocal * world * 256.0;
  };
  EXPECT_TRUE(bothSidesPay(4, Engine::Gloo, extra(128, 4), 2));
  EXPECT_FALSE(bothSidesPay(4, Engine::Gloo, extra(512, 4), 2));
  EXPECT_TRUE(bothSidesPay(2, Engine::Gloo, extra(128, 2), 2));
  EXPECT_FALSE(bothSidesPay(2, Engine::Gloo, extra(512, 2), 2));
  EXPECT_FALSE(bothSidesPay(1, Engine::Gloo, extra(8, 1), 2));
  // A GPU computes the same tiles a thousand times faster.
  EXPECT_TRUE(bothSidesPay(4, Engine::Nccl, extra(512, 4), 2));
}

// Under auto, a small CLIP pass runs as the gather (on the CPU, one
// all-gather of both sides and no carries), and all three give the same
// results. The ring and the first gather make two collectives each, the
// preflight and one exchange; auto's preflight then carries the rows the
// gather before it made room for, and its gather moves nothing.
TEST(ScheduleTest, AutoRunsTheGatherAtSmallSizes) {
  runGloo(3, [](Communicator &comm) {
    at::manual_seed(21 + comm.rank());
    const int64_t n = 2 + comm.rank();
    std::vector<at::Tensor> operands = {at::randn({n, kWidth}, at::kDouble),
                                        at::randn({n, kWidth}, at::kDouble),
                                        at::scalar_tensor(2.0, at::kDouble),
                                        at::zeros({n}, at::kLong),
                                        at::zeros({n}, at::kLong)};
    auto run = [&](fused::Schedule schedule, int64_t &collectives) {
      fused::ScheduleScope scope(schedule);
      int64_t before = comm.collectivesStarted();
      fused::PassCounts passes = fused::passCounts();
      std::vector<at::Tensor> results =
          runFused(comm, "dloss.ring_softmax_ce", operands, 4);
      collectives = comm.collectivesStarted() - before;
      // The executor's call runs under the test's setting (a ring pass
      // under ring, a gather pass under gather and auto).
      const bool ring = schedule == fused::Schedule::Ring;
      EXPECT_EQ(fused::passCounts().ring - passes.ring, ring ? 1 : 0);
      EXPECT_EQ(fused::passCounts().gather - passes.gather, ring ? 0 : 1);
      return results;
    };
    int64_t ring = 0, gather = 0, automatic = 0;
    std::vector<at::Tensor> byRing = run(fused::Schedule::Ring, ring);
    std::vector<at::Tensor> byGather = run(fused::Schedule::Gather, gather);
    std::vector<at::Tensor> byAuto = run(fused::Schedule::Auto, automatic);
    // The preflight, then the ring's exchange or the gather; a ring call
    // leaves the preflight no room, a gather call its rows' bytes.
    EXPECT_EQ(ring, 2);
    EXPECT_EQ(gather, 2);
    EXPECT_EQ(automatic, 1);
    for (size_t k = 0; k < byRing.size(); ++k) {
      expectClose(byGather[k], byRing[k], 1e-13, kF64, "gather against ring");
      expectClose(byAuto[k], byGather[k], 0, kF64, "auto against gather");
    }
  });
}

// A forward's similarity kept for the backward of the same call: found by
// the rows' and columns' registers and shape, forgotten with either
// register, and neither kept outside a call nor above the budget.
TEST(ScheduleTest, AKeptSimilarityServesItsCallsBackwardOnly) {
  const at::TensorOptions f64 = at::TensorOptions(at::kDouble);
  EXPECT_FALSE(fused::keepSimilarity(0, 1, 4, 6, f64).defined())
      << "kept outside a call";
  {
    fused::ScheduleScope scope(fused::Schedule::Gather);
    at::Tensor kept = fused::keepSimilarity(0, 1, 4, 6, f64);
    ASSERT_TRUE(kept.defined());
    kept.fill_(3.0);
    const int64_t reads = fused::passCounts().kept;
    at::Tensor found = fused::keptSimilarity(0, 1, 4, 6, f64);
    ASSERT_TRUE(found.defined());
    EXPECT_TRUE(at::equal(found, kept));
    EXPECT_EQ(fused::passCounts().kept, reads + 1);
    EXPECT_FALSE(fused::keptSimilarity(1, 0, 4, 6, f64).defined());
    EXPECT_FALSE(fused::keptSimilarity(0, 1, 4, 7, f64).defined());
    EXPECT_FALSE(
        fused::keptSimilarity(0, 1, 4, 6, at::TensorOptions(at::kFloat))
            .defined());
    fused::forgetGathered(1);
    EXPECT_FALSE(fused::keptSimilarity(0, 1, 4, 6, f64).defined())
        << "kept after its columns' register was freed";
    const int64_t over = fused::kKeptSimilarityBytes / 8 + 1;
    EXPECT_FALSE(fused::keepSimilarity(0, 1, over, 1, f64).defined());
    fused::keepSimilarity(2, 3, 2, 2, f64);
  }
  fused::ScheduleScope next(fused::Schedule::Gather);
  EXPECT_FALSE(fused::keptSimilarity(2, 3, 2, 2, f64).defined())
      << "kept past its call";
}

// The preflight's fold (Communicator::allGatherIntsFolding): from the
// second call on, the rows a call's first fused op gathers travel with the
// preflight, one collective in all, on uneven batches with an empty rank.
// A rank whose rows outgrow the room sends none, and every rank then runs
// the gather itself; results are the ring's every time.
TEST(ScheduleTest, ThePreflightCarriesTheFirstGatherFromTheSecondCall) {
  runGloo(3, [](Communicator &comm) {
    auto operandsOf = [&](int64_t n, int seed) {
      at::manual_seed(seed + comm.rank());
      return std::vector<at::Tensor>{at::randn({n, kWidth}, at::kDouble),
                                     at::randn({n, kWidth}, at::kDouble),
                                     at::scalar_tensor(2.0, at::kDouble),
                                     at::zeros({n}, at::kLong),
                                     at::zeros({n}, at::kLong)};
    };
    auto run = [&](fused::Schedule schedule,
                   const std::vector<at::Tensor> &operands,
                   int64_t &collectives) {
      fused::ScheduleScope scope(schedule);
      int64_t before = comm.collectivesStarted();
      std::vector<at::Tensor> results =
          runFused(comm, "dloss.ring_softmax_ce", operands, 4);
      collectives = comm.collectivesStarted() - before;
      return results;
    };
    // Rank 1 holds no rows at first, and 5 from the third call on, which
    // outgrow the room the second call made: that call gathers itself.
    const std::vector<int64_t> small = {2, 0, 3}, grown = {2, 5, 3};
    const std::vector<std::pair<const std::vector<int64_t> *, int64_t>> calls =
        {{&small, 2}, {&small, 1}, {&grown, 2}, {&grown, 1}};
    int seed = 40;
    for (const auto &[sizes, expected] : calls) {
      std::vector<at::Tensor> operands =
          operandsOf((*sizes)[comm.rank()], ++seed);
      int64_t gathered = 0, ringed = 0;
      std::vector<at::Tensor> byGather =
          run(fused::Schedule::Gather, operands, gathered);
      EXPECT_EQ(gathered, expected) << "call " << seed - 40;
      // The room for the next call: the largest rank's rows and columns.
      EXPECT_EQ(comm.foldCapacity(),
                2 * kWidth * 8 *
                    *std::max_element(sizes->begin(), sizes->end()));
      std::vector<at::Tensor> byRing =
          run(fused::Schedule::Ring, operands, ringed);
      EXPECT_EQ(comm.foldCapacity(), 0) << "a ring call leaves no room";
      for (size_t k = 0; k < byRing.size(); ++k)
        expectClose(byGather[k], byRing[k], 1e-13, kF64,
                    "folded gather against ring");
      // The ring call emptied the room: the next gather makes it again.
      std::vector<at::Tensor> again =
          run(fused::Schedule::Gather, operands, gathered);
      EXPECT_EQ(gathered, 2);
      for (size_t k = 0; k < byRing.size(); ++k)
        expectClose(again[k], byRing[k], 1e-13, kF64, "gather against ring");
    }
  });
}

// SigLIP's one-sided gather reads only the columns, so from the second call
// on the preflight carries them alone (the last call's gathers say what they
// read) and the room it makes is the columns' bytes: folding the rows too would
// move bytes no pass reads. Results are the ring's every time.
TEST(ScheduleTest, ThePreflightCarriesOnlyWhatTheLastCallsGathersRead) {
  runGloo(2, [](Communicator &comm) {
    // 1000 and 1100 rows of width 6: auto's one-sided gather (both sides
    // would compute more than they save; see the test below).
    const std::vector<int64_t> sizes = {1000, 1100};
    const int64_t n = sizes[comm.rank()];
    at::manual_seed(70 + comm.rank());
    const std::vector<at::Tensor> operands = {
        at::randn({n, kWidth}, at::kDouble),
        at::randn({n, kWidth}, at::kDouble),
        at::scalar_tensor(2.0, at::kDouble),
        at::scalar_tensor(-1.0, at::kDouble),
        at::arange(n, at::kLong) + (comm.rank() ? sizes[0] : 0)};
    std::vector<at::Tensor> byRing;
    {
      fused::ScheduleScope scope(fused::Schedule::Ring);
      byRing = runFused(comm, "dloss.ring_sigmoid_pairs", operands, 2);
    }
    fused::ScheduleScope scope(fused::Schedule::Auto);
    std::unique_ptr<Executor> executor =
        fusedExecutor(comm, "dloss.ring_sigmoid_pairs", operands, 2);
    const int64_t rowBytes = kWidth * 8, largest = 1100;
    // The first call folds nothing (the ring call left no room) and makes
    // room for rows and columns; the second carries the columns only, its
    // gather moves nothing, and it makes room for them alone.
    const std::vector<std::pair<int64_t, int64_t>> calls = {
        {2 * largest * rowBytes, -1},
        {largest * rowBytes, 1},
        {largest * rowBytes, 1}};
    int64_t first = 0;
    for (size_t c = 0; c < calls.size(); ++c) {
      const int64_t before = comm.collectivesStarted();
      std::vector<at::Tensor> results = executor->run("f", operands);
      const int64_t made = comm.collectivesStarted() - before;
      if (c == 0)
        first = made;
      else
        EXPECT_EQ(made, first - calls[c].second) << "call " << c;
      EXPECT_EQ(comm.foldCapacity(), calls[c].first) << "call " << c;
      for (size_t k = 0; k < byRing.size(); ++k)
        expectClose(results[k], byRing[k], 1e-13, kF64,
                    "call " + std::to_string(c) + " against the ring");
    }
  });
}

// The room the fold makes is in every allGatherInts frame, so a rank whose
// call differs from its peers' (a loss where they exchange a size) still
// sends a transfer of their size, and every rank fails with a dloss error
// naming the mismatch rather than Gloo aborting the process.
TEST(ScheduleTest, ARankInAnotherCallStillFailsCleanlyWhenTheFrameHasRoom) {
  runGloo(2, [](Communicator &comm) {
    std::vector<at::Tensor> operands = {at::randn({3, kWidth}, at::kDouble),
                                        at::randn({3, kWidth}, at::kDouble),
                                        at::scalar_tensor(2.0, at::kDouble),
                                        at::zeros({3}, at::kLong),
                                        at::zeros({3}, at::kLong)};
    fused::ScheduleScope scope(fused::Schedule::Gather);
    runFused(comm, "dloss.ring_softmax_ce", operands, 4);
    CHILD_CHECK(comm.foldCapacity() == 2 * 3 * kWidth * 8,
                "room after a gather call: " << comm.foldCapacity());
    std::string message = errorOf([&] {
      if (comm.rank() == 0)
        runFused(comm, "dloss.ring_softmax_ce", operands, 4);
      else
        comm.allGatherInts({7});
    });
    CHILD_CHECK(message.find("found the ranks in different calls") !=
                    std::string::npos,
                "not named as a mismatch: " << message);
  });
}

// Where the bytes are under the crossover but computing the tiles twice
// would cost more than the exchanges it saves (bothSidesPay: here 1000 and
// 1100 rows per rank of width 6 at 2 ranks), auto runs CLIP and SigLIP as
// the one-sided gather: gather passes, the carries' exchanges among the
// collectives, and the same results as every other schedule.
TEST(ScheduleTest, AutoTakesTheOneSidedGatherWhereBothSidesDoNotPay) {
  runGloo(2, [](Communicator &comm) {
    const Layout layout{{1000, 1100}, {1100, 1000}};
    fused::ScheduleScope scope(fused::Schedule::Auto);
    // The collectives of each check (its forward and backward, each a call
    // of its own with a preflight, and the all-reduce of each summed 0-d
    // gradient): CLIP's forward gathers and exchanges, its backward gathers
    // the column statistics and exchanges (2 + 1 + 3 + 1 = 7; both sides
    // would make 2 + 2 + 1); SigLIP's forward gathers, its backward gathers
    // the columns again (another call) and exchanges (2 + 3 + 2 = 7; both
    // sides 2 + 2 + 2).
    const std::vector<std::pair<void (*)(const Case &), int64_t>> checks = {
        {checkRingSoftmaxCE, 7}, {checkRingSigmoidPairs, 7}};
    for (const auto &[check, collectives] : checks) {
      fused::PassCounts before = fused::passCounts();
      const int64_t started = comm.collectivesStarted();
      check(Case{comm, layout, kF64,
                 "rank " + std::to_string(comm.rank()) + ", auto"});
      fused::PassCounts after = fused::passCounts();
      CHILD_CHECK(after.gather - before.gather == 2 &&
                      after.ring == before.ring,
                  "auto did not gather both passes");
      const int64_t made = comm.collectivesStarted() - started;
      CHILD_CHECK(made == collectives,
                  made << " collectives, not the one-sided gather's "
                       << collectives);
    }
  });
}

/// The loss value of the two tests below: argument 0 summed into register
/// 2, then all-reduced into register 3.
std::vector<StepSpec> summedLoss() {
  return {StepSpec{"dloss.reduce",
                   {0},
                   {2},
                   {textAttr("kind", "sum"), intsAttr("axes", {0, 1})}},
          StepSpec{"dloss.all_reduce", {2}, {3}, {textAttr("kind", "sum")}}};
}

// A plan's all_reduce whose value only local steps and the results read
// (a loss value) rides on the call's next all-gather: the preflight and
// that gather are the call's only collectives, and the local step after it
// sees the reduced value. One whose value a later collective reads runs
// where it stands.
TEST(ScheduleTest, ALossAllReduceRidesOnTheNextAllGather) {
  auto plan = [](bool readByCollective) {
    FunctionSpec function;
    function.args = {tensorArg("x", at::zeros({1, 4}, at::kDouble), {0}),
                     tensorArg("y", at::zeros({1, 3}, at::kDouble), {0})};
    function.numRegisters = 6;
    function.steps = summedLoss();
    function.steps.push_back(
        readByCollective
            ? StepSpec{"dloss.all_reduce", {3}, {4}, {textAttr("kind", "max")}}
            : StepSpec{"dloss.mul", {3, 3}, {4}, {}});
    function.steps.push_back(
        StepSpec{"dloss.all_gather", {1}, {5}, {intAttr("axis", 0)}});
    function.results = {4, 5};
    return buildPlan({function});
  };
  runGloo(3, [&](Communicator &comm) {
    const int r = comm.rank();
    at::Tensor x = at::full({r + 1, 4}, r + 1.0, at::kDouble);
    at::Tensor y = at::full({r, 3}, static_cast<double>(r), at::kDouble);
    const double total = 4.0 * (1 + 4 + 9); // rank q: q+1 rows of q+1
    for (bool readByCollective : {false, true}) {
      Executor executor(plan(readByCollective), comm);
      const int64_t before = comm.collectivesStarted();
      std::vector<at::Tensor> results = executor.run("f", {x, y});
      const int64_t made = comm.collectivesStarted() - before;
      // Read by the second all_reduce, the first runs where it stands;
      // the second, read by nothing, rides.
      CHILD_CHECK(made == (readByCollective ? 3 : 2),
                  "the call made " << made << " collectives");
      const double expected = readByCollective ? total : total * total;
      CHILD_CHECK(results[0].dim() == 0 &&
                      results[0].item<double>() == expected,
                  "the reduced value is " << results[0]);
      at::Tensor rows = at::cat({at::full({1, 3}, 1.0, at::kDouble),
                                 at::full({2, 3}, 2.0, at::kDouble)});
      CHILD_CHECK(at::equal(results[1], rows), "the gathered rows changed");
    }
  });
}

// With no all-gather after it, a loss's all_reduce rides on the call's next
// all_reduce of the same kind and element type (ArcFace's replicated W's
// gradient): the preflight and that all_reduce are the call's only
// collectives, and both values are the sums. Of another element type or
// kind, it waits for the flush at the end of the call: one more.
TEST(ScheduleTest, ALossAllReduceRidesOnTheNextAllReduceOfItsKind) {
  auto plan = [](at::ScalarType vectorType, const std::string &kind) {
    FunctionSpec function;
    function.args = {tensorArg("x", at::zeros({1, 4}, at::kDouble), {0}),
                     tensorArg("w", at::zeros({3}, vectorType), {})};
    function.args[1].replicated = true;
    function.numRegisters = 6;
    function.steps = summedLoss();
    function.steps.push_back(StepSpec{"dloss.mul", {3, 3}, {4}, {}});
    function.steps.push_back(
        StepSpec{"dloss.all_reduce", {1}, {5}, {textAttr("kind", kind)}});
    function.results = {4, 5};
    return buildPlan({function});
  };
  runGloo(3, [&](Communicator &comm) {
    const int r = comm.rank();
    at::Tensor x = at::full({r + 1, 4}, r + 1.0, at::kDouble);
    const double total = 4.0 * (1 + 4 + 9); // rank q: q+1 rows of q+1
    struct Case {
      at::ScalarType type;
      std::string kind;
      int64_t collectives;
    };
    for (const Case &c :
         {Case{at::kDouble, "sum", 2}, Case{at::kFloat, "sum", 3},
          Case{at::kDouble, "max", 3}}) {
      at::Tensor w = at::arange(3, c.type) + 1; // 1, 2, 3 on every rank
      Executor executor(plan(c.type, c.kind), comm);
      const int64_t before = comm.collectivesStarted();
      std::vector<at::Tensor> results = executor.run("f", {x, w});
      const int64_t made = comm.collectivesStarted() - before;
      const std::string where =
          std::string(c10::toString(c.type)) + " " + c.kind + ": ";
      CHILD_CHECK(made == c.collectives,
                  where << "the call made " << made << " collectives");
      CHILD_CHECK(results[0].dim() == 0 &&
                      results[0].item<double>() == total * total,
                  where << "the loss is " << results[0]);
      at::Tensor expected = c.kind == "sum" ? w * 3 : w;
      CHILD_CHECK(results[1].sizes() == w.sizes() &&
                      at::equal(results[1], expected),
                  where << "the vector is " << results[1]);
    }
  });
}

// f32 inputs compute in f32: within 1e-5 of the f64 reference, relative.
TEST(FusedKernelF32Test, EveryKernelMatchesTheF64Reference) {
  runGloo(3, [](Communicator &comm) {
    std::vector<std::string> tiles = {"3x4", ""};
    forEachCase(comm, kF32, tiles, checkRingSoftmaxCE);
    forEachCase(comm, kF32, tiles, checkRingSigmoidPairs);
    forEachCase(comm, kF32, tiles, checkShardedSoftmax);
  });
}

// Every rank passes a target past the last column: each raises before any
// transfer, naming the op, its rank and the value.
TEST(FusedKernelErrorTest, OutOfRangeTargetNamesOpRankAndValue) {
  runGloo(2, [](Communicator &comm) {
    const std::vector<int64_t> sizes = {2, 3};
    int64_t mine = sizes[comm.rank()];
    at::Tensor rows = at::randn({mine, kWidth}, at::kDouble);
    at::Tensor targets = at::zeros({mine}, at::kLong);
    targets[mine - 1] = 5; // 5 columns in all: one past the end.
    std::string message = errorOf([&] {
      runFused(comm, "dloss.ring_softmax_ce",
               {rows, rows, at::scalar_tensor(1.0, at::kDouble), targets,
                at::zeros({mine}, at::kLong)},
               4);
    });
    std::string rank = "rank " + std::to_string(comm.rank());
    std::string value = "row_targets[" + std::to_string(mine - 1) + "] = 5";
    for (const std::string &part :
         {rank, std::string("op dloss.ring_softmax_ce"), value,
          std::string("out of range [0, 5)")})
      CHILD_CHECK(message.find(part) != std::string::npos,
                  "'" << part << "' missing from: " << message);
  });
}

/// A 7 x 9 tile whose rows 1, 4 and column 6 lie about 150 below the rest
/// (further than the shared-shift range, so they are summed with their own
/// shift), in `type`.
at::Tensor farTile(at::ScalarType type) {
  at::manual_seed(31);
  at::Tensor tile = at::randn({7, 9}, at::kDouble);
  tile.select(0, 1).sub_(150);
  tile.select(0, 4).sub_(150);
  tile.select(1, 6).sub_(150);
  return tile.to(type);
}

/// The log-sum-exp along `dim` of scale * tile, folded into running
/// statistics (max, sum), in double.
at::Tensor referenceLse(const at::Tensor &tile, double scale, int64_t dim,
                        const at::Tensor &max, const at::Tensor &sum) {
  at::Tensor fresh = at::logsumexp(tile.to(at::kDouble) * scale, dim);
  at::Tensor running = max.to(at::kDouble) + sum.to(at::kDouble).log();
  return at::logaddexp(fresh, running);
}

// The one-exp fold of both directions gives the two per-direction folds'
// statistics: rows and columns far below the tile's maximum, running
// statistics that are empty, smaller and larger than the tile's, a tile
// with an infinity (the per-direction path).
TEST(FusedTileTest, BothDirectionsFoldLikeEachDirection) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const double tol = type == at::kFloat ? 2e-6 : 1e-12;
    at::Tensor plain = farTile(type);
    at::Tensor withInf = plain.clone();
    withInf[2][3] = kInfinity;
    for (const at::Tensor &tile : {plain, withInf}) {
      auto opts = at::TensorOptions(type);
      at::Tensor rowMax =
          at::tensor({-kInfinity, 3.0, -200.0, 0.5, 400.0, -1.0, 2.0},
                     at::kDouble)
              .to(type);
      at::Tensor rowSum =
          at::tensor({0.0, 2.0, 1.5, 1.0, 3.0, 1.0, 4.0}, at::kDouble).to(type);
      at::Tensor colMax = at::full({9}, -kInfinity, opts);
      at::Tensor colSum = at::zeros({9}, opts);
      colMax[2] = 1.0;
      colSum[2] = 2.0;
      at::Tensor wantRows = referenceLse(tile, 1.5, 1, rowMax, rowSum);
      at::Tensor wantCols = referenceLse(tile, 1.5, 0, colMax, colSum);
      dloss::fused::Block whole{0, tile.size(0), 0, tile.size(1)};
      dloss::fused::foldLseBoth(tile, 1.5, whole, rowMax, rowSum, colMax,
                                colSum);
      at::Tensor gotRows = dloss::fused::lseOf(rowMax, rowSum).to(at::kDouble);
      at::Tensor gotCols = dloss::fused::lseOf(colMax, colSum).to(at::kDouble);
      for (auto [got, want] :
           {std::pair{gotRows, wantRows}, std::pair{gotCols, wantCols}})
        for (int64_t k = 0; k < got.size(0); ++k) {
          double g = got[k].item<double>(), w = want[k].item<double>();
          if (std::isinf(w))
            EXPECT_EQ(g, w) << k;
          else
            EXPECT_NEAR(g, w, tol * std::max(1.0, std::fabs(w))) << k;
        }
    }
  }
}

// The CLIP gradient tile, one exp per element where the row and column
// log-sum-exps lie close and two where they do not, against the formula in
// double.
TEST(FusedTileTest, SoftmaxGradientTileMatchesTheFormula) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    for (double spread : {3.0, 120.0}) { // one exp; two
      at::manual_seed(37);
      const double scale = 2.0;
      at::Tensor s = at::randn({5, 8}, at::kDouble);
      at::Tensor logits = s * scale;
      // The lses of a larger matrix: each at least its row's or column's
      // largest logit; the rows' `spread` higher (exp(logit - rowLse)
      // underflows in f32 at 120, the column term does not).
      at::Tensor rowLse =
          std::get<0>(logits.max(1)) + at::rand({5}, at::kDouble) + spread;
      at::Tensor colLse =
          std::get<0>(logits.max(0)) + at::rand({8}, at::kDouble);
      at::Tensor ctRow = at::randn({5}, at::kDouble);
      at::Tensor ctCol = at::randn({8}, at::kDouble);
      at::Tensor rowPart =
          ctRow.unsqueeze(1) * (logits - rowLse.unsqueeze(1)).exp();
      at::Tensor colPart =
          ctCol.unsqueeze(0) * (logits - colLse.unsqueeze(0)).exp();
      at::Tensor want = rowPart + colPart;
      at::Tensor grad = at::empty({5, 8}, at::TensorOptions(type));
      std::pair<double, double> sums = dloss::fused::softmaxTileGradient(
          s.to(type), scale, dloss::fused::Block{0, 5, 0, 8}, rowLse.to(type),
          ctRow.to(type), colLse.to(type), ctCol.to(type), grad);
      const double tol = type == at::kFloat ? 1e-5 : 1e-12;
      EXPECT_TRUE(at::allclose(grad.to(at::kDouble), want, tol, tol))
          << "spread " << spread << "\n"
          << grad << want;
      EXPECT_NEAR(sums.first, (want * s).sum().item<double>(), 10 * tol);
      EXPECT_NEAR(sums.second, (colPart * s).sum().item<double>(), 10 * tol);
    }
  }
}

// The CPU tiles' GEMM on row-major blocks of larger matrices (row strides
// above the widths), every transposition, alpha and beta, and empty sizes:
// through the BLAS ATen's library resolves (pip's x86 torch exports MKL's
// sgemm_) and through ATen (the fallback) it gives at::mm's product.
template <typename T> void checkTileGemm(at::ScalarType type, double tol) {
  ASSERT_TRUE(dloss::fused::tileGemmCallsBlas())
      << "libtorch_cpu resolves sgemm_ here (MKL in pip's x86 torch): "
         "tileGemm should find it";
  at::manual_seed(41);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{5, 7, 3},
                         {33, 17, 65},
                         {1, 9, 4},
                         {0, 4, 3},
                         {4, 0, 3},
                         {4, 6, 0}})
    for (bool transA : {false, true})
      for (bool transB : {false, true})
        for (auto [alpha, beta] :
             {std::pair{1.0, 0.0}, std::pair{0.5, 1.0}, std::pair{-2.0, 1.0}}) {
          // Stored blocks with 3 extra columns each: ld > width.
          at::Tensor aStore = at::randn({transA ? k : m, (transA ? m : k) + 3},
                                        at::TensorOptions(type));
          at::Tensor bStore = at::randn({transB ? n : k, (transB ? k : n) + 3},
                                        at::TensorOptions(type));
          at::Tensor a = aStore.narrow(1, 0, transA ? m : k);
          at::Tensor b = bStore.narrow(1, 0, transB ? k : n);
          at::Tensor opA = transA ? a.t() : a, opB = transB ? b.t() : b;
          at::Tensor c0 = at::randn({m, n + 3}, at::TensorOptions(type));
          if (beta == 0) // beta = 0 ignores c, NaN included
            c0.narrow(1, 0, n).fill_(std::numeric_limits<double>::quiet_NaN());
          at::Tensor want =
              (alpha * at::mm(opA.to(at::kDouble), opB.to(at::kDouble)) +
               (beta == 0 ? at::zeros({m, n}, at::kDouble)
                          : beta * c0.narrow(1, 0, n).to(at::kDouble)));
          for (bool viaATen : {false, true}) {
            at::Tensor c = c0.clone();
            auto gemm = viaATen ? dloss::fused::tileGemmATen<T>
                                : dloss::fused::tileGemm<T>;
            gemm(transA, transB, m, n, k, static_cast<T>(alpha),
                 a.data_ptr<T>(), aStore.stride(0), b.data_ptr<T>(),
                 bStore.stride(0), static_cast<T>(beta), c.data_ptr<T>(),
                 c.stride(0));
            EXPECT_TRUE(
                at::allclose(c.narrow(1, 0, n).to(at::kDouble), want, tol, tol))
                << (viaATen ? "ATen" : "BLAS") << " m " << m << " n " << n
                << " k " << k << " transA " << transA << " transB " << transB
                << " alpha " << alpha << " beta " << beta;
            // The columns past n are another block's: untouched.
            EXPECT_TRUE(at::equal(c.narrow(1, n, 3), c0.narrow(1, n, 3)));
          }
        }
}

TEST(FusedTileTest, TileGemmIsTheBlockProduct) {
  checkTileGemm<float>(at::kFloat, 1e-4);
  checkTileGemm<double>(at::kDouble, 1e-12);
}

TEST(FusedTileTest, DefaultFitsTheCacheAndTheEnvironmentOverridesIt) {
  TileEnv unset("");
  dloss::TileShape f32 = dloss::fusedTileShape(sizeof(float));
  dloss::TileShape f64 = dloss::fusedTileShape(sizeof(double));
  std::printf(
      "default tiles: f32 %lldx%lld, f64 %lldx%lld\n",
      static_cast<long long>(f32.rows), static_cast<long long>(f32.cols),
      static_cast<long long>(f64.rows), static_cast<long long>(f64.cols));
  for (dloss::TileShape tile : {f32, f64}) {
    EXPECT_EQ(tile.cols % 64, 0);
    EXPECT_GE(tile.rows, 32);
    EXPECT_LE(tile.rows, 256);
  }
  {
    TileEnv env("3x5");
    dloss::TileShape tile = dloss::fusedTileShape(sizeof(float));
    EXPECT_EQ(tile.rows, 3);
    EXPECT_EQ(tile.cols, 5);
  }
  for (const char *bad : {"3x", "x5", "0x5", "3x-1", "35", "3x5x"}) {
    TileEnv env(bad);
    std::string message = errorOf([] { dloss::fusedTileShape(sizeof(float)); });
    EXPECT_NE(message.find(std::string("DLOSS_TILE='") + bad + "'"),
              std::string::npos)
        << message;
  }
}

} // namespace
