// The NCCL engine: Communicator over its own ncclComm_t for CUDA tensors,
// bootstrapped by sharing the ncclUniqueId through a c10d TCPStore.
//
// Built only when CMake finds NCCL (DLOSS_HAVE_NCCL). It compiles against a
// CPU-only LibTorch (Debian's 1.13): it needs the CUDA runtime and NCCL, not
// LibTorch's CUDA parts. With a CUDA LibTorch (PyTorch 2.x) CMake defines
// DLOSS_TORCH_HAS_CUDA and the compute stream is c10's current stream;
// otherwise it is the legacy default stream.
//
// Streams: every NCCL call runs on one communication stream of this
// communicator. Before it, the communication stream waits on an event
// recorded on the compute stream (the inputs are ready); after it, the
// compute stream waits on an event recorded on the communication stream
// (the outputs are ready, and memory the caching allocator hands out again
// on the compute stream is no longer read by NCCL). The host then polls that
// event against the deadline, so that a hang becomes an error.
//
// Reliability: the communicator is non-blocking (ncclConfig_t::blocking = 0);
// every wait polls cudaEventQuery and ncclCommGetAsyncError until the
// deadline. On expiry or error it calls ncclCommAbort, marks itself
// unusable (later calls fail fast), records the failure in the store under
// dloss/seq/<rank> and raises a dloss::Error naming the collective, its
// number, the call site and the peers' states read from the store, with the
// flight record's path. The argument checks, that bookkeeping, the store
// and the rendezvous are every engine's (ContractCommunicator.h,
// PeerStates.h, StoreRendezvous.h).
#include "runtime/comm/ContractCommunicator.h"
#include "runtime/comm/StoreRendezvous.h"
#include "runtime/support/CudaDeviceGuard.h"
#include "runtime/support/CudaStream.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

namespace dloss {

using namespace comm;

namespace {

//===----------------------------------------------------------------------===//
// Constants and helpers
//===----------------------------------------------------------------------===//

// Polling: spin (yielding) this long, then sleep between queries.
constexpr std::chrono::microseconds kSpinPeriod{2000};
constexpr std::chrono::microseconds kPollSleep{100};
// How long the destructor lets ncclCommFinalize flush before aborting.
constexpr std::chrono::milliseconds kFinalizeLimit{10000};

// Rank 0's ncclUniqueId, and each rank's "communicator initialised" mark.
const char *const kUniqueIdKey = "dloss/nccl/unique-id";
const char *const kReadyPrefix = "dloss/nccl/ready/";

constexpr EngineWording kWording{
    /*name=*/"NCCL",
    /*sameOrderDetail=*/
    " (and posts matching sends and receives between the same waits)",
    /*peerHint=*/
    "A peer rank probably failed or exited: check the other ranks' logs "
    "for the first error (this one may be a consequence); NCCL_DEBUG=WARN "
    "shows NCCL's own view",
    /*failureSuffix=*/" (the NCCL communicator was aborted)",
    /*reduceTypeHint=*/
    "Convert to float, double, half, bfloat16 or an integer type first"};

int64_t numelOf(const std::vector<int64_t> &shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1},
                         std::multiplies<>());
}

size_t bytesOf(const at::Tensor &tensor) {
  return static_cast<size_t>(tensor.numel()) * tensor.element_size();
}

// NCCL's reduction types. Transfers move bytes (ncclUint8), so any dtype
// travels; reductions need NCCL to know the type.
std::optional<ncclDataType_t> ncclType(at::ScalarType type) {
  switch (type) {
  case at::kFloat:
    return ncclFloat32;
  case at::kDouble:
    return ncclFloat64;
  case at::kHalf:
    return ncclFloat16;
  case at::kBFloat16:
    return ncclBfloat16;
  case at::kChar:
    return ncclInt8;
  case at::kByte:
    return ncclUint8;
  case at::kInt:
    return ncclInt32;
  case at::kLong:
    return ncclInt64;
  default:
    return std::nullopt;
  }
}

// Mean is summed, then divided on the compute stream: the same arithmetic
// as the Gloo engine (ncclAvg pre-scales each rank's values instead).
ncclRedOp_t ncclOp(Reduction op) {
  switch (op) {
  case Reduction::Max:
    return ncclMax;
  case Reduction::Min:
    return ncclMin;
  case Reduction::Sum:
  case Reduction::Mean:
    return ncclSum;
  }
  return ncclSum;
}

// A failure of the communication itself (NCCL, CUDA, the deadline), as
// opposed to a dloss::Error from our own checks.
struct Failure : std::runtime_error {
  Failure(const std::string &message, bool timedOut)
      : std::runtime_error(message), timedOut(timedOut) {}
  bool timedOut;
};

void checkCuda(cudaError_t status, const char *what) {
  if (status == cudaSuccess)
    return;
  (void)cudaGetLastError(); // Clears a non-sticky error.
  throw Failure(std::string(what) + " failed: " + cudaGetErrorString(status),
                false);
}

// An owned event without timing (cheaper to record and to wait on).
class Event {
public:
  Event() {
    checkCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
              "cudaEventCreateWithFlags");
  }
  ~Event() {
    if (event)
      (void)cudaEventDestroy(event);
  }
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
  cudaEvent_t get() const { return event; }

private:
  cudaEvent_t event = nullptr;
};

// The stream ATen enqueues its kernels on.
cudaStream_t computeStream(int device) {
  return static_cast<cudaStream_t>(currentCudaStream(device));
}

//===----------------------------------------------------------------------===//
// NcclCommunicator
//===----------------------------------------------------------------------===//

class NcclCommunicator;

// A send or recv: posted into the communicator's batch, launched with it.
struct Transfer {
  bool isSend = false;
  int peer = -1;
  int tag = 0;
  at::Tensor wire;              // contiguous; what NCCL reads or writes
  std::shared_ptr<Event> ready; // compute stream at post time
  std::shared_ptr<Event> done;  // set at launch
  bool launched = false;
};

class NcclRequest;

class NcclCommunicator final : public ContractCommunicator {
public:
  NcclCommunicator(RendezvousOptions options, int device,
                   c10::intrusive_ptr<c10d::Store> store, ncclComm_t comm);
  ~NcclCommunicator() override;

  /// An allreduce of one int through the scratch buffers: returns once every
  /// rank's communicator works.
  void barrier(Call &call);

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
  std::vector<int64_t>
  transferAllGatherInts(Call &call,
                        const std::vector<int64_t> &values) override;
  std::unique_ptr<Request> transferSend(Call &call, const at::Tensor &tensor,
                                        int peer, int tag) override;
  std::unique_ptr<Request> transferRecv(Call &call, at::Tensor &tensor,
                                        int peer, int tag) override;

private:
  friend class NcclRequest;

  template <typename Body>
  auto communicate(Call &call, Body &&body) -> decltype(body());

  Clock::time_point deadline() const { return Clock::now() + options.timeout; }
  /// Settles a NCCL call's result: waits out ncclInProgress (non-blocking
  /// communicator), throws Failure on an error or at `until`.
  void settle(ncclResult_t result, const char *what, Clock::time_point until);
  /// Throws Failure when NCCL has recorded an asynchronous error.
  void checkAsync();
  /// Polls `event` and the communicator until the event completes or `until`.
  void await(cudaEvent_t event, const char *what, Clock::time_point until);
  /// The communication stream waits for the compute stream's work so far.
  void enterCommStream();
  /// Records the end of the communication stream's work so far, makes the
  /// compute stream wait for it, and waits for it on the host.
  void leaveCommStream(const char *what, Clock::time_point until);
  /// Launches every posted transfer as one NCCL group.
  void launchTransfers(Clock::time_point until);
  /// One NCCL collective on the communication stream, ordered after the
  /// compute stream's work and the posted transfers, waited for on the host:
  /// `launch()` returns the NCCL call's result, `what` names it.
  template <typename Launch>
  void runCollective(const char *what, Launch &&launch) {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    enterCommStream();
    settle(launch(), what, until);
    leaveCommStream(what, until);
  }
  /// Grows the pinned host and device scratch buffers to `count` int64s.
  void reserveScratch(size_t count);
  void abortComm();

  bool reduces(at::ScalarType type) const override {
    return ncclType(type).has_value();
  }
  void checkDevice(const Call &call, const at::Tensor &tensor) const override;

  int device;
  ncclComm_t comm;
  cudaStream_t commStream = nullptr;
  int64_t *hostScratch = nullptr; // pinned
  int64_t *deviceScratch = nullptr;
  size_t scratchCount = 0;
  std::vector<std::shared_ptr<Transfer>> posted; // not launched yet
};

class NcclRequest final : public Communicator::Request {
public:
  NcclRequest(NcclCommunicator *owner, Call call,
              std::shared_ptr<Transfer> transfer, at::Tensor target)
      : owner(owner), call(std::move(call)), transfer(std::move(transfer)),
        target(std::move(target)) {}

  ~NcclRequest() override {
    // Dropped unwaited after its launch: keep the compute stream (and so the
    // caching allocator's reuse of the buffer) behind the transfer.
    if (!waited && transfer && transfer->launched && transfer->done &&
        owner->broken.empty()) {
      CudaDeviceGuard guard(owner->device);
      (void)cudaStreamWaitEvent(computeStream(owner->device),
                                transfer->done->get(), 0);
    }
  }

  void wait() override {
    if (waited)
      return;
    if (transfer) {
      Clock::time_point until = owner->deadline();
      owner->communicate(call, [&] {
        if (!transfer->launched)
          owner->launchTransfers(until);
        owner->await(transfer->done->get(), call.name.c_str(), until);
        checkCuda(cudaStreamWaitEvent(computeStream(owner->device),
                                      transfer->done->get(), 0),
                  "cudaStreamWaitEvent");
        // A recv into a non-contiguous tensor went through a staging buffer.
        if (target.defined() && !transfer->wire.is_same(target))
          target.copy_(transfer->wire);
      });
    }
    waited = true;
  }

private:
  NcclCommunicator *owner;
  Call call;
  std::shared_ptr<Transfer> transfer; // null for empty tensors
  at::Tensor target;
  bool waited = false;
};

NcclCommunicator::NcclCommunicator(RendezvousOptions options, int device,
                                   c10::intrusive_ptr<c10d::Store> store,
                                   ncclComm_t comm)
    : ContractCommunicator(
          options, std::make_unique<PeerStates>(std::move(store), options),
          kWording),
      device(device), comm(comm) {
  CudaDeviceGuard guard(device);
  // Non-blocking: the stream must not synchronise with the legacy default
  // stream, which is the compute stream under a CPU-only LibTorch.
  cudaError_t status =
      cudaStreamCreateWithFlags(&commStream, cudaStreamNonBlocking);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    abortComm();
    throw Error(ErrorInfo{"could not create the NCCL communication stream on "
                          "cuda:" +
                              std::to_string(device) + " (" +
                              cudaGetErrorString(status) + ")",
                          "Check that the GPU is healthy (nvidia-smi)",
                          this->options.rank, "", ""});
  }
}

template <typename Body>
auto NcclCommunicator::communicate(Call &call, Body &&body)
    -> decltype(body()) {
  refuseIfBroken(call);
  CudaDeviceGuard guard(device);
  std::string detail;
  bool timedOut = false;
  try {
    return runAndComplete(call, body);
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header): the
    // peers' state is unknown, so the communicator goes too.
    abortComm();
    breakOn(call, e);
    throw;
  } catch (const Failure &e) {
    detail = e.what();
    timedOut = e.timedOut;
  } catch (const std::exception &e) {
    detail = describeError(e);
  } catch (...) {
    detail = "unknown exception";
  }
  // Abort first: it ends this rank's kernels that may wait on a dead peer.
  abortComm();
  throw diagnose(call, detail, timedOut);
}

void NcclCommunicator::abortComm() {
  posted.clear();
  if (!comm)
    return;
  CudaDeviceGuard guard(device);
  (void)ncclCommAbort(comm);
  comm = nullptr;
}

void NcclCommunicator::checkAsync() {
  ncclResult_t state = ncclSuccess;
  ncclResult_t result = ncclCommGetAsyncError(comm, &state);
  if (result != ncclSuccess)
    state = result;
  if (state != ncclSuccess && state != ncclInProgress)
    throw Failure(std::string("NCCL reported ") + ncclGetErrorString(state) +
                      " (" + ncclGetLastError(comm) + ")",
                  false);
}

void NcclCommunicator::settle(ncclResult_t result, const char *what,
                              Clock::time_point until) {
  if (result == ncclSuccess)
    return;
  if (result != ncclInProgress)
    throw Failure(std::string(what) + " failed: " + ncclGetErrorString(result) +
                      " (" + ncclGetLastError(comm) + ")",
                  false);
  Clock::time_point start = Clock::now();
  while (true) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t query = ncclCommGetAsyncError(comm, &state);
    if (query != ncclSuccess)
      state = query;
    if (state == ncclSuccess)
      return;
    if (state != ncclInProgress)
      throw Failure(std::string(what) +
                        " failed: " + ncclGetErrorString(state) + " (" +
                        ncclGetLastError(comm) + ")",
                    false);
    Clock::time_point now = Clock::now();
    if (now >= until)
      throw Failure(std::string(what) + " was still in progress at the "
                                        "deadline",
                    true);
    if (now - start < kSpinPeriod)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kPollSleep);
  }
}

void NcclCommunicator::await(cudaEvent_t event, const char *what,
                             Clock::time_point until) {
  Clock::time_point start = Clock::now();
  while (true) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess)
      return;
    if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();
      throw Failure(std::string("CUDA error while waiting for ") + what + ": " +
                        cudaGetErrorString(status),
                    false);
    }
    checkAsync();
    Clock::time_point now = Clock::now();
    if (now >= until)
      throw Failure(std::string(what) + " had not completed on the GPU at "
                                        "the deadline",
                    true);
    if (now - start < kSpinPeriod)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(kPollSleep);
  }
}

void NcclCommunicator::enterCommStream() {
  Event ready;
  checkCuda(cudaEventRecord(ready.get(), computeStream(device)),
            "cudaEventRecord on the compute stream");
  checkCuda(cudaStreamWaitEvent(commStream, ready.get(), 0),
            "cudaStreamWaitEvent on the communication stream");
}

void NcclCommunicator::leaveCommStream(const char *what,
                                       Clock::time_point until) {
  Event done;
  checkCuda(cudaEventRecord(done.get(), commStream),
            "cudaEventRecord on the communication stream");
  checkCuda(cudaStreamWaitEvent(computeStream(device), done.get(), 0),
            "cudaStreamWaitEvent on the compute stream");
  await(done.get(), what, until);
}

// NCCL matches point-to-point transfers per peer in the order they are
// issued, not by tag, and a receive blocks the stream until its data
// arrives. So transfers wait in `posted` until the first wait() on one of
// them or the next collective; then all go out as one group (a ring's
// receive from the left and send to the right must be in one group, or every
// rank's stream blocks in its receive), each peer's in tag order, so that
// both ends of a pair issue matching transfers in the same order.
void NcclCommunicator::launchTransfers(Clock::time_point until) {
  if (posted.empty())
    return;
  std::vector<std::shared_ptr<Transfer>> batch;
  batch.swap(posted);
  std::stable_sort(batch.begin(), batch.end(),
                   [](const std::shared_ptr<Transfer> &a,
                      const std::shared_ptr<Transfer> &b) {
                     return std::tie(a->peer, a->isSend, a->tag) <
                            std::tie(b->peer, b->isSend, b->tag);
                   });
  // Each transfer waits for the compute stream as it was when posted, not
  // as it is now: chunk transfers overlap the tile compute queued since.
  for (const auto &transfer : batch)
    checkCuda(cudaStreamWaitEvent(commStream, transfer->ready->get(), 0),
              "cudaStreamWaitEvent on the communication stream");
  settle(ncclGroupStart(), "ncclGroupStart", until);
  for (const auto &transfer : batch) {
    void *data = transfer->wire.data_ptr();
    size_t bytes = bytesOf(transfer->wire);
    ncclResult_t result =
        transfer->isSend
            ? ncclSend(data, bytes, ncclUint8, transfer->peer, comm, commStream)
            : ncclRecv(data, bytes, ncclUint8, transfer->peer, comm,
                       commStream);
    if (result != ncclSuccess && result != ncclInProgress) {
      (void)ncclGroupEnd();
      settle(result, transfer->isSend ? "ncclSend" : "ncclRecv", until);
    }
  }
  settle(ncclGroupEnd(), "ncclGroupEnd of the point-to-point transfers", until);
  auto done = std::make_shared<Event>();
  checkCuda(cudaEventRecord(done->get(), commStream),
            "cudaEventRecord on the communication stream");
  for (const auto &transfer : batch) {
    transfer->done = done;
    transfer->launched = true;
    // A transfer whose request is gone: keep the compute stream behind it
    // before its buffer returns to the allocator.
    if (transfer.use_count() == 1)
      checkCuda(cudaStreamWaitEvent(computeStream(device), done->get(), 0),
                "cudaStreamWaitEvent on the compute stream");
  }
}

void NcclCommunicator::reserveScratch(size_t count) {
  if (count <= scratchCount)
    return;
  // Every earlier use has completed (the host waited for it).
  if (hostScratch)
    (void)cudaFreeHost(hostScratch);
  if (deviceScratch)
    (void)cudaFree(deviceScratch);
  hostScratch = nullptr;
  deviceScratch = nullptr;
  scratchCount = 0;
  checkCuda(cudaMallocHost(reinterpret_cast<void **>(&hostScratch),
                           count * sizeof(int64_t)),
            "cudaMallocHost of the scratch buffer");
  checkCuda(cudaMalloc(reinterpret_cast<void **>(&deviceScratch),
                       count * sizeof(int64_t)),
            "cudaMalloc of the scratch buffer");
  scratchCount = count;
}

// PeerStates' destructor then keeps a failed rank 0's store up.
NcclCommunicator::~NcclCommunicator() {
  CudaDeviceGuard guard(device);
  posted.clear();
  if (comm) {
    // Finalize flushes what is still queued (a request dropped unwaited);
    // a peer that died meanwhile cannot hold this up past the limit.
    ncclResult_t result = ncclCommFinalize(comm);
    bool finalized = false;
    if (result == ncclSuccess) {
      ncclResult_t state = ncclInProgress;
      finalized = ncclCommGetAsyncError(comm, &state) == ncclSuccess &&
                  state == ncclSuccess;
      result = finalized ? ncclSuccess : state;
    }
    Clock::time_point end = Clock::now() + std::min<std::chrono::milliseconds>(
                                               options.timeout, kFinalizeLimit);
    while (!finalized && result == ncclInProgress && Clock::now() < end) {
      ncclResult_t state = ncclInProgress;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
        break;
      if (state == ncclSuccess)
        finalized = true;
      else if (state != ncclInProgress)
        break;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (finalized)
      (void)ncclCommDestroy(comm);
    else
      (void)ncclCommAbort(comm);
    comm = nullptr;
  }
  if (commStream)
    (void)cudaStreamDestroy(commStream);
  if (hostScratch)
    (void)cudaFreeHost(hostScratch);
  if (deviceScratch)
    (void)cudaFree(deviceScratch);
}

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

void NcclCommunicator::checkDevice(const Call &call,
                                   const at::Tensor &tensor) const {
  if (!tensor.device().is_cuda())
    throw fail(call,
               call.name + " got a tensor on " + tensor.device().str() + " " +
                   where() +
                   ": the NCCL communicator takes CUDA tensors; use the Gloo "
                   "communicator for CPU tensors",
               "Move the tensor to cuda:" + std::to_string(device) +
                   ", or connect with connectGloo for CPU tensors");
  if (tensor.device().index() != device)
    throw fail(call,
               call.name + " got a tensor on " + tensor.device().str() + " " +
                   where() + ", but this rank's NCCL communicator uses cuda:" +
                   std::to_string(device),
               "Move the tensor to cuda:" + std::to_string(device) +
                   " (one GPU per rank, usually LOCAL_RANK)");
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

// Uneven sizes: NCCL's allgather moves equal counts, so every rank pads its
// piece to the largest size, one ncclAllGather moves [N, padded...], and the
// pieces are narrowed and concatenated. One bandwidth-optimal ring
// collective beats N grouped ncclBroadcasts (NCCL runs those one after
// another); the padding costs (max - size) rows per rank, which is small for
// the usual uneven case (only the last batch is short). Equal sizes along
// axis 0 gather straight into the result.
at::Tensor
NcclCommunicator::transferAllGather(Call &call, const at::Tensor &input,
                                    int64_t dim,
                                    const std::vector<int64_t> &sizes) {
  int64_t n = options.worldSize;
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> paddedShape = input.sizes().vec();
  paddedShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = total;
  if (numelOf(paddedShape) == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }
  CudaDeviceGuard guard(device);
  bool even = std::all_of(sizes.begin(), sizes.end(),
                          [&](int64_t s) { return s == maxSize; });
  bool direct = even && dim == 0;
  at::Tensor padded;
  if (sizes[options.rank] == maxSize) {
    padded = input.contiguous();
  } else {
    // The padding is gathered and dropped: it need not be initialised.
    padded = at::empty(paddedShape, input.options());
    padded.narrow(dim, 0, input.size(dim)).copy_(input);
  }
  std::vector<int64_t> gatheredShape{n};
  gatheredShape.insert(gatheredShape.end(), paddedShape.begin(),
                       paddedShape.end());
  at::Tensor gathered =
      at::empty(direct ? resultShape : gatheredShape, input.options());
  communicate(call, [&] {
    runCollective("ncclAllGather", [&] {
      return ncclAllGather(padded.data_ptr(), gathered.data_ptr(),
                           bytesOf(padded), ncclUint8, comm, commStream);
    });
  });
  if (direct)
    return gathered;
  std::vector<at::Tensor> pieces;
  for (int64_t r = 0; r < n; ++r)
    pieces.push_back(gathered[r].narrow(dim, 0, sizes[r]));
  return at::cat(pieces, dim);
}

at::Tensor NcclCommunicator::transferAllReduce(Call &call,
                                               const at::Tensor &input,
                                               Reduction op) {
  CudaDeviceGuard guard(device);
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    runCollective("ncclAllReduce", [&] {
      return ncclAllReduce(result.data_ptr(), result.data_ptr(),
                           static_cast<size_t>(result.numel()),
                           *ncclType(result.scalar_type()), ncclOp(op), comm,
                           commStream);
    });
  });
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

// Uneven sizes: one padded ncclReduceScatter. Each rank lays its tensor out
// as N blocks of the largest slice size (block r holds rank r's slice,
// padding after it), NCCL reduces block r onto rank r, and the rank keeps
// the first sizes[r] rows of its block. One ring collective again beats N
// grouped ncclReduce calls; equal sizes along axis 0 need no staging copy.
at::Tensor
NcclCommunicator::transferReduceScatter(Call &call, const at::Tensor &input,
                                        Reduction op, int64_t dim,
                                        const std::vector<int64_t> &sizes) {
  int64_t n = options.worldSize;
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> blockShape = input.sizes().vec();
  blockShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = sizes[options.rank];
  if (numelOf(blockShape) == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }
  CudaDeviceGuard guard(device);
  bool even = std::all_of(sizes.begin(), sizes.end(),
                          [&](int64_t s) { return s == maxSize; });
  at::Tensor staged;
  if (even && dim == 0) {
    staged = input.contiguous();
  } else {
    std::vector<int64_t> stagedShape{n};
    stagedShape.insert(stagedShape.end(), blockShape.begin(), blockShape.end());
    // Padding is reduced and dropped: it need not be initialised.
    staged = at::empty(stagedShape, input.options());
    int64_t offset = 0;
    for (int64_t r = 0; r < n; ++r) {
      staged[r]
          .narrow(dim, 0, sizes[r])
          .copy_(input.narrow(dim, offset, sizes[r]));
      offset += sizes[r];
    }
  }
  at::Tensor block = at::empty(blockShape, input.options());
  communicate(call, [&] {
    runCollective("ncclReduceScatter", [&] {
      return ncclReduceScatter(staged.data_ptr(), block.data_ptr(),
                               static_cast<size_t>(block.numel()),
                               *ncclType(input.scalar_type()), ncclOp(op), comm,
                               commStream);
    });
  });
  at::Tensor result = sizes[options.rank] == maxSize
                          ? block
                          : block.narrow(dim, 0, sizes[options.rank]).clone();
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor NcclCommunicator::transferBroadcast(Call &call,
                                               const at::Tensor &input,
                                               int root) {
  CudaDeviceGuard guard(device);
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    runCollective("ncclBroadcast", [&] {
      return ncclBroadcast(result.data_ptr(), result.data_ptr(),
                           bytesOf(result), ncclUint8, root, comm, commStream);
    });
  });
  return result;
}

// The shape travels first, as with the Gloo engine: a fixed-length header
// [ndim, dtype, sizes...] goes through the pinned and device scratch buffers
// in one send/recv group, then the data in a second group. A shift that is a
// multiple of N sends to this rank itself, which NCCL allows within a group
// (so world size 1 runs the same path).
at::Tensor NcclCommunicator::transferRingShift(Call &call,
                                               const at::Tensor &input,
                                               const ShiftPeers &ring) {
  int dst = ring.dst, src = ring.src;
  CudaDeviceGuard guard(device);
  at::Tensor data = input.contiguous();

  return communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    reserveScratch(2 * kHeaderLength);
    writeShiftHeader(data, hostScratch);
    size_t headerBytes = kHeaderLength * sizeof(int64_t);
    checkCuda(cudaMemcpyAsync(deviceScratch, hostScratch, headerBytes,
                              cudaMemcpyHostToDevice, commStream),
              "cudaMemcpyAsync of the ringShift header");
    settle(ncclGroupStart(), "ncclGroupStart", until);
    settle(ncclSend(deviceScratch, kHeaderLength, ncclInt64, dst, comm,
                    commStream),
           "ncclSend of the ringShift header", until);
    settle(ncclRecv(deviceScratch + kHeaderLength, kHeaderLength, ncclInt64,
                    src, comm, commStream),
           "ncclRecv of the ringShift header", until);
    settle(ncclGroupEnd(), "ncclGroupEnd of the ringShift header", until);
    checkCuda(cudaMemcpyAsync(hostScratch + kHeaderLength,
                              deviceScratch + kHeaderLength, headerBytes,
                              cudaMemcpyDeviceToHost, commStream),
              "cudaMemcpyAsync of the ringShift header");
    Event headerDone;
    checkCuda(cudaEventRecord(headerDone.get(), commStream), "cudaEventRecord");
    await(headerDone.get(), "the ringShift header", until);

    at::Tensor received =
        fromShiftHeader(call, hostScratch + kHeaderLength, src, data);

    // Both ends know both sizes now; empty tensors send nothing.
    if (received.numel() > 0 || data.numel() > 0) {
      enterCommStream();
      settle(ncclGroupStart(), "ncclGroupStart", until);
      if (data.numel() > 0)
        settle(ncclSend(data.data_ptr(), bytesOf(data), ncclUint8, dst, comm,
                        commStream),
               "ncclSend of the ringShift data", until);
      if (received.numel() > 0)
        settle(ncclRecv(received.data_ptr(), bytesOf(received), ncclUint8, src,
                        comm, commStream),
               "ncclRecv of the ringShift data", until);
      settle(ncclGroupEnd(), "ncclGroupEnd of the ringShift data", until);
      leaveCommStream("the ringShift data", until);
    }
    return received;
  });
}

// Small host values go through the device scratch buffer (pinned copies in,
// one ncclAllGather, a copy out): no CUDA tensor is needed, so this also runs
// under a CPU-only LibTorch, and it stays one NCCL collective rather than N
// store round trips.
std::vector<int64_t>
NcclCommunicator::transferAllGatherInts(Call &call,
                                        const std::vector<int64_t> &values) {
  if (values.empty()) {
    complete(call);
    return {};
  }
  return communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    size_t count = values.size();
    size_t n = static_cast<size_t>(options.worldSize);
    reserveScratch(count * n);
    int64_t *mine = hostScratch + count * options.rank;
    std::copy(values.begin(), values.end(), mine);
    checkCuda(cudaMemcpyAsync(deviceScratch + count * options.rank, mine,
                              count * sizeof(int64_t), cudaMemcpyHostToDevice,
                              commStream),
              "cudaMemcpyAsync of allGatherInts' values");
    // In place: rank r's values already sit at block r.
    settle(ncclAllGather(deviceScratch + count * options.rank, deviceScratch,
                         count, ncclInt64, comm, commStream),
           "ncclAllGather", until);
    checkCuda(cudaMemcpyAsync(hostScratch, deviceScratch,
                              count * n * sizeof(int64_t),
                              cudaMemcpyDeviceToHost, commStream),
              "cudaMemcpyAsync of allGatherInts' result");
    Event done;
    checkCuda(cudaEventRecord(done.get(), commStream), "cudaEventRecord");
    await(done.get(), "ncclAllGather of the values", until);
    return std::vector<int64_t>(hostScratch, hostScratch + count * n);
  });
}

void NcclCommunicator::barrier(Call &call) {
  begin(call, nullptr, 1);
  communicate(call, [&] {
    Clock::time_point until = deadline();
    reserveScratch(2 * kHeaderLength);
    hostScratch[0] = 1;
    checkCuda(cudaMemcpyAsync(deviceScratch, hostScratch, sizeof(int64_t),
                              cudaMemcpyHostToDevice, commStream),
              "cudaMemcpyAsync");
    settle(ncclAllReduce(deviceScratch, deviceScratch, 1, ncclInt64, ncclSum,
                         comm, commStream),
           "ncclAllReduce", until);
    checkCuda(cudaMemcpyAsync(hostScratch, deviceScratch, sizeof(int64_t),
                              cudaMemcpyDeviceToHost, commStream),
              "cudaMemcpyAsync");
    Event done;
    checkCuda(cudaEventRecord(done.get(), commStream), "cudaEventRecord");
    await(done.get(), "the connection check", until);
    if (hostScratch[0] != options.worldSize)
      throw fail(call,
                 "the connection check counted " +
                     std::to_string(hostScratch[0]) + " ranks " + where() +
                     ", expected " + std::to_string(options.worldSize),
                 "Every rank must use the same WORLD_SIZE");
  });
}

//===----------------------------------------------------------------------===//
// Point to point
//===----------------------------------------------------------------------===//

std::unique_ptr<Communicator::Request>
NcclCommunicator::transferSend(Call &call, const at::Tensor &tensor, int peer,
                               int tag) {
  if (!broken.empty())
    communicate(call, [] {}); // Fails fast, naming the earlier failure.
  CudaDeviceGuard guard(device);
  auto transfer = std::make_shared<Transfer>();
  transfer->isSend = true;
  transfer->peer = peer;
  transfer->tag = tag;
  transfer->wire = tensor.contiguous();
  if (transfer->wire.numel() == 0)
    return std::make_unique<NcclRequest>(this, call, nullptr, at::Tensor());
  communicate(call, [&] {
    transfer->ready = std::make_shared<Event>();
    checkCuda(cudaEventRecord(transfer->ready->get(), computeStream(device)),
              "cudaEventRecord on the compute stream");
  });
  posted.push_back(transfer);
  return std::make_unique<NcclRequest>(this, call, std::move(transfer),
                                       at::Tensor());
}

std::unique_ptr<Communicator::Request>
NcclCommunicator::transferRecv(Call &call, at::Tensor &tensor, int peer,
                               int tag) {
  if (!broken.empty())
    communicate(call, [] {});
  CudaDeviceGuard guard(device);
  auto transfer = std::make_shared<Transfer>();
  transfer->peer = peer;
  transfer->tag = tag;
  // Receive in place when contiguous; otherwise stage and copy in wait().
  transfer->wire = tensor.is_contiguous()
                       ? tensor
                       : at::empty(tensor.sizes(), tensor.options());
  if (transfer->wire.numel() == 0)
    return std::make_unique<NcclRequest>(this, call, nullptr, at::Tensor());
  // The buffer may still be read by compute queued before the post.
  communicate(call, [&] {
    transfer->ready = std::make_shared<Event>();
    checkCuda(cudaEventRecord(transfer->ready->get(), computeStream(device)),
              "cudaEventRecord on the compute stream");
  });
  posted.push_back(transfer);
  return std::make_unique<NcclRequest>(this, call, std::move(transfer), tensor);
}

//===----------------------------------------------------------------------===//
// Rendezvous
//===----------------------------------------------------------------------===//

// After checkOptions: the device must be one this process sees.
void checkDevice(const RendezvousOptions &options, int device) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    throw rendezvousError(options,
                          std::string("connectNccl: no usable CUDA device (") +
                              cudaGetErrorString(status) + ")",
                          "Run on a GPU machine with a working driver, or use "
                          "connectGloo for CPU tensors");
  }
  if (device < 0 || device >= count)
    throw rendezvousError(options,
                          "connectNccl: device " + std::to_string(device) +
                              " is not one of the " + std::to_string(count) +
                              " visible CUDA devices",
                          "Pass LOCAL_RANK (one GPU per rank) and check "
                          "CUDA_VISIBLE_DEVICES");
}

} // namespace

std::unique_ptr<Communicator> connectNccl(const RendezvousOptions &options,
                                          int device) {
  checkOptions(options, "connectNccl");
  checkDevice(options, device);
  Clock::time_point until = Clock::now() + options.timeout;
  CudaDeviceGuard guard(device);

  // Rank 0 draws the id before it announces itself, so that every rank that
  // sees the verdict "ok" finds the id in the store.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (options.rank == 0) {
    ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess)
      throw rendezvousError(
          options,
          std::string("rank 0 could not create the NCCL unique id (") +
              ncclGetErrorString(result) + ")",
          "NCCL needs a usable network interface for its bootstrap: set "
          "NCCL_SOCKET_IFNAME, and NCCL_DEBUG=WARN to see why");
  }

  c10::intrusive_ptr<c10d::Store> store =
      openStore(options, "an earlier job, or this job's Gloo communicator",
                "nccl");
  guardStore(options, [&] {
    if (options.rank == 0)
      store->set(kUniqueIdKey,
                 std::vector<uint8_t>(reinterpret_cast<const uint8_t *>(&id),
                                      reinterpret_cast<const uint8_t *>(&id) +
                                          sizeof(id)));
    rendezvous(*store, options, until, "NCCL rendezvous");
    if (options.rank != 0) {
      std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
      if (bytes.size() != sizeof(id))
        throw rendezvousError(
            options,
            "the NCCL unique id in the store has " +
                std::to_string(bytes.size()) + " bytes, expected " +
                std::to_string(sizeof(id)),
            "Every rank must run the same dloss build against the same NCCL "
            "version");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
  });

  // Non-blocking init: the host polls it against the deadline, and a rank
  // that never gets there is named from the store.
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "dloss";
  std::string problem;
  ncclResult_t result = ncclCommInitRankConfig(&comm, options.worldSize, id,
                                               options.rank, &config);
  while (problem.empty() && result == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess)
      state = ncclInternalError;
    if (state == ncclInProgress && Clock::now() >= until)
      problem =
          "did not complete within the deadline of " + seconds(options.timeout);
    else if (state == ncclInProgress)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    result = state;
  }
  if (problem.empty() && result != ncclSuccess)
    problem = std::string("failed: ") + ncclGetErrorString(result) + " (" +
              ncclGetLastError(comm) + ")";
  if (!problem.empty()) {
    if (comm)
      (void)ncclCommAbort(comm);
    std::string peers = unmarkedPeers(*store, options, kReadyPrefix,
                                      "never initialised theirs");
    throw rendezvousError(
        options,
        "the NCCL communicator on cuda:" + std::to_string(device) + " " +
            problem + peers,
        "Check the other ranks' logs; NCCL_DEBUG=WARN shows NCCL's view. "
        "Each rank needs its own GPU: NCCL refuses two ranks on one device");
  }
  try {
    setMark(*store, kReadyPrefix, options.rank, "1");
  } catch (const std::exception &) {
    // The connection check below reports a dead peer.
  }

  auto communicator =
      std::make_unique<NcclCommunicator>(options, device, store, comm);
  Call check{"the connection check after the rendezvous", ""};
  communicator->barrier(check);
  return communicator;
}

} // namespace dloss