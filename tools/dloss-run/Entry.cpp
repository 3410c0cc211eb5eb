// Reading the loss to run from a plan: --entry, its gradient, argument names.
#include "tools/dloss-run/DlossRun.h"

#include "runtime/support/Error.h"

namespace dloss {
namespace tools {

Entry findEntry(const PlanFile &plan, const std::string &requested) {
  std::vector<const plan::Function *> losses;
  for (const auto *f : *plan.plan().functions()) {
    bool isLoss = f->grad_mode() && f->grad_mode()->size() &&
                  !(f->gradient_of() && f->gradient_of()->size());
    if (isLoss && (requested.empty() || f->name()->str() == requested))
      losses.push_back(f);
  }
  if (losses.size() != 1) {
    std::string names;
    for (const auto *f : *plan.plan().functions())
      if (f->grad_mode() && f->grad_mode()->size() &&
          !(f->gradient_of() && f->gradient_of()->size()))
        names += (names.empty() ? "" : ", ") + f->name()->str();
    if (losses.empty())
      throw Error(requested.empty()
                      ? "plan '" + plan.name() + "' has no loss entry point"
                      : "plan '" + plan.name() + "' has no loss called '" +
                            requested + "'",
                  names.empty()
                      ? "Mark the loss function with the dloss.loss attribute"
                      : "Choose one of: " + names + " (--entry F)");
    throw Error("plan '" + plan.name() + "' has several losses: " + names,
                "Choose one with --entry F");
  }
  Entry e;
  e.loss = losses.front();
  for (const auto *f : *plan.plan().functions())
    if (f->gradient_of() && f->gradient_of()->str() == e.loss->name()->str())
      e.grad = f;
  if (!e.grad)
    throw Error("plan '" + plan.name() + "' has no gradient function for @" +
                    e.loss->name()->str(),
                "Compile the loss with dlossc, which derives @" +
                    e.loss->name()->str() + "_grad");
  return e;
}

} // namespace tools
} // namespace dloss
