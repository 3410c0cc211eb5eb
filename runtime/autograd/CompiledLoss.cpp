// CompiledLoss: the plan's @<loss>_grad behind a torch::autograd::Function.
#include "runtime/autograd/CompiledLoss.h"

#include "runtime/exec/Executor.h"
#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"

#include <torch/csrc/autograd/custom_function.h>

namespace dloss {
namespace {

/// One call's autograd node: the gradients were computed with the loss;
/// backward scales them by the loss's incoming gradient (a scalar).
struct LossFunction : torch::autograd::Function<LossFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx,
                            std::vector<at::Tensor> *gradients, at::Tensor loss,
                            at::TensorList inputs) {
    ctx->saved_data["count"] = static_cast<int64_t>(inputs.size());
    std::vector<at::Tensor> saved;
    for (at::Tensor &g : *gradients)
      saved.push_back(g);
    ctx->save_for_backward(saved);
    // A fresh tensor: autograd must not alias an input as this node's output.
    return loss.clone();
  }

  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext *ctx,
           torch::autograd::variable_list outputGrads) {
    int64_t count = ctx->saved_data["count"].toInt();
    std::vector<at::Tensor> gradients = ctx->get_saved_variables();
    // Slots: `gradients` (not a tensor), `loss` (no gradient of its own),
    // then one per input.
    torch::autograd::variable_list result(2 + count);
    at::Tensor scale = outputGrads[0];
    for (int64_t i = 0; i < count; ++i)
      if (gradients[i].defined())
        result[2 + i] = gradients[i] * scale.to(gradients[i].scalar_type());
    return result;
  }
};

} // namespace

CompiledLoss::CompiledLoss(std::shared_ptr<const PlanFile> planFile,
                           std::shared_ptr<Communicator> communicator,
                           const std::string &entry,
                           std::optional<fused::Schedule> schedule)
    : plan(std::move(planFile)), comm(std::move(communicator)) {
  if (!plan || !comm)
    throw Error(
        "CompiledLoss needs a plan and a communicator",
        "Pass dloss::PlanFile::load(...) and dloss::connectProcessGroup(...)");
  PlanEntry chosen = plan->entry(entry, "the `entry` argument");
  loss = chosen.loss->name()->str();
  grad = chosen.grad->name()->str();
  const plan::Function &g = *chosen.grad;
  mode = gradModeOf(g);
  for (unsigned i = 0; i < g.arguments()->size(); ++i) {
    names.push_back(inputName(g, i));
    if (g.arguments()->Get(i)->state())
      stateArguments.push_back(static_cast<int>(i));
  }
  if (g.grad_arguments())
    gradArguments.assign(g.grad_arguments()->begin(),
                         g.grad_arguments()->end());
  ExecutorOptions options = ExecutorOptions::fromEnvironment();
  options.schedule = schedule;
  executor = std::make_unique<Executor>(plan, *comm, options);
}

CompiledLoss::~CompiledLoss() = default;
CompiledLoss::CompiledLoss(CompiledLoss &&) noexcept = default;
CompiledLoss &CompiledLoss::operator=(CompiledLoss &&) noexcept = default;

std::vector<at::Tensor>
CompiledLoss::run(const std::vector<at::Tensor> &inputs,
                  const std::vector<bool> &requiresGrad) {
  if (requiresGrad.size() != inputs.size())
    throw Error("CompiledLoss::run got " + std::to_string(inputs.size()) +
                    " inputs and " + std::to_string(requiresGrad.size()) +
                    " requires-grad flags",
                "Pass one flag per input");
  bool wantsGrad = false;
  // The preflight reads each input's requires_grad (an input that requires
  // grad but gets no gradient is refused on every rank): aliases carry the
  // caller's flags, which a traced graph's plain tensors do not.
  std::vector<at::Tensor> flagged(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined())
      continue;
    flagged[i] = inputs[i].detach();
    if (requiresGrad[i] && at::isFloatingType(flagged[i].scalar_type()))
      flagged[i].requires_grad_(true);
    wantsGrad |= requiresGrad[i];
  }
  std::vector<at::Tensor> outputs;
  {
    at::NoGradGuard noGrad;
    outputs = executor->run(wantsGrad ? grad : loss, flagged);
  }
  if (!wantsGrad)
    outputs.resize(1 + stateArguments.size());
  for (at::Tensor &t : outputs)
    if (t.defined())
      t = t.detach();
  return outputs;
}

std::vector<at::ScalarType> CompiledLoss::resultTypes() const {
  PlanEntry chosen = plan->entry(loss, "the loss");
  std::vector<at::ScalarType> types;
  if (const auto *results = chosen.grad->result_types())
    for (const plan::TypeInfo *type : *results)
      types.push_back(toScalarType(type->dtype()));
  return types;
}

at::Tensor CompiledLoss::operator()(const std::vector<at::Tensor> &inputs) {
  std::vector<bool> requiresGrad(inputs.size());
  bool wantsGrad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    requiresGrad[i] = inputs[i].defined() && inputs[i].requires_grad();
    wantsGrad |= requiresGrad[i];
  }
  std::vector<at::Tensor> outputs = run(inputs, requiresGrad);
  // Each state input takes its new value, in place (it carries no
  // gradient: the verifier refuses dloss.grad on state).
  const size_t states = stateArguments.size();
  {
    at::NoGradGuard noGrad;
    for (size_t k = 0; k < states; ++k)
      inputs[stateArguments[k]].copy_(outputs.at(1 + k));
  }
  if (!wantsGrad)
    return outputs.at(0);
  // Gradients in input order; undefined for inputs without dloss.grad.
  std::vector<at::Tensor> gradients(inputs.size());
  for (size_t k = 0; k < gradArguments.size(); ++k)
    gradients[gradArguments[k]] = outputs.at(1 + states + k);
  return LossFunction::apply(&gradients, outputs.at(0), at::TensorList(inputs));
}

} // namespace dloss
