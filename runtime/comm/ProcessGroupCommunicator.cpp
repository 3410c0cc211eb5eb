// The c10d engine: Communicator over any c10d ProcessGroup (the one
// connectGloo builds, or the user's torch.distributed group).
// Every c10d collective call of the project lives in this file; the store
// (TCPStore), the rendezvous and the failure diagnosis it shares with the
// NCCL engine live in StoreRendezvous.cpp and PeerStates.cpp, the contract
// every engine keeps (checks, numbering, flight record) in
// ContractCommunicator.cpp, and connectGloo's setup in GlooCommunicator.cpp.
// A torch 2.x ProcessGroup holds one Backend per device type (the default
// group of init_process_group() is "cpu:gloo,cuda:nccl"), so the engine that
// moves a tensor is decided by the tensor's device, never by the group's name.
#include "runtime/comm/ContractCommunicator.h"
#include "runtime/comm/RingBuffers.h"
#include "runtime/comm/ProcessGroupEngine.h"


#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <numeric>
#include <optional>

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
// Collectives: Work::wait's own limit is the deadline plus this margin, so
// that Gloo's deadline (the same timeout, inside the worker thread) fires
// first and reports more precisely; it only guards against a stuck thread.
constexpr std::chrono::milliseconds kWaitMargin{2000};

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
  if (!group.hasBackendForDeviceType(device))
    return "";
  return group.getBackend(device)->getBackendName();
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

class ProcessGroupCommunicator final : public ContractCommunicator {
public:
  /// Without a store, peers' states are not recorded (failures still name
  /// the collective and its number).
  ProcessGroupCommunicator(RendezvousOptions options,
                           c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::ProcessGroup> group)
      : ContractCommunicator(
            options,
            store ? std::make_unique<PeerStates>(std::move(store), options)
                  : nullptr,
            wordingOf(*group)),
        group(std::move(group)) {}
  // Closing the Gloo pairs first (before PeerStates' destructor keeps a
  // failed rank 0's store up) makes peers still blocked on this rank fail
  // now rather than at their deadline.
  ~ProcessGroupCommunicator() override { group.reset(); }

  /// A Gloo allreduce of one element: returns once every rank has finished
  /// building its process group.
  void barrier(Call &call);

  /// Runs `body`, turning any c10d or Gloo failure into a dloss::Error. After
  /// a failure the group's state is unknown (a peer may be gone, a
  /// collective half done), so every later call fails fast. A collective
  /// (begun with begin()) is marked completed or failed in the flight
  /// recorder, and its failure names the peers' states.
  template <typename Body>
  auto communicate(Call &call, Body &&body) -> decltype(body());

  /// Waits for a collective's `work`; throws what the work threw.
  void awaitCollective(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout + kWaitMargin);
  }
  /// Waits for a send or recv, whose only deadline is this one.
  void awaitTransfer(const c10::intrusive_ptr<c10d::Work> &work) const {
    work->wait(options.timeout);
  }
  /// One ring step's transfers; null where the tensor was empty.
  struct Swap {
    c10::intrusive_ptr<c10d::Work> in, out;
  };
  /// Posts the recv of `received` from `src` before the send of `data` to
  /// `dst`, so no cycle of the ring waits on another. Every rank knows both
  /// sizes, so both ends skip empty tensors.
  Swap postSwap(const at::Tensor &received, const at::Tensor &data, int src,
                int dst, int tag) {
    std::vector<at::Tensor> recvWire{toWire(received)};
    std::vector<at::Tensor> sendWire{toWire(data)};
    Swap swap;
    if (received.numel() > 0)
      swap.in = group->recv(recvWire, src, tag);
    if (data.numel() > 0)
      swap.out = group->send(sendWire, dst, tag);
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
  std::vector<int64_t>
  transferAllGatherInts(Call &call,
                        const std::vector<int64_t> &values) override;
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
  /// The summed/maxed/minned tensor; Mean is left to the caller to divide.
  at::Tensor reduce(Call &call, const at::Tensor &input, Reduction op);

  /// Whether `tensor` travels through Gloo (which reduces no bfloat16).
  bool onGloo(const at::Tensor &tensor) const {
    return backendFor(*group, tensor.device().type()) == "gloo";
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

// A send or recv in flight. It refers to its communicator, which must outlive
// it (the plan executor waits on every request before returning).
class ProcessGroupRequest final : public Communicator::Request {
public:
  ProcessGroupRequest(ProcessGroupCommunicator *owner, Call call,
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
  ProcessGroupCommunicator *owner;
  Call call;
  c10::intrusive_ptr<c10d::Work> work; // Null for empty tensors.
  at::Tensor wire;
  at::Tensor target;
  bool done = false;
};

template <typename Body>
auto ProcessGroupCommunicator::communicate(Call &call, Body &&body)
    -> decltype(body()) {
  refuseIfBroken(call);
  std::string detail;
  try {
    return runAndComplete(call, body);
  } catch (const Error &e) {
    // Our own checks after data moved (a malformed ringShift header).
    breakOn(call, e);
    throw;
  } catch (const std::exception &e) {
    detail = describeError(e);
  } catch (...) {
    detail = "unknown exception";
  }
  if (!call.transfer.empty())
    detail = call.transfer + ": " + detail;
  throw diagnose(call, detail, looksLikeTimeout(detail));
}

void ProcessGroupCommunicator::checkDevice(const Call &call,
                                   const at::Tensor &tensor) const {
  if (!backendFor(*group, tensor.device().type()).empty())
    return;
  std::string cpu = backendFor(*group, c10::DeviceType::CPU);
  std::string cuda = backendFor(*group, c10::DeviceType::CUDA);
  std::string moves = !cpu.empty() && !cuda.empty()
                          ? "CPU tensors (" + cpu + ") and CUDA tensors (" + cuda + ")"
                      : !cpu.empty() ? "CPU tensors (" + cpu + ")"
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
  if (paddedNumel == 0) {
    complete(call);
    return at::empty(resultShape, input.options());
  }

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

at::Tensor ProcessGroupCommunicator::reduce(Call &call, const at::Tensor &input,
                                    Reduction op) {
  // The copy is what Gloo reduces in place: the caller's tensor stays as
  // is. Gloo has no bfloat16 arithmetic: such tensors are summed in float32
  // (exact for the inputs, one rounding at the end).
  bool widen = onGloo(input) && input.scalar_type() == at::kBFloat16;
  at::Tensor result = widen ? input.to(at::kFloat).contiguous()
                            : input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{result};
    c10d::AllreduceOptions reduceOptions;
    reduceOptions.reduceOp = toC10d(op);
    awaitCollective(group->allreduce(tensors, reduceOptions));
  });
  return widen ? result.to(at::kBFloat16) : result;
}

at::Tensor ProcessGroupCommunicator::transferAllReduce(Call &call,
                                               const at::Tensor &input,
                                               Reduction op) {
  at::Tensor result = reduce(call, input, op);
  if (op == Reduction::Mean)
    result.div_(options.worldSize);
  return result;
}

at::Tensor
ProcessGroupCommunicator::transferReduceScatter(Call &call, const at::Tensor &input,
                                        Reduction op, int64_t dim,
                                        const std::vector<int64_t> &sizes) {
  int n = options.worldSize;
  int rank = options.rank;
  if (n == 1) { // The only block is the whole input.
    complete(call);
    return input.clone(at::MemoryFormat::Contiguous);
  }
  // Block b is rank b's slice [offsets[b], offsets[b] + sizes[b]) of `dim`.
  std::vector<int64_t> offsets(n, 0);
  for (int b = 1; b < n; ++b)
    offsets[b] = offsets[b - 1] + sizes[b - 1];
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
        awaitTransfer(swap.in);
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
        awaitTransfer(swap.out);
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
  at::Tensor result = input.clone(at::MemoryFormat::Contiguous);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{toWire(result)};
    c10d::BroadcastOptions broadcastOptions;
    broadcastOptions.rootRank = root;
    awaitCollective(group->broadcast(tensors, broadcastOptions));
  });
  return result;
}

at::Tensor ProcessGroupCommunicator::transferRingShift(Call &call,
                                               const at::Tensor &input,
                                               const ShiftPeers &ring) {
  int dst = ring.dst, src = ring.src;
  if (ring.step == 0) {
    complete(call);
    return input.clone(); // Every rank keeps its own tensor.
  }

  at::Tensor data = input.contiguous();
  at::Tensor sendHeader = at::empty({kHeaderLength}, at::kLong);
  writeShiftHeader(data, sendHeader.data_ptr<int64_t>());
  at::Tensor recvHeader = at::empty({kHeaderLength}, at::kLong);

  return communicate(call, [&] {
    // Every rank posts its receive before waiting on its send, so no cycle
    // of the ring waits on another (any shift, N = 2 included).
    std::vector<at::Tensor> recvHeaders{recvHeader};
    std::vector<at::Tensor> sendHeaders{sendHeader};
    auto headerIn = group->recv(recvHeaders, src, kRingShiftHeaderTag);
    auto headerOut = group->send(sendHeaders, dst, kRingShiftHeaderTag);
    awaitTransfer(headerIn);

    at::Tensor received =
        fromShiftHeader(call, recvHeader.data_ptr<int64_t>(), src, data);

    // Both ends know both sizes now.
    Swap swap = postSwap(received, data, src, dst, kRingShiftDataTag);
    if (swap.in)
      awaitTransfer(swap.in);
    awaitTransfer(headerOut);
    if (swap.out)
      awaitTransfer(swap.out);
    return received;
  });
}

std::vector<int64_t>
ProcessGroupCommunicator::transferAllGatherInts(Call &call,
                                        const std::vector<int64_t> &values) {
  if (values.empty()) {
    complete(call);
    return {};
  }
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
ProcessGroupCommunicator::transferSend(Call &call, const at::Tensor &tensor, int peer,
                               int tag) {
  // The request keeps `wire` alive until Gloo has read it.
  at::Tensor wire = toWire(tensor.contiguous());
  if (wire.numel() == 0)
    return std::make_unique<ProcessGroupRequest>(
        this, call, c10::intrusive_ptr<c10d::Work>(), wire, at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->send(tensors, peer, tag);
  });
  return std::make_unique<ProcessGroupRequest>(this, call, std::move(work), wire,
                                       at::Tensor());
}

std::unique_ptr<Communicator::Request>
ProcessGroupCommunicator::transferRecv(Call &call, at::Tensor &tensor, int peer,
                               int tag) {
  // Receive in place when Gloo can; otherwise stage and copy in wait().
  at::Tensor wire;
  if (tensor.is_contiguous() && glooHasType(tensor.scalar_type()))
    wire = tensor;
  else
    wire = toWire(at::empty(tensor.sizes(), tensor.options()));
  if (wire.numel() == 0)
    return std::make_unique<ProcessGroupRequest>(this, call,
                                         c10::intrusive_ptr<c10d::Work>(),
                                         at::Tensor(), at::Tensor());
  auto work = communicate(call, [&] {
    std::vector<at::Tensor> tensors{wire};
    return group->recv(tensors, peer, tag);
  });
  return std::make_unique<ProcessGroupRequest>(this, call, std::move(work), wire,
                                       tensor);
}

void ProcessGroupCommunicator::barrier(Call &call) {
  at::Tensor token = at::ones({1}, at::kInt);
  begin(call, &token);
  communicate(call, [&] {
    std::vector<at::Tensor> tensors{token};
    awaitCollective(group->allreduce(tensors));
  });
}

} // namespace

std::unique_ptr<Communicator>
makeProcessGroupCommunicator(RendezvousOptions options,
                             c10::intrusive_ptr<c10d::Store> store,
                             c10::intrusive_ptr<c10d::ProcessGroup> group,
                             bool checkConnection) {
  if (!group)
    throw Error("no process group to run on",
                "Initialise torch.distributed (or call dloss.init()) first");
  options.rank = group->getRank();
  options.worldSize = group->getSize();
  auto communicator = std::make_unique<ProcessGroupCommunicator>(
      std::move(options), std::move(store), std::move(group));
  if (checkConnection) {
    Call check{"the connection check after the rendezvous", ""};
    communicator->barrier(check);
  }
  return communicator;
}

} // namespace dloss
