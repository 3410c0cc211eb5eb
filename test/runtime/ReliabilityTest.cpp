// Failure scenarios on real processes over real Gloo with short deadlines: a
// skipped call, losses called in a different order, a rank killed in the
// backward, NaN inputs and diverging gradients under check mode, a rank that
// never starts. Each ends within seconds, with the message asserted on every
// surviving rank and the time to error printed ("time-to-error" lines).
#include "PlanTestUtil.h"

#include "runtime/comm/CallSite.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/FlightRecorder.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/exec/Executor.h"
#include "runtime/support/Error.h"
#include "test/runtime/ForwardingCommunicator.h"
#include "test/runtime/MultiProcess.h"
#include "test/runtime/RemoveTree.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using dloss::CallSite;
using dloss::Communicator;
using dloss::Executor;
using dloss::ExecutorOptions;
using dloss::Reduction;
using namespace dloss::test;

//===----------------------------------------------------------------------===//
// A small loss and its gradient function
//===----------------------------------------------------------------------===//

// @<name>(x: f32[?, 4], w: f32[4] replicated) as a gradient function in
// `gradMode`, returning (loss, dx, dw). Forward: all_gather, sums, mul.
// Backward: reduce_scatter for dx (loss.mlir:9:3) and dw = all_reduce of the
// local column sums, identical on every rank; `localDw` returns the local
// sums instead, a gradient that differs per rank (a deliberately broken
// plan for the check-mode test).
FunctionSpec lossGrad(const std::string &name,
                      const std::string &gradMode = "global",
                      bool localDw = false) {
  FunctionSpec f;
  f.name = name;
  f.gradMode = gradMode;
  f.gradientOf = name + "_loss";
  f.gradArguments = {0, 1};
  f.args = {tensorArg("x", at::zeros({1, 4}), {0}),
            tensorArg("w", at::zeros({4}))};
  f.args[1].replicated = true;
  f.numRegisters = 11;
  auto axis0 = intAttr("axis", 0);
  auto sum = textAttr("kind", "sum");
  f.steps = {
      StepSpec{"dloss.all_gather", {0}, {2}, {axis0}, "loss.mlir:2:8"},
      StepSpec{"dloss.reduce",
               {2},
               {3},
               {sum, intsAttr("axes", {0})},
               "loss.mlir:3:8"},
      StepSpec{"dloss.mul", {3, 1}, {4}, {}, "loss.mlir:4:8"},
      StepSpec{"dloss.reduce",
               {4},
               {5},
               {sum, intsAttr("axes", {0})},
               "loss.mlir:5:8"},
      // The backward.
      StepSpec{"dloss.dim", {0}, {6}, {axis0}, "loss.mlir:7:3"},
      StepSpec{"dloss.neg", {2}, {7}, {}, "loss.mlir:8:3"},
      StepSpec{
          "dloss.reduce_scatter", {7, 6}, {8}, {sum, axis0}, "loss.mlir:9:3"},
      StepSpec{"dloss.reduce",
               {0},
               {9},
               {sum, intsAttr("axes", {0})},
               "loss.mlir:10:3"},
      StepSpec{"dloss.all_reduce", {9}, {10}, {sum}, "loss.mlir:11:3"},
  };
  f.results = {5, 8, localDw ? 9 : 10};
  return f;
}

// Uneven rows per rank (2, 3, 1, 4); column 2 holds the rank, so that the
// local column sums differ from element 2 on.
std::vector<at::Tensor> inputsOf(int rank) {
  static const int64_t rows[] = {2, 3, 1, 4};
  at::Tensor x = at::zeros({rows[rank], 4});
  x.select(1, 2).fill_(static_cast<double>(rank));
  x.select(1, 0).fill_(1.0);
  return {x, at::full({4}, 0.5)};
}

//===----------------------------------------------------------------------===//
// Scenario bookkeeping
//===----------------------------------------------------------------------===//

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One test's directory: flight records, and each rank's message and time to
// error, which the parent compares across ranks.
struct Scenario {
  explicit Scenario(const std::string &name) : name(name) {
    dir = ::testing::TempDir() + "dloss-reliability-" + name + "-" +
          std::to_string(::getpid()) + "/";
    ::mkdir(dir.c_str(), 0755);
    for (int r = 0; r < 4; ++r) {
      std::remove((dir + "rank" + std::to_string(r) + ".message").c_str());
      std::remove(flightPath(r).c_str());
    }
  }

  // Kept for inspection when the test failed.
  ~Scenario() {
    if (!::testing::Test::HasFailure())
      dloss::test::removeTree(dir);
  }

  dloss::RendezvousOptions options(int port, int rank, int world,
                                   std::chrono::milliseconds deadline) const {
    dloss::RendezvousOptions o = loopbackOptions(port, rank, world, deadline);
    o.flightDir = dir;
    return o;
  }

  std::string flightPath(int rank) const {
    return dir + "dloss-flight-rank" + std::to_string(rank) + ".json";
  }

  // In a child: keeps the message for the parent and reports the time.
  void record(int rank, const std::string &message, double seconds) const {
    std::ofstream(dir + "rank" + std::to_string(rank) + ".message") << message;
    std::fprintf(stderr, "[%s] time-to-error rank %d: %.2f s: %s\n",
                 name.c_str(), rank, seconds, message.c_str());
  }

  std::string message(int rank) const {
    return readFile(dir + "rank" + std::to_string(rank) + ".message");
  }

  std::string name;
  std::string dir;
};

// Runs `call` expecting a dloss::Error; records it and returns its message.
// Added to every upper bound: ctest runs several multi-process tests at once
// on CI's 2 cores, and a bound is there to prove "long before the 30 s
// deadline", not to time anything.
constexpr double kLoadSlack = 8.0;

std::string expectError(const Scenario &scenario, int rank,
                        const std::function<void()> &call, double maxSeconds,
                        double minSeconds = 0.0) {
  maxSeconds += kLoadSlack;
  Clock::time_point start = Clock::now();
  try {
    call();
  } catch (const dloss::Error &e) {
    double elapsed = secondsSince(start);
    scenario.record(rank, e.what(), elapsed);
    CHILD_CHECK(elapsed >= minSeconds && elapsed <= maxSeconds,
                "failed after " << elapsed << " s, expected " << minSeconds
                                << " to " << maxSeconds << " s");
    return e.what();
  }
  CHILD_CHECK(false, "the call succeeded; expected a dloss::Error");
  return "";
}

#define CHILD_EXPECT_CONTAINS(text, part)                                      \
  CHILD_CHECK(contains(text, part), "missing '" << (part) << "' in: " << (text))

// The message names the flight record, which holds the failed collective.
void expectFlightRecord(const Scenario &scenario, int rank,
                        const std::string &message) {
  std::string path = scenario.flightPath(rank);
  CHILD_EXPECT_CONTAINS(message, "flight record of this rank's last "
                                 "collectives: " +
                                     path);
  std::string json = readFile(path);
  CHILD_EXPECT_CONTAINS(json, "\"format\": \"dloss-flight-record-v1\"");
  CHILD_EXPECT_CONTAINS(json, "\"state\": \"failed\"");
  CHILD_EXPECT_CONTAINS(json, "\"state\": \"completed\"");
  CHILD_EXPECT_CONTAINS(json, "\"rank\": " + std::to_string(rank));
}

// Every listed rank recorded the same message.
void expectSameMessage(const Scenario &scenario,
                       const std::vector<int> &ranks) {
  std::string first = scenario.message(ranks.front());
  EXPECT_FALSE(first.empty()) << "rank " << ranks.front() << " recorded none";
  for (int r : ranks)
    EXPECT_EQ(scenario.message(r), first) << "rank " << r;
}

//===----------------------------------------------------------------------===//
// Scenarios
//===----------------------------------------------------------------------===//

// Rank 1 skips the last call (an early return) and stays alive; ranks 0 and 2
// wait in its preflight until the 2 s deadline and then name rank 1 as the
// rank that never arrived, with the collective, its number and the call site.
// Rank 1's own next call fails at once: its peers are gone.
TEST(ReliabilityTest, SkippedCallTimesOutNamingTheAbsentRank) {
  Scenario scenario("skipped-call");
  constexpr auto deadline = std::chrono::seconds(2);
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm =
        dloss::connectProcessGroup(scenario.options(port, rank, 3, deadline));
    Executor executor(plan, *comm, ExecutorOptions{});
    executor.run("loss_grad", inputsOf(rank));
    if (rank == 1) {
      // Returns early from this step and does something else for a while.
      std::this_thread::sleep_for(deadline + std::chrono::seconds(2));
      std::string message = expectError(
          scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
          1.5);
      CHILD_EXPECT_CONTAINS(message, "allGatherInts (preflight of @loss_grad)");
      CHILD_EXPECT_CONTAINS(message, "failed on rank 1 of 3");
      return;
    }
    std::string message = expectError(
        scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
        2.0 + 3.0, 1.5);
    std::string seq =
        "collective #" + std::to_string(comm->collectivesStarted());
    CHILD_EXPECT_CONTAINS(message, seq + " allGatherInts (preflight of "
                                         "@loss_grad)");
    CHILD_EXPECT_CONTAINS(message, "rank 1 never arrived (its latest "
                                   "collective is #");
    CHILD_EXPECT_CONTAINS(message,
                          "dloss error [rank " + std::to_string(rank) + "]");
    // Timed out itself, or saw the other waiting rank give up first.
    CHILD_CHECK(contains(message, "timed out on rank " + std::to_string(rank) +
                                      " of 3 after the deadline of 2 s") ||
                    contains(message, "failed on rank " + std::to_string(rank) +
                                          " of 3"),
                "unexpected message: " << message);
    CHILD_CHECK(contains(message, "DLOSS_TIMEOUT_S") ||
                    contains(message, "other ranks' logs"),
                "the message says not what to do: " << message);
    expectFlightRecord(scenario, rank, message);
  });
  expectAllSucceeded(outcomes, "skipped call");
}

// Rank 1 skips the call and exits: the others learn it at once (closed
// connections), not at the deadline (30 s here), and name rank 1.
TEST(ReliabilityTest,
     SkippingRankThatExitsIsNamedWithoutWaitingForTheDeadline) {
  Scenario scenario("skip-and-exit");
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    Executor executor(plan, *comm, ExecutorOptions{});
    executor.run("loss_grad", inputsOf(rank));
    if (rank == 1)
      ::_exit(0); // No destructors: as abrupt as a crash.
    std::string message = expectError(
        scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
        5.0);
    CHILD_EXPECT_CONTAINS(message, "allGatherInts (preflight of @loss_grad)");
    CHILD_EXPECT_CONTAINS(message, "rank 1 never arrived");
    CHILD_EXPECT_CONTAINS(message, "it may have died");
    CHILD_EXPECT_CONTAINS(message, "other ranks' logs");
    expectFlightRecord(scenario, rank, message);
  });
  expectAllSucceeded(outcomes, "skip and exit");
}

// Two compiled losses (two plans) called in a different order: the first
// preflight catches it, with the same message on every rank, long before
// the deadline.
TEST(ReliabilityTest, LossesCalledInADifferentOrderFailInThePreflight) {
  Scenario scenario("different-order");
  auto a = buildPlan({lossGrad("a_grad")}, 0xaaaa);
  auto b = buildPlan({lossGrad("b_grad")}, 0xbbbb);
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    Executor lossA(a, *comm, ExecutorOptions{});
    Executor lossB(b, *comm, ExecutorOptions{});
    Executor &first = rank == 0 ? lossA : lossB;
    std::string message = expectError(
        scenario, rank,
        [&] { first.run(rank == 0 ? "a_grad" : "b_grad", inputsOf(rank)); },
        2.0);
    CHILD_EXPECT_CONTAINS(
        message, "dloss error: preflight: ranks ran different plans: rank 0 "
                 "called @a_grad of plan fingerprint 0x000000000000aaaa, "
                 "ranks 1,2 called @b_grad of plan fingerprint "
                 "0x000000000000bbbb. Every rank must call the same compiled "
                 "losses in the same order");
    // Nothing broke: the ranks can go on together.
    lossA.run("a_grad", inputsOf(rank));
  });
  expectAllSucceeded(outcomes, "different order");
  expectSameMessage(scenario, {0, 1, 2});
}

/// Kills its process (SIGKILL) when the plan reaches a reduce_scatter: a
/// rank dying in the middle of the backward.
class DyingCommunicator final : public ForwardingCommunicator {
public:
  using ForwardingCommunicator::ForwardingCommunicator;
  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) override {
    ::raise(SIGKILL);
    return inner->reduceScatter(input, op, axis, sizes);
  }
};

// Rank 2 is killed in the backward; ranks 0 and 1 fail within about a second
// (closed connections, not the 30 s deadline), naming the collective, its
// number, the backward step's IR location and rank 2.
TEST(ReliabilityTest, RankKilledInTheBackwardFailsItsPeersQuickly) {
  Scenario scenario("killed-in-backward");
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    std::unique_ptr<Communicator> comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    if (rank == 2)
      comm = std::make_unique<DyingCommunicator>(std::move(comm));
    Executor executor(plan, *comm, ExecutorOptions{});
    std::string message = expectError(
        scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
        5.0);
    std::string seq =
        "collective #" + std::to_string(comm->collectivesStarted());
    CHILD_EXPECT_CONTAINS(message, "dloss error [rank " + std::to_string(rank) +
                                       ", op dloss.reduce_scatter at "
                                       "loss.mlir:9:3]");
    CHILD_EXPECT_CONTAINS(message, seq +
                                       " reduceScatter (in @loss_grad) "
                                       "failed on rank " +
                                       std::to_string(rank) + " of 3");
    CHILD_EXPECT_CONTAINS(message, "rank 2 never arrived");
    CHILD_EXPECT_CONTAINS(message, "it may have died");
    CHILD_EXPECT_CONTAINS(message, "other ranks' logs");
    expectFlightRecord(scenario, rank, message);
  });
  ASSERT_EQ(outcomes.size(), 3u);
  expectAllSucceeded({outcomes[0], outcomes[1]}, "survivor");
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << describe(outcomes[2]);
}

// Rank 0, which hosts the store, freezes (SIGSTOP) before its third call:
// its connections stay open and silent, as across a network partition, and
// no store operation answers. Ranks 1 and 2 still fail at the deadline (3 s),
// each store wait bounded by it too, naming rank 0 from the records' mirror
// on rank 2, and saying that the store stopped answering.
TEST(ReliabilityTest, FrozenStoreHostFailsItsPeersAtTheDeadline) {
  Scenario scenario("frozen-store-host");
  constexpr auto deadline = std::chrono::seconds(3);
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  std::string pidFile = scenario.dir + "frozen.pid";
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm =
        dloss::connectProcessGroup(scenario.options(port, rank, 3, deadline));
    Executor executor(plan, *comm, ExecutorOptions{});
    executor.run("loss_grad", inputsOf(rank));
    // The mirror's connection is made beside the ranks' work: wait for it,
    // so that rank 0's records are there when it freezes.
    Clock::time_point limit = Clock::now() + std::chrono::seconds(30);
    while (rank != 2 && !comm->recordsMirrored() && Clock::now() < limit)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHILD_CHECK(rank == 2 || comm->recordsMirrored(),
                "the records are not mirrored after 30 s");
    executor.run("loss_grad", inputsOf(rank));
    if (rank == 0) {
      std::ofstream(pidFile) << ::getpid();
      ::raise(SIGSTOP);
      return;
    }
    // The deadline, then a store read that the frozen host never answers
    // (bounded by the deadline as well).
    std::string message = expectError(
        scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
        3.0 + 3.0, 2.5);
    CHILD_EXPECT_CONTAINS(message, "rank 0 never arrived");
    CHILD_EXPECT_CONTAINS(
        message, "the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                     " stopped answering this rank");
    CHILD_EXPECT_CONTAINS(message, "read from their mirror on rank 2");
    CHILD_CHECK(contains(message, "timed out on rank " + std::to_string(rank) +
                                      " of 3 after the deadline of 3 s") ||
                    contains(message, "failed on rank " + std::to_string(rank) +
                                          " of 3"),
                "unexpected message: " << message);
    expectFlightRecord(scenario, rank, message);
    if (rank == 1)
      ::kill(std::stoi(readFile(pidFile)), SIGKILL);
  });
  ASSERT_EQ(outcomes.size(), 3u);
  expectAllSucceeded({outcomes[1], outcomes[2]}, "survivor");
  EXPECT_EQ(outcomes[0].signal, SIGKILL) << describe(outcomes[0]);
}

// Check mode: NaN and infinite inputs are reported through the preflight,
// the same message on every rank; without check mode the same call runs.
TEST(ReliabilityTest, NonFiniteInputsFailThePreflightInCheckMode) {
  Scenario scenario("nan-check");
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    std::vector<at::Tensor> inputs = inputsOf(rank);
    if (rank == 2)
      inputs[0].view({-1}).narrow(0, 0, 3).fill_(NAN);
    if (rank == 0)
      inputs[0][1][3] = INFINITY;
    Executor unchecked(plan, *comm, ExecutorOptions{false});
    unchecked.run("loss_grad", inputs);
    Executor checked(plan, *comm, ExecutorOptions{true});
    std::string message = expectError(
        scenario, rank, [&] { checked.run("loss_grad", inputs); }, 2.0);
    CHILD_EXPECT_CONTAINS(message,
                          "dloss error: preflight of @loss_grad: rank 0 passed "
                          "argument 0 (x) with 1 infinite value; rank 2 passed "
                          "argument 0 (x) with 3 NaN values. Check mode "
                          "(DLOSS_CHECK=1) rejects NaN and infinite inputs");
  });
  expectAllSucceeded(outcomes, "NaN with checks");
  expectSameMessage(scenario, {0, 1, 2});
}

// Check mode, global gradient mode: a replicated argument's gradient must be
// bit-identical on every rank. A plan that forgets its all_reduce is caught
// with the first rank and element that differ, the same message everywhere;
// the correct plan passes, and ddp mode (where they may differ) is not
// checked.
TEST(ReliabilityTest, CheckModeComparesReplicatedGradientsInGlobalMode) {
  Scenario scenario("gradient-check");
  auto plan = buildPlan({lossGrad("good_grad"),
                         lossGrad("bad_grad", "global", /*localDw=*/true),
                         lossGrad("ddp_grad", "ddp", /*localDw=*/true)});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    auto comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    Executor executor(plan, *comm, ExecutorOptions{true});
    std::vector<at::Tensor> good = executor.run("good_grad", inputsOf(rank));
    CHILD_CHECK(at::equal(good[2], at::tensor({6.0f, 0.0f, 5.0f, 0.0f})),
                "wrong dw: " << good[2]);
    executor.run("ddp_grad", inputsOf(rank));
    std::string message = expectError(
        scenario, rank, [&] { executor.run("bad_grad", inputsOf(rank)); }, 2.0);
    CHILD_EXPECT_CONTAINS(
        message, "dloss error: check mode: @bad_grad (global mode) returned "
                 "different gradients for replicated argument 1 (w) on "
                 "different ranks: rank 1 differs from rank 0 first at "
                 "element 0 (rank 0: 2, rank 1: 3); rank 0 one value, rank 1 "
                 "another, rank 2 another. In global mode");
  });
  expectAllSucceeded(outcomes, "gradient check");
  expectSameMessage(scenario, {0, 1, 2});
}

/// Reports one collective more than it made: a rank out of step.
class OffByOneCommunicator final : public ForwardingCommunicator {
public:
  using ForwardingCommunicator::ForwardingCommunicator;
  int64_t collectivesStarted() const override {
    return inner->collectivesStarted() + 1;
  }
};

// The preflight compares how many collectives each rank has made, so a rank
// out of step (an extra or a skipped collective outside the plan) is named
// before any tensor is exchanged with the wrong peer call.
TEST(ReliabilityTest, PreflightNamesARankOutOfStep) {
  Scenario scenario("out-of-step");
  auto plan = buildPlan({lossGrad("loss_grad")});
  int port = freePort();
  auto outcomes = runChildren({0, 1, 2}, [&](int rank) {
    std::unique_ptr<Communicator> comm = dloss::connectProcessGroup(
        scenario.options(port, rank, 3, std::chrono::seconds(30)));
    if (rank == 1)
      comm = std::make_unique<OffByOneCommunicator>(std::move(comm));
    Executor executor(plan, *comm, ExecutorOptions{});
    int64_t made =
        rank == 1 ? comm->collectivesStarted() - 1 : comm->collectivesStarted();
    std::string message = expectError(
        scenario, rank, [&] { executor.run("loss_grad", inputsOf(rank)); },
        2.0);
    CHILD_EXPECT_CONTAINS(
        message,
        "preflight of @loss_grad: rank 1 made " + std::to_string(made + 1) +
            " collective calls before this one, ranks 0,2 "
            "made " +
            std::to_string(made) + ": the ranks' calls are out of step");
  });
  expectAllSucceeded(outcomes, "out of step");
  expectSameMessage(scenario, {0, 1, 2});
}

// World 4 with 3 processes: rank 2 never starts, and every started rank
// fails at the 3 s rendezvous deadline naming it.
TEST(ReliabilityTest, RankThatNeverStartsFailsTheRendezvous) {
  Scenario scenario("never-started");
  constexpr auto deadline = std::chrono::seconds(3);
  int port = freePort();
  auto outcomes = runChildren({0, 1, 3}, [&](int rank) {
    std::string message = expectError(
        scenario, rank,
        [&] {
          dloss::connectProcessGroup(scenario.options(port, rank, 4, deadline));
        },
        3.0 + 3.0, 2.5);
    CHILD_EXPECT_CONTAINS(message, "dloss error [rank " + std::to_string(rank) +
                                       "]: the rendezvous of 4 ranks");
    CHILD_EXPECT_CONTAINS(message, "rank 2 never joined");
    CHILD_EXPECT_CONTAINS(message, "DLOSS_TIMEOUT_S");
  });
  expectAllSucceeded(outcomes, "rank 2 never started");
}

TEST(ExecutorOptionsTest, CheckModeFromDlossCheck) {
  const char *saved = std::getenv("DLOSS_CHECK");
  std::string savedValue = saved ? saved : "";
  ::unsetenv("DLOSS_CHECK");
  EXPECT_FALSE(ExecutorOptions::fromEnvironment().check);
  ::setenv("DLOSS_CHECK", "1", 1);
  EXPECT_TRUE(ExecutorOptions::fromEnvironment().check);
  ::setenv("DLOSS_CHECK", "0", 1);
  EXPECT_FALSE(ExecutorOptions::fromEnvironment().check);
  ::setenv("DLOSS_CHECK", "yes", 1);
  std::string message = errorOf([] { ExecutorOptions::fromEnvironment(); });
  EXPECT_TRUE(contains(message, "DLOSS_CHECK='yes' is malformed")) << message;
  if (saved)
    ::setenv("DLOSS_CHECK", savedValue.c_str(), 1);
  else
    ::unsetenv("DLOSS_CHECK");
}

//===----------------------------------------------------------------------===//
// The flight recorder itself
//===----------------------------------------------------------------------===//

TEST(FlightRecorderTest, KeepsTheLast64CollectivesOldestFirst) {
  dloss::FlightRecorder recorder;
  uint64_t first = 0;
  for (int64_t seq = 1; seq <= 100; ++seq) {
    dloss::FlightEntry entry;
    entry.seq = seq;
    entry.collective = "allGather";
    uint64_t handle = recorder.start(entry);
    if (seq == 1)
      first = handle;
    if (seq < 100)
      recorder.finish(handle, dloss::FlightEntry::State::Completed);
  }
  // Finishing an overwritten entry is a no-op.
  recorder.finish(first, dloss::FlightEntry::State::Failed, "late");
  std::vector<dloss::FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), dloss::FlightRecorder::kCapacity);
  EXPECT_EQ(entries.front().seq, 37);
  EXPECT_EQ(entries.back().seq, 100);
  EXPECT_EQ(entries.back().state, dloss::FlightEntry::State::Started);
  for (size_t i = 0; i + 1 < entries.size(); ++i) {
    EXPECT_EQ(entries[i].seq + 1, entries[i + 1].seq);
    EXPECT_EQ(entries[i].state, dloss::FlightEntry::State::Completed);
  }

  dloss::FlightRecorder::Header header;
  header.rank = 3;
  header.reason = "a \"quoted\"\nreason";
  std::string json = recorder.toJson(header);
  EXPECT_TRUE(contains(json, "\"error\": \"a \\\"quoted\\\"\\nreason\""))
      << json;
  EXPECT_TRUE(contains(json, "{\"seq\": 37, \"collective\": \"allGather\""));
  EXPECT_FALSE(contains(json, "{\"seq\": 36,"));
}

} // namespace
