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
// dloss/seq/<rank> (the Gloo engine's scheme and encoding) and raises a
// dloss::Error naming the collective, its number, the call site and the
// peers' states read from the store, with the flight record's path.
//
// The store bookkeeping below (Call, PeerState, the encoding of dloss/seq/,
// the rendezvous with its verdict, the peers' summary, the rank-0 linger)
// repeats GlooCommunicator.cpp's, whose copy lives in an anonymous namespace;
// hoisting both into one header is a follow-up.
#include "runtime/Communicator.h"
#include "runtime/Error.h"
#include "runtime/FlightRecorder.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef DLOSS_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <type_traits>

namespace dloss {

namespace {

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Version-sensitive c10d calls (LibTorch 1.13 and 2.x), as in the Gloo engine
//===----------------------------------------------------------------------===//

namespace compat {

// Rank 0 hosts the server; waitWorkers stays off because rendezvous() names
// the ranks that never arrived, which TCPStore's own wait cannot.
c10::intrusive_ptr<c10d::Store> openTcpStore(const RendezvousOptions &options) {
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<std::uint16_t>(options.masterPort);
  storeOptions.isServer = options.rank == 0;
  storeOptions.numWorkers = static_cast<std::size_t>(options.worldSize);
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;
  return c10::make_intrusive<c10d::TCPStore>(options.masterAddr, storeOptions);
}

// c10::Error::what() appends a C++ backtrace; users need the first line.
std::string describe(const std::exception &e) {
  std::string text;
  if (const auto *c10Error = dynamic_cast<const c10::Error *>(&e))
    text = c10Error->what_without_backtrace();
  else
    text = e.what();
  auto newline = text.find('\n');
  if (newline != std::string::npos)
    text.resize(newline);
  while (!text.empty() && (text.back() == ' ' || text.back() == '.'))
    text.pop_back();
  if (text.size() > 400)
    text = text.substr(0, 400) + "...";
  return text.empty() ? std::string("unknown c10d error") : text;
}

} // namespace compat

//===----------------------------------------------------------------------===//
// Constants and helpers
//===----------------------------------------------------------------------===//

// User tags stay below this value, as with the Gloo engine.
constexpr int kReservedTagBase = 1 << 30;
// ringShift header: [ndim, dtype, sizes...], fixed length.
constexpr int64_t kMaxDims = 64;
constexpr int64_t kHeaderLength = 2 + kMaxDims;
// Polling: spin (yielding) this long, then sleep between queries.
constexpr std::chrono::microseconds kSpinPeriod{2000};
constexpr std::chrono::microseconds kPollSleep{100};
constexpr std::chrono::milliseconds kStorePoll{20};
constexpr std::chrono::milliseconds kVerdictLinger{2000};
// How long the destructor lets ncclCommFinalize flush before aborting.
constexpr std::chrono::milliseconds kFinalizeLimit{10000};

const char *const kArrivedPrefix = "dloss/arrived/";
const char *const kArrivedCountKey = "dloss/arrived-count";
const char *const kVerdictKey = "dloss/verdict";
const char *const kVerdictAckKey = "dloss/verdict-acks";
const char *const kSeqPrefix = "dloss/seq/";
const char *const kDonePrefix = "dloss/done/";
// Rank 0's ncclUniqueId, and each rank's "communicator initialised" mark.
const char *const kUniqueIdKey = "dloss/nccl/unique-id";
const char *const kReadyPrefix = "dloss/nccl/ready/";
constexpr std::chrono::milliseconds kPeerReportGrace{1000};
constexpr std::chrono::milliseconds kFailureLinger{3000};
constexpr size_t kMaxPeerClauses = 8;

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

std::string joinRanks(const std::vector<int> &ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::vector<uint8_t> toBytes(const std::string &text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::string fromBytes(const std::vector<uint8_t> &bytes) {
  return std::string(bytes.begin(), bytes.end());
}

int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string truncated(const std::string &text, size_t limit) {
  return text.size() <= limit ? text : text.substr(0, limit) + "...";
}

std::string describeTensor(const at::Tensor &tensor) {
  std::string out = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d)
    out += (d ? ", " : "") + std::to_string(tensor.size(d));
  return out + "]";
}

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

// Makes `device` current for a scope; NCCL and the stream calls act on it.
class DeviceGuard {
public:
  explicit DeviceGuard(int device) : device(device) {
    if (cudaGetDevice(&previous) != cudaSuccess)
      previous = -1;
    if (previous != device)
      (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous >= 0 && previous != device)
      (void)cudaSetDevice(previous);
  }
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

private:
  int device;
  int previous = -1;
};

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
#ifdef DLOSS_TORCH_HAS_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))
      .stream();
#else
  (void)device;
  return nullptr; // The legacy default stream.
#endif
}

//===----------------------------------------------------------------------===//
// Store bookkeeping (the Gloo engine's scheme)
//===----------------------------------------------------------------------===//

struct Call {
  Call(std::string name, std::string irOp)
      : name(std::move(name)), irOp(std::move(irOp)) {
    if (const CallSite *current = currentCallSite())
      site = *current;
  }

  std::string name;
  std::string irOp;
  CallSite site;
  int64_t seq = -1;    // -1 for send and recv
  uint64_t flight = 0; // flight recorder handle
  int64_t startUnixMs = 0;

  std::string describe() const {
    std::string out = seq >= 0 ? "collective #" + std::to_string(seq) + " " +
                                     name
                               : name;
    if (!site.phase.empty())
      out += " (" + site.phase +
             (site.function.empty() ? "" : " of @" + site.function) + ")";
    else if (!site.function.empty())
      out += " (in @" + site.function + ")";
    return out;
  }
};

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

constexpr char kFieldSeparator = '\x1f';

std::string encodeState(int64_t seq, const std::string &state,
                        const std::string &collective, const CallSite &site,
                        int64_t unixMs, const std::string &detail) {
  std::string out;
  for (const std::string &field :
       {std::to_string(seq), state, collective, site.function, site.op,
        site.location, site.phase, std::to_string(unixMs), detail}) {
    out += field;
    out += kFieldSeparator;
  }
  return out;
}

PeerState decodeState(int rank, const std::string &text) {
  std::vector<std::string> fields;
  std::string field;
  for (char c : text) {
    if (c == kFieldSeparator) {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  PeerState peer;
  peer.rank = rank;
  if (fields.size() < 9)
    return peer;
  peer.known = true;
  peer.seq = std::strtoll(fields[0].c_str(), nullptr, 10);
  peer.state = fields[1];
  peer.collective = fields[2];
  peer.site = CallSite{fields[3], fields[4], fields[5], fields[6]};
  peer.unixMs = std::strtoll(fields[7].c_str(), nullptr, 10);
  peer.detail = fields[8];
  return peer;
}

std::string siteText(const CallSite &site) {
  std::string out;
  if (!site.op.empty())
    out = site.op + (site.location.empty() ? "" : " at " + site.location);
  else if (!site.phase.empty())
    out = site.phase;
  if (!site.function.empty())
    out += (out.empty() ? "in @" : " of @") + site.function;
  return out.empty() ? "" : " (" + out + ")";
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
  at::Tensor wire;                // contiguous; what NCCL reads or writes
  std::shared_ptr<Event> ready;   // compute stream at post time
  std::shared_ptr<Event> done;    // set at launch
  bool launched = false;
};

class NcclRequest;

class NcclCommunicator final : public Communicator {
public:
  NcclCommunicator(RendezvousOptions options, int device,
                   c10::intrusive_ptr<c10d::Store> store, ncclComm_t comm);
  ~NcclCommunicator() override;

  int rank() const override { return options.rank; }
  int worldSize() const override { return options.worldSize; }

  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) override;
  at::Tensor allReduce(const at::Tensor &input, Reduction op) override;
  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) override;
  at::Tensor broadcast(const at::Tensor &input, int root) override;
  at::Tensor ringShift(const at::Tensor &input, int64_t shift) override;
  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override;
  std::unique_ptr<Request> send(const at::Tensor &tensor, int peer,
                                int tag) override;
  std::unique_ptr<Request> recv(at::Tensor &tensor, int peer, int tag) override;
  int64_t collectivesStarted() const override { return started; }
  void noteFailure(const std::string &message) override;

  /// An allreduce of one int through the scratch buffers: returns once every
  /// rank's communicator works.
  void barrier(Call &call);

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
  /// Grows the pinned host and device scratch buffers to `count` int64s.
  void reserveScratch(size_t count);
  void abortComm();

  Error fail(const Call &call, std::string problem, std::string hint) const {
    ErrorInfo info;
    info.problem = std::move(problem);
    info.hint = std::move(hint);
    info.rank = options.rank;
    info.op = call.site.op.empty() ? call.irOp : call.site.op;
    info.location = call.site.location;
    return Error(std::move(info));
  }
  void begin(Call &call, const at::Tensor *tensor, int64_t values = -1);
  void complete(Call &call) {
    flight.finish(call.flight, FlightEntry::State::Completed);
  }
  void publish(int64_t seq, const std::string &state,
               const std::string &collective, const CallSite &site,
               int64_t unixMs, const std::string &detail);
  Error diagnose(Call &call, const std::string &detail, bool timedOut);
  std::vector<PeerState> readPeers(std::chrono::milliseconds grace,
                                   std::string &storeProblem);
  std::string summarizePeers(const Call &call,
                             const std::vector<PeerState> &peers,
                             bool timedOut) const;

  std::string where() const {
    return "on rank " + std::to_string(options.rank) + " of " +
           std::to_string(options.worldSize);
  }
  void checkTensor(const Call &call, const at::Tensor &tensor) const;
  void checkReducible(const Call &call, const at::Tensor &tensor,
                      Reduction op) const;
  int64_t checkAxis(const Call &call, const at::Tensor &tensor,
                    int64_t axis) const;
  void checkSizes(const Call &call, const std::vector<int64_t> &sizes) const;
  void checkPeer(const Call &call, int peer, int tag) const;

  RendezvousOptions options;
  int device;
  c10::intrusive_ptr<c10d::Store> store;
  ncclComm_t comm;
  cudaStream_t commStream = nullptr;
  int64_t *hostScratch = nullptr;   // pinned
  int64_t *deviceScratch = nullptr;
  size_t scratchCount = 0;
  std::vector<std::shared_ptr<Transfer>> posted; // not launched yet
  std::string broken;
  int64_t started = 0;
  int64_t failedSeq = -1;
  bool storeUsable = true;
  FlightRecorder flight;
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
      DeviceGuard guard(owner->device);
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
    : options(std::move(options)), device(device), store(std::move(store)),
      comm(comm) {
  DeviceGuard guard(device);
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
  if (!broken.empty()) {
    flight.finish(call.flight, FlightEntry::State::Failed,
                  "not run: the communicator was already unusable");
    throw fail(call,
               call.describe() + " cannot run " + where() +
                   ": the communicator is unusable after an earlier failure (" +
                   broken + ")",
               "Handle the first error: the job has to be restarted once a "
               "collective has failed");
  }
  DeviceGuard guard(device);
  std::string detail;
  bool timedOut = false;
  try {
    if constexpr (std::is_void_v<decltype(body())>) {
      body();
      complete(call);
      return;
    } else {
      auto result = body();
      complete(call);
      return result;
    }
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header): the
    // peers' state is unknown, so the communicator goes too.
    abortComm();
    broken = call.name + ": " + e.problem();
    flight.finish(call.flight, FlightEntry::State::Failed, e.problem());
    throw;
  } catch (const Failure &e) {
    detail = e.what();
    timedOut = e.timedOut;
  } catch (const std::exception &e) {
    detail = compat::describe(e);
  } catch (...) {
    detail = "unknown exception";
  }
  // Abort first: it ends this rank's kernels that may wait on a dead peer.
  abortComm();
  broken = call.describe() + " failed: " + detail;
  throw diagnose(call, detail, timedOut);
}

void NcclCommunicator::abortComm() {
  posted.clear();
  if (!comm)
    return;
  DeviceGuard guard(device);
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
      throw Failure(std::string(what) + " failed: " +
                        ncclGetErrorString(state) + " (" +
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
      throw Failure(std::string("CUDA error while waiting for ") + what +
                        ": " + cudaGetErrorString(status),
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
  settle(ncclGroupEnd(), "ncclGroupEnd of the point-to-point transfers",
         until);
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

void NcclCommunicator::begin(Call &call, const at::Tensor *tensor,
                             int64_t values) {
  call.seq = ++started;
  call.startUnixMs = unixMillis();
  FlightEntry entry;
  entry.seq = call.seq;
  entry.collective = call.name;
  entry.function = call.site.function;
  entry.op = call.site.op.empty() ? call.irOp : call.site.op;
  entry.location = call.site.location;
  entry.phase = call.site.phase;
  if (tensor && tensor->defined()) {
    entry.shape = describeTensor(*tensor);
    entry.dtype = c10::toString(tensor->scalar_type());
    entry.bytes = static_cast<int64_t>(bytesOf(*tensor));
  } else if (values >= 0) {
    entry.shape = "[" + std::to_string(values) + "]";
    entry.dtype = "Long";
    entry.bytes = values * static_cast<int64_t>(sizeof(int64_t));
  }
  call.flight = flight.start(std::move(entry));
  if (broken.empty())
    publish(call.seq, "started", call.name, call.site, call.startUnixMs, "");
}

void NcclCommunicator::publish(int64_t seq, const std::string &state,
                               const std::string &collective,
                               const CallSite &site, int64_t unixMs,
                               const std::string &detail) {
  if (!storeUsable)
    return;
  try {
    store->set(kSeqPrefix + std::to_string(options.rank),
               toBytes(encodeState(seq, state, collective, site, unixMs,
                                   truncated(detail, 600))));
  } catch (const std::exception &) {
    storeUsable = false;
  }
}

void NcclCommunicator::noteFailure(const std::string &message) {
  if (!broken.empty())
    return;
  publish(started, "failed", "", CallSite{}, unixMillis(), message);
}

std::vector<PeerState>
NcclCommunicator::readPeers(std::chrono::milliseconds grace,
                            std::string &storeProblem) {
  std::vector<PeerState> peers;
  std::string storeAt = "the rendezvous store at " + options.masterAddr + ":" +
                        std::to_string(options.masterPort);
  if (!storeUsable) {
    storeProblem = storeAt + " could not be reached earlier: rank 0, which "
                             "hosts it, has probably exited or died";
    return peers;
  }
  Clock::time_point end = Clock::now() + grace;
  try {
    while (true) {
      peers.clear();
      bool allFailed = true;
      for (int r = 0; r < options.worldSize; ++r) {
        if (r == options.rank)
          continue;
        std::string key = kSeqPrefix + std::to_string(r);
        PeerState peer;
        peer.rank = r;
        if (store->check({key}))
          peer = decodeState(r, fromBytes(store->get(key)));
        allFailed &= peer.known && peer.state == "failed";
        peers.push_back(std::move(peer));
      }
      if (allFailed || Clock::now() >= end)
        return peers;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &e) {
    storeUsable = false;
    storeProblem = storeAt + " cannot be read (" + compat::describe(e) +
                   "): rank 0, which hosts it, has probably exited or died";
    peers.clear();
    return peers;
  }
}

std::string NcclCommunicator::summarizePeers(const Call &call,
                                             const std::vector<PeerState> &peers,
                                             bool timedOut) const {
  std::vector<std::string> clauses;
  std::vector<int> reached;
  int64_t now = unixMillis();
  auto ago = [now](int64_t unixMs) {
    std::ostringstream out;
    out.precision(1);
    out << std::fixed << std::max<int64_t>(0, now - unixMs) / 1000.0
        << " s ago";
    return out.str();
  };
  for (const PeerState &peer : peers) {
    std::string who = "rank " + std::to_string(peer.rank);
    if (!peer.known) {
      clauses.push_back(who + " has recorded no collective");
      continue;
    }
    std::string latest = "#" + std::to_string(peer.seq) + " " +
                         peer.collective + siteText(peer.site);
    if (peer.state == "failed") {
      if (peer.collective.empty())
        clauses.push_back(who + " failed outside a collective after #" +
                          std::to_string(peer.seq) + ": " +
                          truncated(peer.detail, 300));
      else
        clauses.push_back(who + " failed in collective " + latest + ": " +
                          truncated(peer.detail, 300));
      continue;
    }
    if (peer.seq < call.seq) {
      clauses.push_back(who + " never arrived (its latest collective is " +
                        latest + ", entered " + ago(peer.unixMs) + ")" +
                        (timedOut ? ""
                                  : " and has recorded no failure: it may "
                                    "have died"));
    } else if (peer.seq == call.seq && peer.collective == call.name) {
      if (timedOut)
        reached.push_back(peer.rank);
      else
        clauses.push_back(who + " reached it but had recorded no failure " +
                          seconds(kPeerReportGrace) +
                          " later (it died, or it still waits on another "
                          "rank)");
    } else if (peer.seq == call.seq) {
      clauses.push_back(who + " is in collective " + latest +
                        " instead: the ranks' collective calls differ");
    } else {
      clauses.push_back(who + " has moved on to collective " + latest);
    }
  }
  std::string out;
  for (size_t i = 0; i < clauses.size() && i < kMaxPeerClauses; ++i)
    out += (i ? "; " : "") + clauses[i];
  if (clauses.size() > kMaxPeerClauses)
    out += "; and " + std::to_string(clauses.size() - kMaxPeerClauses) +
           " more ranks (see the flight record)";
  if (!reached.empty()) {
    std::vector<int> all = reached;
    all.push_back(options.rank);
    std::sort(all.begin(), all.end());
    out += (out.empty() ? "" : "; ") +
           std::string(all.size() == 1 ? "rank " : "ranks ") + joinRanks(all) +
           " reached it";
  }
  return out;
}

Error NcclCommunicator::diagnose(Call &call, const std::string &detail,
                                 bool timedOut) {
  flight.finish(call.flight, FlightEntry::State::Failed, detail);
  std::string timeoutHint =
      "Some rank did not reach this collective in time: check the ranks "
      "named above (and the other ranks' logs) for an earlier error or a "
      "hang, make sure every rank makes the same collective calls in the "
      "same order (and posts matching sends and receives between the same "
      "waits), or raise DLOSS_TIMEOUT_S if the ranks are only slow";
  std::string peerHint =
      "A peer rank probably failed or exited: check the other ranks' logs "
      "for the first error (this one may be a consequence); NCCL_DEBUG=WARN "
      "shows NCCL's own view";
  std::string aborted = " (the NCCL communicator was aborted)";
  if (call.seq < 0) {
    if (timedOut)
      return fail(call,
                  call.name + " timed out " + where() +
                      " after the deadline of " + seconds(options.timeout) +
                      " (" + detail + ")" + aborted,
                  timeoutHint);
    return fail(call,
                call.name + " failed " + where() + ": " + detail + aborted,
                peerHint);
  }

  failedSeq = call.seq;
  publish(call.seq, "failed", call.name, call.site, unixMillis(),
          timedOut ? "timed out after " + seconds(options.timeout) : detail);
  std::string storeProblem;
  std::vector<PeerState> peers = readPeers(
      timedOut ? std::chrono::milliseconds(0) : kPeerReportGrace, storeProblem);
  if (storeUsable) {
    try {
      store->set(kDonePrefix + std::to_string(options.rank), toBytes("1"));
    } catch (const std::exception &) {
      storeUsable = false;
    }
  }
  std::string summary = storeProblem.empty()
                            ? summarizePeers(call, peers, timedOut)
                            : "the peers' states are unknown: " + storeProblem;
  std::string problem =
      timedOut ? call.describe() + " timed out " + where() +
                     " after the deadline of " + seconds(options.timeout)
               : call.describe() + " failed " + where() + " (" + detail + ")";
  if (!summary.empty())
    problem += ": " + summary;
  if (timedOut)
    problem += " (" + detail + ")";
  problem += aborted;
  std::string hint = timedOut ? timeoutHint : peerHint;

  std::string record;
  if (options.flightDir != "off") {
    FlightRecorder::Header header;
    header.rank = options.rank;
    header.worldSize = options.worldSize;
    header.timeoutSeconds = options.timeout.count() / 1000.0;
    header.reason = fail(call, problem, hint).what();
    for (const PeerState &peer : peers)
      header.peers.push_back(
          "rank " + std::to_string(peer.rank) + ": " +
          (peer.known ? peer.state + " #" + std::to_string(peer.seq) + " " +
                            peer.collective + siteText(peer.site) +
                            (peer.detail.empty() ? "" : ": " + peer.detail)
                      : "no collective recorded"));
    if (!storeProblem.empty())
      header.peers.push_back(storeProblem);
    try {
      record = "flight record of this rank's last collectives: " +
               flight.write(options.flightDir, header);
    } catch (const std::exception &e) {
      record = "the flight record could not be written (" +
               std::string(e.what()) + "; set DLOSS_FLIGHT_DIR)";
    }
  }
  if (!record.empty())
    problem += ". " + record;
  return fail(call, problem, hint);
}

NcclCommunicator::~NcclCommunicator() {
  {
    DeviceGuard guard(device);
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
      Clock::time_point end =
          Clock::now() + std::min<std::chrono::milliseconds>(options.timeout,
                                                             kFinalizeLimit);
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
  if (options.rank != 0 || failedSeq < 0 || !storeUsable)
    return;
  // Rank 0 hosts the store: keep it up while peers in the failed collective
  // still read their peers' states (as the Gloo engine does).
  Clock::time_point start = Clock::now();
  Clock::time_point end = start + kFailureLinger;
  auto silentEnd = start + kPeerReportGrace + std::chrono::milliseconds(500);
  try {
    while (Clock::now() < end) {
      bool diagnosing = false, silent = false;
      for (int r = 1; r < options.worldSize; ++r) {
        if (store->check({kDonePrefix + std::to_string(r)}))
          continue;
        std::string key = kSeqPrefix + std::to_string(r);
        if (!store->check({key}))
          continue;
        PeerState peer = decodeState(r, fromBytes(store->get(key)));
        if (!peer.known || peer.seq < failedSeq)
          continue;
        diagnosing |= peer.state == "failed";
        silent |= peer.state != "failed";
      }
      if (!diagnosing && (!silent || Clock::now() >= silentEnd))
        return;
      std::this_thread::sleep_for(kStorePoll);
    }
  } catch (const std::exception &) {
  }
}

//===----------------------------------------------------------------------===//
// Checks
//===----------------------------------------------------------------------===//

void NcclCommunicator::checkTensor(const Call &call,
                                   const at::Tensor &tensor) const {
  if (!tensor.defined())
    throw fail(call, call.name + " got an undefined tensor " + where(),
               "Pass a tensor");
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

void NcclCommunicator::checkReducible(const Call &call,
                                      const at::Tensor &tensor,
                                      Reduction op) const {
  at::ScalarType type = tensor.scalar_type();
  if (op == Reduction::Mean && !at::isFloatingType(type))
    throw fail(call,
               call.name + " Mean of an integer tensor (" +
                   c10::toString(type) + ") is not defined " + where(),
               "Convert the tensor to a floating type, or reduce with Sum and "
               "divide by the world size");
  if (!ncclType(type))
    throw fail(call,
               call.name + " " + reductionName(op) + " of a " +
                   c10::toString(type) + " tensor is not supported by NCCL " +
                   where(),
               "Convert to float, double, half, bfloat16 or an integer type "
               "first");
}

int64_t NcclCommunicator::checkAxis(const Call &call, const at::Tensor &tensor,
                                    int64_t axis) const {
  int64_t dims = tensor.dim();
  if (dims == 0 || axis < -dims || axis >= dims)
    throw fail(call,
               call.name + " axis " + std::to_string(axis) +
                   " is out of range for a " + std::to_string(dims) +
                   "-d tensor " + where(),
               "Pass an axis in [-dims, dims) of a tensor with at least one "
               "dimension");
  return axis < 0 ? axis + dims : axis;
}

void NcclCommunicator::checkSizes(const Call &call,
                                  const std::vector<int64_t> &sizes) const {
  if (static_cast<int64_t>(sizes.size()) != options.worldSize)
    throw fail(call,
               call.name + " got " + std::to_string(sizes.size()) + " sizes " +
                   where() + ", expected one per rank (" +
                   std::to_string(options.worldSize) + ")",
               "Pass every rank's size in rank order, as exchanged with "
               "allGatherInts");
  for (size_t r = 0; r < sizes.size(); ++r)
    if (sizes[r] < 0)
      throw fail(call,
                 call.name + " got a negative size " +
                     std::to_string(sizes[r]) + " for rank " +
                     std::to_string(r) + " " + where(),
                 "Pass every rank's size in rank order, as exchanged with "
                 "allGatherInts");
}

void NcclCommunicator::checkPeer(const Call &call, int peer, int tag) const {
  // A send to oneself outside a group would block its own stream.
  if (peer < 0 || peer >= options.worldSize || peer == options.rank)
    throw fail(call,
               call.name + " names peer rank " + std::to_string(peer) + " " +
                   where() + ", which is not another rank of the job",
               "Pass a peer in [0, world size) other than this rank; a "
               "transfer to oneself is a local copy");
  if (tag < 0 || tag >= kReservedTagBase)
    throw fail(call,
               call.name + " tag " + std::to_string(tag) + " is out of range " +
                   where(),
               "Use tags in [0, 2^30), as with the Gloo engine");
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
at::Tensor NcclCommunicator::allGather(const at::Tensor &input, int64_t axis,
                                       const std::vector<int64_t> &sizes) {
  Call call{"allGather", "dloss.all_gather"};
  checkTensor(call, input);
  int64_t dim = checkAxis(call, input, axis);
  checkSizes(call, sizes);
  if (sizes[options.rank] != input.size(dim))
    throw fail(call,
               "allGather sizes[" + std::to_string(options.rank) +
                   "] = " + std::to_string(sizes[options.rank]) +
                   " but this rank's tensor has " +
                   std::to_string(input.size(dim)) + " along axis " +
                   std::to_string(dim) + " " + where(),
               "Pass the sizes exchanged with allGatherInts, in rank order, "
               "for the same tensor");
  int64_t n = options.worldSize;
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> paddedShape = input.sizes().vec();
  paddedShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = total;
  begin(call, &input);
  if (numelOf(paddedShape) == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }
  DeviceGuard guard(device);
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
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    enterCommStream();
    settle(ncclAllGather(padded.data_ptr(), gathered.data_ptr(),
                         bytesOf(padded), ncclUint8, comm, commStream),
           "ncclAllGather", until);
    leaveCommStream("ncclAllGather", until);
  });
  if (direct)
    return gathered;
  std::vector<at::Tensor> pieces;
  for (int64_t r = 0; r < n; ++r)
    pieces.push_back(gathered[r].narrow(dim, 0, sizes[r]));
  return at::cat(pieces, dim);
}

at::Tensor NcclCommunicator::allReduce(const at::Tensor &input, Reduction op) {
  Call call{"allReduce", "dloss.all_reduce"};
  checkTensor(call, input);
  checkReducible(call, input, op);
  begin(call, &input);
  DeviceGuard guard(device);
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0) {
    complete(call);
    return result;
  }
  communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    enterCommStream();
    settle(ncclAllReduce(result.data_ptr(), result.data_ptr(),
                         static_cast<size_t>(result.numel()),
                         *ncclType(result.scalar_type()), ncclOp(op), comm,
                         commStream),
           "ncclAllReduce", until);
    leaveCommStream("ncclAllReduce", until);
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
at::Tensor NcclCommunicator::reduceScatter(const at::Tensor &input,
                                           Reduction op, int64_t axis,
                                           const std::vector<int64_t> &sizes) {
  Call call{"reduceScatter", "dloss.reduce_scatter"};
  checkTensor(call, input);
  checkReducible(call, input, op);
  int64_t dim = checkAxis(call, input, axis);
  checkSizes(call, sizes);
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (total != input.size(dim))
    throw fail(call,
               "reduceScatter sizes add up to " + std::to_string(total) +
                   " but the tensor has " + std::to_string(input.size(dim)) +
                   " along axis " + std::to_string(dim) + " " + where(),
               "Pass every rank's slice size in rank order; they must add up "
               "to the reduced axis");
  int64_t n = options.worldSize;
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int64_t> blockShape = input.sizes().vec();
  blockShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = sizes[options.rank];
  begin(call, &input);
  if (numelOf(blockShape) == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }
  DeviceGuard guard(device);
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
      staged[r].narrow(dim, 0, sizes[r]).copy_(input.narrow(dim, offset,
                                                            sizes[r]));
      offset += sizes[r];
    }
  }
  at::Tensor block = at::empty(blockShape, input.options());
  communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    enterCommStream();
    settle(ncclReduceScatter(staged.data_ptr(), block.data_ptr(),
                             static_cast<size_t>(block.numel()),
                             *ncclType(input.scalar_type()), ncclOp(op), comm,
                             commStream),
           "ncclReduceScatter", until);
    leaveCommStream("ncclReduceScatter", until);
  });
  at::Tensor result = sizes[options.rank] == maxSize
                          ? block
                          : block.narrow(dim, 0, sizes[options.rank]).clone();
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor NcclCommunicator::broadcast(const at::Tensor &input, int root) {
  Call call{"broadcast", "dloss.broadcast"};
  checkTensor(call, input);
  if (root < 0 || root >= options.worldSize)
    throw fail(call,
               "broadcast root " + std::to_string(root) + " is not a rank " +
                   where(),
               "Pass a root in [0, world size)");
  begin(call, &input);
  DeviceGuard guard(device);
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0) {
    complete(call);
    return result;
  }
  communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    enterCommStream();
    settle(ncclBroadcast(result.data_ptr(), result.data_ptr(), bytesOf(result),
                         ncclUint8, root, comm, commStream),
           "ncclBroadcast", until);
    leaveCommStream("ncclBroadcast", until);
  });
  return result;
}

// The shape travels first, as with the Gloo engine: a fixed-length header
// [ndim, dtype, sizes...] goes through the pinned and device scratch buffers
// in one send/recv group, then the data in a second group. A shift that is a
// multiple of N sends to this rank itself, which NCCL allows within a group
// (so world size 1 runs the same path).
at::Tensor NcclCommunicator::ringShift(const at::Tensor &input, int64_t shift) {
  Call call{"ringShift", "dloss.ring_shift"};
  checkTensor(call, input);
  int64_t n = options.worldSize;
  int64_t step = ((shift % n) + n) % n;
  if (input.dim() > kMaxDims)
    throw fail(call,
               "ringShift of a " + std::to_string(input.dim()) + "-d tensor " +
                   where() + " exceeds the limit of " +
                   std::to_string(kMaxDims) + " dimensions",
               "Reshape the tensor to fewer dimensions before the shift");
  begin(call, &input);
  int dst = static_cast<int>((options.rank + step) % n);
  int src = static_cast<int>((options.rank - step + n) % n);
  DeviceGuard guard(device);
  at::Tensor data = input.contiguous();

  return communicate(call, [&] {
    launchTransfers(deadline());
    Clock::time_point until = deadline();
    reserveScratch(2 * kHeaderLength);
    int64_t *header = hostScratch;
    std::fill(header, header + 2 * kHeaderLength, int64_t{0});
    header[0] = data.dim();
    header[1] = static_cast<int64_t>(data.scalar_type());
    for (int64_t d = 0; d < data.dim(); ++d)
      header[2 + d] = data.size(d);
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

    const int64_t *in = hostScratch + kHeaderLength;
    int64_t dims = in[0];
    if (dims < 0 || dims > kMaxDims || in[1] < 0 ||
        in[1] >= static_cast<int64_t>(at::ScalarType::NumOptions))
      throw fail(call,
                 "ringShift received a malformed header from rank " +
                     std::to_string(src) + " " + where(),
                 "Make sure every rank runs the same dloss build and the same "
                 "collective calls in the same order");
    std::vector<int64_t> shape(in + 2, in + 2 + dims);
    auto type = static_cast<at::ScalarType>(in[1]);
    at::Tensor received = at::empty(shape, data.options().dtype(type));

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
NcclCommunicator::allGatherInts(const std::vector<int64_t> &values) {
  Call call{"allGatherInts", ""};
  begin(call, nullptr, static_cast<int64_t>(values.size()));
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
NcclCommunicator::send(const at::Tensor &tensor, int peer, int tag) {
  Call call{"send to rank " + std::to_string(peer) + " (tag " +
                std::to_string(tag) + ")",
            ""};
  checkTensor(call, tensor);
  checkPeer(call, peer, tag);
  if (!broken.empty())
    communicate(call, [] {}); // Fails fast, naming the earlier failure.
  DeviceGuard guard(device);
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
NcclCommunicator::recv(at::Tensor &tensor, int peer, int tag) {
  Call call{"recv from rank " + std::to_string(peer) + " (tag " +
                std::to_string(tag) + ")",
            ""};
  checkTensor(call, tensor);
  checkPeer(call, peer, tag);
  if (!broken.empty())
    communicate(call, [] {});
  DeviceGuard guard(device);
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

Error rendezvousError(const RendezvousOptions &options, std::string problem,
                      std::string hint) {
  ErrorInfo info;
  info.problem = std::move(problem);
  info.hint = std::move(hint);
  info.rank = options.rank;
  return Error(std::move(info));
}

std::string storeAddress(const RendezvousOptions &options) {
  return options.masterAddr + ":" + std::to_string(options.masterPort);
}

std::string arrivedKey(int rank) {
  return kArrivedPrefix + std::to_string(rank);
}

std::string decide(c10d::Store &store, const std::string &proposal) {
  return fromBytes(store.compareSet(kVerdictKey, {}, toBytes(proposal)));
}

// The Gloo engine's arrival protocol: every rank announces itself; the first
// verdict stored ("ok" or "missing:<ranks>") is every rank's verdict.
void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point until) {
  int n = options.worldSize;
  store.set(arrivedKey(options.rank), toBytes("1"));
  store.add(kArrivedCountKey, 1);
  std::string verdict;
  while (verdict.empty()) {
    if (store.add(kArrivedCountKey, 0) >= n) {
      verdict = decide(store, "ok");
    } else if (store.check({kVerdictKey})) {
      verdict = fromBytes(store.get(kVerdictKey));
    } else if (Clock::now() >= until) {
      std::vector<int> missing;
      for (int r = 0; r < n; ++r)
        if (!store.check({arrivedKey(r)}))
          missing.push_back(r);
      verdict = decide(
          store, missing.empty() ? "ok" : "missing:" + joinRanks(missing));
    } else {
      std::this_thread::sleep_for(kStorePoll);
    }
  }
  if (verdict == "ok")
    return;
  std::string missing = verdict.substr(verdict.find(':') + 1);
  size_t missingCount = std::count(missing.begin(), missing.end(), ',') + 1;
  if (options.rank == 0) {
    int64_t expectedAcks = n - static_cast<int64_t>(missingCount) - 1;
    auto lingerEnd = Clock::now() + kVerdictLinger;
    while (store.add(kVerdictAckKey, 0) < expectedAcks &&
           Clock::now() < lingerEnd)
      std::this_thread::sleep_for(kStorePoll);
  } else {
    store.add(kVerdictAckKey, 1);
  }
  throw rendezvousError(
      options,
      "the NCCL rendezvous of " + std::to_string(n) + " ranks at " +
          storeAddress(options) + " did not complete within the deadline of " +
          seconds(options.timeout) + ": " +
          (missingCount == 1 ? "rank " + missing + " never joined"
                             : "ranks " + missing + " never joined"),
      "Start every rank from 0 to " + std::to_string(n - 1) +
          " with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE; if the "
          "missing ranks were started, check their logs for an error before "
          "the rendezvous, or raise DLOSS_TIMEOUT_S if they start late");
}

void checkOptions(const RendezvousOptions &options, int device) {
  std::string problem;
  if (options.worldSize < 1)
    problem =
        "world size " + std::to_string(options.worldSize) + " is not positive";
  else if (options.rank < 0 || options.rank >= options.worldSize)
    problem = "rank " + std::to_string(options.rank) +
              " is out of range for world size " +
              std::to_string(options.worldSize);
  else if (options.masterPort < 1 || options.masterPort > 65535)
    problem = "master port " + std::to_string(options.masterPort) +
              " is not a TCP port";
  else if (options.timeout.count() <= 0)
    problem = "the timeout (" + std::to_string(options.timeout.count()) +
              " ms) is not positive";
  else if (options.masterAddr.empty())
    problem = "the master address is empty";
  if (!problem.empty())
    throw Error("connectNccl: " + problem,
                "Pass RANK in [0, WORLD_SIZE), a MASTER_PORT in [1, 65535], "
                "a non-empty MASTER_ADDR and a positive DLOSS_TIMEOUT_S");

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
  checkOptions(options, device);
  Clock::time_point until = Clock::now() + options.timeout;
  DeviceGuard guard(device);

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

  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = compat::openTcpStore(options);
  } catch (const std::exception &e) {
    std::string detail = compat::describe(e);
    if (options.rank == 0)
      throw rendezvousError(
          options,
          "rank 0 could not host the rendezvous store on port " +
              std::to_string(options.masterPort) + " (" + detail + ")",
          "Another process (perhaps an earlier job, or this job's Gloo "
          "communicator) may hold MASTER_PORT=" +
              std::to_string(options.masterPort) +
              ": pick a free port or stop that process");
    throw rendezvousError(
        options,
        "could not reach the rendezvous store of rank 0 at " +
            storeAddress(options) + " within the deadline of " +
            seconds(options.timeout) + ": rank 0 never joined (" + detail + ")",
        "Rank 0 hosts the store: check that it was started and that its log "
        "shows no earlier error, that every rank uses the same MASTER_ADDR "
        "and MASTER_PORT, or raise DLOSS_TIMEOUT_S if rank 0 starts late");
  }

  try {
    if (options.rank == 0)
      store->set(kUniqueIdKey,
                 std::vector<uint8_t>(reinterpret_cast<const uint8_t *>(&id),
                                      reinterpret_cast<const uint8_t *>(&id) +
                                          sizeof(id)));
    rendezvous(*store, options, until);
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
  } catch (const Error &) {
    throw;
  } catch (const std::exception &e) {
    throw rendezvousError(
        options,
        "lost the rendezvous store of rank 0 at " + storeAddress(options) +
            " during the rendezvous (" + compat::describe(e) + ")",
        "Rank 0 probably failed or gave up: check its log for the first "
        "error");
  }

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
      problem = "did not complete within the deadline of " +
                seconds(options.timeout);
    else if (state == ncclInProgress)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    result = state;
  }
  if (problem.empty() && result != ncclSuccess)
    problem = std::string("failed: ") + ncclGetErrorString(result) + " (" +
              ncclGetLastError(comm) + ")";
  auto readyKey = [](int rank) { return kReadyPrefix + std::to_string(rank); };
  if (!problem.empty()) {
    if (comm)
      (void)ncclCommAbort(comm);
    std::string peers;
    try {
      std::vector<int> missing;
      for (int r = 0; r < options.worldSize; ++r)
        if (r != options.rank && !store->check({readyKey(r)}))
          missing.push_back(r);
      if (!missing.empty())
        peers = std::string(missing.size() == 1 ? ": rank " : ": ranks ") +
                joinRanks(missing) +
                " never initialised theirs (check whether they died or "
                "failed)";
    } catch (const std::exception &) {
      peers = ": rank 0, which hosts the rendezvous store, is unreachable "
              "(it probably died)";
    }
    throw rendezvousError(
        options,
        "the NCCL communicator on cuda:" + std::to_string(device) + " " +
            problem + peers,
        "Check the other ranks' logs; NCCL_DEBUG=WARN shows NCCL's view. "
        "Each rank needs its own GPU: NCCL refuses two ranks on one device");
  }
  try {
    store->set(readyKey(options.rank), toBytes("1"));
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
