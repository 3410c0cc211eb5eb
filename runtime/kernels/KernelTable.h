// The kernel table's types: a kernel, the rule that binds it to a step, and the
// lookup by op name.
#ifndef DLOSS_RUNTIME_KERNELS_KERNELTABLE_H
#define DLOSS_RUNTIME_KERNELS_KERNELTABLE_H

#include "runtime/exec/KernelContext.h"
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

/// How many operands and results a step of an op has.
struct Arity {
  int minOperands;
  int maxOperands;
  int numResults;
};

/// How a rule binds a step: the kernel from its attributes, and how the
/// result's sizes follow from the operands'.
struct KernelBinding {
  /// Parses the step's attributes (raising dloss::Error when they are
  /// missing or malformed) and returns the kernel.
  std::function<Kernel(const StepAttrs &)> bind;
  ShapeFlow shapeFlow = ShapeFlow::None;
};

/// The lowering rule of one op: its binding and its arity.
struct KernelRule {
  /// Parses the step's attributes (raising dloss::Error when they are
  /// missing or malformed) and returns the kernel.
  std::function<Kernel(const StepAttrs &)> bind;
  int minOperands;
  int maxOperands;
  int numResults;
  ShapeFlow shapeFlow = ShapeFlow::None;
};

/// A step's kernel, bound to its attributes.
struct BoundKernel {
  Kernel run;
  ShapeFlow shapeFlow = ShapeFlow::None;
};

/// The table of every op the runtime runs, keyed by MLIR op name.
const std::unordered_map<std::string, KernelRule> &kernelTable();

/// Resolves and binds the kernel of `step`: an unknown op, a wrong number of
/// operands or results, or a bad attribute raise dloss::Error naming the op
/// and its location.
BoundKernel bindKernel(const plan::Step &step);

} // namespace dloss

#endif // DLOSS_RUNTIME_KERNELS_KERNELTABLE_H
