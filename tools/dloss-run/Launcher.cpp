// dloss-run --world N: starts N local ranks and waits, leaving no orphans.
//
// A rank that fails makes the launcher exit non-zero once the others have
// stopped (they fail within the deadline); ranks still running 10 s past the
// deadline are killed; SIGINT/SIGTERM/SIGHUP stop every rank; and a rank
// dies with its launcher (PR_SET_PDEATHSIG) even if the launcher is killed
// outright. It signals only processes it started.
//
// Each rank is a fork of the launcher that runs runRank() itself, without
// exec: libtorch is loaded and its operators registered once, in the launcher,
// instead of once per rank. Nothing before the fork starts a thread or runs
// a torch operator, so the child inherits no thread pool half-made. A rank's
// name (/proc/<pid>/comm, what ps and top show) is dloss-rank<r>.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/comm/RendezvousOptions.h"
#include "runtime/support/Error.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dloss {
namespace tools {

namespace {

/// The signal that asked the launcher to stop (0: none).
volatile std::sig_atomic_t stopSignal = 0;

extern "C" void onStopSignal(int signal) { stopSignal = signal; }

/// This process's threads (/proc/self/task); 0 where that cannot be read.
std::size_t threadCount() {
  std::error_code error;
  std::size_t count = 0;
  for (std::filesystem::directory_iterator it("/proc/self/task", error), end;
       !error && it != end; it.increment(error))
    ++count;
  return error ? 0 : count;
}

} // namespace

/// A rank that fails makes its peers fail too (they see it gone); any still
/// running after the deadline are killed, so no process of ours outlives
/// the run.
int launch(const Options &o, const std::string &planPath) {
  {
    // Mistakes every rank would make alike are reported before any starts.
    auto plan = PlanFile::load(planPath);
    checkInputNames(o, *entryOf(*plan, o).grad);
  }
  // Held until the launcher exits, so no job started beside this one draws
  // the same port; rank 0 hosts the store on it.
  int port = reserveLoopbackPort();
  // A stop request (Ctrl-C, a job scheduler's SIGTERM) stops the ranks too.
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP})
    sigaction(signal, &action, nullptr);
  pid_t launcher = getpid();
  std::vector<pid_t> children;
  // The rule of this file, checked: a rank forked beside another thread
  // would inherit whatever that thread held (a lock, a pool half-made).
  if (std::size_t threads = threadCount(); threads > 1)
    throw Error("dloss-run: " + std::to_string(threads - 1) +
                    " thread(s) running before the ranks are forked",
                "This is a bug in dloss-run: please report it with the "
                "command line");
  // Nothing buffered before the fork is written again by a rank.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  for (int r = 0; r < o.world; ++r) {
    pid_t pid = fork();
    if (pid < 0)
      throw Error(std::string("cannot start rank ") + std::to_string(r) + ": " +
                      std::strerror(errno),
                  "Lower --world or free some processes");
    if (pid == 0) {
      // Dies with the launcher, even one killed by SIGKILL (no orphans).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher)
        _exit(1); // the launcher died before prctl
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      // All ranks share this machine's cores (intraOpThreads).
      setenv("LOCAL_WORLD_SIZE", std::to_string(o.world).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(o.world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      // Rank 0 hosts the store, whatever launcher started dloss-run.
      unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      unsetenv("TORCHELASTIC_RESTART_COUNT");
      setenv("DLOSS_RUN_PLAN", planPath.c_str(), 1);
      prctl(PR_SET_NAME, ("dloss-rank" + std::to_string(r)).c_str());
      // A rank has no stop handler (the launcher's SIGTERM ends it), as
      // after an exec.
      for (int signal : {SIGINT, SIGTERM, SIGHUP})
        std::signal(signal, SIG_DFL);
      // The rank's part of main(): its exit status, or its error.
      int code = 1;
      try {
        code = runRank(o, planPath);
      } catch (const std::exception &e) {
        std::cerr << "dloss-run: " << e.what() << "\n";
      }
      // Everything the rank made (its group, its files) is gone once
      // runRank returns: what std::exit would add is libtorch's teardown
      // (every operator deregistered, each write a copy of a page shared
      // with the launcher), about half a rank's CPU time. _exit skips it.
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }

  int failures = 0;
  size_t running = children.size();
  std::vector<bool> done(children.size(), false);
  auto deadline = std::chrono::steady_clock::time_point::max();
  // The ranks' own deadline (as they compute it), plus a margin.
  double timeoutSeconds = o.timeoutSeconds;
  if (timeoutSeconds <= 0) {
    timeoutSeconds = 300;
    try {
      timeoutSeconds =
          RendezvousOptions::fromEnvironment().timeout.count() / 1000.0;
    } catch (const std::exception &) {
      // The ranks report a malformed variable themselves.
    }
  }
  int grace = static_cast<int>(std::ceil(timeoutSeconds)) + 10;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = std::find(children.begin(), children.end(), pid);
      if (it == children.end())
        continue;
      done[it - children.begin()] = true;
      --running;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        ++failures;
        if (WIFSIGNALED(status))
          std::cerr << "dloss-run: rank " << (it - children.begin())
                    << " was killed by signal " << WTERMSIG(status) << "\n";
        if (deadline == std::chrono::steady_clock::time_point::max())
          deadline =
              std::chrono::steady_clock::now() + std::chrono::seconds(grace);
      }
      continue;
    }
    if (stopSignal) {
      int signal = stopSignal;
      std::cerr << "dloss-run: stopping the ranks (signal " << signal << ")\n";
      for (size_t r = 0; r < children.size(); ++r)
        if (!done[r])
          kill(children[r], SIGTERM);
      // Ranks have no handler, so SIGTERM ends them; SIGKILL the rest.
      auto killAt = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (running > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        auto it = std::find(children.begin(), children.end(), pid);
        if (pid > 0 && it != children.end() && !done[it - children.begin()]) {
          done[it - children.begin()] = true;
          --running;
          continue;
        }
        if (std::chrono::steady_clock::now() > killAt) {
          for (size_t r = 0; r < children.size(); ++r)
            if (!done[r])
              kill(children[r], SIGKILL);
          killAt = std::chrono::steady_clock::time_point::max();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return 128 + signal;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 0; r < children.size(); ++r)
        if (!done[r]) {
          std::cerr << "dloss-run: rank " << r
                    << " did not stop after a peer failed; "
                    << "killing it\n";
          kill(children[r], SIGKILL);
        }
      deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (failures) {
    std::cerr << "dloss-run: " << failures << " of " << o.world
              << " ranks failed (their messages are above)\n";
    return 1;
  }
  return 0;
}

} // namespace tools
} // namespace dloss
