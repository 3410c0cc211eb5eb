// GuardedBackend (GuardedBackend.h): each op described, checked, then run on
// the group's own backend.
#include "runtime/comm/GuardedBackend.h"

#include "runtime/support/Error.h"

#include <c10/core/ScalarType.h>

#include <mutex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace dloss::comm {

namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;

std::string dtypeName(at::ScalarType type) {
  return std::string(c10::getDtypeNames(type).first);
}

std::string shapeOf(const at::Tensor &tensor) {
  std::string text = "[";
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    if (d)
      text += 'x';
    text += std::to_string(tensor.size(d));
  }
  return text + "]";
}

/// "float32[4x3],[2]": the tensors' dtypes (sorted, "/"-joined) and shapes,
/// as the ranks must agree on them; "[]" for none.
std::string describe(const std::vector<at::Tensor> &tensors) {
  if (tensors.empty())
    return "[]";
  std::set<std::string> dtypes;
  std::string shapes;
  for (const at::Tensor &t : tensors) {
    dtypes.insert(dtypeName(t.scalar_type()));
    if (!shapes.empty())
      shapes += ',';
    shapes += shapeOf(t);
  }
  std::string text;
  for (const std::string &d : dtypes) {
    if (!text.empty())
      text += '/';
    text += d;
  }
  return text + shapes;
}

std::string describe(const at::Tensor &tensor) {
  return describe(std::vector<at::Tensor>{tensor});
}

/// "SUM", "AVG", "PREMUL_SUM"...
std::string reduction(const c10d::ReduceOp &op) {
  switch (op.op_) {
  case c10d::ReduceOp::SUM:
    return "SUM";
  case c10d::ReduceOp::AVG:
    return "AVG";
  case c10d::ReduceOp::PRODUCT:
    return "PRODUCT";
  case c10d::ReduceOp::MIN:
    return "MIN";
  case c10d::ReduceOp::MAX:
    return "MAX";
  case c10d::ReduceOp::BAND:
    return "BAND";
  case c10d::ReduceOp::BOR:
    return "BOR";
  case c10d::ReduceOp::BXOR:
    return "BXOR";
  case c10d::ReduceOp::PREMUL_SUM:
    return "PREMUL_SUM";
  default:
    return "UNUSED";
  }
}

/// A send's or recv's work whose first wait compares the op with its peer's
/// record (GuardHooks::verify) before it waits for the transfer.
class VerifiedWork : public Work {
public:
  VerifiedWork(WorkPtr inner, std::function<void()> verify, c10d::OpType type)
      : Work(-1, type), inner(std::move(inner)), verify(std::move(verify)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    verifyOnce();
    return inner->wait(timeout);
  }
  void synchronize() override {
    verifyOnce();
    inner->synchronize();
  }
  bool isCompleted() override { return inner->isCompleted(); }
  bool isSuccess() const override { return inner->isSuccess(); }
  std::exception_ptr exception() const override { return inner->exception(); }
  int sourceRank() const override { return inner->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner->result(); }
  void blockCurrentStream() override {
    verifyOnce();
    inner->blockCurrentStream();
  }
  void abort() override { inner->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return inner->getFuture();
  }

private:
  void verifyOnce() {
    std::function<void()> pending;
    {
      std::lock_guard<std::mutex> lock(mutex);
      pending.swap(verify);
    }
    if (pending)
      pending();
  }

  WorkPtr inner;
  std::mutex mutex;
  std::function<void()> verify;
};

class GuardedBackend : public c10d::Backend {
public:
  GuardedBackend(std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> inner,
                 c10::DeviceType fallback, GuardHooks hooks)
      : Backend(inner.at(fallback)->getRank(), inner.at(fallback)->getSize()),
        inner(std::move(inner)), fallback(fallback), hooks(std::move(hooks)) {
    name();
  }

  bool active() const { return !inner.empty(); }
  void setHooks(GuardHooks next) { hooks = std::move(next); }
  /// Guards again (after release()), around `next`.
  void reset(std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> next,
             c10::DeviceType nextFallback, GuardHooks nextHooks) {
    inner = std::move(next);
    fallback = nextFallback;
    hooks = std::move(nextHooks);
    name();
  }
  /// The backends it wrapped, for the group to take back; idle after.
  std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> release() {
    std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> out;
    out.swap(inner);
    return out;
  }

  /// The backend that runs `device`'s tensors.
  const c10::intrusive_ptr<Backend> &on(c10::DeviceType device) const {
    auto found = inner.find(device);
    return found == inner.end() ? inner.at(fallback) : found->second;
  }

  // -- what the group's backend says of itself ---------------------------
  const std::string getBackendName() const override {
    return on(fallback)->getBackendName();
  }
  bool supportsSplitting() const override {
    return on(fallback)->supportsSplitting();
  }
  bool supportsCoalescing() const override {
    return on(coalescingDevice())->supportsCoalescing();
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    for (auto &[device, backend] : inner)
      backend->setTimeout(timeout);
  }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return on(fallback)->getBackendOptions();
  }
  void setSequenceNumberForGroup() override {
    on(fallback)->setSequenceNumberForGroup();
  }
  uint64_t getSequenceNumberForGroup() override {
    return on(fallback)->getSequenceNumberForGroup();
  }
  void setGroupUid(const std::string &uid) override {
    Backend::setGroupUid(uid);
    for (auto &[device, backend] : inner)
      backend->setGroupUid(uid);
  }
  // abort() and shutdown() stay Backend's no-ops: the group's own backends
  // are in its table beside this one, and get the group's abort and
  // shutdown themselves.
  void waitForPendingWorks() override {
    on(coalescingDevice())->waitForPendingWorks();
  }
  c10d::ErrorType getError() override { return on(fallback)->getError(); }
  void eagerConnectSingleDevice(at::Device device) override {
    on(device.type())->eagerConnectSingleDevice(device);
  }
  bool supportsTensorAlloc(c10::DeviceIndex index) override {
    return on(c10::DeviceType::CUDA)->supportsTensorAlloc(index);
  }
  std::shared_ptr<c10::Allocator> getMemAllocator() override {
    return on(c10::DeviceType::CUDA)->getMemAllocator();
  }
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    return on(options.device().type())->allocateTensor(size, options);
  }

  // -- coalescing (NCCL's batches of ops) ---------------------------------
  void startCoalescing() override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      coalescing = true;
    }
    on(coalescingDevice())->startCoalescing();
  }
  WorkPtr endCoalescing() override {
    std::vector<int64_t> tokens;
    {
      std::lock_guard<std::mutex> lock(mutex);
      coalescing = false;
      tokens.swap(coalesced);
    }
    WorkPtr work = on(coalescingDevice())->endCoalescing();
    if (tokens.empty() || !work)
      return work;
    return c10::make_intrusive<VerifiedWork>(
        work,
        [this, tokens] {
          for (int64_t token : tokens)
            hooks.verify(token);
        },
        c10d::OpType::COALESCED);
  }

  // -- collectives ----------------------------------------------------------
  WorkPtr broadcast(std::vector<at::Tensor> &tensors,
                    const c10d::BroadcastOptions &opts) override {
    check("broadcast " + describe(tensors) + " from rank " +
          std::to_string(opts.rootRank));
    return of(tensors)->broadcast(tensors, opts);
  }
  WorkPtr allreduce(std::vector<at::Tensor> &tensors,
                    const c10d::AllreduceOptions &opts) override {
    check("all_reduce " + describe(tensors) + " " + reduction(opts.reduceOp));
    return of(tensors)->allreduce(tensors, opts);
  }
  WorkPtr allreduce_sparse(std::vector<at::Tensor> &tensors,
                           const c10d::AllreduceOptions &opts) override {
    check("all_reduce_sparse " + describe(tensors) + " " +
          reduction(opts.reduceOp));
    return of(tensors)->allreduce_sparse(tensors, opts);
  }
  WorkPtr
  allreduce_coalesced(std::vector<at::Tensor> &tensors,
                      const c10d::AllreduceCoalescedOptions &opts) override {
    check("all_reduce_coalesced " + describe(tensors) + " " +
          reduction(opts.reduceOp));
    return of(tensors)->allreduce_coalesced(tensors, opts);
  }
  WorkPtr reduce(std::vector<at::Tensor> &tensors,
                 const c10d::ReduceOptions &opts) override {
    check("reduce " + describe(tensors) + " " + reduction(opts.reduceOp) +
          " to rank " + std::to_string(opts.rootRank));
    return of(tensors)->reduce(tensors, opts);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>> &outputs,
                    std::vector<at::Tensor> &inputs,
                    const c10d::AllgatherOptions &opts) override {
    check("all_gather " + describe(inputs));
    return of(inputs)->allgather(outputs, inputs, opts);
  }
  WorkPtr _allgather_base(at::Tensor &output, at::Tensor &input,
                          const c10d::AllgatherOptions &opts) override {
    check("all_gather_into_tensor " + describe(input) + " into " +
          shapeOf(output));
    return on(input.device().type())->_allgather_base(output, input, opts);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                              std::vector<at::Tensor> &inputs,
                              const c10d::AllgatherOptions &opts) override {
    check("all_gather_coalesced " + describe(inputs));
    return of(inputs)->allgather_coalesced(outputs, inputs, opts);
  }
  WorkPtr
  allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                  std::vector<at::Tensor> &inputs,
                                  const c10d::AllgatherOptions &opts) override {
    check("all_gather_into_tensor_coalesced " + describe(inputs));
    return of(inputs)->allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>> &outputs,
                 std::vector<at::Tensor> &inputs,
                 const c10d::GatherOptions &opts) override {
    check("gather " + describe(inputs) + " to rank " +
          std::to_string(opts.rootRank));
    return of(inputs)->gather(outputs, inputs, opts);
  }
  WorkPtr scatter(std::vector<at::Tensor> &outputs,
                  std::vector<std::vector<at::Tensor>> &inputs,
                  const c10d::ScatterOptions &opts) override {
    // Only the root passes inputs: the outputs are what all ranks share.
    check("scatter " + describe(outputs) + " from rank " +
          std::to_string(opts.rootRank));
    return of(outputs)->scatter(outputs, inputs, opts);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor> &outputs,
                         std::vector<std::vector<at::Tensor>> &inputs,
                         const c10d::ReduceScatterOptions &opts) override {
    check("reduce_scatter " + describe(outputs) + " " +
          reduction(opts.reduceOp));
    return of(outputs)->reduce_scatter(outputs, inputs, opts);
  }
  WorkPtr
  _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                       const c10d::ReduceScatterOptions &opts) override {
    check("reduce_scatter_tensor " + describe(input) + " into " +
          shapeOf(output) + " " + reduction(opts.reduceOp));
    return on(input.device().type())->_reduce_scatter_base(output, input, opts);
  }
  WorkPtr reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override {
    check("reduce_scatter_tensor_coalesced " + describe(inputs) + " " +
          reduction(opts.reduceOp));
    return of(inputs)->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  WorkPtr alltoall_base(at::Tensor &output, at::Tensor &input,
                        std::vector<int64_t> &outputSplits,
                        std::vector<int64_t> &inputSplits,
                        const c10d::AllToAllOptions &opts) override {
    // With split sizes, the first dimension differs between ranks by
    // design: only the dtype and the trailing dimensions must agree.
    std::string call = "all_to_all_single ";
    if (inputSplits.empty() && outputSplits.empty()) {
      call += describe(input);
    } else {
      call += dtypeName(input.scalar_type());
      call += "[*";
      for (int64_t d = 1; d < input.dim(); ++d) {
        call += 'x';
        call += std::to_string(input.size(d));
      }
      call += ']';
    }
    check(call);
    return on(input.device().type())
        ->alltoall_base(output, input, outputSplits, inputSplits, opts);
  }
  WorkPtr alltoall(std::vector<at::Tensor> &outputs,
                   std::vector<at::Tensor> &inputs,
                   const c10d::AllToAllOptions &opts) override {
    // Each rank's tensors may differ in size (one per peer): their number
    // and dtype must agree.
    std::set<std::string> dtypes;
    for (const at::Tensor &t : inputs)
      dtypes.insert(dtypeName(t.scalar_type()));
    std::string text = "all_to_all " + std::to_string(inputs.size()) + " x";
    for (const std::string &d : dtypes)
      text += " " + d;
    check(text);
    return of(inputs)->alltoall(outputs, inputs, opts);
  }
  WorkPtr barrier(const c10d::BarrierOptions &opts) override {
    check("barrier");
    return on(opts.device ? opts.device->type() : fallback)->barrier(opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions &opts,
                        bool waitAllRanks) override {
    check("monitored_barrier");
    on(fallback)->monitoredBarrier(opts, waitAllRanks);
  }

  // -- point to point ------------------------------------------------------
  WorkPtr send(std::vector<at::Tensor> &tensors, int dst, int tag) override {
    int64_t token = hooks.post("send " + describe(tensors), dst, true, tag);
    return pending(of(tensors)->send(tensors, dst, tag), token,
                   c10d::OpType::SEND);
  }
  WorkPtr recv(std::vector<at::Tensor> &tensors, int src, int tag) override {
    int64_t token = hooks.post("recv " + describe(tensors), src, false, tag);
    return pending(of(tensors)->recv(tensors, src, tag), token,
                   c10d::OpType::RECV);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor> &tensors, int tag) override {
    // No peer to pair with until it arrives: unchecked.
    return of(tensors)->recvAnysource(tensors, tag);
  }

private:
  /// The wrapped backend's name in the group (ProcessGroup::getGroupName
  /// reads it from the group's backends, DeviceMesh looks the group up by
  /// it) and description.
  void name() {
    Backend::setGroupUid(on(fallback)->getGroupUid());
    setGroupDesc(on(fallback)->getGroupDesc());
  }
  const c10::intrusive_ptr<Backend> &of(const std::vector<at::Tensor> &ts) {
    return on(ts.empty() ? fallback : ts.front().device().type());
  }
  c10::DeviceType coalescingDevice() const {
    return inner.count(c10::DeviceType::CUDA) ? c10::DeviceType::CUDA
                                              : fallback;
  }
  void check(const std::string &call) { hooks.collective(call); }
  /// `work`, whose first wait verifies `token`; inside a coalescing window
  /// the window's work verifies it instead (the caller waits on that one).
  WorkPtr pending(WorkPtr work, int64_t token, c10d::OpType type) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (coalescing) {
        coalesced.push_back(token);
        return work;
      }
    }
    if (!work)
      return work;
    return c10::make_intrusive<VerifiedWork>(
        work, [this, token] { hooks.verify(token); }, type);
  }

  std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> inner;
  c10::DeviceType fallback;
  GuardHooks hooks;
  std::mutex mutex;
  bool coalescing = false;
  std::vector<int64_t> coalesced;
};

} // namespace

namespace {

using BackendType = c10d::ProcessGroup::BackendType;

/// `group`'s GuardedBackend, once it has been guarded; null before.
GuardedBackend *guardedOf(c10d::ProcessGroup &group) {
  c10::intrusive_ptr<c10d::Backend> custom;
  try {
    custom = group.getBackend(BackendType::CUSTOM);
  } catch (const c10::Error &) {
    return nullptr;
  }
  auto *guarded = dynamic_cast<GuardedBackend *>(custom.get());
  if (!guarded)
    throw Error("dloss.guard cannot guard a group whose backend is a custom "
                "one (" +
                    custom->getBackendName() + ")",
                "Guard a group of torch's own backends (gloo, nccl)");
  return guarded;
}

} // namespace

void guardGroup(c10d::ProcessGroup &group, GuardHooks hooks) {
  if (group.getBackendType() == BackendType::CUSTOM)
    throw Error("dloss.guard cannot guard a group whose backend is a custom "
                "one (" +
                    group.getBackendName() + ")",
                "Guard a group of torch's own backends (gloo, nccl)");
  GuardedBackend *guarded = guardedOf(group);
  if (guarded && guarded->active())
    return guarded->setHooks(std::move(hooks));
  std::map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>> inner;
  for (const c10::Device &device : group.getDeviceTypes())
    inner[device.type()] = group.getBackend(device.type());
  c10::DeviceType fallback = c10::DeviceType::CPU;
  for (const auto &[device, backend] : inner)
    if (c10d::ProcessGroup::strToBackendType(backend->getBackendName()) ==
        group.getBackendType())
      fallback = device;
  if (!inner.count(fallback))
    fallback = inner.begin()->first;
  c10::intrusive_ptr<c10d::Backend> wrapper;
  if (guarded) {
    guarded->reset(std::move(inner), fallback, std::move(hooks));
    wrapper = group.getBackend(BackendType::CUSTOM);
  } else {
    wrapper = c10::make_intrusive<GuardedBackend>(std::move(inner), fallback,
                                                  std::move(hooks));
  }
  for (const c10::Device &device : group.getDeviceTypes())
    group.setBackend(device.type(), BackendType::CUSTOM, wrapper);
}

bool unguardGroup(c10d::ProcessGroup &group) {
  GuardedBackend *guarded = guardedOf(group);
  if (!guarded || !guarded->active())
    return false;
  for (const auto &[device, backend] : guarded->release())
    group.setBackend(
        device, c10d::ProcessGroup::strToBackendType(backend->getBackendName()),
        backend);
  return true;
}

bool hasBackend(const c10d::ProcessGroup &group, c10::DeviceType device) {
  // setBackend records the device type in both of the group's tables.
  for (const c10::Device &known : group.getDeviceTypes())
    if (known.type() == device)
      return true;
  return false;
}

c10::intrusive_ptr<c10d::Backend> movingBackend(c10d::ProcessGroup &group,
                                                c10::DeviceType device) {
  if (!hasBackend(group, device))
    return {};
  c10::intrusive_ptr<c10d::Backend> backend = group.getBackend(device);
  if (auto *guarded = dynamic_cast<GuardedBackend *>(backend.get()))
    return guarded->on(device);
  return backend;
}

} // namespace dloss::comm
