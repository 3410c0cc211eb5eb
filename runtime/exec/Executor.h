// The plan interpreter: runs one function of a plan on this rank's tensors.
#ifndef DLOSS_RUNTIME_EXECUTOR_H
#define DLOSS_RUNTIME_EXECUTOR_H

#include "runtime/comm/CallSite.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/PreflightIndices.h"
#include "runtime/fused/Schedule.h"
#include "runtime/kernels/KernelTable.h"
#include "runtime/plan/PlanFile.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace dloss {

/// How an executor runs its calls.
struct ExecutorOptions {
  /// Check mode. (a) The preflight also reports NaN and infinite values in
  /// floating inputs ("rank 2 passed argument 1 (text) with 3 NaN values"),
  /// the same error on every rank. (b) After a gradient function in global
  /// mode, the gradients of replicated arguments must be bit-identical on
  /// every rank: they are hashed and compared (one allGatherInts), and a
  /// difference names the first rank and element that differ. (In ddp mode
  /// those gradients legitimately differ per rank and are not checked.)
  /// Costs a pass over the inputs and one small collective per call; every
  /// rank must run with the same setting (the preflight checks it).
  bool check = false;
  /// The fused ops' schedule (fused/Schedule.h) for this executor's calls;
  /// unset: the process default (DLOSS_SCHEDULE, dloss.set_schedule), read
  /// at each call. Every rank must run with the same setting (the preflight
  /// checks it): auto's choice is then the same on every rank.
  std::optional<fused::Schedule> schedule;

  /// `check` from DLOSS_CHECK ("1" on; "0" or unset off); any other value
  /// is a dloss::Error, as is a DLOSS_SCHEDULE other than auto, ring or
  /// gather.
  static ExecutorOptions fromEnvironment();
};

/// Interprets the functions of one plan over one communicator.
///
/// Every step's kernel is resolved when the executor is built, so an op the
/// runtime does not support is reported before anything runs. run() is
/// collective: every rank calls it with the same function, in the same
/// order. It starts with a preflight (one allGatherInts) in which the ranks
/// compare the plan fingerprint, the function and the inputs' dtypes,
/// shapes and devices, and each rank's own checks of its inputs (devices it
/// computes on, one device per call, no input that requires grad without
/// getting one from a gradient function, indices within the statically
/// sized dimension they index); a mismatch or a failed check on any rank
/// raises the same dloss::Error on every rank. Inputs may have any strides.
/// An executor is not thread-safe (its communicator is not either).
class Executor {
public:
  /// Raises dloss::Error for a malformed plan (registers out of range) and
  /// for an op the runtime does not support, naming the op and its location.
  /// Options from the environment (ExecutorOptions::fromEnvironment).
  Executor(std::shared_ptr<const PlanFile> plan, Communicator &communicator);
  Executor(std::shared_ptr<const PlanFile> plan, Communicator &communicator,
           ExecutorOptions options);

  /// Runs `function` on this rank's `inputs` (one per argument, in order;
  /// index-typed arguments and results are 0-d int64 tensors). Every error is
  /// a dloss::Error carrying this rank and, for a step, its op and location.
  std::vector<at::Tensor> run(const std::string &function,
                              const std::vector<at::Tensor> &inputs);

  const PlanFile &planFile() const { return *plan; }
  Communicator &communicator() const { return comm; }
  const ExecutorOptions &options() const { return opts; }
  /// The schedule setting of the next call: opts.schedule, else the
  /// setting of the call scope this thread is in (a test's, or an outer
  /// call's: fused::ScheduleScope), else the process default.
  fused::Schedule scheduleSetting() const {
    return opts.schedule.value_or(fused::currentSchedule());
  }

  /// The number of int64 values each rank contributes to the preflight. It
  /// is fixed (independent of the plan) so that ranks holding different
  /// plans still meet in a well-formed collective and report the mismatch.
  static constexpr size_t kPreflightArgs = 32;
  static constexpr size_t kPreflightDims = 8;
  static constexpr size_t kPreflightHeader = 17;
  /// Per input: dtype, number of dims, device, then kPreflightDims sizes.
  static constexpr size_t kPreflightSlotFields = 3;
  static constexpr size_t kPreflightLength =
      kPreflightHeader +
      kPreflightArgs * (kPreflightSlotFields + kPreflightDims);

private:
  struct BoundStep {
    BoundKernel kernel;
    std::vector<int32_t> operands;
    std::vector<int32_t> results;
    std::vector<int32_t> free;
    std::string op;
    std::string loc;
    /// What a collective of this step reports as its call site.
    CallSite site;
    /// An all_reduce whose result reaches no later collective, only local
    /// steps and the results (the loss value of a plan that goes on to
    /// derive its gradient): its reduction, deferred to ride on the call's
    /// next all-gather (Communicator::deferReduction).
    std::optional<Reduction> deferred;
    /// A local step that reads a deferred reduction's value: it runs once
    /// the reductions are complete, at the end of the call.
    bool afterFlush = false;
    /// The first of n adjacent all_reduce steps that the compiler marked
    /// to run as one collective (`coalesce = n`, dloss-coalesce-all-
    /// reduces): n. The others of the group are `joined`: the first step
    /// runs them.
    size_t coalesce = 1;
    bool joined = false;
    /// The group's reduction (its first step's).
    Reduction coalesceKind = Reduction::Sum;
  };
  struct BoundFunction {
    const plan::Function *function = nullptr;
    std::vector<BoundStep> steps;
    /// The arguments whose values the preflight range-checks.
    std::vector<preflight::IndexUse> indexUses;
    /// The arguments the preflight carries, when they fit the
    /// communicator's fold capacity: the rows the call's first collective
    /// (a fused op) gathers, which then skips its own gather.
    std::vector<int32_t> foldRegisters;
    /// Which of foldRegisters (bit k for the k-th) the last call's gathers
    /// asked for (fused::gatherWanted); -1 before the first call. The
    /// preflight folds only those: a one-sided gather never reads the rows.
    int64_t foldWanted = -1;
  };
  /// A folded argument's every-rank rows, by register
  /// (fused::keepGathered).
  using Folded = std::vector<std::pair<int32_t, at::Tensor>>;
  /// Each argument's shape on every rank: shapes[argument][rank]. Empty for
  /// arguments the preflight could not record in full.
  using RankShapes = std::vector<std::vector<std::vector<int64_t>>>;
  class StepContext;
  /// Marks the all_reduce steps that may be deferred and the local steps
  /// that then run after them (BoundStep::deferred, afterFlush).
  static void markDeferred(std::vector<BoundStep> &steps, int64_t numRegisters);
  /// Checks and marks the groups of adjacent all-reduces the plan says to
  /// run as one (`coalesce`); a dloss::Error when a group is malformed.
  /// `kinds`: each step's reduction (an all_reduce's), else nullopt.
  static void markCoalesced(std::vector<BoundStep> &steps,
                            const std::vector<std::optional<Reduction>> &kinds);
  /// BoundFunction::foldRegisters of `steps`.
  static std::vector<int32_t> foldRegisters(const std::vector<BoundStep> &steps,
                                            const plan::Function &function);

  /// The preflight; returns every rank's argument shapes or raises.
  /// `schedule`: the call's setting, which the ranks must share.
  /// `folded` receives the rows the preflight carried (foldRegisters).
  RankShapes preflight(const std::string &name, const BoundFunction *bound,
                       const std::vector<at::Tensor> &inputs,
                       fused::Schedule schedule, Folded &folded);
  /// Check mode, after a global-mode gradient function: the replicated
  /// arguments' gradients agree bit for bit on every rank, or this raises.
  void checkReplicatedGradients(const std::string &name,
                                const plan::Function &function,
                                const std::vector<at::Tensor> &results);

  std::shared_ptr<const PlanFile> plan;
  Communicator &comm;
  ExecutorOptions opts;
  std::unordered_map<std::string, BoundFunction> functions;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_EXECUTOR_H
