// The preflight's index checks: the arguments that index a statically sized
// dimension, and the first value of one outside it.
#ifndef DLOSS_RUNTIME_EXEC_PREFLIGHTINDICES_H
#define DLOSS_RUNTIME_EXEC_PREFLIGHTINDICES_H

#include "runtime/plan/Plan_generated.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dloss::preflight {

/// A use of an argument as the indices of an op that picks one element per
/// row along a dimension whose size the plan knows statically (ArcFace's
/// classes): an op whose ODS definition marks the operand (Dloss_IndexOperand,
/// carried by the op table), or a class target of the general fused op. The
/// preflight checks the range, so that a bad label fails every rank in the
/// same call instead of one rank's kernel, with its peers left waiting at
/// their next collective.
struct IndexUse {
  size_t argument;
  int64_t size;
  int64_t axis;
  std::string op;
  std::string loc;
};

/// Every argument that indexes a statically sized dimension, with the
/// smallest such size (the bound its values must respect), in argument
/// order. Register types come from the arguments and the steps'
/// result_types; a register overwritten by a step no longer holds its
/// argument. A function's uses depend on its plan alone: the executor finds
/// them once, when it binds the function, not on every call.
std::vector<IndexUse> indexUses(const plan::Function &function);

/// A value of an index argument outside the size it indexes.
struct OutOfRange {
  int64_t value;
  int64_t flat; ///< its position in the flattened input
};

/// The first value of `input` outside [0, use.size), if any. Reads the
/// tensor's values, so it raises only on a broken tensor.
std::optional<OutOfRange> firstOutOfRange(const IndexUse &use,
                                          const at::Tensor &input);

} // namespace dloss::preflight

#endif // DLOSS_RUNTIME_EXEC_PREFLIGHTINDICES_H
