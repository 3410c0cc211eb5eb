// The c10d engine: Communicator over any c10d ProcessGroup (the one
// connectProcessGroup builds, or the user's torch.distributed group). It is
// dloss's only transport: every c10d collective call of the project lives
// in this file. The store (TCPStore), the rendezvous and the failure
// diagnosis live in StoreRendezvous.cpp and PeerStates.cpp, the contract
// every engine keeps (checks, numbering, flight record) in
// ContractCommunicator.cpp, and the group's setup in ConnectProcessGroup.cpp.
// A torch 2.x ProcessGroup holds one Backend per device type (the default
// group of init_process_group() is "cpu:gloo,cuda:nccl"), so the engine that
// moves a tensor is decided by the tensor's device, never by the group's name.
//
// What differs on the GPU (NCCL), where c10d's Work completes on the device:
// - Waiting: the host polls Work::isCompleted() against the deadline, then
//   Work::wait() orders the current stream after the transfer. At the
//   deadline the group's NCCL backend is aborted (Backend::abort), which ends
//   the kernels still waiting for a peer, and the error says so.
// - Point to point: NCCL matches transfers per peer in issue order, not by
//   tag, and a pending receive blocks its stream. So send() and recv() of
//   CUDA tensors only post; the first wait() on one of them, or the next
//   collective, issues every posted transfer as one coalesced batch
//   (ProcessGroup::startCoalescing / endCoalescing, as
//   torch.distributed.batch_isend_irecv does), each peer's in tag order, so
//   that both ends of a pair issue matching transfers in the same order. The
//   engine's own exchanges (ringShift, reduceScatter's ring) coalesce each
//   step's receive and send the same way.
// - Starting: ProcessGroupNCCL creates its communicators at the group's
//   first CUDA call, and that blocks the host until every rank joins, with
//   no deadline of dloss's. So on a group of connectProcessGroup's, every
//   rank first meets the others in a one-element Gloo allreduce under the
//   deadline (meetBeforeNccl): a rank that never comes is named as at any
//   collective, and NCCL starts only once all are there. A user's group is
//   the user's to start (init_process_group(device_id=...) starts it eagerly).
// - The small exchanges (sizes, fingerprints, ringShift headers) travel as
//   CPU tensors when the group has a CPU backend, else as CUDA tensors.
// CUDA tensors in a group whose CUDA backend is Gloo (ranks sharing one
// GPU, which NCCL refuses) are copied to the host and back around every
// transfer (stagedOnHost): Gloo's send and recv take host pointers, and it
// has no coalescing.
#include "runtime/comm/ContractCommunicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/GuardedBackend.h"
#include "runtime/comm/Refusal.h"
#include "runtime/comm/RingBuffers.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

namespace dloss {

using namespace comm;

namespace {

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

constexpr int kRingShiftHeaderTag = kReservedTagBase;
constexpr int kRingShiftDataTag = kReservedTagBase + 1;
// reduceScatter's ring (ProcessGroupGloo 1.13 has no reduce_scatter).
constexpr int kReduceScatterTag = kReservedTagBase + 2;
// allGather's direct exchange (exchangeAllGather).
constexpr int kAllGatherTag = kReservedTagBase + 3;
// Collectives: Work::wait's own limit is the deadline plus this margin, so
// that Gloo's deadline (the same timeout, inside the worker thread) fires
// first and reports more precisely; it only guards against a stuck thread.
constexpr std::chrono::milliseconds kWaitMargin{2000};
// Polling a GPU transfer: spin (yielding) this long, then sleep between
// queries.
constexpr std::chrono::microseconds kSpinPeriod{2000};
constexpr std::chrono::microseconds kPollSleep{100};

constexpr EngineWording kGlooWording{
    /*name=*/"Gloo",
    /*sameOrderDetail=*/"",
    /*peerHint=*/
    "A peer rank probably failed or exited: check the other ranks' logs "
    "for the first error (this one is a consequence)",
    /*failureSuffix=*/"",
    /*reduceTypeHint=*/
    "Convert to float, double, half or an integer type first"};

// A group over NCCL (the user's, on GPUs): c10d's ProcessGroupNCCL moves it.
constexpr EngineWording kNcclGroupWording{
    /*name=*/"NCCL (through the torch.distributed group)",
    /*sameOrderDetail=*/"",
    /*peerHint=*/
    "A peer rank probably failed or exited: check the other ranks' logs "
    "for the first error (this one is a consequence)",
    /*failureSuffix=*/"",
    /*reduceTypeHint=*/
    "Convert to float, double, half or an integer type first"};

// The name of the backend that moves `device`'s tensors, or "" when the
// group has none for that device type.
std::string backendFor(c10d::ProcessGroup &group, c10::DeviceType device) {
  c10::intrusive_ptr<c10d::Backend> backend = movingBackend(group, device);
  return backend ? backend->getBackendName() : "";
}

// The wording of the group's CPU engine when it has one (Gloo), else of its
// GPU one: messages name the engine the group mostly moves.
const EngineWording &wordingOf(c10d::ProcessGroup &group) {
  return backendFor(group, c10::DeviceType::CPU).empty() &&
                 backendFor(group, c10::DeviceType::CUDA) == "nccl"
             ? kNcclGroupWording
             : kGlooWording;
}

bool looksLikeTimeout(const std::string &message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
}

// The dtypes Gloo 1.13 moves and reduces natively.
bool glooHasType(at::ScalarType type) {
  switch (type) {
  case at::kFloat:
  case at::kDouble:
  case at::kHalf:
  case at::kChar:
  case at::kByte:
  case at::kInt:
  case at::kLong:
    return true;
  default:
    return false;
  }
}

// Transfers do not look at the values, so other dtypes (bool, bfloat16,
// complex) travel as bytes. The result shares storage with `contiguous`.
at::Tensor toWire(const at::Tensor &contiguous) {
  if (glooHasType(contiguous.scalar_type()))
    return contiguous;
  return contiguous.reshape({-1}).view(at::kByte);
}

at::Tensor fromWire(const at::Tensor &wire, at::ScalarType type,
                    at::IntArrayRef shape) {
  if (wire.scalar_type() == type)
    return wire.view(shape);
  return wire.view(type).view(shape);
}

/// Where each rank's block starts along the gathered or scattered axis.
std::vector<int64_t> offsetsOf(const std::vector<int64_t> &sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t r = 1; r < sizes.size(); ++r)
    offsets[r] = offsets[r - 1] + sizes[r - 1];
  return offsets;
}

c10d::ReduceOp toC10d(Reduction op) {
  switch (op) {
  case Reduction::Max:
    return c10d::ReduceOp::MAX;
  case Reduction::Min:
    return c10d::ReduceOp::MIN;
  case Reduction::Sum:
  case Reduction::Mean: // Summed, then divided by the world size.
    return c10d::ReduceOp::SUM;
  }
  return c10d::ReduceOp::SUM;
}

//===----------------------------------------------------------------------===//
// ProcessGroupCommunicator
//===----------------------------------------------------------------------===//

/// Watches a Gloo send or recv while the caller waits for it. Gloo's own
/// timed wait on one fails the whole group when its timeout ends (every
/// connection of the rank closes, so peers waiting in unrelated
/// collectives fail at once too), and it cannot be waited on in slices
/// between which the peers are checked, as a collective is (awaitOnCpu).
/// Instead the caller waits with Gloo's limit past the deadline, and this
/// thread checks every kWatchPeriod whether the transfer should be abandoned
/// (`reason`: the peers' states) or its deadline has passed and, if so,
/// aborts it (Work::abort: Gloo's wait then returns, and the connections
/// stay as they are). The check runs under the lock the caller takes when
/// its wait ends, so it never overlaps the caller's own use of the store.
/// The thread starts at the first watched wait: a process that never waits
/// on a transfer has none.
class TransferWatch {
public:
  using Clock = std::chrono::steady_clock;

  TransferWatch(std::function<std::string()> reason,
                std::chrono::milliseconds period)
      : reason(std::move(reason)), period(period) {}
  ~TransferWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_one();
    if (thread.joinable())
      thread.join();
    // An aborted transfer is still posted in Gloo's transport, which may
    // write into its buffer when the peer's data comes: never freed.
    for (c10::intrusive_ptr<c10d::Work> &work : kept)
      (void)work.release();
  }

  /// Waits for `work` until `limit` (Gloo's own wait until `backstop`,
  /// later); throws what the work threw, or why the watch aborted it ("timed
  /// out" at the deadline). An aborted work is kept (see the destructor).
  void await(const c10::intrusive_ptr<c10d::Work> &work,
             std::chrono::milliseconds limit,
             std::chrono::milliseconds backstop) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      current = work;
      since = Clock::now();
      deadline = since + limit;
      this->limit = limit;
      if (!thread.joinable())
        thread = std::thread([this] { watch(); });
    }
    std::exception_ptr failure;
    try {
      work->wait(backstop);
    } catch (...) {
      failure = std::current_exception();
    }
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mutex);
      current.reset();
      why.swap(abortedBecause);
    }
    if (!why.empty()) {
      kept.push_back(work);
      throw std::runtime_error(why);
    }
    if (failure)
      std::rethrow_exception(failure);
  }

  /// Whether a transfer was abandoned (see ~ProcessGroupCommunicator).
  bool abandoned() const { return !kept.empty(); }

private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stopping) {
      Clock::time_point wakeAt = Clock::now() + period;
      if (current)
        wakeAt = std::min(wakeAt, deadline);
      wake.wait_until(lock, wakeAt);
      Clock::time_point now = Clock::now();
      if (stopping || !current || now - since < std::min(period, limit))
        continue;
      std::string why;
      if (now >= deadline) {
        why = "timed out: the peer's data had not come at the deadline of " +
              seconds(limit);
      } else {
        try {
          why = reason();
        } catch (...) { // The store failed: keep waiting for the deadline.
        }
      }
      if (why.empty())
        continue;
      abortedBecause = std::move(why);
      current->abort();
      current.reset();
    }
  }

  std::function<std::string()> reason;
  std::chrono::milliseconds period;
  std::mutex mutex;
  std::condition_variable wake;
  c10::intrusive_ptr<c10d::Work> current; ///< The wait in progress.
  Clock::time_point since, deadline;
  std::chrono::milliseconds limit{0};
  std::string abortedBecause;
  bool stopping = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> kept;
  std::thread thread;
};

/// A send or recv. A CPU one is issued at once; a CUDA one waits in the
/// communicator's posted list until its batch is issued (launchPosted).
struct Transfer {
  bool isSend;
  int peer;
  int tag;
  at::Tensor wire;
  c10::intrusive_ptr<c10d::Work> work; // Null for an empty tensor.
};

class ProcessGroupCommunicator final : public ContractCommunicator {
public:
  /// Without a store, peers' states are not recorded (failures still name
  /// the collective and its number). Nor in a group of one rank, which has
  /// no peer to read them: each record is a store write, about 12 us of a
  /// call's collective (bench/host_cost_bench.py).
  ProcessGroupCommunicator(RendezvousOptions options,
                           c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::ProcessGroup> group,
                           bool ownGroup)
      : ContractCommunicator(options,
                             store && options.worldSize > 1
                                 ? std::make_unique<PeerStates>(
                                       std::move(store), options, ownGroup)
                                 : nullptr,
                             wordingOf(*group)),
        group(std::move(group)), ownGroup(ownGroup) {}
  // Closing the Gloo pairs first (before PeerStates' destructor keeps a
  // failed rank 0's store up) makes peers still blocked on this rank fail
  // now rather than at their deadline. The NCCL backend of a group built
  // for this communicator is shut down (aborted after a failure).
  //
  // Except after a Gloo collective was abandoned (awaitOnCpu stopped
  // waiting for it because a peer failed): its work still runs on the
  // group's worker thread, blocked on a live peer that left the collective,
  // until Gloo's own timeout; ProcessGroupGloo's destructor joins that
  // thread, so destroying the group would hold this rank (and every peer
  // blocked on it) for the whole deadline. A group of connectProcessGroup's
  // is then left to the process's exit, which closes its connections. A
  // user's group is only released: its owner decides.
  ~ProcessGroupCommunicator() override {
    posted.clear();
    if (ownGroup && broken.empty() &&
        hasBackend(*group, c10::DeviceType::CUDA)) {
      try {
        movingBackend(*group, c10::DeviceType::CUDA)->shutdown();
      } catch (...) { // A destructor reports nothing; the process goes on.
      }
    }
    if (ownGroup && (abandonedWork || watch.abandoned()))
      (void)group.release(); // Deliberately never destroyed: see above.
    group.reset();
  }

  /// A Gloo allreduce of one element: returns once every rank has finished
  /// building its process group.
  void barrier(Call &call);

  /// Runs `body`, turning any c10d, Gloo or NCCL failure into a
  /// dloss::Error. Posted CUDA transfers are issued first. After a failure
  /// the group's state is unknown (a peer may be gone, a collective half
  /// done), so every later call fails fast. A collective (begun with
  /// begin()) is marked completed or failed in the flight recorder, and its
  /// failure names the peers' states.
  template <typename Body>
  auto communicate(Call &call, Body &&body) -> decltype(body());

  /// Waits for a collective's `work`, which moved `moved`; throws what the
  /// work threw.
  void awaitCollective(const c10::intrusive_ptr<c10d::Work> &work,
                       const at::Tensor &moved) {
    if (moved.is_cuda())
      awaitOnGpu(work);
    else
      awaitOnCpu(work, options.timeout + kWaitMargin);
  }
  /// Waits for a send or recv of `moved`, whose only deadline is this one.
  void awaitTransfer(const c10::intrusive_ptr<c10d::Work> &work,
                     const at::Tensor &moved) {
    if (moved.is_cuda())
      awaitOnGpu(work);
    else
      watch.await(work, options.timeout, options.timeout + kWaitMargin);
  }
  /// Issues the posted CUDA transfers as one coalesced batch.
  void launchPosted();
  /// Before the group's first NCCL call: see the file's comment.
  void meetBeforeNccl(const at::Tensor &moved) {
    if (ncclStarted || !moved.is_cuda() || !ownGroup)
      return;
    at::Tensor token = at::ones({1}, at::kInt);
    std::vector<at::Tensor> tensors{token};
    awaitCollective(group->allreduce(tensors), token);
    ncclStarted = true;
  }

  /// One ring step's transfers; null where the tensor was empty.
  struct Swap {
    c10::intrusive_ptr<c10d::Work> in, out;
  };
  /// Posts the recv of `received` from `src` before the send of `data` to
  /// `dst`, so no cycle of the ring waits on another (coalesced on the GPU,
  /// where src == dst would otherwise block the stream). Every rank knows
  /// both sizes, so both ends skip empty tensors.
  Swap postSwap(const at::Tensor &received, const at::Tensor &data, int src,
                int dst, int tag) {
    std::vector<at::Tensor> recvWire{toWire(received)};
    std::vector<at::Tensor> sendWire{toWire(data)};
    bool gpu = data.is_cuda();
    if (gpu) {
      meetBeforeNccl(data);
      group->startCoalescing(c10::DeviceType::CUDA);
    }
    Swap swap;
    if (received.numel() > 0)
      swap.in = group->recv(recvWire, src, tag);
    if (data.numel() > 0)
      swap.out = group->send(sendWire, dst, tag);
    if (gpu) {
      auto batch = group->endCoalescing(c10::DeviceType::CUDA);
      swap.in = swap.in ? batch : nullptr;
      swap.out = swap.out ? batch : nullptr;
    }
    return swap;
  }

protected:
  at::Tensor transferAllGather(Call &call, const at::Tensor &input, int64_t dim,
                               const std::vector<int64_t> &sizes) override;
  at::Tensor transferAllReduce(Call &call, const at::Tensor &input,
                               Reduction op) override;
  at::Tensor transferReduceScatter(Call &call, const at::Tensor &input,
                                   Reduction op, int64_t dim,
                                   const std::vector<int64_t> &sizes) override;
  at::Tensor transferBroadcast(Call &call, const at::Tensor &input,
                               int root) override;
  at::Tensor transferRingShift(Call &call, const at::Tensor &input,
                               const ShiftPeers &ring) override;
  at::Tensor transferAllGatherInts(Call &call,
                                   const at::Tensor &values) override;
  std::unique_ptr<Request> transferSend(Call &call, const at::Tensor &tensor,
                                        int peer, int tag) override;
  std::unique_ptr<Request> transferRecv(Call &call, at::Tensor &tensor,
                                        int peer, int tag) override;

private:
  // bfloat16 (CPU autocast's dtype) is reduced in float32 (reduce()).
  bool reduces(at::ScalarType type) const override {
    return glooHasType(type) || type == at::kBFloat16;
  }
  void checkDevice(const Call &call, const at::Tensor &tensor) const override;
  /// Issues a CPU transfer now; posts a CUDA one for launchPosted().
  void post(Call &call, const std::shared_ptr<Transfer> &transfer);
  /// allGather on Gloo's CPU backend as a direct exchange with every peer:
  /// Gloo's own all-gather runs on its worker thread in N - 1 ring steps,
  /// and costs 1.4-2.1x the exchange at 2 ranks and 3-6x at 4 ranks on two
  /// cores (docs/Fusion.md, "Direct exchanges"). The waits are watched
  /// (TransferWatch), as a collective's are.
  at::Tensor exchangeAllGather(const at::Tensor &input, int64_t dim,
                               const std::vector<int64_t> &sizes);
  /// The summed/maxed/minned tensor; Mean is left to the caller to divide.
  at::Tensor reduce(Call &call, const at::Tensor &input, Reduction op);

  /// A group of one rank: every transfer is the identity, so the group is
  /// not called (a Gloo collective of one rank still hands its work to
  /// Gloo's worker thread and waits: about 30 us, 4 times a small CLIP
  /// call). The contract's checks, numbering and flight record stay.
  bool alone() const { return options.worldSize == 1; }
  /// A copy, never an alias of the caller's tensor, as a transfer returns.
  static at::Tensor ownCopy(const at::Tensor &input) {
    return input.clone(at::MemoryFormat::Contiguous);
  }
  /// Whether `tensor` travels through Gloo (which reduces no bfloat16).
  bool onGloo(const at::Tensor &tensor) const {
    return backendFor(*group, tensor.device().type()) == "gloo";
  }
  /// A CUDA tensor in a group whose CUDA backend is Gloo (ranks sharing a
  /// GPU, which NCCL refuses) moves through host memory, staged here:
  /// ProcessGroupGloo's send and recv hand the tensor's pointer to Gloo's
  /// transport as host memory, and Gloo has no coalescing, which CUDA
  /// transfers otherwise go through.
  bool stagedOnHost(const at::Tensor &tensor) const {
    return tensor.is_cuda() && onGloo(tensor);
  }
  /// Where the small exchanges' tensors live: the CPU when the group moves
  /// CPU tensors, else the current CUDA device (a user's NCCL-only group).
  at::TensorOptions smallExchange(at::ScalarType type) const {
    at::TensorOptions result = at::TensorOptions().dtype(type);
    return hasBackend(*group, c10::DeviceType::CPU) ? result.device(at::kCPU)
                                                    : result.device(at::kCUDA);
  }
  /// Polls `work` against the deadline; see the file's comment.
  void awaitOnGpu(const c10::intrusive_ptr<c10d::Work> &work);
  /// Waits for a Gloo collective's `work` (not a send or recv's) for `limit`
  /// at most, in slices of kWatchPeriod
  /// between which it checks whether a peer failed or left (abandonReason):
  /// a peer that failed but lives on keeps its connections open, so Gloo
  /// alone would wait for the deadline.
  void awaitOnCpu(const c10::intrusive_ptr<c10d::Work> &work,
                  std::chrono::milliseconds limit);
  /// Throws when the call in flight should stop waiting.
  void watchPeers() {
    if (!inFlight)
      return;
    std::string reason = abandonReason(*inFlight);
    if (!reason.empty())
      throw std::runtime_error(reason);
  }
  /// Aborts the group's NCCL backend (once): its kernels that wait for a
  /// peer end. After a deadline on any group (a collective is half done,
  /// the group is unusable), and after any failure on a group of
  /// connectProcessGroup's.
  void abortGpu() {
    if (gpuAborted || !hasBackend(*group, c10::DeviceType::CUDA))
      return;
    gpuAborted = true;
    movingBackend(*group, c10::DeviceType::CUDA)->abort();
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group;
  bool ownGroup;
  /// Whether a deadline aborted the group's NCCL backend.
  bool gpuAborted = false;
  /// Whether a Gloo collective was left running (awaitOnCpu stopped waiting
  /// for it): see the destructor.
  bool abandonedWork = false;
  /// Whether the ranks met before NCCL's start (meetBeforeNccl).
  bool ncclStarted = false;
  /// CUDA transfers posted and not issued yet.
  std::vector<std::shared_ptr<Transfer>> posted;
  /// The call being waited for (communicate()); null between calls.
  const Call *inFlight = nullptr;
  /// Watches the waits on Gloo's sends and receives (awaitTransfer).
  TransferWatch watch{
      [this] { return inFlight ? abandonReason(*inFlight) : std::string(); },
      kWatchPeriod};
};

// A send or recv in flight. It refers to its communicator, which must outlive
// it (the plan executor waits on every request before returning).
class ProcessGroupRequest final : public Communicator::Request {
public:
  ProcessGroupRequest(ProcessGroupCommunicator *owner, Call call,
                      std::shared_ptr<Transfer> transfer, at::Tensor target)
      : owner(owner), call(std::move(call)), transfer(std::move(transfer)),
        target(std::move(target)) {}

  void wait() override {
    if (done)
      return;
    owner->communicate(call, [&] {
      if (transfer->work)
        owner->awaitTransfer(transfer->work, transfer->wire);
      // A recv into a non-contiguous or non-Gloo-dtype tensor went through
      // a staging buffer.
      if (target.defined() && !transfer->wire.is_same(target))
        target.copy_(
            fromWire(transfer->wire, target.scalar_type(), target.sizes()));
    });
    done = true;
  }

private:
  ProcessGroupCommunicator *owner;
  Call call;
  std::shared_ptr<Transfer> transfer;
  at::Tensor target; // A recv's destination; undefined for a send.
  bool done = false;
};

template <typename Body>
auto ProcessGroupCommunicator::communicate(Call &call, Body &&body)
    -> decltype(body()) {
  refuseIfBroken(call);
  std::string detail;
  inFlight = &call;
  struct ClearInFlight {
    const Call *&slot;
    ~ClearInFlight() { slot = nullptr; }
  } clearInFlight{inFlight};
  try {
    launchPosted();
    return runAndComplete(call, body);
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header).
    if (ownGroup)
      abortGpu();
    breakOn(call, e);
    throw;
  } catch (const std::exception &e) {
    if (std::optional<ErrorInfo> refusal = takeRefusal()) {
      // A layer under the group (dloss.guard) refused to start it: nothing
      // moved, and its error already names every rank's call.
      Error error(std::move(*refusal));
      breakOn(call, error);
      throw error;
    }
    detail = describeError(e);
  } catch (...) {
    detail = "unknown exception";
  }
  if (!call.transfer.empty())
    detail = call.transfer + ": " + detail;
  if (ownGroup)
    abortGpu();
  throw diagnose(call, detail, looksLikeTimeout(detail));
}

void ProcessGroupCommunicator::awaitOnGpu(
    const c10::intrusive_ptr<c10d::Work> &work) {
  Clock::time_point start = Clock::now();
  Clock::time_point until = start + options.timeout;
  Clock::time_point watch = start + kWatchPeriod;
  while (!work->isCompleted()) { // Also true once NCCL reported an error.
    Clock::time_point now = Clock::now();
    if (now >= watch) {
      watch = now + kWatchPeriod;
      try {
        watchPeers();
      } catch (const std::exception &) {
        abortGpu(); // Its kernels wait for a peer that will not come.
        throw;
      }
    }
    if (now >= until) {
      abortGpu();
      throw std::runtime_error(
          "timed out: the GPU had not completed it at the deadline of " +
          seconds(options.timeout) +
          ", and the group's NCCL communicators were aborted");
    }
    if (now - start < kSpinPeriod)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kPollSleep);
  }
  work->wait(); // Rethrows NCCL's error; orders the current stream after it.
}

void ProcessGroupCommunicator::awaitOnCpu(
    const c10::intrusive_ptr<c10d::Work> &work,
    std::chrono::milliseconds limit) {
  Clock::time_point until = Clock::now() + limit;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - Clock::now());
    if (left <= kWatchPeriod) {
      try {
        work->wait(std::max(left, std::chrono::milliseconds(1)));
      } catch (...) {
        abandonedWork |= !work->isCompleted();
        throw;
      }
      return;
    }
    // c10d's Work::wait(timeout) throws when the slice ends before the
    // work does, and leaves the work running.
    try {
      work->wait(kWatchPeriod);
      return;
    } catch (const std::exception &) {
      // Done since: it may have ended well just after the slice did (a CI
      // run saw "timed out" for a collective that completed). A wait with
      // no limit returns at once, or throws the work's own failure.
      if (work->isCompleted()) {
        work->wait();
        return;
      }
    }
    try {
      watchPeers();
    } catch (...) {
      abandonedWork = true;
      throw;
    }
  }
}

void ProcessGroupCommunicator::launchPosted() {
  if (posted.empty())
    return;
  std::vector<std::shared_ptr<Transfer>> batch;
  batch.swap(posted);
  meetBeforeNccl(batch.front()->wire);
  std::stable_sort(batch.begin(), batch.end(),
                   [](const std::shared_ptr<Transfer> &a,
                      const std::shared_ptr<Transfer> &b) {
                     return std::tie(a->peer, a->isSend, a->tag) <
                            std::tie(b->peer, b->isSend, b->tag);
                   });
  group->startCoalescing(c10::DeviceType::CUDA);
  for (const auto &transfer : batch) {
    std::vector<at::Tensor> tensors{transfer->wire};
    if (transfer->isSend)
      group->send(tensors, transfer->peer, transfer->tag);
    else
      group->recv(tensors, transfer->peer, transfer->tag);
  }
  c10::intrusive_ptr<c10d::Work> work =
      group->endCoalescing(c10::DeviceType::CUDA);
  for (const auto &transfer : batch)
    transfer->work = work;
}

void ProcessGroupCommunicator::checkDevice(const Call &call,
                                           const at::Tensor &tensor) const {
  std::string cpu = backendFor(*group, c10::DeviceType::CPU);
  // Staged through the host, a CUDA tensor moves through the group's CPU
  // backend (stagedOnHost).
  if (stagedOnHost(tensor) && cpu.empty())
    throw fail(call,
               call.name + " got a tensor on " + tensor.device().str() + " " +
                   where() +
                   ", but the group's CUDA backend is Gloo and it has no CPU "
                   "backend: dloss moves such tensors through host memory, "
                   "with the group's CPU backend",
               "Create the group with backend=\"cpu:gloo,cuda:gloo\" (or "
               "\"gloo\"), or use NCCL for CUDA tensors");
  if (!backendFor(*group, tensor.device().type()).empty())
    return;
  std::string cuda = backendFor(*group, c10::DeviceType::CUDA);
  std::string moves =
      !cpu.empty() && !cuda.empty()
          ? "CPU tensors (" + cpu + ") and CUDA tensors (" + cuda + ")"
      : !cpu.empty()  ? "CPU tensors (" + cpu + ")"
      : !cuda.empty() ? "CUDA tensors (" + cuda + ")"
                      : "no tensors (it has no backend)";
  bool gpu = cpu.empty() && !cuda.empty();
  throw fail(call,
             call.name + " got a tensor on " + tensor.device().str() + " " +
                 where() + ", but the process group moves only " + moves,
             gpu ? "Move the tensor to this rank's GPU, or use a Gloo "
                   "group for CPU tensors"
                 : "Move the tensor to the CPU, or use a group with an NCCL "
                   "backend for GPU tensors");
}

at::Tensor
ProcessGroupCommunicator::transferAllGather(Call &call, const at::Tensor &input,
                                            int64_t dim,
                                            const std::vector<int64_t> &sizes) {
  if (alone())
    return communicate(call, [&] { return ownCopy(input); });
  if (stagedOnHost(input))
    return transferAllGather(call, input.cpu(), dim, sizes).to(input.device());
  if (!input.is_cuda() && onGloo(input))
    return communicate(call,
                       [&] { return exchangeAllGather(input, dim, sizes); });

  // NCCL gathers equal shapes: pad every piece to the largest size.
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> paddedShape = input.sizes().vec();
  paddedShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = total;
  int64_t paddedNumel = std::accumulate(paddedShape.begin(), paddedShape.end(),
                                        int64_t{1}, std::multiplies<>());
  // Every rank knows the sizes, so all skip together when nothing would move.
  if (paddedNumel == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }

  at::Tensor padded = at::zeros(paddedShape, input.options());
  padded.narrow(dim, 0, input.size(dim)).copy_(input);
  return communicate(call, [&] {
    meetBeforeNccl(padded);
    std::vector<at::Tensor> inputs{toWire(padded)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(at::empty_like(inputs[0]));
    awaitCollective(group->allgather(outputs, inputs), padded);
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < options.worldSize; ++r)
      pieces.push_back(fromWire(outputs[0][r], input.scalar_type(), paddedShape)
                           .narrow(dim, 0, sizes[r]));
    return at::cat(pieces, dim);
  });
}

at::Tensor ProcessGroupCommunicator::exchangeAllGather(
    const at::Tensor &input, int64_t dim, const std::vector<int64_t> &sizes) {
  const int n = options.worldSize, rank = options.rank;
  const std::vector<int64_t> offsets = offsetsOf(sizes);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[dim] = offsets[n - 1] + sizes[n - 1];
  at::Tensor result = at::empty(shape, input.options());
  auto piece = [&](int r) { return result.narrow(dim, offsets[r], sizes[r]); };
  at::Tensor mine = toWire(input.contiguous());
  // Rank r's piece lands in place where its slice of the result is
  // contiguous (dim 0), else in a buffer copied in after the wait.
  struct Incoming {
    at::Tensor wire, target;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Incoming> incoming;
  std::vector<c10::intrusive_ptr<c10d::Work>> outgoing;
  // Every receive is posted before any send, each rank's k-th send going
  // to the rank whose k-th receive expects it. Every rank knows every
  // size, so both ends of a pair skip an empty piece.
  for (int k = 1; k < n; ++k) {
    int src = (rank - k + n) % n;
    at::Tensor target = piece(src);
    if (target.numel() == 0)
      continue;
    at::Tensor wire = toWire(target.is_contiguous()
                                 ? target
                                 : at::empty(target.sizes(), input.options()));
    std::vector<at::Tensor> tensors{wire};
    incoming.push_back(
        {wire, target, group->recv(tensors, src, kAllGatherTag)});
  }
  if (mine.numel() > 0)
    for (int k = 1; k < n; ++k) {
      std::vector<at::Tensor> tensors{mine};
      outgoing.push_back(group->send(tensors, (rank + k) % n, kAllGatherTag));
    }
  piece(rank).copy_(input);
  for (Incoming &in : incoming) {
    awaitTransfer(in.work, in.wire);
    if (!in.target.is_contiguous())
      in.target.copy_(
          fromWire(in.wire, input.scalar_type(), in.target.sizes()));
  }
  for (const c10::intrusive_ptr<c10d::Work> &work : outgoing)
    awaitTransfer(work, mine);
  return result;
}

at::Tensor ProcessGroupCommunicator::reduce(Call &call, const at::Tensor &input,
                                            Reduction op) {
  // The copy is what Gloo reduces in place: the caller's tensor stays as
  // is. Gloo has no bfloat16 arithmetic: such tensors are summed in float32
  // (exact for the inputs, one rounding at the end).
  bool widen = onGloo(input) && input.scalar_type() == at::kBFloat16;
  at::Tensor result = widen ? input.to(at::kFloat).contiguous()
                            : input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    meetBeforeNccl(result);
    std::vector<at::Tensor> tensors{result};
    c10d::AllreduceOptions reduceOptions;
    reduceOptions.reduceOp = toC10d(op);
    awaitCollective(group->allreduce(tensors, reduceOptions), result);
  });
  return widen ? result.to(at::kBFloat16) : result;
}

at::Tensor ProcessGroupCommunicator::transferAllReduce(Call &call,
                                                       const at::Tensor &input,
                                                       Reduction op) {
  if (alone()) // Every reduction of one value is that value, the mean too.
    return communicate(call, [&] { return ownCopy(input); });
  if (stagedOnHost(input))
    return transferAllReduce(call, input.cpu(), op).to(input.device());
  at::Tensor result = reduce(call, input, op);
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor ProcessGroupCommunicator::transferReduceScatter(
    Call &call, const at::Tensor &input, Reduction op, int64_t dim,
    const std::vector<int64_t> &sizes) {
  if (alone()) // The only block is the whole input.
    return communicate(call, [&] { return ownCopy(input); });
  if (stagedOnHost(input))
    return transferReduceScatter(call, input.cpu(), op, dim, sizes)
        .to(input.device());
  int n = options.worldSize;
  int rank = options.rank;
  // Block b is rank b's slice [offsets[b], offsets[b] + sizes[b]) of `dim`.
  const std::vector<int64_t> offsets = offsetsOf(sizes);
  auto block = [&](int b) { return input.narrow(dim, offsets[b], sizes[b]); };
  auto shapeOf = [&](int b) {
    std::vector<int64_t> shape = input.sizes().vec();
    shape[dim] = sizes[b];
    return shape;
  };
  std::vector<int64_t> rest = input.sizes().vec();
  rest[dim] = 1;
  int64_t inner = c10::multiply_integers(rest); // elements per index of `dim`
  int64_t largest = *std::max_element(sizes.begin(), sizes.end()) * inner;

  return communicate(call, [&] {
    at::Tensor result = at::empty(shapeOf(rank), input.options());
    // A ring (as in NCCL and Horovod): in step k, rank r sends its partial
    // sum of block (r - k - 1) mod N to rank r + 1 and adds its own share to
    // block (r - k - 2) mod N, received from rank r - 1; after N - 1 steps
    // the last block received, (r - N) mod N = r, holds every rank's share.
    // Each rank sends N - 1 blocks. Besides the result it holds at most two
    // blocks: the one going out and the one coming in, which goes out in
    // the next step. Its own first block goes out straight from the input
    // when it is contiguous (along the leading axis).
    int next = (rank + 1) % n, previous = (rank - 1 + n) % n;
    int firstBlock = (rank - 1 + n) % n;
    at::Tensor sendData = block(firstBlock), sendBuffer;
    // The pool holds what glooReduceScatterBuffers says, which the cost
    // report counts too; a buffer goes back once its send has completed.
    std::vector<at::Tensor> spare(
        glooReduceScatterBuffers(n, sendData.is_contiguous()));
    for (at::Tensor &buffer : spare)
      buffer = at::empty({largest}, input.options());
    auto take = [&] {
      TORCH_INTERNAL_ASSERT(!spare.empty(),
                            "glooReduceScatterBuffers undercounts the ring");
      at::Tensor buffer = spare.back();
      spare.pop_back();
      return buffer;
    };
    auto inBuffer = [&](const at::Tensor &buffer, int b) {
      return buffer.narrow(0, 0, sizes[b] * inner).view(shapeOf(b));
    };
    if (!sendData.is_contiguous()) {
      sendBuffer = take();
      sendData = inBuffer(sendBuffer, firstBlock).copy_(sendData);
    }
    for (int k = 0; k < n - 1; ++k) {
      int recvBlock = (rank - k - 2 + 2 * n) % n;
      bool last = k == n - 2;
      at::Tensor recvBuffer = last ? at::Tensor() : take();
      at::Tensor recvData = last ? result : inBuffer(recvBuffer, recvBlock);
      Swap swap =
          postSwap(recvData, sendData, previous, next, kReduceScatterTag);
      if (swap.in)
        awaitTransfer(swap.in, input);
      at::Tensor own = block(recvBlock);
      switch (op) {
      case Reduction::Sum:
      case Reduction::Mean:
        recvData.add_(own);
        break;
      case Reduction::Max:
        at::maximum_out(recvData, recvData, own);
        break;
      case Reduction::Min:
        at::minimum_out(recvData, recvData, own);
        break;
      }
      if (swap.out)
        awaitTransfer(swap.out, input);
      if (sendBuffer.defined())
        spare.push_back(sendBuffer);
      sendData = recvData;
      sendBuffer = recvBuffer;
    }
    if (op == Reduction::Mean)
      result.div_(n);
    return result;
  });
}

at::Tensor ProcessGroupCommunicator::transferBroadcast(Call &call,
                                                       const at::Tensor &input,
                                                       int root) {
  if (alone())
    return communicate(call, [&] { return ownCopy(input); });
  if (stagedOnHost(input))
    return transferBroadcast(call, input.cpu(), root).to(input.device());
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    meetBeforeNccl(result);
    std::vector<at::Tensor> tensors{toWire(result)};
    c10d::BroadcastOptions broadcastOptions;
    broadcastOptions.rootRank = root;
    awaitCollective(group->broadcast(tensors, broadcastOptions), result);
  });
  return result;
}

at::Tensor ProcessGroupCommunicator::transferRingShift(Call &call,
                                                       const at::Tensor &input,
                                                       const ShiftPeers &ring) {
  if (stagedOnHost(input))
    return transferRingShift(call, input.cpu(), ring).to(input.device());
  int dst = ring.dst, src = ring.src;
  if (ring.step == 0) {
    complete(call);
    return input.clone(); // Every rank keeps its own tensor.
  }

  at::Tensor data = input.contiguous();
  at::Tensor header = at::empty({kHeaderLength}, at::kLong);
  writeShiftHeader(data, header.data_ptr<int64_t>());
  at::Tensor sendHeader = header.to(smallExchange(at::kLong));
  at::Tensor recvHeader = at::empty({kHeaderLength}, smallExchange(at::kLong));

  return communicate(call, [&] {
    // Every rank posts its receive before waiting on its send, so no cycle
    // of the ring waits on another (any shift, N = 2 included).
    Swap headers =
        postSwap(recvHeader, sendHeader, src, dst, kRingShiftHeaderTag);
    awaitTransfer(headers.in, recvHeader);
    at::Tensor received =
        fromShiftHeader(call, recvHeader.cpu().data_ptr<int64_t>(), src, data);

    // Both ends know both sizes now.
    Swap swap = postSwap(received, data, src, dst, kRingShiftDataTag);
    if (swap.in)
      awaitTransfer(swap.in, data);
    awaitTransfer(headers.out, sendHeader);
    if (swap.out)
      awaitTransfer(swap.out, data);
    return received;
  });
}

at::Tensor
ProcessGroupCommunicator::transferAllGatherInts(Call &call,
                                                const at::Tensor &values) {
  if (values.numel() == 0) {
    complete(call);
    return values;
  }
  if (alone())
    return communicate(call, [&] { return values; });
  // Each rank's piece lands in a row of one tensor: the frames (up to a
  // MiB each with the fold) are not copied again on the way out.
  at::Tensor local = values.to(smallExchange(at::kLong));
  // On Gloo, the direct exchange of exchangeAllGather. Not under dloss.guard,
  // which checks collectives, not sends and receives: the preflight, a
  // call's first transfer, is the collective it checks for the whole call
  // (GuardedBackend's post()).
  if (!local.is_cuda() && onGloo(local) && !isGuarded(*group))
    return communicate(call, [&] {
      return exchangeAllGather(local.view({1, -1}), 0,
                               std::vector<int64_t>(options.worldSize, 1))
          .view({-1});
    });
  return communicate(call, [&] {
    std::vector<at::Tensor> inputs{local};
    at::Tensor gathered =
        at::empty({options.worldSize, local.numel()}, local.options());
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(gathered[r]);
    awaitCollective(group->allgather(outputs, inputs), local);
    return gathered.view({-1}).cpu();
  });
}

std::unique_ptr<Communicator::Request>
ProcessGroupCommunicator::transferSend(Call &call, const at::Tensor &tensor,
                                       int peer, int tag) {
  // The transfer keeps `wire` alive until the engine has read it.
  at::Tensor source = stagedOnHost(tensor) ? tensor.cpu() : tensor.contiguous();
  auto transfer = std::make_shared<Transfer>(
      Transfer{true, peer, tag, toWire(source.contiguous()), {}});
  post(call, transfer);
  return std::make_unique<ProcessGroupRequest>(this, call, transfer,
                                               at::Tensor());
}

std::unique_ptr<Communicator::Request>
ProcessGroupCommunicator::transferRecv(Call &call, at::Tensor &tensor, int peer,
                                       int tag) {
  // Receive in place when the wire can; otherwise stage (on the host for a
  // CUDA tensor on Gloo) and copy in wait().
  const bool host = stagedOnHost(tensor);
  at::Tensor wire =
      !host && tensor.is_contiguous() && glooHasType(tensor.scalar_type())
          ? tensor
          : toWire(at::empty(tensor.sizes(),
                             host ? tensor.options().device(at::kCPU)
                                  : tensor.options()));
  auto transfer =
      std::make_shared<Transfer>(Transfer{false, peer, tag, wire, {}});
  post(call, transfer);
  return std::make_unique<ProcessGroupRequest>(this, call, transfer, tensor);
}

void ProcessGroupCommunicator::post(Call &call,
                                    const std::shared_ptr<Transfer> &transfer) {
  if (transfer->wire.numel() == 0) // Both ends know; nothing moves.
    return;
  if (transfer->wire.is_cuda()) { // Issued with its batch (launchPosted).
    posted.push_back(transfer);
    return;
  }
  transfer->work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{transfer->wire};
    return transfer->isSend
               ? group->send(tensors, transfer->peer, transfer->tag)
               : group->recv(tensors, transfer->peer, transfer->tag);
  });
}

void ProcessGroupCommunicator::barrier(Call &call) {
  at::Tensor token = at::ones({1}, smallExchange(at::kInt));
  begin(call, &token);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{token};
    awaitCollective(group->allreduce(tensors), token);
  });
}

} // namespace

std::unique_ptr<Communicator> makeProcessGroupCommunicator(
    RendezvousOptions options, c10::intrusive_ptr<c10d::Store> store,
    c10::intrusive_ptr<c10d::ProcessGroup> group, bool ownGroup) {
  if (!group)
    throw Error("no process group to run on",
                "Initialise torch.distributed (or call dloss.init()) first");
  options.rank = group->getRank();
  options.worldSize = group->getSize();
  auto communicator = std::make_unique<ProcessGroupCommunicator>(
      std::move(options), std::move(store), std::move(group), ownGroup);
  if (ownGroup) {
    Call check{"the connection check after the rendezvous", ""};
    communicator->barrier(check);
  }
  return communicator;
}

} // namespace dloss
