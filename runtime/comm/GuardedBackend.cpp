// GuardedBackend (GuardedBackend.h): each op described, checked, then run on
// the group's own backend.
#include "runtime/comm/GuardedBackend.h"

#include "runtime/comm/CallSite.h"
#include "runtime/comm/FingerprintExchange.h"
#include "runtime/support/Error.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
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

/// The framework origin of this thread's ops (setOriginOfThread).
thread_local std::string originOfThread;

/// One installed guard: its config, and what its checks count. Shared by
/// the ops in flight, which keep it after the guard is replaced.
struct Guard {
  explicit Guard(std::shared_ptr<const GuardConfig> config)
      : config(std::move(config)), exchange(this->config->side),
        broken(this->config->broken) {}
  std::shared_ptr<const GuardConfig> config;
  FingerprintExchange exchange;
  /// One check at a time: the side backend pairs the ranks' fingerprints
  /// in the order they are posted.
  std::mutex checking;
  int64_t seq = 0;
  bool broken;
  /// DDP's buckets: the autograd graph task of the last one, and the next
  /// bucket's number in it.
  int ddpTask = -1;
  int64_t ddpBucket = 0;
};

/// Side backends of guards that refused: an exchange may still be posted
/// on one, and destroying it would wait for that exchange's timeout.
void keepForever(c10::intrusive_ptr<c10d::Backend> side) {
  static std::mutex mutex;
  static auto *kept = new std::vector<c10::intrusive_ptr<c10d::Backend>>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(side));
}

/// Who calls `call` when it is not the user's own code: dloss's runtime,
/// FSDP2 (a Python hook names the module), or DDP's reducer (an all-reduce
/// from an AccumulateGrad's hook, or a final callback, of a backward pass).
/// Part of what the ranks must agree on. `follows`: the op follows from
/// the last one checked (DDP's buckets after the first of a backward pass
/// go in the order of DDP's bucket plan, the same on every rank, while
/// the user's thread waits in backward()), so checking it would add an
/// exchange and catch nothing more.
std::string originOf(const std::string &call, Guard &guard, bool &follows) {
  if (const CallSite *site = currentCallSite())
    return " (dloss @" + site->function + ", " +
           (site->op.empty() ? site->phase : site->op) + ")";
  std::string kind = call.substr(0, call.find(' '));
  if (!originOfThread.empty()) {
    std::string what = kind.rfind("all_gather", 0) == 0       ? "all-gather"
                       : kind.rfind("reduce_scatter", 0) == 0 ? "reduce-scatter"
                                                              : kind;
    std::replace(what.begin(), what.end(), '_', '-');
    return " (FSDP2 " + what + " of " + originOfThread + ")";
  }
  if (kind != "all_reduce")
    return "";
  int task = torch::autograd::get_current_graph_task_id();
  if (task == -1)
    return "";
  c10::intrusive_ptr<torch::autograd::Node> node =
      torch::autograd::get_current_node();
  if (node && !dynamic_cast<torch::autograd::AccumulateGrad *>(node.get()))
    return ""; // a custom Function's backward: the user's own
  int64_t bucket = guard.ddpTask == task ? guard.ddpBucket : 0;
  guard.ddpTask = task;
  guard.ddpBucket = bucket + 1;
  follows = bucket > 0;
  return " (DDP gradient all-reduce, bucket " + std::to_string(bucket) + ")";
}

/// Whether every rank's op has `call`'s fingerprint: one all-reduce of MAX
/// over (hash, -hash) (FingerprintExchange), waited for in polls of
/// `config.poll` (the hooks record a slow op and learn of a peer that gave
/// up) up to the deadline. Throws what the hooks throw.
void agree(Guard &guard, int64_t seq, const std::string &call) {
  const GuardConfig &config = *guard.config;
  int64_t hash = fingerprint(call);
  auto request = guard.exchange.start({hash, -hash});
  auto deadline = std::chrono::steady_clock::now() + config.deadline;
  bool waited = false;
  for (;;) {
    auto until =
        std::min(deadline, std::chrono::steady_clock::now() + config.poll);
    // An exchange that failed (a peer exited and closed its side
    // connection) settles nothing: the ranks still wait for the deadline,
    // and the hooks name who never came and why.
    bool ended = request->waitUntil(until);
    if (ended && request->failure.empty())
      break;
    if (ended)
      std::this_thread::sleep_until(until);
    if (std::chrono::steady_clock::now() >= deadline) {
      config.hooks.timedOut(seq, call);
      throw Error("dloss.guard: collective #" + std::to_string(seq) + " (" +
                      call + ") met no agreement within the deadline",
                  "Call it on every rank");
    }
    config.hooks.waiting(seq, call, !waited);
    waited = true;
  }
  if (request->values[0] != hash || request->values[1] != -hash) {
    config.hooks.disagreed(seq, call);
    throw Error("dloss.guard: the ranks reached different collectives as "
                "collective #" +
                    std::to_string(seq) + " (" + call + " here)",
                "Call it on every rank, in the same order");
  }
  if (waited)
    config.hooks.passed(seq);
}

/// The backends a guarded group runs its ops on, and its guard: replaced
/// as one object, so that an op reads one consistent state.
struct Wrapped {
  std::map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>> inner;
  c10::DeviceType fallback = c10::DeviceType::CPU;
  std::shared_ptr<Guard> guard;

  /// The backend that runs `device`'s tensors.
  const c10::intrusive_ptr<c10d::Backend> &on(c10::DeviceType device) const {
    auto found = inner.find(device);
    return found == inner.end() ? inner.at(fallback) : found->second;
  }
  const c10::intrusive_ptr<c10d::Backend> &
  of(const std::vector<at::Tensor> &tensors) const {
    return on(tensors.empty() ? fallback : tensors.front().device().type());
  }
};

class GuardedBackend : public c10d::Backend {
public:
  explicit GuardedBackend(std::shared_ptr<const Wrapped> wrapped)
      : Backend(wrapped->on(wrapped->fallback)->getRank(),
                wrapped->on(wrapped->fallback)->getSize()),
        state(std::move(wrapped)) {
    name();
  }

  bool active() const { return !current()->inner.empty(); }
  /// Guards again (after release(), or with a new guard).
  void reset(std::shared_ptr<const Wrapped> next) {
    {
      std::lock_guard<std::mutex> lock(stateMutex);
      state = std::move(next);
    }
    name();
  }
  /// The backends it wrapped, for the group to take back; idle after.
  std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> release() {
    auto idle = std::make_shared<Wrapped>();
    std::lock_guard<std::mutex> lock(stateMutex);
    std::map<c10::DeviceType, c10::intrusive_ptr<Backend>> out = state->inner;
    state = std::move(idle);
    return out;
  }
  /// The backend that runs `device`'s tensors.
  c10::intrusive_ptr<Backend> on(c10::DeviceType device) const {
    return current()->on(device);
  }

  // -- what the group's backend says of itself ---------------------------
  const std::string getBackendName() const override {
    return main()->getBackendName();
  }
  bool supportsSplitting() const override {
    return main()->supportsSplitting();
  }
  bool supportsCoalescing() const override {
    return current()->on(coalescingDevice())->supportsCoalescing();
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    for (auto &[device, backend] : current()->inner)
      backend->setTimeout(timeout);
  }
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return main()->getBackendOptions();
  }
  void setSequenceNumberForGroup() override {
    main()->setSequenceNumberForGroup();
  }
  uint64_t getSequenceNumberForGroup() override {
    return main()->getSequenceNumberForGroup();
  }
  void setGroupUid(const std::string &uid) override {
    Backend::setGroupUid(uid);
    for (auto &[device, backend] : current()->inner)
      backend->setGroupUid(uid);
  }
  // abort() and shutdown() stay Backend's no-ops: the group's own backends
  // are in its table beside this one, and get the group's abort and
  // shutdown themselves.
  void waitForPendingWorks() override {
    current()->on(coalescingDevice())->waitForPendingWorks();
  }
  c10d::ErrorType getError() override { return main()->getError(); }
  void eagerConnectSingleDevice(at::Device device) override {
    current()->on(device.type())->eagerConnectSingleDevice(device);
  }
  bool supportsTensorAlloc(c10::DeviceIndex index) override {
    return current()->on(c10::DeviceType::CUDA)->supportsTensorAlloc(index);
  }
  std::shared_ptr<c10::Allocator> getMemAllocator() override {
    return current()->on(c10::DeviceType::CUDA)->getMemAllocator();
  }
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    return current()
        ->on(options.device().type())
        ->allocateTensor(size, options);
  }

  // -- coalescing (NCCL's batches of ops) ---------------------------------
  void startCoalescing() override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      coalescing = true;
    }
    current()->on(coalescingDevice())->startCoalescing();
  }
  WorkPtr endCoalescing() override {
    std::vector<int64_t> tokens;
    {
      std::lock_guard<std::mutex> lock(mutex);
      coalescing = false;
      tokens.swap(coalesced);
    }
    std::shared_ptr<const Wrapped> s = current();
    WorkPtr work = s->on(coalescingDevice())->endCoalescing();
    if (tokens.empty() || !work || !s->guard)
      return work;
    return c10::make_intrusive<VerifiedWork>(
        work,
        [config = s->guard->config, tokens] {
          for (int64_t token : tokens)
            config->hooks.verify(token);
        },
        c10d::OpType::COALESCED);
  }

  // -- collectives ----------------------------------------------------------
  WorkPtr broadcast(std::vector<at::Tensor> &tensors,
                    const c10d::BroadcastOptions &opts) override {
    auto s = check("broadcast " + describe(tensors) + " from rank " +
                   std::to_string(opts.rootRank));
    return s->of(tensors)->broadcast(tensors, opts);
  }
  WorkPtr allreduce(std::vector<at::Tensor> &tensors,
                    const c10d::AllreduceOptions &opts) override {
    auto s = check("all_reduce " + describe(tensors) + " " +
                   reduction(opts.reduceOp));
    return s->of(tensors)->allreduce(tensors, opts);
  }
  WorkPtr allreduce_sparse(std::vector<at::Tensor> &tensors,
                           const c10d::AllreduceOptions &opts) override {
    auto s = check("all_reduce_sparse " + describe(tensors) + " " +
                   reduction(opts.reduceOp));
    return s->of(tensors)->allreduce_sparse(tensors, opts);
  }
  WorkPtr
  allreduce_coalesced(std::vector<at::Tensor> &tensors,
                      const c10d::AllreduceCoalescedOptions &opts) override {
    auto s = check("all_reduce_coalesced " + describe(tensors) + " " +
                   reduction(opts.reduceOp));
    return s->of(tensors)->allreduce_coalesced(tensors, opts);
  }
  WorkPtr reduce(std::vector<at::Tensor> &tensors,
                 const c10d::ReduceOptions &opts) override {
    auto s =
        check("reduce " + describe(tensors) + " " + reduction(opts.reduceOp) +
              " to rank " + std::to_string(opts.rootRank));
    return s->of(tensors)->reduce(tensors, opts);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>> &outputs,
                    std::vector<at::Tensor> &inputs,
                    const c10d::AllgatherOptions &opts) override {
    auto s = check("all_gather " + describe(inputs));
    return s->of(inputs)->allgather(outputs, inputs, opts);
  }
  WorkPtr _allgather_base(at::Tensor &output, at::Tensor &input,
                          const c10d::AllgatherOptions &opts) override {
    auto s = check("all_gather_into_tensor " + describe(input) + " into " +
                   shapeOf(output));
    return s->on(input.device().type())->_allgather_base(output, input, opts);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>> &outputs,
                              std::vector<at::Tensor> &inputs,
                              const c10d::AllgatherOptions &opts) override {
    auto s = check("all_gather_coalesced " + describe(inputs));
    return s->of(inputs)->allgather_coalesced(outputs, inputs, opts);
  }
  WorkPtr
  allgather_into_tensor_coalesced(std::vector<at::Tensor> &outputs,
                                  std::vector<at::Tensor> &inputs,
                                  const c10d::AllgatherOptions &opts) override {
    auto s = check("all_gather_into_tensor_coalesced " + describe(inputs));
    return s->of(inputs)->allgather_into_tensor_coalesced(outputs, inputs,
                                                          opts);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>> &outputs,
                 std::vector<at::Tensor> &inputs,
                 const c10d::GatherOptions &opts) override {
    auto s = check("gather " + describe(inputs) + " to rank " +
                   std::to_string(opts.rootRank));
    return s->of(inputs)->gather(outputs, inputs, opts);
  }
  WorkPtr scatter(std::vector<at::Tensor> &outputs,
                  std::vector<std::vector<at::Tensor>> &inputs,
                  const c10d::ScatterOptions &opts) override {
    // Only the root passes inputs: the outputs are what all ranks share.
    auto s = check("scatter " + describe(outputs) + " from rank " +
                   std::to_string(opts.rootRank));
    return s->of(outputs)->scatter(outputs, inputs, opts);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor> &outputs,
                         std::vector<std::vector<at::Tensor>> &inputs,
                         const c10d::ReduceScatterOptions &opts) override {
    auto s = check("reduce_scatter " + describe(outputs) + " " +
                   reduction(opts.reduceOp));
    return s->of(outputs)->reduce_scatter(outputs, inputs, opts);
  }
  WorkPtr
  _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                       const c10d::ReduceScatterOptions &opts) override {
    auto s = check("reduce_scatter_tensor " + describe(input) + " into " +
                   shapeOf(output) + " " + reduction(opts.reduceOp));
    return s->on(input.device().type())
        ->_reduce_scatter_base(output, input, opts);
  }
  WorkPtr reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override {
    auto s = check("reduce_scatter_tensor_coalesced " + describe(inputs) + " " +
                   reduction(opts.reduceOp));
    return s->of(inputs)->reduce_scatter_tensor_coalesced(outputs, inputs,
                                                          opts);
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
    auto s = check(call);
    return s->on(input.device().type())
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
    auto s = check(text);
    return s->of(inputs)->alltoall(outputs, inputs, opts);
  }
  WorkPtr barrier(const c10d::BarrierOptions &opts) override {
    auto s = check("barrier");
    return s->on(opts.device ? opts.device->type() : s->fallback)
        ->barrier(opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions &opts,
                        bool waitAllRanks) override {
    auto s = check("monitored_barrier");
    s->on(s->fallback)->monitoredBarrier(opts, waitAllRanks);
  }

  // -- point to point ------------------------------------------------------
  WorkPtr send(std::vector<at::Tensor> &tensors, int dst, int tag) override {
    std::shared_ptr<const Wrapped> s = current();
    int64_t token = post(*s, "send " + describe(tensors), dst, true, tag);
    return pending(*s, s->of(tensors)->send(tensors, dst, tag), token,
                   c10d::OpType::SEND);
  }
  WorkPtr recv(std::vector<at::Tensor> &tensors, int src, int tag) override {
    std::shared_ptr<const Wrapped> s = current();
    int64_t token = post(*s, "recv " + describe(tensors), src, false, tag);
    return pending(*s, s->of(tensors)->recv(tensors, src, tag), token,
                   c10d::OpType::RECV);
  }
  WorkPtr recvAnysource(std::vector<at::Tensor> &tensors, int tag) override {
    // No peer to pair with until it arrives: unchecked.
    return current()->of(tensors)->recvAnysource(tensors, tag);
  }

private:
  /// The group's default backend.
  c10::intrusive_ptr<Backend> main() const {
    std::shared_ptr<const Wrapped> s = current();
    return s->on(s->fallback);
  }
  std::shared_ptr<const Wrapped> current() const {
    std::lock_guard<std::mutex> lock(stateMutex);
    return state;
  }
  /// The wrapped backend's name in the group (ProcessGroup::getGroupName
  /// reads it from the group's backends, DeviceMesh looks the group up by
  /// it) and description.
  void name() {
    std::shared_ptr<const Wrapped> s = current();
    if (s->inner.empty())
      return;
    Backend::setGroupUid(s->on(s->fallback)->getGroupUid());
    setGroupDesc(s->on(s->fallback)->getGroupDesc());
  }
  c10::DeviceType coalescingDevice() const {
    std::shared_ptr<const Wrapped> s = current();
    return s->inner.count(c10::DeviceType::CUDA) ? c10::DeviceType::CUDA
                                                 : s->fallback;
  }
  /// Checks collective `call` against every rank's (see agree()); the
  /// state to run it with.
  std::shared_ptr<const Wrapped> check(std::string call) {
    std::shared_ptr<const Wrapped> s = current();
    if (!s->guard)
      return s;
    // Inside a dloss call, the collectives after its preflight follow from
    // the call's plan, on which the checked preflight made the ranks agree
    // (as its ring transfers do): checking each would add an exchange per
    // collective and catch nothing more.
    if (const CallSite *site = currentCallSite())
      if (!site->function.empty() && site->phase != "preflight")
        return s;
    Guard &guard = *s->guard;
    std::lock_guard<std::mutex> lock(guard.checking);
    bool follows = false;
    call += originOf(call, guard, follows);
    if (follows && !guard.broken)
      return s;
    if (guard.broken) {
      // The ranks disagree on the order from here on: any collective would
      // pair with the wrong one or hang.
      guard.config->hooks.refused(call);
      throw Error("dloss.guard refused an earlier collective of this group",
                  "The ranks disagree on the order of its collectives from "
                  "there on: fix the first refusal (its error named each "
                  "rank's line)");
    }
    int64_t seq = guard.seq++;
    try {
      agree(guard, seq, call);
    } catch (...) {
      guard.broken = true;
      keepForever(guard.config->side);
      throw;
    }
    return s;
  }
  /// Records a send or recv for its pair's check; -1: unchecked (dloss's
  /// own ring transfers follow from the call's plan, whose first,
  /// checked, collective the ranks agreed on).
  int64_t post(const Wrapped &s, const std::string &call, int peer, bool send,
               int tag) {
    if (!s.guard || currentCallSite())
      return -1;
    Guard &guard = *s.guard;
    {
      std::lock_guard<std::mutex> lock(guard.checking);
      if (guard.broken) {
        guard.config->hooks.refused(call);
        throw Error("dloss.guard refused an earlier op of this group",
                    "The ranks disagree on the order of its ops from there "
                    "on: fix the first refusal (its error named each rank's "
                    "line)");
      }
    }
    return guard.config->hooks.post(call, peer, send, tag);
  }
  /// `work`, whose first wait verifies `token`; inside a coalescing window
  /// the window's work verifies it instead (the caller waits on that one).
  WorkPtr pending(const Wrapped &s, WorkPtr work, int64_t token,
                  c10d::OpType type) {
    if (token < 0 || !work)
      return work;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (coalescing) {
        coalesced.push_back(token);
        return work;
      }
    }
    return c10::make_intrusive<VerifiedWork>(
        work,
        [config = s.guard->config, token] { config->hooks.verify(token); },
        type);
  }

  mutable std::mutex stateMutex;
  std::shared_ptr<const Wrapped> state;
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

int64_t fingerprint(const std::string &call) {
  // FNV-1a: the same on every rank and every build, unlike std::hash.
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : call) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 2);
}

std::string setOriginOfThread(std::string origin) {
  std::swap(origin, originOfThread);
  return origin;
}

void guardGroup(c10d::ProcessGroup &group,
                std::shared_ptr<const GuardConfig> config) {
  if (group.getBackendType() == BackendType::CUSTOM)
    throw Error("dloss.guard cannot guard a group whose backend is a custom "
                "one (" +
                    group.getBackendName() + ")",
                "Guard a group of torch's own backends (gloo, nccl)");
  // The side exchange's own timeout is a bound on a stuck exchange only:
  // the guard's deadline ends every wait before it.
  config->side->setTimeout(config->deadline * 2 +
                           std::chrono::milliseconds(10000));
  auto next = std::make_shared<Wrapped>();
  next->guard = std::make_shared<Guard>(std::move(config));
  GuardedBackend *guarded = guardedOf(group);
  if (guarded && guarded->active()) {
    for (const auto &[device, backend] : guarded->release())
      next->inner[device] = backend;
  } else {
    for (const c10::Device &device : group.getDeviceTypes())
      next->inner[device.type()] = group.getBackend(device.type());
  }
  next->fallback = c10::DeviceType::CPU;
  for (const auto &[device, backend] : next->inner)
    if (c10d::ProcessGroup::strToBackendType(backend->getBackendName()) ==
        group.getBackendType())
      next->fallback = device;
  if (!next->inner.count(next->fallback))
    next->fallback = next->inner.begin()->first;
  c10::intrusive_ptr<c10d::Backend> wrapper;
  if (guarded) {
    guarded->reset(std::move(next));
    wrapper = group.getBackend(BackendType::CUSTOM);
  } else {
    wrapper = c10::make_intrusive<GuardedBackend>(std::move(next));
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

bool isGuarded(c10d::ProcessGroup &group) {
  GuardedBackend *guarded = guardedOf(group);
  return guarded && guarded->active();
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
