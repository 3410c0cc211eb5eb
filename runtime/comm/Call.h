// A communicator call as errors and the flight record name it ("collective #12
// allGather (in @clip_grad)").
#ifndef DLOSS_RUNTIME_COMM_CALL_H
#define DLOSS_RUNTIME_COMM_CALL_H

#include "runtime/comm/CallSite.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>

namespace dloss::comm {

using Clock = std::chrono::steady_clock;

/// "2.5 s".
std::string seconds(std::chrono::milliseconds duration);

/// The message of a c10d, Gloo, NCCL or ATen exception, fit for a user: its
/// first line, without c10's backtrace or Gloo's source position.
std::string describeError(const std::exception &e);

/// Milliseconds since the Unix epoch, as the peers' states record them.
int64_t unixMillis();

/// " (dloss.all_gather at clip.mlir:12:16 of @clip_grad)", or the phase;
/// empty when the site says nothing.
std::string siteText(const CallSite &site);

/// What a failing call reports: the method, the IR op a plan step lowers to
/// it, and the caller's site (its step's op and location, when the executor
/// runs one). `seq` and `flight` are set once a collective starts.
struct Call {
  Call(std::string name, std::string irOp);

  std::string name;
  std::string irOp;
  CallSite site;
  int64_t seq = -1;    // the collective's number; -1 for send and recv
  uint64_t flight = 0; // its flight recorder handle
  int64_t startUnixMs = 0;
  /// For a send or recv inside an exchange (which gives it its number):
  /// "send to rank 2 (tag 1024)", reported with the failure.
  std::string transfer;

  /// "collective #12 allGather (in @clip_grad)".
  std::string describe() const;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_CALL_H
