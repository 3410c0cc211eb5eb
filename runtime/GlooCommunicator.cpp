// The Gloo engine: Communicator over c10d's ProcessGroupGloo and TCPStore.
// Every c10d call of the project lives in this file. Setup (store, device,
// process group) and error text go through namespace `compat`, the place to
// adapt when c10d changes; the collective calls themselves (allgather,
// allreduce, broadcast, send, recv, Work::wait) read the same in LibTorch
// 1.13 and 2.x.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO // ProcessGroupGloo.hpp is empty without it.
#endif

#include "runtime/Communicator.h"
#include "runtime/Error.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>

namespace dloss {

namespace {

using Clock = std::chrono::steady_clock;

//===----------------------------------------------------------------------===//
// Version-sensitive c10d calls (LibTorch 1.13 and 2.x)
//===----------------------------------------------------------------------===//

namespace compat {

// Rank 0 hosts the server. waitWorkers stays off: TCPStore's own join wait
// cannot say which ranks are missing and destroys the store when it gives up;
// the arrival protocol in rendezvous() waits for every rank instead.
c10::intrusive_ptr<c10d::Store> openTcpStore(const RendezvousOptions &options) {
  c10d::TCPStoreOptions storeOptions;
  storeOptions.port = static_cast<std::uint16_t>(options.masterPort);
  storeOptions.isServer = options.rank == 0;
  storeOptions.numWorkers = static_cast<std::size_t>(options.worldSize);
  storeOptions.waitWorkers = false;
  storeOptions.timeout = options.timeout;
  return c10::make_intrusive<c10d::TCPStore>(options.masterAddr, storeOptions);
}

// The address Gloo listens on: GLOO_SOCKET_IFNAME as in torch.distributed,
// else the master address when it is local (single-host jobs, loopback
// tests), else this host's own name (multi-host jobs, where binding to rank
// 0's address would fail).
std::shared_ptr<::gloo::transport::Device>
makeDevice(const std::string &masterAddr) {
  if (const char *interface = std::getenv("GLOO_SOCKET_IFNAME"))
    if (*interface)
      return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  try {
    return c10d::ProcessGroupGloo::createDeviceForHostname(masterAddr);
  } catch (const std::exception &) {
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }
}

c10::intrusive_ptr<c10d::ProcessGroupGloo>
makeProcessGroup(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                 int worldSize,
                 std::shared_ptr<::gloo::transport::Device> device,
                 std::chrono::milliseconds timeout) {
  auto groupOptions = c10d::ProcessGroupGloo::Options::create(timeout);
  groupOptions->devices.push_back(std::move(device));
  // One worker thread: calls are synchronous, so a second thread would only
  // idle, and the machines running many ranks are short of cores.
  groupOptions->threads = 1;
  // A prefix keeps Gloo's keys apart from the rendezvous keys.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dloss/gloo", store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, worldSize,
                                                     groupOptions);
}

// c10::Error::what() appends a C++ backtrace; users need the message only.
std::string describe(const std::exception &e) {
  std::string text;
  if (const auto *c10Error = dynamic_cast<const c10::Error *>(&e))
    text = c10Error->what_without_backtrace();
  else
    text = e.what();
  // Keep the first line: later lines are backtraces or debug dumps.
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
// Helpers
//===----------------------------------------------------------------------===//

// Tags at or above this value are the engine's own (ringShift); user tags
// stay below so a ring schedule can never steal the engine's messages.
constexpr int kReservedTagBase = 1 << 30;
constexpr int kRingShiftHeaderTag = kReservedTagBase;
constexpr int kRingShiftDataTag = kReservedTagBase + 1;
// ringShift header: [ndim, dtype, sizes...]; fixed length so the receiver can
// post it before knowing anything.
constexpr int64_t kMaxDims = 64;
constexpr int64_t kHeaderLength = 2 + kMaxDims;
// Collectives: Work::wait's own limit is the deadline plus this margin, so
// that Gloo's deadline (the same timeout, inside the worker thread) fires
// first and reports more precisely; it only guards against a stuck thread.
constexpr std::chrono::milliseconds kWaitMargin{2000};
constexpr std::chrono::milliseconds kPollInterval{20};
// How long rank 0 keeps the store up after a failed rendezvous so that the
// other ranks can read the verdict.
constexpr std::chrono::milliseconds kVerdictLinger{2000};

const char *const kArrivedPrefix = "dloss/arrived/";
const char *const kArrivedCountKey = "dloss/arrived-count";
const char *const kVerdictKey = "dloss/verdict";
const char *const kVerdictAckKey = "dloss/verdict-acks";

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

bool looksLikeTimeout(const std::string &message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return lower.find("timed out") != std::string::npos ||
         lower.find("timeout") != std::string::npos;
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

const char *reductionName(Reduction op) {
  switch (op) {
  case Reduction::Sum:
    return "Sum";
  case Reduction::Mean:
    return "Mean";
  case Reduction::Max:
    return "Max";
  case Reduction::Min:
    return "Min";
  }
  return "?";
}

// What a failing call reports: the method and, when one exists, the IR op a
// plan step lowers to it (which callers may replace with their own context).
struct Call {
  std::string name;
  std::string irOp;
};

//===----------------------------------------------------------------------===//
// GlooCommunicator
//===----------------------------------------------------------------------===//

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(RendezvousOptions options,
                   c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : options(std::move(options)), store(std::move(store)),
        group(std::move(group)) {}

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

  /// A Gloo allreduce of one element: returns once every rank has finished
  /// building its process group, so none needs the store any more.
  void barrier(const Call &call);

  /// Runs `body`, turning any c10d or Gloo failure into a dloss::Error. After
  /// a failure the group's state is unknown (a peer may be gone, a
  /// collective half done), so every later call fails fast.
  template <typename Body>
  auto communicate(const Call &call, Body &&body) -> decltype(body());

  /// Waits for a collective's `work`; throws what the work threw.
  void awaitCollective(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout + kWaitMargin);
  }
  /// Waits for a send or recv, whose only deadline is this one.
  void awaitTransfer(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout);
  }

private:
  Error fail(const Call &call, std::string problem, std::string hint) const {
    ErrorInfo info;
    info.problem = std::move(problem);
    info.hint = std::move(hint);
    info.rank = options.rank;
    info.op = call.irOp;
    return Error(std::move(info));
  }

  std::string where() const {
    return "on rank " + std::to_string(options.rank) + " of " +
           std::to_string(options.worldSize);
  }

  void checkCpu(const Call &call, const at::Tensor &tensor) const;
  void checkReducible(const Call &call, const at::Tensor &tensor,
                      Reduction op) const;
  int64_t checkAxis(const Call &call, const at::Tensor &tensor,
                    int64_t axis) const;
  void checkSizes(const Call &call, const std::vector<int64_t> &sizes) const;
  void checkPeer(const Call &call, int peer, int tag) const;
  /// The summed/maxed/minned tensor; Mean is left to the caller to divide.
  at::Tensor reduce(const Call &call, const at::Tensor &input, Reduction op);

  RendezvousOptions options;
  // Declared before the group so that it is destroyed after it.
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  /// Why the communicator is unusable; empty while it is healthy.
  std::string broken;
};

// A send or recv in flight. It refers to its communicator, which must outlive
// it (the plan executor waits on every request before returning).
class GlooRequest final : public Communicator::Request {
public:
  GlooRequest(GlooCommunicator *owner, Call call,
              c10::intrusive_ptr<c10d::Work> work, at::Tensor wire,
              at::Tensor target)
      : owner(owner), call(std::move(call)), work(std::move(work)),
        wire(std::move(wire)), target(std::move(target)) {}

  void wait() override {
    if (done)
      return;
    owner->communicate(call, [&] {
      if (work)
        owner->awaitTransfer(work);
      // A recv into a non-contiguous or non-Gloo-dtype tensor went through
      // a staging buffer.
      if (target.defined() && wire.defined() && !wire.is_same(target))
        target.copy_(fromWire(wire, target.scalar_type(), target.sizes()));
    });
    done = true;
  }

private:
  GlooCommunicator *owner;
  Call call;
  c10::intrusive_ptr<c10d::Work> work; // Null for empty tensors.
  at::Tensor wire;
  at::Tensor target;
  bool done = false;
};

template <typename Body>
auto GlooCommunicator::communicate(const Call &call, Body &&body)
    -> decltype(body()) {
  if (!broken.empty())
    throw fail(call,
               call.name + " cannot run " + where() +
                   ": the communicator is unusable after an earlier failure (" +
                   broken + ")",
               "Handle the first error: the job has to be restarted once a "
               "collective has failed");
  std::string detail;
  try {
    return body();
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header).
    broken = call.name + ": " + e.problem();
    throw;
  } catch (const std::exception &e) {
    detail = compat::describe(e);
  } catch (...) {
    detail = "unknown exception";
  }
  broken = call.name + " failed: " + detail;
  if (looksLikeTimeout(detail))
    throw fail(call,
               call.name + " timed out " + where() + " after the deadline of " +
                   seconds(options.timeout) + " (" + detail + ")",
               "Some rank did not reach this collective in time: check the "
               "other ranks' logs for an earlier error or a hang, make sure "
               "every rank makes the same collective calls in the same order, "
               "or raise DLOSS_TIMEOUT_S if the ranks are only slow");
  throw fail(call, call.name + " failed " + where() + ": " + detail,
             "A peer rank probably failed or exited: check the other ranks' "
             "logs for the first error (this one is a consequence)");
}

void GlooCommunicator::checkCpu(const Call &call,
                                const at::Tensor &tensor) const {
  if (!tensor.defined())
    throw fail(call, call.name + " got an undefined tensor " + where(),
               "Pass a tensor");
  if (!tensor.device().is_cpu())
    throw fail(call,
               call.name + " got a tensor on " + tensor.device().str() + " " +
                   where() + ", but the Gloo engine moves CPU tensors",
               "Move the tensor to the CPU, or use the NCCL engine for GPU "
               "tensors");
}

void GlooCommunicator::checkReducible(const Call &call,
                                      const at::Tensor &tensor,
                                      Reduction op) const {
  at::ScalarType type = tensor.scalar_type();
  if (op == Reduction::Mean && !at::isFloatingType(type))
    throw fail(call,
               call.name + " Mean of an integer tensor (" +
                   c10::toString(type) + ") is not defined " + where(),
               "Convert the tensor to a floating type, or reduce with Sum and "
               "divide by the world size");
  if (!glooHasType(type))
    throw fail(call,
               call.name + " " + reductionName(op) + " of a " +
                   c10::toString(type) + " tensor is not supported by Gloo " +
                   where(),
               "Convert to float, double, half or an integer type first");
}

int64_t GlooCommunicator::checkAxis(const Call &call, const at::Tensor &tensor,
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

void GlooCommunicator::checkSizes(const Call &call,
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

void GlooCommunicator::checkPeer(const Call &call, int peer, int tag) const {
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
               "Use tags in [0, 2^30); larger ones are reserved for the "
               "engine's own ringShift");
}

at::Tensor GlooCommunicator::allGather(const at::Tensor &input, int64_t axis,
                                       const std::vector<int64_t> &sizes) {
  Call call{"allGather", "dloss.all_gather"};
  checkCpu(call, input);
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

  // Gloo gathers equal shapes: pad every piece to the largest size.
  int64_t maxSize = *std::max_element(sizes.begin(), sizes.end());
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int64_t> paddedShape = input.sizes().vec();
  paddedShape[dim] = maxSize;
  std::vector<int64_t> resultShape = input.sizes().vec();
  resultShape[dim] = total;
  int64_t paddedNumel = std::accumulate(paddedShape.begin(), paddedShape.end(),
                                        int64_t{1}, std::multiplies<>());
  // Every rank knows the sizes, so all skip together when nothing would move.
  if (paddedNumel == 0)
    return at::empty(resultShape, input.options());

  at::Tensor padded = at::zeros(paddedShape, input.options());
  padded.narrow(dim, 0, input.size(dim)).copy_(input);
  return communicate(call, [&] {
    std::vector<at::Tensor> inputs{toWire(padded)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(at::empty_like(inputs[0]));
    awaitCollective(group->allgather(outputs, inputs));
    std::vector<at::Tensor> pieces;
    for (int r = 0; r < options.worldSize; ++r)
      pieces.push_back(fromWire(outputs[0][r], input.scalar_type(), paddedShape)
                           .narrow(dim, 0, sizes[r]));
    return at::cat(pieces, dim);
  });
}

at::Tensor GlooCommunicator::reduce(const Call &call, const at::Tensor &input,
                                    Reduction op) {
  // The clone is what Gloo reduces in place: the caller's tensor stays as is.
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0)
    return result;
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{result};
    c10d::AllreduceOptions reduceOptions;
    reduceOptions.reduceOp = toC10d(op);
    awaitCollective(group->allreduce(tensors, reduceOptions));
  });
  return result;
}

at::Tensor GlooCommunicator::allReduce(const at::Tensor &input, Reduction op) {
  Call call{"allReduce", "dloss.all_reduce"};
  checkCpu(call, input);
  checkReducible(call, input, op);
  at::Tensor result = reduce(call, input, op);
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor GlooCommunicator::reduceScatter(const at::Tensor &input,
                                           Reduction op, int64_t axis,
                                           const std::vector<int64_t> &sizes) {
  Call call{"reduceScatter", "dloss.reduce_scatter"};
  checkCpu(call, input);
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
  // ProcessGroupGloo has no reduce_scatter (1.13): reduce everything, keep
  // this rank's slice. The clone frees the other ranks' slices.
  at::Tensor reduced = reduce(call, input, op);
  int64_t offset =
      std::accumulate(sizes.begin(), sizes.begin() + options.rank, int64_t{0});
  at::Tensor slice = reduced.narrow(dim, offset, sizes[options.rank]).clone();
  if (op == Reduction::Mean)
    slice.div_(options.worldSize);
  return slice;
}

at::Tensor GlooCommunicator::broadcast(const at::Tensor &input, int root) {
  Call call{"broadcast", "dloss.broadcast"};
  checkCpu(call, input);
  if (root < 0 || root >= options.worldSize)
    throw fail(call,
               "broadcast root " + std::to_string(root) + " is not a rank " +
                   where(),
               "Pass a root in [0, world size)");
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  if (result.numel() == 0)
    return result;
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{toWire(result)};
    c10d::BroadcastOptions broadcastOptions;
    broadcastOptions.rootRank = root;
    awaitCollective(group->broadcast(tensors, broadcastOptions));
  });
  return result;
}

at::Tensor GlooCommunicator::ringShift(const at::Tensor &input, int64_t shift) {
  Call call{"ringShift", "dloss.ring_shift"};
  checkCpu(call, input);
  int64_t n = options.worldSize;
  int64_t step = ((shift % n) + n) % n;
  if (step == 0)
    return input.clone(); // Every rank keeps its own tensor.
  if (input.dim() > kMaxDims)
    throw fail(call,
               "ringShift of a " + std::to_string(input.dim()) + "-d tensor " +
                   where() + " exceeds the limit of " +
                   std::to_string(kMaxDims) + " dimensions",
               "Reshape the tensor to fewer dimensions before the shift");
  int dst = static_cast<int>((options.rank + step) % n);
  int src = static_cast<int>((options.rank - step + n) % n);

  at::Tensor data = input.contiguous();
  at::Tensor sendHeader = at::zeros({kHeaderLength}, at::kLong);
  auto *header = sendHeader.data_ptr<int64_t>();
  header[0] = data.dim();
  header[1] = static_cast<int64_t>(data.scalar_type());
  for (int64_t d = 0; d < data.dim(); ++d)
    header[2 + d] = data.size(d);
  at::Tensor recvHeader = at::empty({kHeaderLength}, at::kLong);

  return communicate(call, [&] {
    // Every rank posts its receive before waiting on its send, so no cycle
    // of the ring waits on another (any shift, N = 2 included).
    std::vector<at::Tensor> recvHeaders{recvHeader};
    std::vector<at::Tensor> sendHeaders{sendHeader};
    auto headerIn = group->recv(recvHeaders, src, kRingShiftHeaderTag);
    auto headerOut = group->send(sendHeaders, dst, kRingShiftHeaderTag);
    awaitTransfer(headerIn);

    const auto *in = recvHeader.data_ptr<int64_t>();
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
    std::vector<at::Tensor> recvData{toWire(received)};
    std::vector<at::Tensor> sendData{toWire(data)};
    c10::intrusive_ptr<c10d::Work> dataIn, dataOut;
    if (received.numel() > 0)
      dataIn = group->recv(recvData, src, kRingShiftDataTag);
    if (data.numel() > 0)
      dataOut = group->send(sendData, dst, kRingShiftDataTag);
    if (dataIn)
      awaitTransfer(dataIn);
    awaitTransfer(headerOut);
    if (dataOut)
      awaitTransfer(dataOut);
    return received;
  });
}

std::vector<int64_t>
GlooCommunicator::allGatherInts(const std::vector<int64_t> &values) {
  Call call{"allGatherInts", ""};
  if (values.empty())
    return {};
  at::Tensor local =
      at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), local.data_ptr<int64_t>());
  return communicate(call, [&] {
    std::vector<at::Tensor> inputs{local};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < options.worldSize; ++r)
      outputs[0].push_back(at::empty_like(local));
    awaitCollective(group->allgather(outputs, inputs));
    std::vector<int64_t> gathered;
    gathered.reserve(values.size() * options.worldSize);
    for (const at::Tensor &piece : outputs[0])
      gathered.insert(gathered.end(), piece.data_ptr<int64_t>(),
                      piece.data_ptr<int64_t>() + piece.numel());
    return gathered;
  });
}

std::unique_ptr<Communicator::Request>
GlooCommunicator::send(const at::Tensor &tensor, int peer, int tag) {
  Call call{"send to rank " + std::to_string(peer) + " (tag " +
                std::to_string(tag) + ")",
            ""};
  checkCpu(call, tensor);
  checkPeer(call, peer, tag);
  // The request keeps `wire` alive until Gloo has read it.
  at::Tensor wire = toWire(tensor.contiguous());
  if (wire.numel() == 0)
    return std::make_unique<GlooRequest>(
        this, call, c10::intrusive_ptr<c10d::Work>(), wire, at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->send(tensors, peer, tag);
  });
  return std::make_unique<GlooRequest>(this, call, std::move(work), wire,
                                       at::Tensor());
}

std::unique_ptr<Communicator::Request>
GlooCommunicator::recv(at::Tensor &tensor, int peer, int tag) {
  Call call{"recv from rank " + std::to_string(peer) + " (tag " +
                std::to_string(tag) + ")",
            ""};
  checkCpu(call, tensor);
  checkPeer(call, peer, tag);
  // Receive in place when Gloo can; otherwise stage and copy in wait().
  at::Tensor wire;
  if (tensor.is_contiguous() && glooHasType(tensor.scalar_type()))
    wire = tensor;
  else
    wire = toWire(at::empty(tensor.sizes(), tensor.options()));
  if (wire.numel() == 0)
    return std::make_unique<GlooRequest>(this, call,
                                         c10::intrusive_ptr<c10d::Work>(),
                                         at::Tensor(), at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->recv(tensors, peer, tag);
  });
  return std::make_unique<GlooRequest>(this, call, std::move(work), wire,
                                       tensor);
}

void GlooCommunicator::barrier(const Call &call) {
  at::Tensor token = at::ones({1}, at::kInt);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{token};
    awaitCollective(group->allreduce(tensors));
  });
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

std::vector<int> missingRanks(c10d::Store &store, int worldSize) {
  std::vector<int> missing;
  for (int r = 0; r < worldSize; ++r)
    if (!store.check({arrivedKey(r)}))
      missing.push_back(r);
  return missing;
}

// The first proposal stored wins, so every rank acts on the same verdict:
// "ok", or "missing:<ranks>" from the first rank whose deadline passed.
std::string decide(c10d::Store &store, const std::string &proposal) {
  return fromBytes(store.compareSet(kVerdictKey, {}, toBytes(proposal)));
}

// Waits until every rank has announced itself in the store, or fails on
// every rank alike, naming the ranks that never came.
void rendezvous(c10d::Store &store, const RendezvousOptions &options,
                Clock::time_point deadline) {
  int n = options.worldSize;
  store.set(arrivedKey(options.rank), toBytes("1"));
  store.add(kArrivedCountKey, 1);

  std::string verdict;
  while (verdict.empty()) {
    if (store.add(kArrivedCountKey, 0) >= n) {
      verdict = decide(store, "ok");
    } else if (store.check({kVerdictKey})) {
      verdict = fromBytes(store.get(kVerdictKey));
    } else if (Clock::now() >= deadline) {
      std::vector<int> missing = missingRanks(store, n);
      verdict = decide(
          store, missing.empty() ? "ok" : "missing:" + joinRanks(missing));
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  if (verdict == "ok")
    return;

  std::string missing = verdict.substr(verdict.find(':') + 1);
  size_t missingCount = std::count(missing.begin(), missing.end(), ',') + 1;
  if (options.rank == 0) {
    // The store dies with rank 0: keep it up until the ranks that did arrive
    // have read the verdict, or briefly.
    int64_t expectedAcks = n - static_cast<int64_t>(missingCount) - 1;
    auto lingerEnd = Clock::now() + kVerdictLinger;
    while (store.add(kVerdictAckKey, 0) < expectedAcks &&
           Clock::now() < lingerEnd)
      std::this_thread::sleep_for(kPollInterval);
  } else {
    store.add(kVerdictAckKey, 1);
  }
  throw rendezvousError(
      options,
      "the rendezvous of " + std::to_string(n) + " ranks at " +
          storeAddress(options) + " did not complete within the deadline of " +
          seconds(options.timeout) + ": " +
          (missingCount == 1 ? "rank " + missing + " never joined"
                             : "ranks " + missing + " never joined"),
      "Start every rank from 0 to " + std::to_string(n - 1) +
          " with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE; if the "
          "missing ranks were started, check their logs for an error before "
          "the rendezvous, or raise DLOSS_TIMEOUT_S if they start late");
}

void checkOptions(const RendezvousOptions &options) {
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
    throw Error("connectGloo: " + problem,
                "Pass RANK in [0, WORLD_SIZE), a MASTER_PORT in [1, 65535], "
                "a non-empty MASTER_ADDR and a positive DLOSS_TIMEOUT_S");
}

} // namespace

std::unique_ptr<Communicator> connectGloo(const RendezvousOptions &options) {
  checkOptions(options);
  Clock::time_point deadline = Clock::now() + options.timeout;

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
          "Another process (perhaps an earlier job) may hold MASTER_PORT=" +
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
    rendezvous(*store, options, deadline);
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

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  try {
    group = compat::makeProcessGroup(store, options.rank, options.worldSize,
                                     compat::makeDevice(options.masterAddr),
                                     options.timeout);
  } catch (const std::exception &e) {
    throw rendezvousError(
        options,
        "could not connect the Gloo mesh after the rendezvous (" +
            compat::describe(e) + ")",
        "A peer rank probably failed while connecting: check the other "
        "ranks' logs; on hosts with several network interfaces set "
        "GLOO_SOCKET_IFNAME to the one the ranks share");
  }

  auto communicator =
      std::make_unique<GlooCommunicator>(options, store, std::move(group));
  communicator->barrier(Call{"the connection check after the rendezvous", ""});
  return communicator;
}

} // namespace dloss
