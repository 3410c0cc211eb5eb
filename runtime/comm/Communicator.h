// The communicator interface: the collectives and point-to-point transfers a
// plan needs.
#ifndef DLOSS_RUNTIME_COMMUNICATOR_H
#define DLOSS_RUNTIME_COMMUNICATOR_H

#include "runtime/comm/Reduction.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dloss {

/// Collectives across the ranks of one job. Every call is collective: all
/// ranks make the same calls in the same order (the compiler's
/// dloss-verify-collectives and the runtime's preflight see to it). Tensors
/// live where the engine moves them (a c10d group: CPU tensors through its
/// Gloo backend, CUDA ones through its NCCL backend). Failures (a peer gone,
/// a deadline passed) raise dloss::Error naming the operation and the ranks
/// involved.
///
/// The runtime's engines (a c10d group, a single process) implement it through
/// ContractCommunicator (comm/ContractCommunicator.h), which checks every
/// call's arguments, numbers it and records it for the flight recorder once,
/// with the same messages for every engine, and leaves only the transfer to
/// the engine; Engines.h builds them. Other implementations (tests'
/// wrappers) may forward to one.
class Communicator {
public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int worldSize() const = 0;

  /// Concatenation along `axis` of every rank's tensor, in rank order.
  /// `sizes[r]` is rank r's size along `axis` (uneven batches); all other
  /// dimensions agree.
  virtual at::Tensor allGather(const at::Tensor &input, int64_t axis,
                               const std::vector<int64_t> &sizes) = 0;
  /// Element-wise reduction of equally-shaped tensors, result on every rank.
  virtual at::Tensor allReduce(const at::Tensor &input, Reduction op) = 0;
  /// Reduces equally-shaped tensors (axis length = sum of `sizes`) and keeps
  /// rank r's slice [offset_r, offset_r + sizes[r]) along `axis`.
  virtual at::Tensor reduceScatter(const at::Tensor &input, Reduction op,
                                   int64_t axis,
                                   const std::vector<int64_t> &sizes) = 0;
  /// Rank `root`'s tensor on every rank (`input` gives the shape elsewhere).
  virtual at::Tensor broadcast(const at::Tensor &input, int root) = 0;
  /// Sends `input` to rank (r + shift) mod N and returns the tensor received
  /// from rank (r - shift) mod N, whose shape may differ along any dimension
  /// (its shape travels with it).
  virtual at::Tensor ringShift(const at::Tensor &input, int64_t shift) = 0;
  /// Every rank's `values` (same length on every rank), concatenated in rank
  /// order: the small exchanges of sizes, fingerprints and status.
  virtual std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) = 0;

  /// allGatherInts whose one transfer also carries each rank's `payload`
  /// (CPU tensors whose elements travel as writeDense lays them out; empty:
  /// none): the preflight's fold of the call's first gather into its
  /// agreement. Every allGatherInts frame has room for
  /// foldCapacity() bytes, the same on every rank, so ranks in different
  /// calls still send transfers of one size. `payloads` holds every rank's
  /// bytes only when every rank's fit; else it is empty. `proposal` >= 0
  /// sets the capacity of the exchanges after this one: the largest rank's
  /// (0 above kFoldLimit); -1 leaves it as it is. An engine without the
  /// fold returns no payloads and keeps no capacity. A payload is a view of
  /// the received frame: nothing is copied out of it.
  struct FoldedInts {
    std::vector<int64_t> values;
    std::vector<at::Tensor> payloads;
  };
  static constexpr int64_t kFoldLimit = 1 << 20;
  virtual FoldedInts
  allGatherIntsFolding(const std::vector<int64_t> &values,
                       const std::vector<at::Tensor> &payload,
                       int64_t proposal) {
    (void)payload;
    (void)proposal;
    return {allGatherInts(values), {}};
  }
  /// The payload bytes the next allGatherInts frame carries (0: none).
  virtual int64_t foldCapacity() const { return 0; }

  /// Point-to-point transfers for ring schedules: nonblocking, completed by
  /// wait(). Shapes must be known on both sides.
  class Request {
  public:
    virtual ~Request() = default;
    virtual void wait() = 0;
  };
  virtual std::unique_ptr<Request> send(const at::Tensor &tensor, int peer,
                                        int tag) = 0;
  virtual std::unique_ptr<Request> recv(at::Tensor &tensor, int peer,
                                        int tag) = 0;

  /// Brackets a group of send/recv calls that every rank makes together (a
  /// fused op's ring): until endExchange(), they are one numbered collective
  /// called `name`. It counts in collectivesStarted(), has one flight-record
  /// entry, and a failing transfer is diagnosed as a failing collective is
  /// (its number, the call site, which peers never arrived or failed). The
  /// default does nothing. Use ExchangeScope.
  virtual void beginExchange(const std::string &name) { (void)name; }
  virtual void endExchange() {}

  /// A reduction whose result nobody reads before the call ends (a plan's
  /// loss value, when the plan goes on to derive its gradient): `done`
  /// receives it later, from the bytes it adds to this rank's next allGather
  /// along axis 0 or next allReduce of the same reduction and element type
  /// (a replicated parameter's gradient), or at the latest from
  /// flushReductions, so that it costs no round trip of its own. Every rank
  /// defers the same reductions in the same order, as it makes any
  /// collective; every rank gets the same bits (a gather's values reduced in
  /// rank order, an all-reduce's as the engine reduces). The default
  /// reduces at once.
  virtual void deferReduction(const at::Tensor &input, Reduction op,
                              std::function<void(at::Tensor)> done) {
    done(allReduce(input, op));
  }
  /// Completes the deferred reductions, in one collective; none when none
  /// is pending.
  virtual void flushReductions() {}
  /// Forgets them: the call that deferred them failed.
  virtual void dropReductions() {}

  /// The number of collective calls (every method above but send and recv)
  /// this communicator has started: the sequence number of the latest one.
  /// Ranks that made the same calls agree on it, so the executor's preflight
  /// compares it to catch a rank that skipped a call. -1 when the engine does
  /// not count.
  virtual int64_t collectivesStarted() const { return -1; }

  /// Tells the engine that this rank failed outside a collective (a kernel
  /// error, a rejected input) with `message`, so that peers left waiting for
  /// it can name it and say why. The default does nothing.
  virtual void noteFailure(const std::string &message) { (void)message; }

  /// Why a rank's process left, as it recorded it on its way out.
  struct PeerExit {
    int rank = -1;
    int64_t unixMs = 0;
    /// "exited after raising ValueError('bad batch') at train.py:20 in
    /// step".
    std::string reason;
    /// Whether its communicator had already failed: then the exit is a
    /// consequence of a peer's failure, not a root cause.
    bool afterFailure = false;
  };
  /// Records that this rank's process is exiting and why (`raised`: because
  /// of an exception), so that peers left waiting fail at once and name it
  /// as the root cause. The default does nothing.
  virtual void recordExit(const std::string &reason, bool raised) {
    (void)reason;
    (void)raised;
  }
  /// On the way out of the process: a rank that hosts the store keeps it up
  /// (a few seconds at most) while peers that fail because of this exit, or
  /// of an earlier failure, still read it. Returns at once in a healthy job.
  /// The default does nothing.
  virtual void keepStoreForPeers() {}
  /// Every exit recorded by the ranks (this one included), earliest first.
  virtual std::vector<PeerExit> peerExits() { return {}; }
  /// The first rank that left or failed on its own (not because a peer
  /// did), as a clause ("rank 1 exited after raising ..."), from what the
  /// ranks recorded; empty when none did. The default knows of none.
  virtual std::string rootCause() { return ""; }
  /// Whether this rank's records are in the last rank's mirror, up to date:
  /// its connection made and nothing queued. The default keeps no mirror.
  virtual bool recordsMirrored() { return false; }
};

/// Communicator::beginExchange for the lifetime of the scope.
class ExchangeScope {
public:
  ExchangeScope(Communicator &comm, const std::string &name) : comm(comm) {
    comm.beginExchange(name);
  }
  ~ExchangeScope() { comm.endExchange(); }
  ExchangeScope(const ExchangeScope &) = delete;
  ExchangeScope &operator=(const ExchangeScope &) = delete;

private:
  Communicator &comm;
};

/// The elements of `parts`, densely and one after another (each row-major),
/// into `bytes`, a byte tensor on their device of at least their size: the
/// layout of a preflight's folded payload and of fused::packRows.
void writeDense(const std::vector<at::Tensor> &parts, const at::Tensor &bytes);

} // namespace dloss

#endif // DLOSS_RUNTIME_COMMUNICATOR_H
