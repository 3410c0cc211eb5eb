// CompiledLoss: the plan's @<loss>_grad behind a torch::autograd::Function.
#include "runtime/autograd/CompiledLoss.h"

#include "runtime/exec/Executor.h"
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
                           const std::string &entry)
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
  for (unsigned i = 0; i < g.arguments()->size(); ++i)
    names.push_back(inputName(g, i));
  if (g.grad_arguments())
    gradArguments.assign(g.grad_arguments()->begin(),
                         g.grad_arguments()->end());
  executor = std::make_unique<Executor>(plan, *comm);
}

CompiledLoss::~CompiledLoss() = default;
CompiledLoss::CompiledLoss(CompiledLoss &&) noexcept = default;
CompiledLoss &CompiledLoss::operator=(CompiledLoss &&) noexcept = default;

at::Tensor CompiledLoss::operator()(const std::vector<at::Tensor> &inputs) {
  bool wantsGrad = false;
  for (const at::Tensor &t : inputs)
    wantsGrad |= t.defined() && t.requires_grad();
  // The executor gets the caller's tensors, not detached copies, so that its
  // preflight can reject an input that requires grad but gets no gradient,
  // on every rank; NoGradGuard keeps autograd out of its steps (autograd
  // sees one node, below).
  std::vector<at::Tensor> outputs;
  {
    at::NoGradGuard noGrad;
    outputs = executor->run(wantsGrad ? grad : loss, inputs);
  }
  for (at::Tensor &t : outputs)
    if (t.defined())
      t = t.detach();
  if (!wantsGrad)
    return outputs.at(0);
  // Gradients in input order; undefined for inputs without dloss.grad.
  std::vector<at::Tensor> gradients(inputs.size());
  for (size_t k = 0; k < gradArguments.size(); ++k)
    gradients[gradArguments[k]] = outputs.at(1 + k);
  return LossFunction::apply(&gradients, outputs.at(0), at::TensorList(inputs));
}

} // namespace dloss
