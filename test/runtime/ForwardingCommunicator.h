// A communicator that forwards every call to another; tests override the calls
// they watch or break.
#ifndef DLOSS_TEST_RUNTIME_FORWARDINGCOMMUNICATOR_H
#define DLOSS_TEST_RUNTIME_FORWARDINGCOMMUNICATOR_H

#include "runtime/comm/Communicator.h"

#include <memory>
#include <string>
#include <vector>

namespace dloss::test {

/// Forwards every call to `inner`; a test overrides what it needs.
class ForwardingCommunicator : public dloss::Communicator {
public:
  explicit ForwardingCommunicator(std::unique_ptr<dloss::Communicator> inner)
      : inner(std::move(inner)) {}

  int rank() const override { return inner->rank(); }
  int worldSize() const override { return inner->worldSize(); }
  at::Tensor allGather(const at::Tensor &input, int64_t axis,
                       const std::vector<int64_t> &sizes) override {
    return inner->allGather(input, axis, sizes);
  }
  at::Tensor allReduce(const at::Tensor &input, dloss::Reduction op) override {
    return inner->allReduce(input, op);
  }
  at::Tensor reduceScatter(const at::Tensor &input, dloss::Reduction op,
                           int64_t axis,
                           const std::vector<int64_t> &sizes) override {
    return inner->reduceScatter(input, op, axis, sizes);
  }
  at::Tensor broadcast(const at::Tensor &input, int root) override {
    return inner->broadcast(input, root);
  }
  at::Tensor ringShift(const at::Tensor &input, int64_t shift) override {
    return inner->ringShift(input, shift);
  }
  std::vector<int64_t>
  allGatherInts(const std::vector<int64_t> &values) override {
    return inner->allGatherInts(values);
  }
  FoldedInts allGatherIntsFolding(const std::vector<int64_t> &values,
                                  const std::vector<at::Tensor> &payload,
                                  int64_t proposal) override {
    return inner->allGatherIntsFolding(values, payload, proposal);
  }
  int64_t foldCapacity() const override { return inner->foldCapacity(); }
  std::unique_ptr<Request> send(const at::Tensor &tensor, int peer,
                                int tag) override {
    return inner->send(tensor, peer, tag);
  }
  std::unique_ptr<Request> recv(at::Tensor &tensor, int peer,
                                int tag) override {
    return inner->recv(tensor, peer, tag);
  }
  void beginExchange(const std::string &name) override {
    inner->beginExchange(name);
  }
  void endExchange() override { inner->endExchange(); }
  int64_t collectivesStarted() const override {
    return inner->collectivesStarted();
  }
  void noteFailure(const std::string &message) override {
    inner->noteFailure(message);
  }

protected:
  std::unique_ptr<dloss::Communicator> inner;
};

} // namespace dloss::test

#endif // DLOSS_TEST_RUNTIME_FORWARDINGCOMMUNICATOR_H
