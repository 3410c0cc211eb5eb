// The engine of a world of one: every collective is the identity.
//
// It keeps the contract like every engine (ContractCommunicator): the same
// checks and messages, so a single-process reference run rejects the calls a
// distributed run would, and the same numbering. It has no store and writes
// no flight record: it has no peer to wait for.
#include "runtime/comm/ContractCommunicator.h"
#include "runtime/comm/Engines.h"

namespace dloss {

using namespace comm;

namespace {

constexpr EngineWording kWording{/*name=*/"the single-process engine",
                                 /*sameOrderDetail=*/"",
                                 /*peerHint=*/"",
                                 /*failureSuffix=*/"",
                                 /*reduceTypeHint=*/""};

RendezvousOptions worldOfOne() {
  RendezvousOptions options;
  options.rank = 0;
  options.worldSize = 1;
  options.flightDir = "off";
  return options;
}

class SingleProcessCommunicator final : public ContractCommunicator {
public:
  SingleProcessCommunicator()
      : ContractCommunicator(worldOfOne(), nullptr, kWording) {}

protected:
  // Tensors on any device, of any type: nothing moves.
  void checkDevice(const Call &, const at::Tensor &) const override {}
  bool reduces(at::ScalarType) const override { return true; }

  at::Tensor transferAllGather(Call &call, const at::Tensor &input, int64_t,
                               const std::vector<int64_t> &) override {
    return identity(call, input);
  }
  at::Tensor transferAllReduce(Call &call, const at::Tensor &input,
                               Reduction) override {
    return identity(call, input);
  }
  at::Tensor transferReduceScatter(Call &call, const at::Tensor &input,
                                   Reduction, int64_t,
                                   const std::vector<int64_t> &) override {
    return identity(call, input);
  }
  at::Tensor transferBroadcast(Call &call, const at::Tensor &input,
                               int) override {
    return identity(call, input);
  }
  // Every shift lands back on rank 0.
  at::Tensor transferRingShift(Call &call, const at::Tensor &input,
                               const ShiftPeers &) override {
    return identity(call, input);
  }
  at::Tensor transferAllGatherInts(Call &call,
                                   const at::Tensor &values) override {
    complete(call);
    return values;
  }
  // The contract refuses every send and recv in a world of one (checkPeer):
  // there is no other rank to name.
  std::unique_ptr<Request> transferSend(Call &call, const at::Tensor &, int,
                                        int) override {
    throw fail(call, call.name + " is not possible " + where(),
               "Point-to-point transfers need at least 2 ranks");
  }
  std::unique_ptr<Request> transferRecv(Call &call, at::Tensor &, int,
                                        int) override {
    throw fail(call, call.name + " is not possible " + where(),
               "Point-to-point transfers need at least 2 ranks");
  }

private:
  /// A copy, never an alias of the caller's tensor, as any engine returns.
  at::Tensor identity(Call &call, const at::Tensor &input) {
    complete(call);
    return input.clone();
  }
};

} // namespace

std::unique_ptr<Communicator> makeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

} // namespace dloss
