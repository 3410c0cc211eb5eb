// The contract between per-op cost rules (dialect/DlossCosts.cpp) and the cost
// report (report/).
//
// The report evaluates a straight-line function on one representative rank
// under concrete sizes. Each op's rule (CostOpInterface::evaluateCost) gives
// its results' concrete shapes or index values through the op's shape rule
// (dialect/ShapeFunctions.h), the bytes one rank sends per call under the
// runtime's algorithm, and the temporaries its kernel allocates beyond its
// results.
#ifndef DLOSS_DIALECT_COSTMODEL_H
#define DLOSS_DIALECT_COSTMODEL_H

#include "dialect/ShapeFunctions.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/DenseMap.h"

#include <cstdint>
#include <string>

namespace mlir::dloss {

/// What the evaluation knows about one SSA value on the representative rank:
/// a tensor's concrete type, or an index (or integer scalar)'s value.
struct Concrete {
  /// The tensor's type with every dimension known; null for an index.
  RankedTensorType tensor;
  int64_t value = 0;

  bool isTensor() const { return static_cast<bool>(tensor); }
  int64_t bytes() const;
  /// "4096x256xf32".
  std::string typeText() const;
};

/// Bytes and how they add up (one rank's sends, or a kernel's temporaries).
struct Cost {
  double bytes = 0;
  std::string how;
};

/// The cost of one call of an op.
struct OpCost {
  /// Bytes this rank sends (collectives only).
  Cost sent;
  /// Temporaries the kernel allocates beyond its results.
  Cost workspace;
};

/// The sizes the evaluation assumes beyond the function's arguments.
struct CostOptions {
  int64_t worldSize = 4;
  /// The nominal tile (rows x columns) of the fused kernels' workspace.
  int64_t tileRows = 256, tileCols = 1024;
};

/// The concrete values of one function on the representative rank (rank 0;
/// with equal sizes on every rank no shape depends on the rank).
class CostEvaluator {
public:
  explicit CostEvaluator(const CostOptions &options) : options(options) {}

  const CostOptions &costOptions() const { return options; }
  int64_t worldSize() const { return options.worldSize; }
  int64_t rank() const { return 0; }

  bool has(Value value) const { return known.count(value); }
  const Concrete &get(Value value) const { return known.find(value)->second; }
  /// The concrete type of a tensor value (callers know it is one).
  RankedTensorType type(Value value) const { return get(value).tensor; }
  ArrayRef<int64_t> shape(Value value) const {
    return get(value).tensor.getShape();
  }
  int64_t bytes(Value value) const { return get(value).bytes(); }
  int64_t index(Value value) const { return get(value).value; }
  /// Bytes of one element of `value`'s type.
  int64_t elementSize(Value value) const;
  /// Bytes of one fused-kernel tile of `value`'s elements.
  int64_t tileBytes(Value value) const {
    return options.tileRows * options.tileCols * elementSize(value);
  }

  /// `result` is a tensor of `shape` (element type from the IR).
  void setTensor(Value result, ArrayRef<int64_t> shape);
  /// `result` is `type`'s shape, with the IR's element type.
  LogicalResult setType(Value result, FailureOr<RankedTensorType> type);
  void setIndex(Value result, int64_t value);
  void set(Value result, const Concrete &like) { known[result] = like; }

  /// The shape rules' errors for `op`, said to hold under the report's sizes.
  shapes::Errors errors(Operation *op) const;
  /// An error at `op`'s location that names it. (Operation::emitError would
  /// append the whole op, and with it the function, as a note.)
  InFlightDiagnostic fail(Operation *op) const;

private:
  CostOptions options;
  llvm::DenseMap<Value, Concrete> known;
};

/// "4096x256" ("0-d" for a scalar): a concrete shape in the report's words.
std::string concreteShapeText(ArrayRef<int64_t> shape);

/// Attaches the cost rules of the arith ops a plan may hold (constants and
/// index arithmetic), as external models.
void registerArithCostModels(DialectRegistry &registry);

} // namespace mlir::dloss

#endif // DLOSS_DIALECT_COSTMODEL_H
