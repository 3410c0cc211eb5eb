// The communicator interface: the collectives and point-to-point transfers a
// plan needs.
#ifndef DLOSS_RUNTIME_COMMUNICATOR_H
#define DLOSS_RUNTIME_COMMUNICATOR_H

#include "runtime/comm/Reduction.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dloss {

/// What the caller is doing while it calls a collective: the plan function,
/// the step's IR op and location, or a phase outside the steps ("preflight").
/// Communicators read it (currentCallSite()) to say where a collective
/// failed and to label their flight record; the executor sets it with a
/// CallSiteScope. Thread-local, so it passes through wrapping communicators.
struct CallSite {
  std::string function; ///< "clip_grad"; empty outside a plan function.
  std::string op;       ///< "dloss.all_gather"; empty outside a step.
  std::string location; ///< "clip.mlir:12:16"; empty when unknown.
  std::string phase;    ///< "preflight", "check"; empty inside a step.
};

/// The call site of this thread's innermost CallSiteScope, or nullptr.
const CallSite *currentCallSite();

/// Makes `site` the current call site until the scope ends (scopes nest).
class CallSiteScope {
public:
  explicit CallSiteScope(const CallSite &site);
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope &) = delete;
  CallSiteScope &operator=(const CallSiteScope &) = delete;

private:
  const CallSite *previous;
};

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
/// the engine. Other implementations (tests' wrappers) may forward to one.
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

/// How to reach the other ranks, as torchrun describes it.
struct RendezvousOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  int rank = 0;
  int worldSize = 1;
  /// Deadline of every collective and of the rendezvous itself.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// Where a failed collective writes this rank's flight record
  /// (dloss-flight-rank<r>.json: its last 64 collectives); empty: the
  /// current directory. "off" writes none.
  std::string flightDir;
  /// Whether a launcher, not rank 0, hosts the store at masterPort (as
  /// torchrun's agent does with its default static rendezvous: it sets
  /// TORCHELASTIC_USE_AGENT_STORE=True). Then every rank is a client, and
  /// dloss keeps its keys under "dloss/attempt_<restartCount>/" so that a
  /// restarted job never reads an earlier attempt's.
  bool agentStore = false;
  /// TORCHELASTIC_RESTART_COUNT: which attempt this is (agentStore only).
  int restartCount = 0;

  /// From MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and DLOSS_TIMEOUT_S,
  /// DLOSS_FLIGHT_DIR, TORCHELASTIC_USE_AGENT_STORE,
  /// TORCHELASTIC_RESTART_COUNT);
  /// a missing or malformed variable is a dloss::Error saying which.
  static RendezvousOptions fromEnvironment();
};

/// A TCP port on 127.0.0.1 for a job's rendezvous store, reserved for the
/// rest of this process's life: it stays bound (SO_REUSEADDR, close on
/// exec, never listening), so the kernel gives it to no other bind(port 0),
/// while the job's rank 0 may still bind and listen on it (the c10d store
/// sets SO_REUSEADDR too). Picking a free port and closing it, as launchers
/// often do, lets two jobs started at once draw the same one. Throws
/// dloss::Error when no port can be bound.
int reserveLoopbackPort();

/// The c10d group of a job that has none yet (dloss-run, the C++ JIT), as
/// init_process_group() builds it: over a c10d TCPStore (rank 0 hosts it,
/// or the launcher), Gloo moves CPU tensors and, where torch has NCCL and
/// this process sees a GPU, c10d's ProcessGroupNCCL moves CUDA tensors on
/// each tensor's device (set the current device to LOCAL_RANK's first). The
/// communicator runs on it through the c10d engine (ProcessGroupEngine.h).
/// Returns once every rank has joined, or raises dloss::Error at the
/// deadline naming the ranks that never arrived.
///
/// Every collective is numbered; before entering one, a rank records its
/// number in the store (key dloss/seq/<rank>). When a collective fails (its
/// deadline passed, a peer closed its connection), the error names the
/// collective, its number, the call site, and each peer's state read from
/// the store: which ranks never arrived (their number is behind), which
/// failed and why. The rank's last 64 collectives are written as JSON to
/// RendezvousOptions::flightDir and the error gives the path. A CUDA
/// collective past its deadline aborts the group's NCCL communicators.
std::unique_ptr<Communicator>
connectProcessGroup(const RendezvousOptions &options);

/// The communicator of a single process (world size 1): every collective is
/// the identity. Used for single-device reference runs.
std::unique_ptr<Communicator> makeSingleProcessCommunicator();

} // namespace dloss

#endif // DLOSS_RUNTIME_COMMUNICATOR_H
