// The shape rules of the dloss ops (see ShapeFunctions.h).
#include "dialect/ShapeFunctions.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::dloss;

namespace {

/// `shape` without dimension `axis`.
SmallVector<int64_t> withoutAxis(ArrayRef<int64_t> shape, int64_t axis) {
  SmallVector<int64_t> result(shape);
  result.erase(result.begin() + axis);
  return result;
}

/// Joins two shapes of equal rank whose static dimensions agree, keeping every
/// static size. Fails on the first disagreement.
FailureOr<SmallVector<int64_t>> joinShapes(ArrayRef<int64_t> lhs,
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

/// Checks an operand that holds one entry per row of `input` along `axis`
/// (the indices of take_along/put_along/cross_entropy, the values of
/// put_along) and returns the joined row shape.
FailureOr<SmallVector<int64_t>>
checkPerRowOperand(const shapes::Errors &error, RankedTensorType input,
                   int64_t axis, RankedTensorType perRow, StringRef name) {
  SmallVector<int64_t> rows = withoutAxis(input.getShape(), axis);
  FailureOr<SmallVector<int64_t>> joined = joinShapes(rows, perRow.getShape());
  if (failed(joined)) {
    (void)error(name, " must have the shape of the input without axis ", axis,
                ", ", shapes::formatShape(rows), ", got ",
                shapes::formatShape(perRow.getShape()));
    return failure();
  }
  return joined;
}

LogicalResult sameElementType(const shapes::Errors &error, Type lhs, Type rhs) {
  if (lhs != rhs)
    return error("operand element types differ: ", lhs, " and ", rhs,
                 "; insert a dloss.cast");
  return success();
}

/// Each axis of `axes` names a dimension of `type`, once.
FailureOr<llvm::SmallSet<int64_t, 4>>
distinctAxes(const shapes::Errors &error, ShapedType type,
             ArrayRef<int64_t> axes, StringRef operand = "operand") {
  llvm::SmallSet<int64_t, 4> seen;
  for (int64_t axis : axes) {
    if (failed(shapes::checkAxis(error, type, axis, operand)))
      return failure();
    if (!seen.insert(axis).second) {
      (void)error("axis ", axis, " is listed twice");
      return failure();
    }
  }
  return seen;
}

} // namespace

std::string shapes::formatShape(ArrayRef<int64_t> shape) {
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

LogicalResult shapes::checkAxis(const Errors &error, ShapedType type,
                                int64_t axis, StringRef operand) {
  if (axis < 0 || axis >= type.getRank())
    return error("axis ", axis, " is out of range for the rank-",
                 type.getRank(), " ", operand, " ", Type(type),
                 "; axes count from 0");
  return success();
}

FailureOr<RankedTensorType> shapes::resizeAxis(const Errors &error,
                                               RankedTensorType input,
                                               int64_t axis,
                                               std::optional<int64_t> size) {
  if (failed(checkAxis(error, input, axis)))
    return failure();
  if (size && *size < 0) {
    (void)error("gives axis ", axis, " the negative size ", *size);
    return failure();
  }
  SmallVector<int64_t> shape(input.getShape());
  shape[axis] = size ? *size : ShapedType::kDynamic;
  return RankedTensorType::get(shape, input.getElementType());
}

FailureOr<RankedTensorType>
shapes::allGather(const Errors &error, RankedTensorType input, int64_t axis,
                  std::optional<int64_t> worldSize) {
  std::optional<int64_t> size;
  if (worldSize && axis >= 0 && axis < input.getRank() &&
      !input.isDynamicDim(axis))
    size = input.getDimSize(axis) * *worldSize;
  return resizeAxis(error, input, axis, size);
}

FailureOr<RankedTensorType> shapes::matmul(const Errors &error,
                                           RankedTensorType lhs,
                                           RankedTensorType rhs, bool tl,
                                           bool tr) {
  if (lhs.getRank() != 2 || rhs.getRank() != 2) {
    (void)error("multiplies 2-D tensors, got ", Type(lhs), " and ", Type(rhs));
    return failure();
  }
  if (failed(
          sameElementType(error, lhs.getElementType(), rhs.getElementType())))
    return failure();
  int64_t m = lhs.getDimSize(tl ? 1 : 0), kl = lhs.getDimSize(tl ? 0 : 1);
  int64_t kr = rhs.getDimSize(tr ? 1 : 0), n = rhs.getDimSize(tr ? 0 : 1);
  if (!ShapedType::isDynamic(kl) && !ShapedType::isDynamic(kr) && kl != kr) {
    (void)error("inner dimensions differ: ", kl, " (lhs",
                tl ? ", transposed" : "", ") vs ", kr, " (rhs",
                tr ? ", transposed" : "",
                "); check the operands or the transpose flags");
    return failure();
  }
  return RankedTensorType::get({m, n}, lhs.getElementType());
}

FailureOr<RankedTensorType> shapes::elementwise(const Errors &error,
                                                RankedTensorType lhs,
                                                RankedTensorType rhs) {
  if (failed(
          sameElementType(error, lhs.getElementType(), rhs.getElementType())))
    return failure();
  if (lhs.getRank() == 0 || rhs.getRank() == 0)
    return lhs.getRank() == 0 ? rhs : lhs;
  FailureOr<SmallVector<int64_t>> shape =
      joinShapes(lhs.getShape(), rhs.getShape());
  if (failed(shape)) {
    (void)error("operand shapes ", formatShape(lhs.getShape()), " and ",
                formatShape(rhs.getShape()),
                " differ; element-wise ops broadcast only 0-d operands");
    return failure();
  }
  return RankedTensorType::get(*shape, lhs.getElementType());
}

FailureOr<RankedTensorType> shapes::select(const Errors &error,
                                           RankedTensorType cond,
                                           RankedTensorType trueValue,
                                           RankedTensorType falseValue) {
  if (failed(sameElementType(error, trueValue.getElementType(),
                             falseValue.getElementType())))
    return failure();
  SmallVector<int64_t> shape(cond.getShape());
  for (auto [name, value] :
       {std::pair<StringRef, RankedTensorType>{"true value", trueValue},
        {"false value", falseValue}}) {
    if (value.getRank() == 0)
      continue;
    FailureOr<SmallVector<int64_t>> joined =
        joinShapes(shape, value.getShape());
    if (failed(joined)) {
      (void)error("the ", name, " has shape ", formatShape(value.getShape()),
                  " but the condition has ", formatShape(cond.getShape()),
                  "; a value must have the condition's shape or be 0-d");
      return failure();
    }
    shape = *joined;
  }
  return RankedTensorType::get(shape, trueValue.getElementType());
}

FailureOr<RankedTensorType> shapes::reduce(const Errors &error,
                                           RankedTensorType input,
                                           ArrayRef<int64_t> axes) {
  if (axes.empty()) {
    (void)error("needs at least one axis to reduce");
    return failure();
  }
  FailureOr<llvm::SmallSet<int64_t, 4>> seen = distinctAxes(error, input, axes);
  if (failed(seen))
    return failure();
  SmallVector<int64_t> shape;
  for (auto [i, size] : llvm::enumerate(input.getShape()))
    if (!seen->contains(i))
      shape.push_back(size);
  return RankedTensorType::get(shape, input.getElementType());
}

FailureOr<RankedTensorType>
shapes::dropAxis(const Errors &error, RankedTensorType input, int64_t axis) {
  if (failed(checkAxis(error, input, axis)))
    return failure();
  return RankedTensorType::get(withoutAxis(input.getShape(), axis),
                               input.getElementType());
}

FailureOr<RankedTensorType> shapes::perRowPick(const Errors &error,
                                               RankedTensorType input,
                                               RankedTensorType indices,
                                               int64_t axis) {
  if (failed(checkAxis(error, input, axis)))
    return failure();
  FailureOr<SmallVector<int64_t>> rows =
      checkPerRowOperand(error, input, axis, indices, "indices");
  if (failed(rows))
    return failure();
  return RankedTensorType::get(*rows, input.getElementType());
}

FailureOr<RankedTensorType> shapes::putAlong(const Errors &error,
                                             RankedTensorType input,
                                             RankedTensorType indices,
                                             RankedTensorType values,
                                             int64_t axis) {
  if (failed(perRowPick(error, input, indices, axis)))
    return failure();
  if (values.getElementType() != input.getElementType()) {
    (void)error("values have element type ", values.getElementType(),
                " but the input has ", input.getElementType(),
                "; insert a dloss.cast");
    return failure();
  }
  if (failed(checkPerRowOperand(error, input, axis, values, "values")))
    return failure();
  return input;
}

FailureOr<RankedTensorType> shapes::expand(const Errors &error,
                                           RankedTensorType input,
                                           RankedTensorType like,
                                           ArrayRef<int64_t> axes) {
  FailureOr<llvm::SmallSet<int64_t, 4>> expanded =
      distinctAxes(error, like, axes, "'like' operand");
  if (failed(expanded))
    return failure();
  SmallVector<int64_t> kept;
  for (auto [i, size] : llvm::enumerate(like.getShape()))
    if (!expanded->contains(i))
      kept.push_back(size);
  FailureOr<SmallVector<int64_t>> joined = joinShapes(kept, input.getShape());
  if (failed(joined)) {
    (void)error("input shape ", formatShape(input.getShape()),
                " must be the shape of 'like' without the expanded axes, ",
                formatShape(kept));
    return failure();
  }
  SmallVector<int64_t> shape;
  unsigned next = 0;
  for (auto [i, size] : llvm::enumerate(like.getShape()))
    shape.push_back(expanded->contains(i) ? size : (*joined)[next++]);
  return RankedTensorType::get(shape, input.getElementType());
}
