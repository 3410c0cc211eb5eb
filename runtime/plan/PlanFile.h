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

  const std::vector<uint8_t> &bytes() const { return data; }

private:
  PlanFile(std::vector<uint8_t> bytes, std::string name);

  std::vector<uint8_t> data;
  std::string sourceName;
  const plan::Plan *root = nullptr;
};

/// Argument `i`'s input name (the loss's `%image` -> "image", as
/// `dloss-run --input` and CompiledLoss take it), or "arg<i>" when the plan
/// has none.
std::string inputName(const plan::Function &function, size_t i);

} // namespace dloss

#endif // DLOSS_RUNTIME_PLANFILE_H
