// The dloss ops: verifiers, result-type inference and folders.
#include "dialect/DlossOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::dloss;

//===----------------------------------------------------------------------===//
// Shared checks. Inference runs while parsing, before any verifier, so these
// report through an optional location, in the same words as emitOpError.
//===----------------------------------------------------------------------===//

namespace {
/// Reports an error for op `OpT` at an optional location.
template <typename OpT>
struct OpErrors {
  std::optional<Location> loc;

  template <typename... Args>
  LogicalResult operator()(Args &&...args) const {
    return emitOptionalError(loc, "'", OpT::getOperationName(), "' op ",
                             std::forward<Args>(args)...);
  }
};
} // namespace

template <typename OpT>
static OpErrors<OpT> errorsFor(std::optional<Location> loc) {
  return OpErrors<OpT>{loc};
}

template <typename OpT>
static OpErrors<OpT> errorsFor(OpT op) {
  return OpErrors<OpT>{op.getLoc()};
}

/// Checks that `axis` names a dimension of `type`.
template <typename OpT>
static LogicalResult checkAxis(const OpErrors<OpT> &error, ShapedType type,
                               int64_t axis, StringRef operand = "operand") {
  if (axis < 0 || axis >= type.getRank())
    return error("axis ", axis, " is out of range for the rank-",
                 type.getRank(), " ", operand, " ", Type(type),
                 "; axes count from 0");
  return success();
}

/// `shape` without dimension `axis`.
static SmallVector<int64_t> dropAxis(ArrayRef<int64_t> shape, int64_t axis) {
  SmallVector<int64_t> result(shape);
  result.erase(result.begin() + axis);
  return result;
}

/// `shape` with dimension `axis` made dynamic: the size differs per rank.
static SmallVector<int64_t> dynamicAxis(ArrayRef<int64_t> shape, int64_t axis) {
  SmallVector<int64_t> result(shape);
  result[axis] = ShapedType::kDynamic;
  return result;
}

/// Joins two shapes of equal rank whose static dimensions agree, keeping every
/// static size. Fails on the first disagreement.
static FailureOr<SmallVector<int64_t>> joinShapes(ArrayRef<int64_t> lhs,
                                                  ArrayRef<int64_t> rhs) {
  if (lhs.size() != rhs.size())
    return failure();
  SmallVector<int64_t> result;
  for (auto [l, r] : llvm::zip_equal(lhs, rhs)) {
    if (!ShapedType::isDynamic(l) && !ShapedType::isDynamic(r) && l != r)
      return failure();
    result.push_back(ShapedType::isDynamic(l) ? r : l);
  }
  return result;
}

static std::string formatShape(ArrayRef<int64_t> shape) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(shape, os, [&](int64_t d) {
    if (ShapedType::isDynamic(d))
      os << "?";
    else
      os << d;
  });
  os << "]";
  return text;
}

/// Checks an operand that holds one entry per row of `input` along `axis`
/// (the indices of take_along/put_along/cross_entropy, the values of
/// put_along) and returns the joined row shape.
template <typename OpT>
static FailureOr<SmallVector<int64_t>>
checkPerRowOperand(const OpErrors<OpT> &error, RankedTensorType input,
                   int64_t axis, RankedTensorType perRow, StringRef name) {
  SmallVector<int64_t> rows = dropAxis(input.getShape(), axis);
  FailureOr<SmallVector<int64_t>> joined =
      joinShapes(rows, perRow.getShape());
  if (failed(joined)) {
    (void)error(name, " must have the shape of the input without axis ", axis,
                ", ", formatShape(rows), ", got ",
                formatShape(perRow.getShape()));
    return failure();
  }
  return joined;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

LogicalResult AllGatherOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  if (failed(checkAxis(errorsFor<AllGatherOp>(loc), input, adaptor.getAxis())))
    return failure();
  results.push_back(RankedTensorType::get(
      dynamicAxis(input.getShape(), adaptor.getAxis()), input.getElementType()));
  return success();
}

LogicalResult ReduceScatterOp::inferReturnTypes(MLIRContext *,
                                                std::optional<Location> loc,
                                                Adaptor adaptor,
                                                SmallVectorImpl<Type> &results) {
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  if (failed(checkAxis(errorsFor<ReduceScatterOp>(loc), input, adaptor.getAxis())))
    return failure();
  results.push_back(RankedTensorType::get(
      dynamicAxis(input.getShape(), adaptor.getAxis()), input.getElementType()));
  return success();
}

LogicalResult ReduceScatterOp::verify() {
  if (getKind() != ReduceKind::sum && getKind() != ReduceKind::mean)
    return emitOpError("combines with sum or mean, not ")
           << stringifyReduceKind(getKind())
           << "; use dloss.all_reduce " << stringifyReduceKind(getKind())
           << " and keep this rank's slice";
  return success();
}

LogicalResult BroadcastOp::verify() {
  if (static_cast<int64_t>(getRoot()) < 0)
    return emitOpError("root ") << static_cast<int64_t>(getRoot()) << " is negative; ranks count from 0";
  return success();
}

OpFoldResult RingShiftOp::fold(FoldAdaptor) {
  // Every rank folds the same way, so dropping an identity shift keeps the
  // ranks' collective sequences in agreement.
  if (getShift() == 0)
    return getInput();
  return {};
}

// Replication rules of the collectives (the table in DESIGN.md).
Replication AllGatherOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Invariant;
}
Replication AllReduceOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Invariant;
}
Replication BroadcastOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Invariant;
}
Replication ReduceScatterOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication RingShiftOp::inferReplication(ArrayRef<Replication> operands) {
  // Every rank receives a copy of an equal value: still equal.
  return operands.front();
}

//===----------------------------------------------------------------------===//
// Rank facts
//===----------------------------------------------------------------------===//

Replication RankOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication DimOp::inferReplication(ArrayRef<Replication> operands) {
  // Invariant tensors have the same shape everywhere.
  return operands.front();
}
Replication ShardOffsetOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication GlobalSizeOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Invariant;
}

template <typename OpT>
static LogicalResult verifyAxisSizeOp(OpT op) {
  return checkAxis(errorsFor(op), cast<ShapedType>(op.getInput().getType()),
                   op.getAxis());
}

LogicalResult DimOp::verify() { return verifyAxisSizeOp(*this); }
LogicalResult ShardOffsetOp::verify() { return verifyAxisSizeOp(*this); }
LogicalResult GlobalSizeOp::verify() { return verifyAxisSizeOp(*this); }

OpFoldResult DimOp::fold(FoldAdaptor) {
  auto type = cast<ShapedType>(getInput().getType());
  auto axis = static_cast<int64_t>(getAxis());
  if (axis < 0 || axis >= type.getRank() || type.isDynamicDim(axis))
    return {};
  return IntegerAttr::get(IndexType::get(getContext()),
                          type.getDimSize(axis));
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto error = errorsFor<MatmulOp>(loc);
  auto lhs = cast<RankedTensorType>(adaptor.getLhs().getType());
  auto rhs = cast<RankedTensorType>(adaptor.getRhs().getType());
  if (lhs.getRank() != 2 || rhs.getRank() != 2)
    return error("multiplies 2-D tensors, got ", Type(lhs), " and ", Type(rhs));
  if (lhs.getElementType() != rhs.getElementType())
    return error("operand element types differ: ", lhs.getElementType(),
                 " and ", rhs.getElementType(), "; insert a dloss.cast");
  bool tl = adaptor.getTransposeLhs(), tr = adaptor.getTransposeRhs();
  int64_t m = lhs.getDimSize(tl ? 1 : 0), kl = lhs.getDimSize(tl ? 0 : 1);
  int64_t kr = rhs.getDimSize(tr ? 1 : 0), n = rhs.getDimSize(tr ? 0 : 1);
  if (!ShapedType::isDynamic(kl) && !ShapedType::isDynamic(kr) && kl != kr)
    return error("inner dimensions differ: ", kl, " (lhs", tl ? ", transposed" : "",
                 ") vs ", kr, " (rhs", tr ? ", transposed" : "",
                 "); check the operands or the transpose flags");
  results.push_back(RankedTensorType::get({m, n}, lhs.getElementType()));
  return success();
}

/// Element-wise shape rule: equal shapes, or a 0-d operand broadcast to the other.
template <typename OpT>
static LogicalResult inferElementwise(std::optional<Location> loc, Value lhsValue,
                                      Value rhsValue,
                                      SmallVectorImpl<Type> &results) {
  auto error = errorsFor<OpT>(loc);
  auto lhs = cast<RankedTensorType>(lhsValue.getType());
  auto rhs = cast<RankedTensorType>(rhsValue.getType());
  if (lhs.getElementType() != rhs.getElementType())
    return error("operand element types differ: ", lhs.getElementType(),
                 " and ", rhs.getElementType(), "; insert a dloss.cast");
  if (lhs.getRank() == 0 || rhs.getRank() == 0) {
    results.push_back(lhs.getRank() == 0 ? rhs : lhs);
    return success();
  }
  FailureOr<SmallVector<int64_t>> shape =
      joinShapes(lhs.getShape(), rhs.getShape());
  if (failed(shape))
    return error("operand shapes ", formatShape(lhs.getShape()), " and ",
                 formatShape(rhs.getShape()),
                 " differ; element-wise ops broadcast only 0-d operands");
  results.push_back(RankedTensorType::get(*shape, lhs.getElementType()));
  return success();
}

#define DLOSS_ELEMENTWISE_INFER(OP)                                            \
  LogicalResult OP::inferReturnTypes(MLIRContext *,                           \
                                     std::optional<Location> loc,             \
                                     Adaptor adaptor,                         \
                                     SmallVectorImpl<Type> &results) {        \
    return inferElementwise<OP>(loc, adaptor.getLhs(), adaptor.getRhs(),      \
                                results);                                     \
  }
DLOSS_ELEMENTWISE_INFER(AddOp)
DLOSS_ELEMENTWISE_INFER(SubOp)
DLOSS_ELEMENTWISE_INFER(MulOp)
DLOSS_ELEMENTWISE_INFER(DivOp)
DLOSS_ELEMENTWISE_INFER(EqOp)
#undef DLOSS_ELEMENTWISE_INFER

LogicalResult ClampOp::verify() {
  auto toDouble = [](std::optional<APFloat> v) -> std::optional<double> {
    if (!v)
      return std::nullopt;
    return v->convertToDouble();
  };
  std::optional<double> lo = toDouble(getMin()), hi = toDouble(getMax());
  if (!lo && !hi)
    return emitOpError("needs a min, a max or both");
  if (lo && hi && *lo > *hi)
    return emitOpError("min ") << *lo << " is greater than max " << *hi;
  return success();
}

LogicalResult CastOp::verify() {
  auto result = cast<RankedTensorType>(getResult().getType());
  if (isa<IndexType>(getInput().getType())) {
    if (result.getRank() != 0)
      return emitOpError("casts an index to a 0-d tensor, not to ") << Type(result);
    return success();
  }
  auto input = cast<RankedTensorType>(getInput().getType());
  if (failed(verifyCompatibleShape(input, result)))
    return emitOpError("changes only the element type; shapes ")
           << formatShape(input.getShape()) << " and "
           << formatShape(result.getShape()) << " differ";
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType())
    return getInput();
  return {};
}

LogicalResult L2NormalizeOp::verify() {
  if (failed(checkAxis(errorsFor(*this), getInput().getType(), getAxis())))
    return failure();
  if (!(getEps().convertToDouble() > 0.0))
    return emitOpError("eps must be positive, got ") << getEps().convertToDouble();
  return success();
}

LogicalResult ReduceOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto error = errorsFor<ReduceOp>(loc);
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  ArrayRef<int64_t> axes = adaptor.getAxes();
  if (axes.empty())
    return error("needs at least one axis to reduce");
  llvm::SmallSet<int64_t, 4> seen;
  for (int64_t axis : axes) {
    if (failed(checkAxis(error, input, axis)))
      return failure();
    if (!seen.insert(axis).second)
      return error("axis ", axis, " is listed twice");
  }
  SmallVector<int64_t> shape;
  for (auto [i, size] : llvm::enumerate(input.getShape()))
    if (!seen.contains(i))
      shape.push_back(size);
  results.push_back(RankedTensorType::get(shape, input.getElementType()));
  return success();
}

LogicalResult LogSumExpOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  if (failed(checkAxis(errorsFor<LogSumExpOp>(loc), input, adaptor.getAxis())))
    return failure();
  results.push_back(RankedTensorType::get(
      dropAxis(input.getShape(), adaptor.getAxis()), input.getElementType()));
  return success();
}

/// Shared rule of take_along and cross_entropy: one index per row.
template <typename OpT>
static LogicalResult inferPerRowPick(std::optional<Location> loc, Value inputValue,
                                     Value indicesValue, int64_t axis,
                                     SmallVectorImpl<Type> &results) {
  auto error = errorsFor<OpT>(loc);
  auto input = cast<RankedTensorType>(inputValue.getType());
  auto indices = cast<RankedTensorType>(indicesValue.getType());
  if (failed(checkAxis(error, input, axis)))
    return failure();
  FailureOr<SmallVector<int64_t>> rows =
      checkPerRowOperand(error, input, axis, indices, "indices");
  if (failed(rows))
    return failure();
  results.push_back(RankedTensorType::get(*rows, input.getElementType()));
  return success();
}

LogicalResult TakeAlongOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  return inferPerRowPick<TakeAlongOp>(loc, adaptor.getInput(),
                                      adaptor.getIndices(), adaptor.getAxis(),
                                      results);
}

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *,
                                               std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &results) {
  return inferPerRowPick<CrossEntropyOp>(loc, adaptor.getLogits(),
                                         adaptor.getTargets(),
                                         adaptor.getAxis(), results);
}

LogicalResult PutAlongOp::inferReturnTypes(MLIRContext *,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &results) {
  auto error = errorsFor<PutAlongOp>(loc);
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  auto values = cast<RankedTensorType>(adaptor.getValues().getType());
  SmallVector<Type> picked;
  if (failed(inferPerRowPick<PutAlongOp>(loc, adaptor.getInput(),
                                         adaptor.getIndices(),
                                         adaptor.getAxis(), picked)))
    return failure();
  if (values.getElementType() != input.getElementType())
    return error("values have element type ", values.getElementType(),
                 " but the input has ", input.getElementType(),
                 "; insert a dloss.cast");
  if (failed(checkPerRowOperand(error, input, adaptor.getAxis(), values,
                                "values")))
    return failure();
  results.push_back(input);
  return success();
}

LogicalResult ArangeOp::verify() {
  auto result = cast<RankedTensorType>(getResult().getType());
  if (result.getRank() != 1)
    return emitOpError("produces a 1-D tensor, not ") << Type(result);
  return success();
}

LogicalResult ExpandOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  auto error = errorsFor<ExpandOp>(loc);
  auto input = cast<RankedTensorType>(adaptor.getInput().getType());
  auto like = cast<RankedTensorType>(adaptor.getLike().getType());
  llvm::SmallSet<int64_t, 4> axes;
  for (int64_t axis : adaptor.getAxes()) {
    if (failed(checkAxis(error, like, axis, "'like' operand")))
      return failure();
    if (!axes.insert(axis).second)
      return error("axis ", axis, " is listed twice");
  }
  SmallVector<int64_t> kept;
  for (auto [i, size] : llvm::enumerate(like.getShape()))
    if (!axes.contains(i))
      kept.push_back(size);
  FailureOr<SmallVector<int64_t>> joined = joinShapes(kept, input.getShape());
  if (failed(joined))
    return error("input shape ", formatShape(input.getShape()),
                 " must be the shape of 'like' without the expanded axes, ",
                 formatShape(kept));
  SmallVector<int64_t> shape;
  unsigned next = 0;
  for (auto [i, size] : llvm::enumerate(like.getShape()))
    shape.push_back(axes.contains(i) ? size : (*joined)[next++]);
  results.push_back(RankedTensorType::get(shape, input.getElementType()));
  return success();
}

/// Slice and pad change one axis by run-time amounts: it becomes dynamic.
template <typename OpT>
static LogicalResult inferDynamicAxis(std::optional<Location> loc, Value inputValue,
                                      int64_t axis, SmallVectorImpl<Type> &results) {
  auto input = cast<RankedTensorType>(inputValue.getType());
  if (failed(checkAxis(errorsFor<OpT>(loc), input, axis)))
    return failure();
  results.push_back(
      RankedTensorType::get(dynamicAxis(input.getShape(), axis), input.getElementType()));
  return success();
}

LogicalResult SliceOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &results) {
  return inferDynamicAxis<SliceOp>(loc, adaptor.getInput(), adaptor.getAxis(),
                                   results);
}

LogicalResult PadOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &results) {
  return inferDynamicAxis<PadOp>(loc, adaptor.getInput(), adaptor.getAxis(),
                                 results);
}

#define GET_OP_CLASSES
#include "dialect/DlossOps.cpp.inc"

//===----------------------------------------------------------------------===//
// Fused ops (produced by dloss-fuse-gather-similarity)
//===----------------------------------------------------------------------===//

namespace {
/// Shape checks shared by the fused ops: 2-D feature matrices of one float
/// type and feature size, 0-d parameters and 1-D per-row vectors of it.
struct FusedChecks {
  Operation *op;
  Type element;
  LogicalResult features(Value value, StringRef name) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getRank() != 2)
      return op->emitOpError() << name << " must be 2-D, got " << Type(type);
    if (type.getElementType() != element)
      return op->emitOpError()
             << name << " has element type " << type.getElementType()
             << " but the fused op computes in " << element;
    return success();
  }
  LogicalResult sameFeatureSize(Value a, Value b) {
    int64_t x = cast<RankedTensorType>(a.getType()).getDimSize(1);
    int64_t y = cast<RankedTensorType>(b.getType()).getDimSize(1);
    if (!ShapedType::isDynamic(x) && !ShapedType::isDynamic(y) && x != y)
      return op->emitOpError() << "feature sizes differ: " << x << " vs " << y;
    return success();
  }
  LogicalResult scalar(Value value, StringRef name) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getRank() != 0 || type.getElementType() != element)
      return op->emitOpError() << name << " must be a 0-d tensor of " << element
                               << ", got " << Type(type);
    return success();
  }
  LogicalResult vector(Value value, StringRef name, bool integer = false) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getRank() != 1 || (!integer && type.getElementType() != element))
      return op->emitOpError()
             << name << " must be a 1-D tensor"
             << (integer ? "" : " of the features' element type") << ", got "
             << Type(type);
    return success();
  }
  /// The operands every fused op starts with: two feature matrices of one
  /// feature size and a 0-d scale.
  LogicalResult similarity(Value rows, Value cols, StringRef colsName, Value scale) {
    return success(succeeded(features(rows, "rows")) &&
                   succeeded(features(cols, colsName)) &&
                   succeeded(sameFeatureSize(rows, cols)) &&
                   succeeded(this->scalar(scale, "scale")));
  }
  LogicalResult like(Value value, Value reference, StringRef name) {
    if (value.getType() != reference.getType())
      return op->emitOpError() << name << " must have type " << reference.getType()
                               << ", got " << value.getType();
    return success();
  }
};

FusedChecks fusedChecks(Operation *op, Value features) {
  return {op, cast<ShapedType>(features.getType()).getElementType()};
}
} // namespace

LogicalResult RingSoftmaxCEOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
                 succeeded(c.vector(getRowTargets(), "row_targets", true)) &&
                 succeeded(c.vector(getColTargets(), "col_targets", true)) &&
                 succeeded(c.vector(getRowCe(), "row_ce")) &&
                 succeeded(c.vector(getColCe(), "col_ce")) &&
                 succeeded(c.vector(getRowLse(), "row_lse")) &&
                 succeeded(c.vector(getColLse(), "col_lse")));
}

LogicalResult RingSoftmaxCEGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
                 succeeded(c.vector(getRowTargets(), "row_targets", true)) &&
                 succeeded(c.vector(getColTargets(), "col_targets", true)) &&
                 succeeded(c.vector(getRowLse(), "row_lse")) &&
                 succeeded(c.vector(getColLse(), "col_lse")) &&
                 succeeded(c.vector(getCtRow(), "ct_row")) &&
                 succeeded(c.vector(getCtCol(), "ct_col")) &&
                 succeeded(c.like(getDRows(), getRows(), "d_rows")) &&
                 succeeded(c.like(getDCols(), getCols(), "d_cols")) &&
                 succeeded(c.like(getDScale(), getScale(), "d_scale")));
}

LogicalResult RingSigmoidPairsOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
                 succeeded(c.scalar(getBias(), "bias")) &&
                 succeeded(c.vector(getTargets(), "targets", true)) &&
                 succeeded(c.vector(getPairSum(), "pair_sum")) &&
                 succeeded(c.vector(getPositive(), "positive")));
}

LogicalResult RingSigmoidPairsGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
                 succeeded(c.scalar(getBias(), "bias")) &&
                 succeeded(c.vector(getTargets(), "targets", true)) &&
                 succeeded(c.vector(getCtPair(), "ct_pair")) &&
                 succeeded(c.vector(getCtPositive(), "ct_positive")) &&
                 succeeded(c.like(getDRows(), getRows(), "d_rows")) &&
                 succeeded(c.like(getDCols(), getCols(), "d_cols")) &&
                 succeeded(c.like(getDScale(), getScale(), "d_scale")) &&
                 succeeded(c.like(getDBias(), getBias(), "d_bias")));
}

LogicalResult ShardedSoftmaxOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getWeights(), "weights", getScale())) &&
                 succeeded(c.vector(getTargets(), "targets", true)) &&
                 succeeded(c.vector(getLseRest(), "lse_rest")) &&
                 succeeded(c.vector(getTargetDot(), "target_dot")));
}

LogicalResult ShardedSoftmaxGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(succeeded(c.similarity(getRows(), getWeights(), "weights", getScale())) &&
                 succeeded(c.vector(getTargets(), "targets", true)) &&
                 succeeded(c.vector(getLseRest(), "lse_rest")) &&
                 succeeded(c.vector(getCtLse(), "ct_lse")) &&
                 succeeded(c.vector(getCtTarget(), "ct_target")) &&
                 succeeded(c.like(getDRows(), getRows(), "d_rows")) &&
                 succeeded(c.like(getDWeights(), getWeights(), "d_weights")) &&
                 succeeded(c.like(getDScale(), getScale(), "d_scale")));
}

// The ring ops compute this rank's rows: varying. The sharded softmax
// all-reduces its statistics over the class shards: invariant (its rows are
// the gathered batch). Its backward holds this shard's partial gradients.
Replication RingSoftmaxCEOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication RingSoftmaxCEGradOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication RingSigmoidPairsOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication RingSigmoidPairsGradOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
Replication ShardedSoftmaxOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Invariant;
}
Replication ShardedSoftmaxGradOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}
