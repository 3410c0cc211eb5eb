// A compiled loss as a LibTorch callable with autograd (MLIR-free: plans come
// from dlossc or the JIT).
#ifndef DLOSS_RUNTIME_COMPILEDLOSS_H
#define DLOSS_RUNTIME_COMPILEDLOSS_H

#include "runtime/comm/Communicator.h"
#include "runtime/fused/Schedule.h"
#include "runtime/plan/PlanFile.h"

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dloss {

class Executor;

/// Calls a plan's loss on this rank's tensors. The result is the global loss
/// (the same value on every rank, so logging it needs no collective). When
/// any input requires grad, the result has a grad_fn and `loss.backward()`
/// fills each `dloss.grad` input's `.grad` per the plan's gradient contract
/// (ddp: N * dF/dx_r, so that DDP's average gives the single-device gradient;
/// global: dF/dx_r). An input that requires grad but is not a `dloss.grad`
/// argument (float labels, a parameter the loss does not differentiate) is
/// refused by the preflight on every rank: its gradient would silently be
/// missing. Inputs may have any strides (transposed, sliced, expanded).
///
/// The plan's derived @<loss>_grad computes the loss and its gradients in one
/// pass, with every collective, when the loss is called; backward() only
/// scales the saved gradients by the incoming gradient. So all communication
/// happens in the call that every rank makes, and a rank that skips
/// backward() cannot hang its peers.
class CompiledLoss {
public:
  /// `entry`: the loss to call (default: the plan's only loss).
  /// `schedule`: the fused ops' schedule for this loss (fused/Schedule.h);
  /// unset: the process default (DLOSS_SCHEDULE, setDefaultSchedule).
  CompiledLoss(std::shared_ptr<const PlanFile> plan,
               std::shared_ptr<Communicator> communicator,
               const std::string &entry = "",
               std::optional<fused::Schedule> schedule = std::nullopt);
  ~CompiledLoss();
  CompiledLoss(CompiledLoss &&) noexcept;
  CompiledLoss &operator=(CompiledLoss &&) noexcept;

  at::Tensor operator()(const std::vector<at::Tensor> &inputs);

  /// The call without autograd, for callers that record it themselves
  /// (Python's `dloss::loss` op, which torch.compile sees): the loss, the
  /// new value of each state input (`stateArgumentIndices()`, dloss.state;
  /// the caller stores them), then, when `requiresGrad` holds a true (one
  /// flag per input: whether the caller's tensor requires grad, which the
  /// preflight checks on every rank as for operator()), one gradient per
  /// `gradArgumentIndices()` entry, all detached. operator() stores the
  /// state itself, in place.
  std::vector<at::Tensor> run(const std::vector<at::Tensor> &inputs,
                              const std::vector<bool> &requiresGrad);
  /// For each gradient run() returns, the input it belongs to.
  const std::vector<int> &gradArgumentIndices() const { return gradArguments; }
  /// The state inputs whose new values run() returns after the loss, in
  /// that order.
  const std::vector<int> &stateArgumentIndices() const {
    return stateArguments;
  }
  /// The element types of @<loss>_grad's results (the loss, each state's
  /// new value, then each gradient), as the compiler inferred them.
  std::vector<at::ScalarType> resultTypes() const;

  /// The inputs' names, in call order (from dloss.name / the source).
  const std::vector<std::string> &argumentNames() const { return names; }
  const std::string &lossName() const { return loss; }
  /// "ddp" or "global".
  const std::string &gradMode() const { return mode; }
  Communicator &communicator() const { return *comm; }
  const PlanFile &planFile() const { return *plan; }

private:
  std::shared_ptr<const PlanFile> plan;
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<Executor> executor;
  std::string loss, grad, mode;
  std::vector<std::string> names;
  /// For each output gradient of @<loss>_grad, the input it belongs to.
  std::vector<int> gradArguments;
  /// The dloss.state inputs, in result order.
  std::vector<int> stateArguments;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_COMPILEDLOSS_H
