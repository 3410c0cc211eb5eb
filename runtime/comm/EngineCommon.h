// What the Gloo and NCCL engines share: the rendezvous, collective numbering and store records, failure diagnosis, argument checks.
//
// Internal to the runtime (never included by a public header). The store
// calls live in EngineCommon.cpp: opening the TCPStore, the arrival
// protocol, each rank's state under dloss/seq/<rank>, reading the peers'
// states after a failure and rank 0 keeping the store up for them; the NCCL
// engine only adds its unique id to the store. The engines keep their
// transports: ProcessGroupGloo in GlooCommunicator.cpp, NCCL in
// NcclCommunicator.cpp.
#ifndef DLOSS_RUNTIME_ENGINECOMMON_H
#define DLOSS_RUNTIME_ENGINECOMMON_H

#include "runtime/comm/Communicator.h"
#include "runtime/support/Error.h"
#include "runtime/comm/FlightRecorder.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace dloss {
namespace engine {

using Clock = std::chrono::steady_clock;

// Tags at or above this value are the engines' own (ringShift,
// reduceScatter); user tags stay below so a ring schedule can never steal
// the engine's messages.
constexpr int kReservedTagBase = 1 << 30;
// ringShift header: [ndim, dtype, sizes...]; fixed length so the receiver can
// post it before knowing anything.
constexpr int64_t kMaxDims = 64;
constexpr int64_t kHeaderLength = 2 + kMaxDims;

/// "2.5 s".
std::string seconds(std::chrono::milliseconds duration);

/// The message of a c10d, Gloo or ATen exception, fit for a user: its first
/// line, without c10's backtrace or Gloo's source position.
std::string describeError(const std::exception &e);

// What a failing call reports: the method, the IR op a plan step lowers to
// it, and the caller's site (its step's op and location, when the executor
// runs one). `seq` and `flight` are set once a collective starts.
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

// A peer's latest collective as it recorded it in the store.
struct PeerState {
  int rank = -1;
  bool known = false;
  int64_t seq = 0;
  std::string state; // "started" or "failed"
  std::string collective;
  CallSite site;
  int64_t unixMs = 0;
  std::string detail;
};

/// The parts of an engine's error text that differ between the engines.
struct EngineWording {
  /// The engine's name ("Gloo").
  const char *name;
  /// What the hint of a call that timed out adds to "make sure every rank
  /// makes the same collective calls in the same order".
  const char *sameOrderDetail;
  /// The hint of one that failed because a peer did.
  const char *peerHint;
  /// Appended to the problem of a failed call (" (... was aborted)").
  const char *failureSuffix;
  /// The hint of a tag out of range.
  const char *tagHint;
  /// The hint of a reduction of a dtype the engine cannot reduce.
  const char *reduceTypeHint;
};

/// The engine-independent half of a communicator: the options and the
/// store, the numbering of collectives, their flight record and their
/// states in the store, the diagnosis of a failure, and the checks whose
/// errors read the same in every engine. Not thread-safe.
class EngineBase : public Communicator {
public:
  int rank() const override { return options.rank; }
  int worldSize() const override { return options.worldSize; }
  int64_t collectivesStarted() const override { return started; }
  void noteFailure(const std::string &message) override;

protected:
  EngineBase(RendezvousOptions options, c10::intrusive_ptr<c10d::Store> store,
             const EngineWording &wording);
  /// Runs after the engine's own teardown: a failed rank 0 (the store's
  /// host) keeps the store up while its peers read each other's states.
  ~EngineBase() override;

  Error fail(const Call &call, std::string problem, std::string hint) const;
  std::string where() const;

  /// Numbers the collective `call`, records it in the flight recorder and
  /// publishes its number in the store. `tensor` (optional) is what this
  /// rank contributes, or else `values` int64s when not negative.
  void begin(Call &call, const at::Tensor *tensor, int64_t values = -1);
  /// Marks a collective completed (also one that had nothing to move).
  void complete(Call &call);
  /// Throws when an earlier failure left the communicator unusable.
  void refuseIfBroken(Call &call);
  /// Runs `body`, then completes `call`.
  template <typename Body>
  auto runAndComplete(Call &call, Body &&body) -> decltype(body()) {
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      complete(call);
    } else {
      auto result = body();
      complete(call);
      return result;
    }
  }
  /// Our own check failed after data moved (a malformed ringShift header):
  /// the communicator is unusable.
  void breakOn(const Call &call, const Error &error);
  /// Marks the communicator unusable after `call` failed with `detail`, and
  /// returns its error: its number and site, the peers' states, and the
  /// path of the flight record.
  Error diagnose(Call &call, const std::string &detail, bool timedOut);

  void checkDefined(const Call &call, const at::Tensor &tensor) const;
  /// Whether the engine reduces tensors of `type`.
  virtual bool reduces(at::ScalarType type) const = 0;
  /// Mean is defined for floating types only, any reduction for the types
  /// the engine reduces.
  void checkReducible(const Call &call, const at::Tensor &tensor,
                      Reduction op) const;
  /// allGather's axis and sizes; returns the axis in [0, dims).
  int64_t checkGather(const Call &call, const at::Tensor &input, int64_t axis,
                      const std::vector<int64_t> &sizes) const;
  /// reduceScatter's axis and sizes; returns the axis in [0, dims).
  int64_t checkScatter(const Call &call, const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) const;
  void checkRoot(const Call &call, int root) const;
  void checkShiftDims(const Call &call, const at::Tensor &input) const;
  /// Where a ringShift by `shift` sends and receives; `step` is the shift
  /// modulo the world size (0: every rank keeps its own tensor).
  struct ShiftPeers {
    int64_t step;
    int dst;
    int src;
  };
  ShiftPeers shiftPeers(int64_t shift) const;
  void checkPeer(const Call &call, int peer, int tag) const;
  /// Writes ringShift's header of `data` ([ndim, dtype, sizes...], zero
  /// padded to kHeaderLength values).
  static void writeShiftHeader(const at::Tensor &data, int64_t *header);
  /// The uninitialised tensor a received ringShift header describes, with
  /// `data`'s other options; throws naming `src` when it makes no sense.
  at::Tensor fromShiftHeader(const Call &call, const int64_t *header, int src,
                             const at::Tensor &data) const;

  RendezvousOptions options;
  // Engines declare their transport after it, so it outlives the transport.
  c10::intrusive_ptr<c10d::Store> store;
  /// Why the communicator is unusable; empty while it is healthy.
  std::string broken;
  /// Collectives started, i.e. the number of the latest one.
  int64_t started = 0;
  FlightRecorder flight;

private:
  /// Publishes this rank's state in the store; store failures only turn the
  /// bookkeeping off (the collective itself reports a dead peer).
  void publish(int64_t seq, const std::string &state,
               const std::string &collective, const CallSite &site,
               int64_t unixMs, const std::string &detail);
  /// Reads every peer's state; waits up to `grace` for the peers to record
  /// a failure. Sets `storeProblem` when the store cannot be read.
  std::vector<PeerState> readPeers(std::chrono::milliseconds grace,
                                   std::string &storeProblem);
  std::string summarizePeers(const Call &call,
                             const std::vector<PeerState> &peers,
                             bool timedOut) const;
  int64_t checkAxis(const Call &call, const at::Tensor &tensor,
                    int64_t axis) const;
  void checkSizes(const Call &call, const std::vector<int64_t> &sizes) const;

  EngineWording wording;
  /// The number of the collective that failed; -1 while healthy.
  int64_t failedSeq = -1;
  /// False once a store operation failed: the bookkeeping stops.
  bool storeUsable = true;
};

//===----------------------------------------------------------------------===//
// Connecting
//===----------------------------------------------------------------------===//

/// Throws when `options` cannot describe a job; `function` ("connectGloo")
/// starts the message.
void checkOptions(const RendezvousOptions &options,
                  const std::string &function);

/// An error of the rendezvous, on this rank.
Error rendezvousError(const RendezvousOptions &options, std::string problem,
                      std::string hint);

/// Opens the TCPStore (rank 0 hosts it) or throws saying why;
/// `otherHolders` names what else may hold the port ("an earlier job").
c10::intrusive_ptr<c10d::Store> openStore(const RendezvousOptions &options,
                                          const std::string &otherHolders);

/// Runs `body` (the rendezvous and the engine's own exchanges through the
/// store), turning a lost store into an error that says so.
void guardStore(const RendezvousOptions &options,
                const std::function<void()> &body);

/// Waits until every rank has announced itself in the store, or fails on
/// every rank alike, naming the ranks that never came. `name` ("NCCL
/// rendezvous") starts the message.
void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point deadline, const std::string &name);

/// Records in the store that this rank reached a step of the connection
/// (under `prefix` + rank).
void setMark(c10d::Store &store, const std::string &prefix, int rank,
             const std::string &value);

/// ": ranks 1, 3 <never> (check whether they died or failed)" for the peers
/// without a mark under `prefix`; empty when all have one; a clause naming
/// rank 0 when the store is gone.
std::string unmarkedPeers(c10d::Store &store, const RendezvousOptions &options,
                          const std::string &prefix, const std::string &never);

} // namespace engine
} // namespace dloss

#endif // DLOSS_RUNTIME_ENGINECOMMON_H
