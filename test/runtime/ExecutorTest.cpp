// Tests of the plan loader and the executor: preflight, register lifetimes,
// errors, and uneven batches on in-process ranks (threads).
#include "PlanTestUtil.h"

#include "runtime/comm/Engines.h"
#include "runtime/exec/Executor.h"
#include "runtime/plan/PlanFile.h"
#include "runtime/support/Error.h"
#include "test/runtime/ForwardingCommunicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace {

using namespace dloss::test;
using dloss::Communicator;
using dloss::Executor;
using dloss::PlanFile;
using dloss::Reduction;

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

#define EXPECT_CONTAINS(text, part)                                            \
  EXPECT_TRUE(contains(text, part))                                            \
      << "missing: " << (part) << "\n  in: " << (text)

//===----------------------------------------------------------------------===//
// Test communicators
//===----------------------------------------------------------------------===//

/// Forwards to the single-process communicator and lets a test look inside
/// the run at each allReduce.
class SpyCommunicator final : public dloss::test::ForwardingCommunicator {
public:
  SpyCommunicator()
      : ForwardingCommunicator(dloss::makeSingleProcessCommunicator()) {}

  std::function<void(int call, const at::Tensor &result)> onAllReduce;

  at::Tensor allReduce(const at::Tensor &input, Reduction op) override {
    at::Tensor result = inner->allReduce(input, op);
    if (onAllReduce)
      onAllReduce(allReduceCalls++, result);
    return result;
  }
  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override {
    ++allGatherIntsCalls;
    return inner->allGatherInts(values);
  }

  int allReduceCalls = 0;
  int allGatherIntsCalls = 0;
};

/// The meeting point of in-process ranks: the n-th exchange of every rank
/// returns all ranks' n-th values.
class ThreadWorld {
public:
  explicit ThreadWorld(int size) : size(size) {}

  std::vector<at::Tensor> exchange(int rank, uint64_t seq, at::Tensor value) {
    std::unique_lock<std::mutex> lock(mutex);
    Round &round = rounds[seq];
    round.values.resize(size);
    round.values[rank] = std::move(value);
    ++round.arrived;
    ready.notify_all();
    // A bounded wait: a rank that never arrives is a test failure, not a hang.
    if (!ready.wait_for(lock, std::chrono::seconds(30),
                        [&] { return round.arrived == size; }))
      throw std::runtime_error("thread world: rank " + std::to_string(rank) +
                               " waited 30 s in exchange " +
                               std::to_string(seq));
    std::vector<at::Tensor> out = round.values;
    if (++round.left == size)
      rounds.erase(seq);
    return out;
  }

  int size;

private:
  struct Round {
    std::vector<at::Tensor> values;
    int arrived = 0;
    int left = 0;
  };
  std::mutex mutex;
  std::condition_variable ready;
  std::map<uint64_t, Round> rounds; // std::map: references stay valid
};

/// One rank of a ThreadWorld; the collectives' reference semantics.
class ThreadCommunicator final : public Communicator {
public:
  ThreadCommunicator(ThreadWorld &world, int rank) : world(world), me(rank) {}

  int rank() const override { return me; }
  int worldSize() const override { return world.size; }
  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) override {
    std::vector<at::Tensor> all = exchange(input);
    for (int r = 0; r < world.size; ++r)
      if (sizes.at(r) != all[r].size(axis))
        throw std::runtime_error("allGather: wrong sizes");
    return at::cat(all, axis);
  }
  at::Tensor allReduce(const at::Tensor &input, Reduction op) override {
    return combine(exchange(input), op);
  }
  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) override {
    at::Tensor total = combine(exchange(input), op);
    int64_t offset = 0;
    for (int r = 0; r < me; ++r)
      offset += sizes.at(r);
    return total.narrow(axis, offset, sizes.at(me)).clone();
  }
  at::Tensor broadcast(const at::Tensor &input, int root) override {
    return exchange(input).at(root).clone();
  }
  at::Tensor ringShift(const at::Tensor &input, int64_t shift) override {
    int64_t n = world.size;
    return exchange(input).at(((me - shift) % n + n) % n).clone();
  }
  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override {
    ++allGatherIntsCalls;
    std::vector<int64_t> out;
    for (const at::Tensor &t :
         exchange(at::tensor(values, at::TensorOptions(at::kLong))))
      out.insert(out.end(), t.data_ptr<int64_t>(),
                 t.data_ptr<int64_t>() + t.numel());
    return out;
  }
  std::unique_ptr<Request> send(const at::Tensor &, int, int) override {
    throw std::runtime_error("send: not in thread worlds");
  }
  int allGatherIntsCalls = 0;
  std::unique_ptr<Request> recv(at::Tensor &, int, int) override {
    throw std::runtime_error("recv: not in thread worlds");
  }

private:
  std::vector<at::Tensor> exchange(const at::Tensor &value) {
    return world.exchange(me, seq++, value);
  }
  static at::Tensor combine(const std::vector<at::Tensor> &all, Reduction op) {
    at::Tensor stacked = at::stack(all);
    switch (op) {
    case Reduction::Sum:
      return stacked.sum(0);
    case Reduction::Mean:
      return stacked.sum(0) / static_cast<double>(all.size());
    case Reduction::Max:
      return stacked.amax(0);
    case Reduction::Min:
      return stacked.amin(0);
    }
    throw std::runtime_error("bad reduction");
  }

  ThreadWorld &world;
  int me;
  uint64_t seq = 0;
};

struct RankOutcome {
  std::vector<at::Tensor> results;
  std::string error; // what() of the exception, empty when none
};

/// Runs `body` on `size` in-process ranks, one thread each.
std::vector<RankOutcome> runRanks(
    int size,
    const std::function<std::vector<at::Tensor>(int, Communicator &)> &body) {
  ThreadWorld world(size);
  std::vector<RankOutcome> outcomes(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(world, r);
      try {
        outcomes[r].results = body(r, comm);
      } catch (const std::exception &error) {
        outcomes[r].error = error.what();
      }
    });
  for (std::thread &thread : threads)
    thread.join();
  return outcomes;
}

//===----------------------------------------------------------------------===//
// PlanFile
//===----------------------------------------------------------------------===//

FunctionSpec negFunction(const std::string &name = "f") {
  FunctionSpec function =
      singleOpFunction("dloss.neg", {at::zeros({2, 3})}, {});
  function.name = name;
  function.args[0].shape = {-1, 3};
  return function;
}

std::string writeTemp(const std::string &name,
                      const std::vector<uint8_t> &bytes) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char *>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(PlanFileTest, LoadsVerifiesAndFindsFunctions) {
  std::vector<uint8_t> bytes =
      buildPlanBytes({negFunction("loss"), negFunction("loss_grad")}, 77);
  std::string path = writeTemp("dloss_good.plan", bytes);
  std::shared_ptr<const PlanFile> plan = PlanFile::load(path);
  EXPECT_EQ(plan->name(), path);
  EXPECT_EQ(plan->fingerprint(), 77u);
  EXPECT_EQ(plan->functionNames(),
            (std::vector<std::string>{"loss", "loss_grad"}));
  ASSERT_NE(plan->findFunction("loss_grad"), nullptr);
  EXPECT_EQ(plan->findFunction("nope"), nullptr);
  EXPECT_CONTAINS(errorOf([&] { plan->function("nope"); }),
                  "has no function @nope. It has @loss, @loss_grad.");

  {
    SCOPED_TRACE("missing file");
    std::string message =
        errorOf([] { PlanFile::load("/nonexistent/x.plan"); });
    EXPECT_CONTAINS(message, "cannot open plan '/nonexistent/x.plan'");
    EXPECT_CONTAINS(message, "dlossc");
  }
  {
    SCOPED_TRACE("not a plan");
    std::string garbage =
        writeTemp("dloss_garbage.plan", std::vector<uint8_t>(100, 0x41));
    std::string message = errorOf([&] { PlanFile::load(garbage); });
    EXPECT_CONTAINS(message, "plan '" + garbage + "' is not a dloss plan");
    EXPECT_CONTAINS(message, "Recompile the loss with dlossc");
  }
  {
    SCOPED_TRACE("truncated");
    std::vector<uint8_t> half(bytes.begin(), bytes.begin() + bytes.size() / 2);
    std::string message =
        errorOf([&] { PlanFile::fromBytes(half, "half.plan"); });
    EXPECT_CONTAINS(message, "plan 'half.plan' is corrupt or truncated");
    EXPECT_CONTAINS(errorOf([] {
                      PlanFile::fromBytes({1, 2}, "tiny.plan");
                    }),
                    "too short to be a plan");
  }
  {
    SCOPED_TRACE("wrong version");
    std::vector<uint8_t> future =
        buildPlanBytes({negFunction()}, 1, dloss::kPlanVersion + 1);
    std::string message =
        errorOf([&] { PlanFile::fromBytes(future, "future.plan"); });
    EXPECT_CONTAINS(message, "plan 'future.plan' has plan format version " +
                                 std::to_string(dloss::kPlanVersion + 1) +
                                 ", this runtime reads version " +
                                 std::to_string(dloss::kPlanVersion));
    EXPECT_CONTAINS(message, "Recompile");
  }
  {
    // A plan from before the current version (version 1 plans lack the fused
    // step's facts) is refused by number, before any step is read.
    SCOPED_TRACE("older version");
    ASSERT_GE(dloss::kPlanVersion, 2);
    std::vector<uint8_t> old =
        buildPlanBytes({negFunction()}, 1, dloss::kPlanVersion - 1);
    std::string message =
        errorOf([&] { PlanFile::fromBytes(old, "old.plan"); });
    EXPECT_CONTAINS(message, "plan 'old.plan' has plan format version " +
                                 std::to_string(dloss::kPlanVersion - 1) +
                                 ", this runtime reads version " +
                                 std::to_string(dloss::kPlanVersion));
    EXPECT_CONTAINS(message, "Recompile");
  }
  {
    SCOPED_TRACE("duplicate function");
    EXPECT_CONTAINS(errorOf([] {
                      buildPlan({negFunction(), negFunction()});
                    }),
                    "defines function 'f' twice");
  }
}

// A loss @name (grad mode `mode`) or its gradient function @name_grad.
FunctionSpec lossFunction(const std::string &name, const std::string &mode,
                          bool gradient = false) {
  FunctionSpec function = negFunction(gradient ? name + "_grad" : name);
  function.gradMode = mode;
  if (gradient)
    function.gradientOf = name;
  return function;
}

TEST(PlanFileTest, EntryChoosesTheLossAndItsGradient) {
  auto plan =
      buildPlan({negFunction("helper"), lossFunction("a", "ddp"),
                 lossFunction("a", "ddp", true), lossFunction("b", "global"),
                 lossFunction("b", "global", true)});
  dloss::PlanEntry b = plan->entry("b");
  EXPECT_EQ(b.loss->name()->str(), "b");
  EXPECT_EQ(b.grad->name()->str(), "b_grad");
  EXPECT_EQ(dloss::gradModeOf(*b.grad), "global");
  EXPECT_EQ(dloss::gradModeOf(*plan->entry("a").grad), "ddp");
  EXPECT_EQ(dloss::gradModeOf(*plan->findFunction("helper")), "ddp");
  EXPECT_TRUE(dloss::isLossEntry(*b.loss));
  EXPECT_FALSE(dloss::isLossEntry(*b.grad));
  EXPECT_FALSE(dloss::isLossEntry(*plan->findFunction("helper")));
  EXPECT_TRUE(dloss::isDerivedGradient(*b.grad));
  EXPECT_FALSE(dloss::isDerivedGradient(*b.loss));

  auto only = buildPlan({lossFunction("a", "ddp", true), negFunction("h"),
                         lossFunction("a", "ddp")});
  EXPECT_EQ(only->entry("").loss->name()->str(), "a");
  EXPECT_EQ(only->entry("").grad->name()->str(), "a_grad");

  {
    SCOPED_TRACE("several losses, none chosen");
    EXPECT_CONTAINS(errorOf([&] { plan->entry("", "--entry F"); }),
                    "plan 'test.plan' has several losses: a, b. "
                    "Choose one with --entry F.");
    EXPECT_CONTAINS(errorOf([&] { plan->entry(""); }),
                    "Choose one with the entry option.");
  }
  {
    SCOPED_TRACE("unknown name");
    EXPECT_CONTAINS(errorOf([&] { plan->entry("c", "--entry F"); }),
                    "has no loss called 'c'. Choose one of: a, b "
                    "(--entry F).");
    EXPECT_CONTAINS(errorOf([&] { plan->entry("helper"); }),
                    "has no loss called 'helper'. Choose one of: a, b "
                    "(the entry option).");
  }
  {
    SCOPED_TRACE("no loss at all");
    auto none = buildPlan({negFunction("h")});
    std::string hint = "Mark the loss function with the dloss.loss attribute.";
    EXPECT_CONTAINS(errorOf([&] { none->entry(""); }),
                    "has no loss entry point. " + hint);
    EXPECT_CONTAINS(errorOf([&] { none->entry("h"); }),
                    "has no loss called 'h'. " + hint);
  }
  {
    SCOPED_TRACE("no gradient function");
    auto underived = buildPlan({lossFunction("a", "ddp")});
    EXPECT_CONTAINS(errorOf([&] { underived->entry("a"); }),
                    "has no gradient function for @a. Compile the loss with "
                    "dlossc or dloss::jit::compile, which derive @a_grad.");
  }
}

//===----------------------------------------------------------------------===//
// Executor on one rank
//===----------------------------------------------------------------------===//

// f(x: f32[?, 4], labels: i64[?], n: index) -> global_size(x, 0) + n.
FunctionSpec threeArgFunction() {
  FunctionSpec function;
  function.args = {tensorArg("x", at::zeros({2, 4}), {0}),
                   tensorArg("labels", at::zeros({2}, at::kLong), {0}),
                   indexArg("n")};
  function.numRegisters = 5;
  function.steps = {
      StepSpec{"dloss.global_size", {0}, {3}, {intAttr("axis", 0)}},
      StepSpec{"arith.addi", {3, 2}, {4}, {}},
      StepSpec{"dloss.cast", {2}, {3}, {textAttr("dtype", "f32")}},
  };
  function.results = {4, 3};
  return function;
}

TEST(ExecutorTest, IndexArgumentsAndResults) {
  auto comm = dloss::makeSingleProcessCommunicator();
  Executor executor(buildPlan({threeArgFunction()}), *comm);
  std::vector<at::Tensor> results =
      executor.run("f", {at::ones({3, 4}), at::zeros({3}, at::kLong),
                         at::scalar_tensor(10, at::kLong)});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].scalar_type(), at::kLong);
  EXPECT_EQ(results[0].dim(), 0);
  EXPECT_EQ(results[0].item<int64_t>(), 13);
  EXPECT_EQ(results[1].scalar_type(), at::kFloat);
  EXPECT_EQ(results[1].item<float>(), 10.0f);
  // The executor is reusable, with another batch size.
  results = executor.run("f", {at::ones({7, 4}), at::zeros({7}, at::kLong),
                               at::scalar_tensor(1, at::kLong)});
  EXPECT_EQ(results[0].item<int64_t>(), 8);
}

TEST(ExecutorTest, PreflightRejectsBadInputsNamingTheArgument) {
  auto comm = dloss::makeSingleProcessCommunicator();
  Executor executor(buildPlan({threeArgFunction()}), *comm);
  at::Tensor x = at::ones({3, 4}), labels = at::zeros({3}, at::kLong),
             n = at::scalar_tensor(2, at::kLong);
  struct Case {
    const char *name;
    std::vector<at::Tensor> inputs;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"count",
       {x, labels},
       "preflight of @f: rank 0 passed 2 inputs to @f, which takes 3 (x, "
       "labels, n)"},
      {"dtype",
       {x.to(at::kDouble), labels, n},
       "rank 0 passed argument 0 (x) as f64 [3, 4], expected f32 [?, 4]"},
      {"int dtype",
       {x, labels.to(at::kInt), n},
       "rank 0 passed argument 1 (labels) as i32 [3], expected i64 [?]"},
      {"rank",
       {x.reshape({3, 2, 2}), labels, n},
       "rank 0 passed argument 0 (x) with 3 dims [3, 2, 2], expected f32 [?, "
       "4]"},
      {"static dim",
       {at::ones({3, 5}), labels, n},
       "rank 0 passed argument 0 (x) of shape [3, 5], expected f32 [?, 4]"},
      {"undefined",
       {at::Tensor(), labels, n},
       "rank 0 passed no tensor for argument 0 (x)"},
      {"index as float",
       {x, labels, at::scalar_tensor(2.0)},
       "rank 0 passed argument 2 (n) as f32 [], expected index (a 0-d i64 "
       "tensor)"},
      {"index not 0-d",
       {x, labels, at::ones({1}, at::kLong)},
       "rank 0 passed argument 2 (n) with 1 dims [1], expected index"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    std::string message = errorOf([&] { executor.run("f", c.inputs); });
    EXPECT_CONTAINS(message, c.expected);
    EXPECT_CONTAINS(message, "dloss error: preflight of @f:");
  }
  std::string message = errorOf([&] { executor.run("g", {x}); });
  EXPECT_CONTAINS(message, "preflight of @g: rank 0 called @g, which the plan "
                           "does not have (it has @f)");
}

/// @f_grad, the gradient of @f with respect to x only: x f32 [?, 5],
/// labels i64 [?] indexing x's 5 columns, and w f32 [?], not
/// differentiated. @plain is the same body as an ordinary function.
std::vector<FunctionSpec> labelledFunctions() {
  FunctionSpec grad;
  grad.name = "f_grad";
  grad.gradMode = "global";
  grad.gradientOf = "f";
  grad.gradArguments = {0};
  grad.args = {tensorArg("x", at::zeros({1, 5}), {0}),
               tensorArg("labels", at::zeros({1}, at::kLong), {0}),
               tensorArg("w", at::zeros({1}), {0})};
  grad.numRegisters = 4;
  grad.steps = {StepSpec{
      "dloss.take_along", {0, 1}, {3}, {intAttr("axis", -1)}, "loss.mlir:4:7"}};
  grad.results = {3, 0};
  FunctionSpec plain = grad;
  plain.name = "plain";
  plain.gradMode = "";
  plain.gradientOf = "";
  plain.gradArguments = {};
  return {grad, plain};
}

// The preflight's own checks of each input: the devices it computes on, an
// input that requires grad but gets none, and labels outside the statically
// sized dimension they index (found through the plan, not the kernel).
TEST(ExecutorTest, PreflightChecksDevicesGradientsAndIndexRanges) {
  auto comm = dloss::makeSingleProcessCommunicator();
  Executor executor(buildPlan(labelledFunctions()), *comm);
  at::Tensor x = at::arange(15, at::kFloat).reshape({3, 5});
  at::Tensor labels = at::tensor({0, 4, 2}, at::kLong);
  at::Tensor w = at::ones({3});
  std::vector<at::Tensor> good = executor.run("f_grad", {x, labels, w});
  EXPECT_TRUE(at::equal(good[0], at::tensor({0.0f, 9.0f, 12.0f})));
  // A differentiated input may require grad.
  executor.run("f_grad", {x.clone().requires_grad_(), labels, w});
  // An ordinary function does not return gradients: nothing to check.
  executor.run("plain", {x, labels, w.clone().requires_grad_()});

  struct Case {
    const char *name;
    std::vector<at::Tensor> inputs;
    std::string expected;
    std::string hint;
  };
  std::vector<Case> cases = {
      {"label too large",
       {x, at::tensor({0, 5, 2}, at::kLong), w},
       "rank 0 passed argument 1 (labels) with value 5 at [1], outside [0, "
       "5): it indexes axis 1 (size 5) of dloss.take_along at "
       "loss.mlir:4:7",
       "Indices (labels, targets) must lie in [0, size)"},
      {"negative label",
       {x, at::tensor({0, 1, -3}, at::kLong), w},
       "rank 0 passed argument 1 (labels) with value -3 at [2], outside [0, "
       "5)",
       "check the labels those ranks passed"},
      {"requires grad, not differentiated",
       {x, labels, w.clone().requires_grad_()},
       "rank 0 passed argument 2 (w) as f32 [3] requiring grad, but @f is "
       "not differentiated with respect to it (only with respect to x): no "
       "gradient would reach it",
       "Pass the input detached (x.detach())"},
      {"requires grad and the wrong dtype",
       {x, labels.to(at::kFloat).requires_grad_(), w},
       "rank 0 passed argument 1 (labels) as f32 [3] requiring grad, but @f "
       "is not differentiated with respect to it (only with respect to x): "
       "no gradient would reach it; @f also expects it as i64 [?]",
       "declare it with dloss.grad"},
      {"meta device",
       {x, labels, at::ones({3}, at::TensorOptions().device(at::kMeta))},
       "rank 0 passed argument 2 (w) on meta, a device dloss does not "
       "compute on",
       "Pass CP"},
      {"two failures, generic hint",
       {x.to(at::kDouble), labels, w},
       "rank 0 passed argument 0 (x) as f64 [3, 5], expected f32 [?, 5]",
       "Pass every rank inputs of the function's argument types"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    std::string message = errorOf([&] { executor.run("f_grad", c.inputs); });
    EXPECT_CONTAINS(message, "dloss error: preflight of @f_grad: ");
    EXPECT_CONTAINS(message, c.expected);
    EXPECT_CONTAINS(message, c.hint);
  }
  // Non-contiguous inputs run and agree with contiguous ones.
  at::Tensor strided = at::arange(30, at::kFloat)
                           .reshape({5, 6})
                           .t()
                           .narrow(0, 1, 3)
                           .t()
                           .t(); // [3, 5], neither row- nor column-major
  ASSERT_FALSE(strided.is_contiguous());
  at::Tensor stridedLabels = at::tensor({0, 9, 4, 9, 2, 9}, at::kLong)
                                 .slice(0, 0, 6, 2); // [0, 4, 2], stride 2
  ASSERT_FALSE(stridedLabels.is_contiguous());
  EXPECT_TRUE(
      at::equal(executor.run("f_grad", {strided, stridedLabels, w})[0],
                executor.run("f_grad", {strided.contiguous(),
                                        stridedLabels.contiguous(), w})[0]));
}

// A freed register is really released: the input's reference and an
// intermediate's buffer are gone by the time a later step runs.
TEST(ExecutorTest, FreedRegistersAreReleased) {
  auto makePlan = [](bool free) {
    FunctionSpec function;
    function.args = {tensorArg("x", at::zeros({2, 4}), {0})};
    function.numRegisters = 4;
    std::vector<int32_t> none;
    function.steps = {
        StepSpec{"dloss.all_reduce",
                 {0},
                 {1},
                 {textAttr("kind", "sum")},
                 "a:1:1",
                 free ? std::vector<int32_t>{0} : none},
        StepSpec{"dloss.reduce",
                 {1},
                 {2},
                 {textAttr("kind", "sum"), intsAttr("axes", {0, 1})},
                 "a:2:1",
                 free ? std::vector<int32_t>{1} : none},
        StepSpec{"dloss.all_reduce", {2}, {3}, {textAttr("kind", "sum")}},
    };
    function.results = {3};
    return buildPlan({function});
  };
  for (bool free : {true, false}) {
    SCOPED_TRACE(free ? "with free lists" : "without free lists (control)");
    SpyCommunicator spy;
    Executor executor(makePlan(free), spy);
    at::Tensor x = at::ones({1000, 4});
    std::vector<at::Tensor> inputs = {x};
    long baseline = x.use_count();
    c10::weak_intrusive_ptr<at::TensorImpl> intermediate(
        c10::intrusive_ptr<at::TensorImpl>{});
    long countAtLastStep = -1;
    bool intermediateAlive = true;
    spy.onAllReduce = [&](int call, const at::Tensor &result) {
      if (call == 0) {
        intermediate =
            c10::weak_intrusive_ptr<at::TensorImpl>(result.getIntrusivePtr());
      } else {
        countAtLastStep = x.use_count();
        intermediateAlive = !intermediate.expired();
      }
    };
    std::vector<at::Tensor> results = executor.run("f", inputs);
    EXPECT_EQ(results[0].item<float>(), 4000.0f);
    EXPECT_EQ(countAtLastStep, free ? baseline : baseline + 1);
    EXPECT_EQ(intermediateAlive, !free);
    // Nothing outlives the call.
    EXPECT_EQ(x.use_count(), baseline);
    EXPECT_TRUE(intermediate.expired());
  }
}

TEST(ExecutorTest, UnknownOpsAndMalformedPlansFailAtConstruction) {
  auto comm = dloss::makeSingleProcessCommunicator();
  auto build = [&](FunctionSpec function) {
    Executor executor(buildPlan({function}), *comm);
  };
  {
    SCOPED_TRACE("unknown op");
    FunctionSpec function = singleOpFunction(
        "dloss.frobnicate", {at::ones({2})}, {}, "clip.mlir:3:7");
    std::string message = errorOf([&] { build(function); });
    EXPECT_CONTAINS(message, "[op dloss.frobnicate at clip.mlir:3:7]");
    EXPECT_CONTAINS(message, "the runtime does not support op "
                             "'dloss.frobnicate' yet");
  }
  {
    SCOPED_TRACE("missing attribute");
    FunctionSpec function = singleOpFunction(
        "dloss.logsumexp", {at::ones({2, 2})}, {}, "l.mlir:4:2");
    std::string message = errorOf([&] { build(function); });
    EXPECT_CONTAINS(message, "[op dloss.logsumexp at l.mlir:4:2]: missing "
                             "integer attribute 'axis'");
  }
  {
    SCOPED_TRACE("attribute of the wrong kind");
    FunctionSpec function = singleOpFunction(
        "dloss.all_reduce", {at::ones({2})}, {intAttr("kind", 0)});
    EXPECT_CONTAINS(errorOf([&] { build(function); }),
                    "attribute 'kind' is integer, expected text");
  }
  {
    SCOPED_TRACE("operand count");
    FunctionSpec function = singleOpFunction("dloss.add", {at::ones({2})}, {});
    EXPECT_CONTAINS(errorOf([&] { build(function); }),
                    "the step has 1 operands, expected 2");
  }
  {
    SCOPED_TRACE("register out of range");
    FunctionSpec function = singleOpFunction("dloss.neg", {at::ones({2})}, {});
    function.steps[0].operands = {9};
    EXPECT_CONTAINS(errorOf([&] { build(function); }),
                    "function @f: operand register 9 is outside [0, 2)");
  }
}

TEST(ExecutorTest, StepErrorsCarryRankOpAndLocation) {
  auto comm = dloss::makeSingleProcessCommunicator();
  {
    SCOPED_TRACE("an ATen error (c10::Error)");
    // ATen refuses the mean of an integer tensor.
    FunctionSpec function = singleOpFunction(
        "dloss.reduce", {at::ones({2, 2}, at::kLong)},
        {textAttr("kind", "mean"), intsAttr("axes", {0})}, "loss.mlir:9:3");
    Executor executor(buildPlan({function}), *comm);
    try {
      executor.run("f", {at::ones({2, 2}, at::kLong)});
      FAIL() << "expected an error";
    } catch (const dloss::Error &error) {
      EXPECT_EQ(error.rank(), 0);
      EXPECT_EQ(error.op(), "dloss.reduce");
      EXPECT_EQ(error.location(), "loss.mlir:9:3");
      EXPECT_CONTAINS(
          std::string(error.what()),
          "dloss error [rank 0, op dloss.reduce at loss.mlir:9:3]: ");
      EXPECT_CONTAINS(error.problem(), "mean");
      // No C++ backtrace in a user-facing message.
      EXPECT_FALSE(contains(error.problem(), "Exception raised from"));
    }
  }
  {
    SCOPED_TRACE("a kernel's own check");
    FunctionSpec function =
        singleOpFunction("dloss.matmul", {at::ones({2, 3}), at::ones({2, 3})},
                         {}, "clip.mlir:19:12");
    Executor executor(buildPlan({function}), *comm);
    std::string message = errorOf([&] {
      executor.run("f", {at::ones({2, 3}), at::ones({2, 3})});
    });
    EXPECT_CONTAINS(message,
                    "dloss error [rank 0, op dloss.matmul at "
                    "clip.mlir:19:12]: matmul inner dimensions differ");
  }
  {
    SCOPED_TRACE("a register read after it is freed");
    FunctionSpec function;
    function.args = {tensorArg("x", at::ones({2}))};
    function.numRegisters = 3;
    function.steps = {StepSpec{"dloss.neg", {0}, {1}, {}, "a:1:1", {0}},
                      StepSpec{"dloss.exp", {0}, {2}, {}, "a:2:1"}};
    function.results = {2};
    Executor executor(buildPlan({function}), *comm);
    std::string message = errorOf([&] { executor.run("f", {at::ones({2})}); });
    EXPECT_CONTAINS(message, "[rank 0, op dloss.exp at a:2:1]: operand 0 "
                             "(register 0) is read before it is written or "
                             "after it is freed");
  }
}

//===----------------------------------------------------------------------===//
// Several in-process ranks
//===----------------------------------------------------------------------===//

// f(image: f32[?, ?], text: f32[?, ?], scale: f32[?] replicated)
//   -> global_size(text, 0).
FunctionSpec clipLikeFunction(const std::string &name = "f") {
  FunctionSpec function;
  function.name = name;
  function.args = {tensorArg("image", at::zeros({1, 1}), {0, 1}),
                   tensorArg("text", at::zeros({1, 1}), {0, 1}),
                   tensorArg("scale", at::zeros({1}), {0})};
  function.args[2].replicated = true;
  function.numRegisters = 4;
  function.steps = {
      StepSpec{"dloss.global_size", {1}, {3}, {intAttr("axis", 0)}}};
  function.results = {3};
  return function;
}

// Every rank raises the same error, naming the ranks and fields that differ.
TEST(ExecutorThreadTest, PreflightMismatchRaisesTheSameErrorOnEveryRank) {
  auto plan = buildPlan({clipLikeFunction("f"), clipLikeFunction("g")});
  auto expectSameError = [](const std::vector<RankOutcome> &outcomes,
                            const std::string &expected) {
    for (size_t r = 0; r < outcomes.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(outcomes[r].error, outcomes[0].error);
      EXPECT_CONTAINS(outcomes[r].error, expected);
    }
  };
  auto inputs = [](int64_t batch, int64_t dim) {
    return std::vector<at::Tensor>{at::zeros({batch, dim}),
                                   at::zeros({batch, dim}), at::ones({1})};
  };
  {
    SCOPED_TRACE("a non-batch dim differs");
    auto outcomes = runRanks(4, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      std::vector<at::Tensor> in = inputs(64, 512);
      if (rank == 2)
        in[1] = at::zeros({64, 256});
      return executor.run("f", in);
    });
    expectSameError(
        outcomes, "dloss error: preflight of @f: rank 2 passed argument 1 "
                  "(text) of shape [64, 256], ranks 0,1,3 [64, 512]. Ranks "
                  "may differ only in dimension 0 (the batch) of an argument.");
  }
  {
    SCOPED_TRACE("uneven batches are fine");
    auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      return executor.run("f", inputs(rank + 1, 8));
    });
    for (const RankOutcome &outcome : outcomes) {
      ASSERT_EQ(outcome.error, "");
      EXPECT_EQ(outcome.results[0].item<int64_t>(), 6);
    }
  }
  {
    SCOPED_TRACE("a replicated argument differs");
    auto outcomes = runRanks(2, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      std::vector<at::Tensor> in = inputs(2, 8);
      if (rank == 1)
        in[2] = at::ones({2});
      return executor.run("f", in);
    });
    // Even dimension 0 must agree: the value is the same on every rank.
    expectSameError(outcomes, "preflight of @f: rank 1 passed replicated "
                              "argument 2 (scale) of shape [2], rank 0 [1]. A "
                              "replicated argument must be the same tensor");
  }
  {
    SCOPED_TRACE("one rank passes the wrong dtype");
    auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      std::vector<at::Tensor> in = inputs(2, 8);
      if (rank == 1)
        in[0] = in[0].to(at::kBFloat16);
      return executor.run("f", in);
    });
    expectSameError(outcomes, "preflight of @f: rank 1 passed argument 0 "
                              "(image) as bf16 [2, 8], expected f32 [?, ?]");
  }
  {
    SCOPED_TRACE("ranks loaded plans for different dtypes");
    auto other = buildPlan({clipLikeFunction("f")}, 0x9999);
    auto outcomes = runRanks(2, [&](int rank, Communicator &comm) {
      Executor executor(rank == 1 ? other : plan, comm);
      std::vector<at::Tensor> in = inputs(2, 8);
      if (rank == 1)
        in[0] = in[0].to(at::kDouble);
      return executor.run("f", in);
    });
    expectSameError(outcomes,
                    "preflight: ranks ran different plans: rank 0 called @f of "
                    "plan fingerprint 0x0000000000001234 with inputs of dtypes "
                    "(f32, f32, f32), rank 1 called @f of plan fingerprint "
                    "0x0000000000009999 with inputs of dtypes (f64, f32, f32). "
                    "The ranks passed inputs of different dtypes");
  }
  {
    SCOPED_TRACE("ranks call different functions");
    auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      return executor.run(rank == 0 ? "g" : "f", inputs(2, 8));
    });
    EXPECT_CONTAINS(outcomes[0].error, "ranks called different functions: "
                                       "rank 0 called @g, ranks 1,2 called @f");
    EXPECT_CONTAINS(outcomes[1].error, "rank 0 called @g, ranks 1,2 called @f");
    EXPECT_CONTAINS(outcomes[2].error, "rank 0 called @g, ranks 1,2 called @f");
  }
  {
    SCOPED_TRACE("ranks loaded different plans");
    auto other = buildPlan({clipLikeFunction("f")}, 0x9999);
    auto outcomes = runRanks(4, [&](int rank, Communicator &comm) {
      Executor executor(rank == 3 ? other : plan, comm);
      return executor.run("f", inputs(2, 8));
    });
    for (const RankOutcome &outcome : outcomes)
      EXPECT_CONTAINS(outcome.error,
                      "ranks ran different plans: ranks 0,1,2 called @f of "
                      "plan fingerprint 0x0000000000001234, rank 3 called @f "
                      "of plan fingerprint 0x0000000000009999. Every rank "
                      "must call the same compiled losses in the same order");
  }
}

// A bad input that only one rank's own checks see (a label out of range,
// an input that requires grad but gets no gradient, a device it cannot
// compute on) fails every rank in the same preflight, with the same message;
// the ranks can go on together afterwards.
/// f(x [2], y [3] (, w)) = the all_reduce sums of x and y, marked to run
/// as one collective (dloss-coalesce-all-reduces): the first carries
/// `coalesce = group`; `between` puts a step between them.
FunctionSpec coalescedFunction(int64_t group, bool between = false) {
  FunctionSpec f;
  f.args = {tensorArg("x", at::zeros({2})), tensorArg("y", at::zeros({2, 3}))};
  StepSpec first, second;
  first.op = second.op = "dloss.all_reduce";
  first.attrs = {textAttr("kind", "sum"), intAttr("coalesce", group)};
  second.attrs = {textAttr("kind", "sum")};
  first.operands = {0};
  first.results = {2};
  second.operands = {1};
  second.results = {3};
  f.steps.push_back(first);
  if (between) {
    StepSpec neg;
    neg.op = "dloss.neg";
    neg.operands = {0};
    neg.results = {4};
    f.steps.push_back(neg);
  }
  f.steps.push_back(second);
  f.results = {2, 3};
  f.numRegisters = 5;
  return f;
}

// Two all-reduces marked as a group run as one collective over both
// operands (flattened, reduced, split back to their shapes): each rank gets
// each sum, as two collectives would give.
TEST(ExecutorThreadTest, CoalescedAllReducesGiveEachSum) {
  auto plan = buildPlan({coalescedFunction(2)});
  auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
    Executor executor(plan, comm);
    return executor.run("f", {at::full({2}, rank + 1.0),
                              at::arange(6, at::kFloat).view({2, 3}) * rank});
  });
  for (const RankOutcome &outcome : outcomes) {
    ASSERT_EQ(outcome.error, "");
    ASSERT_EQ(outcome.results.size(), 2u);
    EXPECT_TRUE(at::equal(outcome.results[0], at::full({2}, 6.0)));
    EXPECT_TRUE(at::equal(outcome.results[1],
                          at::arange(6, at::kFloat).view({2, 3}) * 3));
  }
}

// A group that is not n adjacent all-reduces is a plan bug, named when the
// plan is loaded.
TEST(ExecutorTest, MalformedCoalescedGroupsAreRefused) {
  auto comm = dloss::makeSingleProcessCommunicator();
  EXPECT_CONTAINS(errorOf([&] {
                    Executor(buildPlan({coalescedFunction(2, true)}), *comm);
                  }),
                  "is in the group of all_reduces at step 0 but is no "
                  "all_reduce of its kind");
  EXPECT_CONTAINS(
      errorOf([&] { Executor(buildPlan({coalescedFunction(3)}), *comm); }),
      "coalesces 3 steps, past the function's end");
  EXPECT_CONTAINS(
      errorOf([&] { Executor(buildPlan({coalescedFunction(1)}), *comm); }),
      "coalesce = 1 (a group has at least 2)");
}

TEST(ExecutorThreadTest, OneRanksLocalCheckFailsEveryRank) {
  auto plan = buildPlan(labelledFunctions());
  auto inputsOf = [](int rank) {
    return std::vector<at::Tensor>{at::ones({rank + 1, 5}),
                                   at::zeros({rank + 1}, at::kLong),
                                   at::ones({rank + 1})};
  };
  struct Case {
    const char *name;
    int rank;
    int argument;
    at::Tensor bad;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"label", 2, 1, at::tensor({1, 2, 7}, at::kLong),
       "preflight of @f_grad: rank 2 passed argument 1 (labels) with value 7 "
       "at [2], outside [0, 5)"},
      {"requires grad", 1, 2, at::ones({2}).requires_grad_(),
       "preflight of @f_grad: rank 1 passed argument 2 (w) as f32 [2] "
       "requiring grad"},
      {"device", 0, 0, at::ones({1, 5}, at::TensorOptions().device(at::kMeta)),
       "preflight of @f_grad: rank 0 passed argument 0 (x) on meta"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
      Executor executor(plan, comm);
      std::vector<at::Tensor> in = inputsOf(rank);
      if (rank == c.rank)
        in[c.argument] = c.bad;
      try {
        executor.run("f_grad", in);
      } catch (const dloss::Error &) {
        // Every rank failed in the same collective: they are still in step.
        executor.run("f_grad", inputsOf(rank));
        throw;
      }
      return std::vector<at::Tensor>{};
    });
    for (size_t r = 0; r < outcomes.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(outcomes[r].error, outcomes[0].error);
      EXPECT_CONTAINS(outcomes[r].error, c.expected);
    }
  }
}

// Uneven batches (2, 3, 1 rows): rank facts from the preflight and from
// exchanged sizes, and every collective kernel, against hand results.
TEST(ExecutorThreadTest, UnevenBatchesAcrossRanks) {
  FunctionSpec function;
  function.args = {tensorArg("x", at::zeros({1, 2}), {0})};
  function.numRegisters = 18;
  auto axis0 = intAttr("axis", 0);
  function.steps = {
      StepSpec{"dloss.shard_offset", {0}, {1}, {axis0}},
      StepSpec{"dloss.dim", {0}, {2}, {axis0}},
      StepSpec{"dloss.arange", {1, 2}, {3}, {textAttr("dtype", "i64")}},
      StepSpec{"dloss.all_gather", {0}, {4}, {axis0}},
      // Shape-preserving ops keep the sizes known from the preflight, so
      // this all_gather needs no exchange of sizes.
      StepSpec{"dloss.neg", {0}, {5}, {}},
      StepSpec{"dloss.mul", {5, 5}, {6}, {}},
      StepSpec{"dloss.all_gather", {6}, {7}, {axis0}},
      // pad's result has unknown sizes: each of the next three steps
      // exchanges the local size.
      StepSpec{"arith.constant", {}, {8}, {intAttr("value", 0)}},
      StepSpec{"dloss.pad", {5, 8, 8}, {9}, {axis0}},
      StepSpec{"dloss.global_size", {9}, {10}, {axis0}},
      StepSpec{"dloss.shard_offset", {9}, {11}, {axis0}},
      StepSpec{"dloss.all_gather", {9}, {12}, {axis0}},
      // The adjoint round trip: every rank's copy summed, own rows kept.
      StepSpec{"dloss.reduce_scatter",
               {12, 2},
               {13},
               {textAttr("kind", "sum"), axis0}},
      StepSpec{"dloss.ring_shift", {0}, {14}, {intAttr("shift", 1)}},
      StepSpec{"dloss.reduce",
               {0},
               {15},
               {textAttr("kind", "sum"), intsAttr("axes", {0})}},
      StepSpec{"dloss.broadcast", {15}, {16}, {intAttr("root", 1)}},
      StepSpec{"dloss.all_reduce", {15}, {17}, {textAttr("kind", "max")}},
  };
  function.results = {3, 4, 7, 10, 11, 13, 14, 16, 17};
  auto plan = buildPlan({function});

  std::vector<int64_t> sizes = {2, 3, 1};
  std::vector<at::Tensor> xs;
  for (int r = 0; r < 3; ++r)
    xs.push_back(at::arange(sizes[r] * 2, at::TensorOptions(at::kFloat))
                     .reshape({sizes[r], 2}) +
                 10 * r);
  auto outcomes = runRanks(3, [&](int rank, Communicator &comm) {
    Executor executor(plan, comm);
    std::vector<at::Tensor> results = executor.run("f", {xs[rank]});
    // The number of size exchanges, as one more result.
    results.push_back(at::scalar_tensor(
        static_cast<ThreadCommunicator &>(comm).allGatherIntsCalls, at::kLong));
    return results;
  });
  at::Tensor all = at::cat(xs, 0);
  at::Tensor rowSums = at::stack({xs[0].sum(0), xs[1].sum(0), xs[2].sum(0)});
  int64_t offset = 0;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankOutcome &outcome = outcomes[r];
    ASSERT_EQ(outcome.error, "");
    ASSERT_EQ(outcome.results.size(), 10u);
    const std::vector<at::Tensor> &got = outcome.results;
    EXPECT_TRUE(at::equal(got[0], at::arange(offset, offset + sizes[r],
                                             at::TensorOptions(at::kLong))))
        << got[0];
    EXPECT_TRUE(at::equal(got[1], all));
    EXPECT_TRUE(at::equal(got[2], all * all));
    EXPECT_EQ(got[3].item<int64_t>(), 6);
    EXPECT_EQ(got[4].item<int64_t>(), offset);
    EXPECT_TRUE(at::equal(got[5], -3 * xs[r])) << got[5];
    EXPECT_TRUE(at::equal(got[6], xs[(r + 2) % 3]));
    EXPECT_TRUE(at::equal(got[7], xs[1].sum(0)));
    EXPECT_TRUE(at::equal(got[8], rowSums.amax(0)));
    // The preflight, then global_size, shard_offset and all_gather of the
    // padded value and reduce_scatter's sizes: nothing else.
    EXPECT_EQ(got[9].item<int64_t>(), 5);
    offset += sizes[r];
  }
}

} // namespace
