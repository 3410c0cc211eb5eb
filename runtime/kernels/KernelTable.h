// The kernel table's types: a kernel, the rule that binds it to a step, the
// lookup by op name.
#ifndef DLOSS_RUNTIME_KERNELS_KERNELTABLE_H
#define DLOSS_RUNTIME_KERNELS_KERNELTABLE_H

#include "runtime/kernels/KernelContext.h"
#include "runtime/kernels/StepAttrs.h"
#include "runtime/plan/Plan_generated.h"

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

namespace dloss {

/// A bound kernel: attributes parsed, ready to run any number of times.
using Kernel = std::function<void(KernelContext &)>;

/// How every rank's sizes of result 0 follow from the operands', so that the
/// executor keeps them (known from the preflight) instead of exchanging them
/// at a later dloss.shard_offset / global_size / all_gather.
enum class ShapeFlow : uint8_t {
  None,
  /// The result has operand 0's shape.
  Operand0,
  /// The result has the shape of the operand that is not 0-d.
  Elementwise,
};

/// The lowering rule of one op: how it binds a step (the kernel from its
/// attributes) and how the result's sizes follow from the operands'. The
/// op's operand and result counts and its attributes' kinds are not here:
/// they come from its ODS definition (runtime/kernels/OpTable.inc), and
/// bindKernel checks a step against them before the rule runs.
struct KernelRule {
  /// Parses the step's attributes (raising dloss::Error when they are
  /// malformed) and returns the kernel.
  std::function<Kernel(const StepAttrs &)> bind;
  ShapeFlow shapeFlow = ShapeFlow::None;
  /// A fused op's operands whose every-rank rows its gather schedule
  /// gathers (by operand key, fused::gatheredOperand): the preflight may
  /// carry them when the op is a call's first collective (Executor). The
  /// initialiser lets a rule's braces leave it out under
  /// -Wmissing-field-initializers (the runtime's -Wextra).
  std::vector<int> foldOperands = {};
};

/// A step's kernel, bound to its attributes.
struct BoundKernel {
  Kernel run;
  ShapeFlow shapeFlow = ShapeFlow::None;
  std::vector<int> foldOperands;
};

/// The table of every op the runtime runs, keyed by MLIR op name.
const std::unordered_map<std::string, KernelRule> &kernelTable();

/// Resolves and binds the kernel of `step`: an unknown op, a wrong number of
/// operands or results, or an attribute that is missing or of the wrong kind
/// (as the op's ODS definition declares them) raise dloss::Error naming the
/// op and its location.
BoundKernel bindKernel(const plan::Step &step);

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_KERNELTABLE_H
