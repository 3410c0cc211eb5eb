// The communicator contract, enforced once above every engine: argument checks,
// collective numbering, flight record, failure diagnosis.
//
// As c10d's ProcessGroup checks a call and dispatches it to a Backend, the
// public calls of ContractCommunicator check their arguments (with the same
// messages for every engine), number the call, record it in the flight
// recorder and in the store (PeerStates, when the engine has one), and only
// then call the engine's transfer (the protected transfer* methods). An
// engine (ProcessGroupCommunicator.cpp,
// SingleProcessCommunicator.cpp) is only a transport: it moves the data and
// turns its own failures into diagnose() or breakOn().
//
// Internal to the runtime (never included by a public header).
#ifndef DLOSS_RUNTIME_COMM_CONTRACTCOMMUNICATOR_H
#define DLOSS_RUNTIME_COMM_CONTRACTCOMMUNICATOR_H

#include "runtime/comm/Call.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/FlightRecorder.h"
#include "runtime/comm/PeerStates.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/support/Error.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dloss::comm {

// Tags at or above this value are the engines' own (ringShift,
// reduceScatter); user tags stay below so a ring schedule can never steal
// the engine's messages.
constexpr int kReservedTagBase = 1 << 30;
// allGatherInts' first transfer: every rank's length, its folded payload's
// byte count and its capacity proposal (Communicator::allGatherIntsFolding)
// and, when they fit (at most kIntsFrame - kIntsFrameHeader values: the
// preflight's, a size, a hash), its values, in one frame of this many int64
// whatever the call, followed by the fold capacity's bytes.
constexpr int64_t kIntsFrame = 512;
constexpr int64_t kIntsFrameHeader = 3;
// ringShift header: [ndim, dtype, sizes...]; fixed length so the receiver can
// post it before knowing anything.
constexpr int64_t kMaxDims = 64;
constexpr int64_t kHeaderLength = 2 + kMaxDims;

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
  /// The hint of a reduction of a dtype the engine cannot reduce.
  const char *reduceTypeHint;
};

/// The Communicator every engine derives from. Not thread-safe.
class ContractCommunicator : public Communicator {
public:
  int rank() const final { return options.rank; }
  int worldSize() const final { return options.worldSize; }
  int64_t collectivesStarted() const final { return started; }
  void noteFailure(const std::string &message) final;
  void recordExit(const std::string &reason, bool raised) final;
  void keepStoreForPeers() final;
  std::vector<PeerExit> peerExits() final;
  std::string rootCause() final;
  bool recordsMirrored() final;

  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) final;
  at::Tensor allReduce(const at::Tensor &input, Reduction op) final;
  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) final;
  at::Tensor broadcast(const at::Tensor &input, int root) final;
  at::Tensor ringShift(const at::Tensor &input, int64_t shift) final;
  std::vector<int64_t> allGatherInts(const std::vector<int64_t> &values) final;
  FoldedInts allGatherIntsFolding(const std::vector<int64_t> &values,
                                  const std::vector<at::Tensor> &payload,
                                  int64_t proposal) final;
  int64_t foldCapacity() const final { return capacity; }
  std::unique_ptr<Request> send(const at::Tensor &tensor, int peer,
                                int tag) final;
  std::unique_ptr<Request> recv(at::Tensor &tensor, int peer, int tag) final;
  void beginExchange(const std::string &name) final;
  void endExchange() final;
  void deferReduction(const at::Tensor &input, Reduction op,
                      std::function<void(at::Tensor)> done) final;
  void flushReductions() final;
  void dropReductions() final;

protected:
  /// `peers` is null for an engine without a store (a single process).
  ContractCommunicator(RendezvousOptions options,
                       std::unique_ptr<PeerStates> peers,
                       const EngineWording &wording);
  ~ContractCommunicator() override;

  //===--------------------------------------------------------------------===//
  // The engine's side
  //===--------------------------------------------------------------------===//

  /// Where the engine's tensors live: throws (fail()) for a tensor on a
  /// device it cannot move. `tensor` is defined.
  virtual void checkDevice(const Call &call,
                           const at::Tensor &tensor) const = 0;
  /// Whether the engine reduces tensors of `type`.
  virtual bool reduces(at::ScalarType type) const = 0;

  // The transfers, called once the call is checked and, for a collective,
  // numbered (begin()); each completes its call (complete() or
  // runAndComplete()) or reports its failure (diagnose(), breakOn()).
  // `dim` is the checked axis in [0, dims).
  virtual at::Tensor transferAllGather(Call &call, const at::Tensor &input,
                                       int64_t dim,
                                       const std::vector<int64_t> &sizes) = 0;
  virtual at::Tensor transferAllReduce(Call &call, const at::Tensor &input,
                                       Reduction op) = 0;
  virtual at::Tensor
  transferReduceScatter(Call &call, const at::Tensor &input, Reduction op,
                        int64_t dim, const std::vector<int64_t> &sizes) = 0;
  virtual at::Tensor transferBroadcast(Call &call, const at::Tensor &input,
                                       int root) = 0;
  /// Where a ringShift sends and receives; `step` is the shift modulo the
  /// world size (0: every rank keeps its own tensor).
  struct ShiftPeers {
    int64_t step;
    int dst;
    int src;
  };
  virtual at::Tensor transferRingShift(Call &call, const at::Tensor &input,
                                       const ShiftPeers &peers) = 0;
  /// `values`: a CPU int64 vector of the same length on every rank; returns
  /// every rank's, rank by rank, as one CPU int64 vector.
  virtual at::Tensor transferAllGatherInts(Call &call,
                                           const at::Tensor &values) = 0;
  /// `call` is the open exchange's (with its number) or the transfer's own.
  virtual std::unique_ptr<Request>
  transferSend(Call &call, const at::Tensor &tensor, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> transferRecv(Call &call, at::Tensor &tensor,
                                                int peer, int tag) = 0;

  //===--------------------------------------------------------------------===//
  // What the engines use
  //===--------------------------------------------------------------------===//

  Error fail(const Call &call, std::string problem, std::string hint) const;
  /// "on rank 2 of 4".
  std::string where() const;

  /// Numbers the collective `call`, records it in the flight recorder and
  /// publishes its number in the store. `tensor` (optional) is what this
  /// rank contributes, or else `values` int64s when not negative.
  void begin(Call &call, const at::Tensor *tensor, int64_t values = -1);
  /// Marks a collective completed (also one that had nothing to move).
  void complete(Call &call);
  /// An all-reduce or broadcast of an empty tensor: no engine is asked to
  /// move it; the call completes with a contiguous copy.
  at::Tensor nothingToMove(Call &call, const at::Tensor &input);
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
  /// While this rank waits in `call` (every kWatchPeriod or so): why it
  /// should stop waiting, because a peer failed or left before reaching
  /// it; "" to keep waiting.
  std::string abandonReason(const Call &call);
  /// How often a wait checks abandonReason.
  static constexpr std::chrono::milliseconds kWatchPeriod{200};
  /// Marks the communicator unusable after `call` failed with `detail`, and
  /// returns its error: its number and site, the peers' states, and the
  /// path of the flight record.
  Error diagnose(Call &call, const std::string &detail, bool timedOut);

  /// Writes ringShift's header of `data` ([ndim, dtype, sizes...], zero
  /// padded to kHeaderLength values).
  static void writeShiftHeader(const at::Tensor &data, int64_t *header);
  /// The uninitialised tensor a received ringShift header describes, with
  /// `data`'s other options; throws naming `src` when it makes no sense.
  at::Tensor fromShiftHeader(const Call &call, const int64_t *header, int src,
                             const at::Tensor &data) const;

  RendezvousOptions options;
  /// Why the communicator is unusable; empty while it is healthy.
  std::string broken;

private:
  // The contract's checks: the same messages for every engine.
  void checkTensor(const Call &call, const at::Tensor &tensor) const;
  void checkReducible(const Call &call, const at::Tensor &tensor,
                      Reduction op) const;
  int64_t checkAxis(const Call &call, const at::Tensor &tensor,
                    int64_t axis) const;
  void checkSizes(const Call &call, const std::vector<int64_t> &sizes) const;
  int64_t checkGather(const Call &call, const at::Tensor &input, int64_t axis,
                      const std::vector<int64_t> &sizes) const;
  int64_t checkScatter(const Call &call, const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) const;
  void checkRoot(const Call &call, int root) const;
  void checkShiftDims(const Call &call, const at::Tensor &input) const;
  void checkPeer(const Call &call, int peer, int tag) const;
  ShiftPeers shiftPeers(int64_t shift) const;
  /// A send or recv's call: its own, or the open exchange's.
  Call transferCall(std::string transfer) const;
  /// The deferred reductions' inputs, byte after byte, on `device`.
  at::Tensor deferredBytes(const c10::Device &device) const;
  /// Hands each deferred reduction its result from every rank's bytes of
  /// them (tails[q]: rank q's deferredBytes), reduced in rank order.
  void completeDeferred(const std::vector<at::Tensor> &tails);

  /// Null without a store; declared before the flight recorder and the
  /// engine's transport, so that it outlives both.
  std::unique_ptr<PeerStates> peers;
  EngineWording wording;
  /// Collectives started, i.e. the number of the latest one.
  int64_t started = 0;
  /// The payload bytes every allGatherInts frame carries (foldCapacity);
  /// set from every rank's proposal, so the same on every rank.
  int64_t capacity = 0;
  FlightRecorder flight;
  /// The open exchange (beginExchange), whose number its transfers carry.
  std::optional<Call> exchange;
  /// The reductions deferReduction holds, in the order they were deferred.
  struct Deferred {
    at::Tensor input;
    Reduction op;
    std::function<void(at::Tensor)> done;
  };
  std::vector<Deferred> deferred;
};

} // namespace dloss::comm

#endif // DLOSS_RUNTIME_COMM_CONTRACTCOMMUNICATOR_H
