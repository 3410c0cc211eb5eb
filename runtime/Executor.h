// The plan interpreter: runs one function of a plan on this rank's tensors.
#ifndef DLOSS_RUNTIME_EXECUTOR_H
#define DLOSS_RUNTIME_EXECUTOR_H

#include "runtime/Communicator.h"
#include "runtime/Kernels.h"
#include "runtime/PlanFile.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace dloss {

/// Interprets the functions of one plan over one communicator.
///
/// Every step's kernel is resolved when the executor is built, so an op the
/// runtime does not support is reported before anything runs. run() is
/// collective: every rank calls it with the same function, in the same
/// order. It starts with a preflight (one allGatherInts) in which the ranks
/// compare the plan fingerprint, the function and the inputs' dtypes and
/// shapes; a mismatch on any rank raises the same dloss::Error on every rank.
/// An executor is not thread-safe (its communicator is not either).
class Executor {
public:
  /// Raises dloss::Error for a malformed plan (registers out of range) and
  /// for an op the runtime does not support, naming the op and its location.
  Executor(std::shared_ptr<const PlanFile> plan, Communicator &communicator);

  /// Runs `function` on this rank's `inputs` (one per argument, in order;
  /// index-typed arguments and results are 0-d int64 tensors). Every error is
  /// a dloss::Error carrying this rank and, for a step, its op and location.
  std::vector<at::Tensor> run(const std::string &function,
                              const std::vector<at::Tensor> &inputs);

  const PlanFile &planFile() const { return *plan; }
  Communicator &communicator() const { return comm; }

  /// The number of int64 values each rank contributes to the preflight. It
  /// is fixed (independent of the plan) so that ranks holding different
  /// plans still meet in a well-formed collective and report the mismatch.
  static constexpr size_t kPreflightArgs = 32;
  static constexpr size_t kPreflightDims = 8;
  static constexpr size_t kPreflightHeader = 6;
  static constexpr size_t kPreflightLength =
      kPreflightHeader + kPreflightArgs * (2 + kPreflightDims);

private:
  struct BoundStep {
    BoundKernel kernel;
    std::vector<int32_t> operands;
    std::vector<int32_t> results;
    std::vector<int32_t> free;
    std::string op;
    std::string loc;
  };
  struct BoundFunction {
    const plan::Function *function = nullptr;
    std::vector<BoundStep> steps;
  };
  /// Each argument's shape on every rank: shapes[argument][rank]. Empty for
  /// arguments the preflight could not record in full.
  using RankShapes = std::vector<std::vector<std::vector<int64_t>>>;
  class StepContext;

  /// The preflight; returns every rank's argument shapes or raises.
  RankShapes preflight(const std::string &name, const BoundFunction *bound,
                       const std::vector<at::Tensor> &inputs);

  std::shared_ptr<const PlanFile> plan;
  Communicator &comm;
  std::unordered_map<std::string, BoundFunction> functions;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_EXECUTOR_H
