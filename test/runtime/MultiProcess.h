// Test helpers that run code on several real processes (forked ranks) and never
// hang.
#ifndef DLOSS_TEST_RUNTIME_MULTIPROCESS_H
#define DLOSS_TEST_RUNTIME_MULTIPROCESS_H

#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dloss::test {

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Child processes
//===----------------------------------------------------------------------===//

// Longest a group of children may run before the parent kills them: far
// above the few seconds a healthy run takes, well below ctest's TIMEOUT.
constexpr std::chrono::seconds kChildLimit{60};
// Deadline of the children's collectives: a bug fails, it does not hang.
constexpr std::chrono::seconds kCollectiveTimeout{30};

// A failed check inside a child: reported on stderr, turned into exit code 1.
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CHILD_CHECK(condition, message)                                        \
  do {                                                                         \
    if (!(condition)) {                                                        \
      std::ostringstream checkMessage_;                                        \
      checkMessage_ << __FILE__ << ":" << __LINE__ << ": " << message;         \
      throw CheckFailure(checkMessage_.str());                                 \
    }                                                                          \
  } while (false)

// How one child ended: its exit code, or the signal that killed it.
struct ChildOutcome {
  int rank = -1;
  std::optional<int> exitCode;
  std::optional<int> signal;
  bool killedByParent = false;
};

inline std::string describe(const ChildOutcome &outcome) {
  std::ostringstream out;
  out << "rank " << outcome.rank << ": ";
  if (outcome.killedByParent)
    out << "still running after " << kChildLimit.count()
        << " s, killed by the test";
  else if (outcome.exitCode)
    out << "exit code " << *outcome.exitCode;
  else if (outcome.signal)
    out << "killed by signal " << *outcome.signal;
  return out.str();
}

// A port for one job's store, reserved for the rest of the test process
// (dloss::reserveLoopbackPort), so concurrently running tests never share
// one.
inline int freePort() { return dloss::reserveLoopbackPort(); }

// Forks one child per entry of `ranks`, runs `body(rank)` in each and reports
// how they ended; a child that outlives kChildLimit is killed, so a test never
// hangs. Children leave with _exit: they must not run the parent's gtest
// teardown or atexit handlers. Each child computes on one thread: the
// ranks share the machine's cores, and an OpenMP team that an earlier test
// of the same process started does not survive the fork (a child's next
// parallel GEMM would wait for its threads forever; seen when the whole
// test program runs in one process).
inline std::vector<ChildOutcome>
runChildren(const std::vector<int> &ranks,
            const std::function<void(int)> &body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t started : pids)
        ::kill(started, SIGKILL);
      throw std::runtime_error("fork failed");
    }
    if (pid == 0) {
      int code = 0;
      try {
        at::set_num_threads(1);
        body(rank);
        // A failed EXPECT_* in the child is recorded in the child's copy of
        // the test: turn it into an exit code, or the parent never sees it.
        if (::testing::Test::HasFailure()) {
          std::fprintf(stderr, "[child rank %d] an expectation failed\n", rank);
          code = 1;
        }
      } catch (const CheckFailure &e) {
        std::fprintf(stderr, "[child rank %d] check failed: %s\n", rank,
                     e.what());
        code = 1;
      } catch (const std::exception &e) {
        std::fprintf(stderr, "[child rank %d] unexpected exception: %s\n", rank,
                     e.what());
        code = 2;
      } catch (...) {
        std::fprintf(stderr, "[child rank %d] unexpected exception\n", rank);
        code = 3;
      }
      std::fflush(stderr);
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }

  std::vector<ChildOutcome> outcomes(ranks.size());
  size_t remaining = ranks.size();
  Clock::time_point limit = Clock::now() + kChildLimit;
  for (size_t i = 0; i < ranks.size(); ++i)
    outcomes[i].rank = ranks[i];
  std::vector<bool> reaped(ranks.size(), false);
  while (remaining > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (reaped[i])
        continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) != pids[i])
        continue;
      reaped[i] = true;
      --remaining;
      if (WIFEXITED(status))
        outcomes[i].exitCode = WEXITSTATUS(status);
      else if (WIFSIGNALED(status))
        outcomes[i].signal = WTERMSIG(status);
    }
    if (remaining == 0)
      break;
    if (Clock::now() > limit) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (reaped[i])
          continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);
        outcomes[i].killedByParent = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return outcomes;
}

// Asserts that every child exited 0 (their checks passed).
inline void expectAllSucceeded(const std::vector<ChildOutcome> &outcomes,
                               const std::string &context) {
  for (const ChildOutcome &outcome : outcomes)
    EXPECT_TRUE(outcome.exitCode && *outcome.exitCode == 0)
        << context << ": " << describe(outcome);
}

inline dloss::RendezvousOptions
loopbackOptions(int port, int rank, int worldSize,
                std::chrono::milliseconds timeout) {
  dloss::RendezvousOptions options;
  options.masterAddr = "127.0.0.1";
  options.masterPort = port;
  options.rank = rank;
  options.worldSize = worldSize;
  options.timeout = timeout;
  // Flight records of failing tests go to the temporary directory, not to
  // the directory the tests run in.
  options.flightDir = ::testing::TempDir();
  return options;
}

// Runs `body` on every rank of a Gloo job of `worldSize` processes and
// expects all of them to pass their checks.
inline void runGloo(int worldSize,
                    const std::function<void(dloss::Communicator &)> &body) {
  int port = freePort();
  std::vector<int> ranks;
  for (int r = 0; r < worldSize; ++r)
    ranks.push_back(r);
  auto outcomes = runChildren(ranks, [&](int rank) {
    auto communicator = dloss::connectProcessGroup(
        loopbackOptions(port, rank, worldSize, kCollectiveTimeout));
    CHILD_CHECK(communicator->rank() == rank, "rank() is wrong");
    CHILD_CHECK(communicator->worldSize() == worldSize, "worldSize() is wrong");
    body(*communicator);
  });
  expectAllSucceeded(outcomes, "world size " + std::to_string(worldSize));
}

} // namespace dloss::test

#endif // DLOSS_TEST_RUNTIME_MULTIPROCESS_H
