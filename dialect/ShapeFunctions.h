// The shape rules of the dloss ops, written once (as StableHLO's
// TypeInference).
//
// Every rule maps operand types to a result type. Result-type inference calls
// them with the IR's types, where a run-time size is dynamic (`?`); the cost
// report (dialect/DlossCosts.cpp) calls the same rules with the concrete types
// of one rank under the report's sizes, passing the run-time sizes it knows
// (the world size, a slice's length). The checks, and their messages, are
// therefore the same in both.
#ifndef DLOSS_DIALECT_SHAPEFUNCTIONS_H
#define DLOSS_DIALECT_SHAPEFUNCTIONS_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/Support/LLVM.h"

#include <optional>
#include <string>

namespace mlir::dloss::shapes {

/// Reports the errors of one op's shape rule: "'dloss.matmul' op <what>"
/// followed by `suffix` (the report adds " under the report's sizes"). No
/// location: the rule only answers (inference while parsing probes quietly).
class Errors {
public:
  Errors(std::optional<Location> loc, StringRef opName, StringRef suffix = "")
      : loc(loc), opName(opName), suffix(suffix) {}

  template <typename... Args> LogicalResult operator()(Args &&...args) const {
    if (!loc)
      return failure();
    InFlightDiagnostic diag = emitError(*loc) << "'" << opName << "' op ";
    (diag << ... << std::forward<Args>(args));
    return diag << suffix;
  }

private:
  std::optional<Location> loc;
  StringRef opName;
  StringRef suffix;
};

/// "[4096, ?]".
std::string formatShape(ArrayRef<int64_t> shape);

/// `axis` names a dimension of `type` (axes count from 0).
LogicalResult checkAxis(const Errors &error, ShapedType type, int64_t axis,
                        StringRef operand = "operand");

/// `input` with dimension `axis` resized to `size`, dynamic when the size is
/// known only at run time (all_gather, reduce_scatter, slice, pad).
FailureOr<RankedTensorType> resizeAxis(const Errors &error,
                                       RankedTensorType input, int64_t axis,
                                       std::optional<int64_t> size);

/// dloss.all_gather: dimension `axis` becomes the sum over ranks, known when
/// every rank holds `input`'s static size and the world size is known.
FailureOr<RankedTensorType> allGather(const Errors &error,
                                      RankedTensorType input, int64_t axis,
                                      std::optional<int64_t> worldSize);

/// dloss.matmul with its transpose flags.
FailureOr<RankedTensorType> matmul(const Errors &error, RankedTensorType lhs,
                                   RankedTensorType rhs, bool transposeLhs,
                                   bool transposeRhs);

/// Element-wise binary ops: equal shapes, or a 0-d operand broadcast.
FailureOr<RankedTensorType>
elementwise(const Errors &error, RankedTensorType lhs, RankedTensorType rhs);

/// dloss.select: `cond` has the result's shape; each value has it too or is
/// 0-d; the values share an element type (the result's).
FailureOr<RankedTensorType> select(const Errors &error, RankedTensorType cond,
                                   RankedTensorType trueValue,
                                   RankedTensorType falseValue);

/// dloss.reduce over `axes` (each once).
FailureOr<RankedTensorType> reduce(const Errors &error, RankedTensorType input,
                                   ArrayRef<int64_t> axes);

/// dloss.logsumexp: `input` without `axis`.
FailureOr<RankedTensorType> dropAxis(const Errors &error,
                                     RankedTensorType input, int64_t axis);

/// dloss.take_along and dloss.cross_entropy: one index per row along `axis`.
FailureOr<RankedTensorType> perRowPick(const Errors &error,
                                       RankedTensorType input,
                                       RankedTensorType indices, int64_t axis);

/// dloss.put_along: `input` with one value per row written along `axis`.
FailureOr<RankedTensorType> putAlong(const Errors &error,
                                     RankedTensorType input,
                                     RankedTensorType indices,
                                     RankedTensorType values, int64_t axis);

/// dloss.expand: `input` broadcast along `axes` to the shape of `like`.
FailureOr<RankedTensorType> expand(const Errors &error, RankedTensorType input,
                                   RankedTensorType like,
                                   ArrayRef<int64_t> axes);

} // namespace mlir::dloss::shapes

#endif // DLOSS_DIALECT_SHAPEFUNCTIONS_H
