// Loading and validating a compiled plan (.plan file or bytes) for the runtime.
#ifndef DLOSS_RUNTIME_PLANFILE_H
#define DLOSS_RUNTIME_PLANFILE_H

#include "runtime/plan/PlanVersion.h"
#include "runtime/plan/Plan_generated.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dloss {

/// A plan's loss entry point and the gradient function the compiler derived
/// from it (@<loss>_grad: the loss followed by one gradient per dloss.grad
/// argument).
struct PlanEntry {
  const plan::Function *loss = nullptr;
  const plan::Function *grad = nullptr;
};

/// An immutable, verified plan. The bytes are owned here and every accessor
/// points into them, so keep the PlanFile alive (executors share it through
/// a shared_ptr) while anything reads the plan.
class PlanFile {
public:
  /// Reads and verifies `path`. A missing, truncated, corrupt or
  /// wrong-version file raises dloss::Error naming the file and advising to
  /// recompile it with dlossc.
  static std::shared_ptr<const PlanFile> load(const std::string &path);
  /// Verifies `bytes` (a plan built in memory, e.g. by the JIT). `name`
  /// stands for the file in error messages.
  static std::shared_ptr<const PlanFile>
  fromBytes(std::vector<uint8_t> bytes, std::string name = "<in-memory plan>");

  const plan::Plan &plan() const { return *root; }
  /// The file path or the name given to fromBytes().
  const std::string &name() const { return sourceName; }
  uint64_t fingerprint() const { return root->fingerprint(); }

  /// The function called `name`, or nullptr.
  const plan::Function *findFunction(const std::string &name) const;
  /// The function called `name`; raises dloss::Error listing the functions
  /// the plan has when there is none.
  const plan::Function &function(const std::string &name) const;
  std::vector<std::string> functionNames() const;

  /// The loss `requested` names (empty: the plan's only loss) and its
  /// gradient function: the one choice of what to call, for every front end.
  /// Raises dloss::Error when the plan has no loss entry point, has several
  /// and `requested` is empty, has none called `requested` (the hint lists
  /// those it has), or lacks the loss's gradient function. `option` is how
  /// the caller's user names a loss ("--entry F"), for the hints.
  PlanEntry entry(const std::string &requested,
                  const std::string &option = "the entry option") const;

  const std::vector<uint8_t> &bytes() const { return data; }

private:
  PlanFile(std::vector<uint8_t> bytes, std::string name);

  std::vector<uint8_t> data;
  std::string sourceName;
  const plan::Plan *root = nullptr;
};

/// Whether `function` is a loss entry point (the source's dloss.loss).
bool isLossEntry(const plan::Function &function);
/// Whether `function` is a gradient function the compiler derived from a
/// loss (@<loss>_grad).
bool isDerivedGradient(const plan::Function &function);
/// The gradient contract of a loss or of its gradient function: "ddp" (the
/// default) or "global".
std::string gradModeOf(const plan::Function &function);

/// Argument `i`'s input name (the loss's `%image` -> "image", as
/// `dloss-run --input` and CompiledLoss take it), or "arg<i>" when the plan
/// has none.
std::string inputName(const plan::Function &function, size_t i);

} // namespace dloss

#endif // DLOSS_RUNTIME_PLANFILE_H
