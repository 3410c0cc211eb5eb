// The time of one call of a loss per rank, as dloss-run and bench/ measure it.
//
// Header-only, beside LossMemory.h and shared the same way, so that the
// compiled losses and the eager baselines report comparable times.
#ifndef DLOSS_TOOLS_DLOSS_RUN_CALLTIMING_H
#define DLOSS_TOOLS_DLOSS_RUN_CALLTIMING_H

#include "runtime/comm/CallSite.h"
#include "runtime/comm/Communicator.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace dloss {
namespace tools {

/// Makes `warmup` untimed calls of `call`, then `iters` timed ones, and
/// returns the median time of a timed call in milliseconds (0 with none).
///
/// Each timed call starts with the ranks lined up (one allGatherInts), so
/// that a rank times its own call, not its wait for a peer still finishing
/// the previous one. Collective: every rank calls it with the same counts.
/// `function` (may be empty) is the plan function `call` runs: a failed
/// line-up names it ("line-up before timing of @clip_grad"), as a failure
/// inside the call would.
template <typename Call>
double timeCalls(Communicator &comm, const std::string &function, int warmup,
                 int iters, Call &&call) {
  for (int k = 0; k < warmup; ++k)
    call();
  // A peer that dies between two calls is first missed at the line-up: its
  // call site says so in the error and the flight record.
  CallSite site;
  site.function = function;
  site.phase = "line-up before timing";
  std::vector<double> times;
  for (int k = 0; k < iters; ++k) {
    {
      CallSiteScope scope(site);
      comm.allGatherInts({0});
    }
    auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count());
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

} // namespace tools
} // namespace dloss

#endif // DLOSS_TOOLS_DLOSS_RUN_CALLTIMING_H
