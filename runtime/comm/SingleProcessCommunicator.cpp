// The communicator of a world of one: every collective is the identity.
#include "runtime/comm/Communicator.h"
#include "runtime/support/Error.h"

namespace dloss {

namespace {

// Checks mirror the Gloo engine's, so a single-process reference run rejects
// the same calls a distributed run would.
class SingleProcessCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int worldSize() const override { return 1; }

  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) override {
    checkOwnSize("dloss.all_gather", input, axis, sizes);
    ++started;
    return input.clone();
  }

  at::Tensor allReduce(const at::Tensor &input, Reduction op) override {
    checkReduction("dloss.all_reduce", input, op);
    ++started;
    return input.clone();
  }

  at::Tensor reduceScatter(const at::Tensor &input, Reduction op, int64_t axis,
                           const std::vector<int64_t> &sizes) override {
    checkReduction("dloss.reduce_scatter", input, op);
    checkOwnSize("dloss.reduce_scatter", input, axis, sizes);
    ++started;
    return input.clone();
  }

  at::Tensor broadcast(const at::Tensor &input, int root) override {
    if (root != 0)
      throw fail("dloss.broadcast",
                 "broadcast root " + std::to_string(root) +
                     " does not exist in a world of 1 rank",
                 "Use root 0, or run with more ranks");
    ++started;
    return input.clone();
  }

  at::Tensor ringShift(const at::Tensor &input, int64_t) override {
    // Every shift lands back on rank 0.
    ++started;
    return input.clone();
  }

  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override {
    ++started;
    return values;
  }

  int64_t collectivesStarted() const override { return started; }

  std::unique_ptr<Request> send(const at::Tensor &, int peer, int) override {
    throw fail("",
               "send to rank " + std::to_string(peer) +
                   " is not possible in a single-process run (world size 1)",
               "Point-to-point transfers need at least 2 ranks; use "
               "ringShift, which is the identity here");
  }

  std::unique_ptr<Request> recv(at::Tensor &, int peer, int) override {
    throw fail("",
               "recv from rank " + std::to_string(peer) +
                   " is not possible in a single-process run (world size 1)",
               "Point-to-point transfers need at least 2 ranks; use "
               "ringShift, which is the identity here");
  }

private:
  int64_t started = 0;

  static Error fail(const std::string &op, const std::string &problem,
                    const std::string &hint) {
    ErrorInfo info;
    info.problem = problem;
    info.hint = hint;
    info.rank = 0;
    info.op = op;
    return Error(info);
  }

  static void checkReduction(const std::string &op, const at::Tensor &input,
                             Reduction reduction) {
    if (reduction == Reduction::Mean &&
        !at::isFloatingType(input.scalar_type()) &&
        !at::isComplexType(input.scalar_type()))
      throw fail(op,
                 std::string("Mean of an integer tensor (") +
                     c10::toString(input.scalar_type()) + ") is not defined",
                 "Convert the tensor to a floating type, or reduce with Sum "
                 "and divide by the world size");
  }

  static void checkOwnSize(const std::string &op, const at::Tensor &input,
                           int64_t axis, const std::vector<int64_t> &sizes) {
    int64_t dims = input.dim();
    if (axis < -dims || axis >= dims || dims == 0)
      throw fail(op,
                 "axis " + std::to_string(axis) + " is out of range for a " +
                     std::to_string(dims) + "-d tensor",
                 "Pass an axis in [-rank, rank)");
    if (axis < 0)
      axis += dims;
    if (sizes.size() != 1 || sizes[0] != input.size(axis))
      throw fail(op,
                 "sizes must hold this rank's size along axis " +
                     std::to_string(axis) + " (" +
                     std::to_string(input.size(axis)) + ") for a world of 1",
                 "Pass one size per rank, in rank order, as exchanged by "
                 "allGatherInts");
  }
};

} // namespace

std::unique_ptr<Communicator> makeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

} // namespace dloss
