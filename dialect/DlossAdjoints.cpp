// Reverse-mode rules of the dloss ops, one per op (AdjointOpInterface).
//
// Each rule reads the cotangent of its results and adds contributions to its
// operands through AdjointBuilder; the autodiff pass (passes/Autodiff.cpp) does
// the bookkeeping. Forward values are used directly: the backward keeps every
// forward value alive (the policy documented in docs/Autodiff.md).
#include "dialect/DlossOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace mlir::dloss;

//===----------------------------------------------------------------------===//
// AdjointBuilder helpers
//===----------------------------------------------------------------------===//

AdjointBuilder::~AdjointBuilder() = default;

Value AdjointBuilder::reduced(Cotangent ct) {
  if (ct.kind != CotangentKind::Partial)
    return ct.value;
  return AllReduceOp::create(b, loc, ReduceKind::sum, ct.value);
}

static Type elementTypeOf(Value value) {
  return cast<ShapedType>(value.getType()).getElementType();
}

Value AdjointBuilder::partial(Cotangent ct) {
  if (ct.kind != CotangentKind::Reduced)
    return ct.value;
  return DivOp::create(b, loc, ct.value, worldSize(elementTypeOf(ct.value)));
}

Value AdjointBuilder::scalar(double value, Type elementType) {
  auto type = RankedTensorType::get({}, elementType);
  return arith::ConstantOp::create(
      b, loc, DenseElementsAttr::get(type, b.getFloatAttr(elementType, value)));
}

Value AdjointBuilder::worldSize(Type elementType) {
  Value n = WorldSizeOp::create(b, loc);
  return CastOp::create(b, loc, RankedTensorType::get({}, elementType), n);
}

Value AdjointBuilder::unbroadcast(Value ct, Type operandType) {
  auto operand = cast<RankedTensorType>(operandType);
  auto ctType = cast<RankedTensorType>(ct.getType());
  if (operand.getRank() != 0 || ctType.getRank() == 0)
    return ct;
  auto axes = llvm::to_vector(llvm::seq<int64_t>(0, ctType.getRank()));
  return ReduceOp::create(b, loc, ReduceKind::sum, ct, axes);
}

Value AdjointBuilder::expand(Value ct, int64_t axis, Value like) {
  return ExpandOp::create(b, loc, ct, ArrayRef<int64_t>{axis}, like);
}

//===----------------------------------------------------------------------===//
// Short names for the rules below.
//===----------------------------------------------------------------------===//

namespace {
/// Builds the element-wise arithmetic of a rule at the rule's insertion point.
struct Ops {
  AdjointBuilder &ab;
  Value add(Value x, Value y) { return AddOp::create(ab.b, ab.loc, x, y); }
  Value sub(Value x, Value y) { return SubOp::create(ab.b, ab.loc, x, y); }
  Value mul(Value x, Value y) { return MulOp::create(ab.b, ab.loc, x, y); }
  Value div(Value x, Value y) { return DivOp::create(ab.b, ab.loc, x, y); }
  Value neg(Value x) { return NegOp::create(ab.b, ab.loc, x); }
  Value eq(Value x, Value y) { return EqOp::create(ab.b, ab.loc, x, y); }
  Value scalar(double v, Value like) {
    return ab.scalar(v, elementTypeOf(like));
  }
  Value sumOver(Value x, ArrayRef<int64_t> axes) {
    return ReduceOp::create(ab.b, ab.loc, ReduceKind::sum, x, axes);
  }
  Value dim(Value x, int64_t axis) {
    return DimOp::create(ab.b, ab.loc, x, axis);
  }
};
} // namespace

/// The cotangent of a single-result op, or null.
static Value resultCt(AdjointBuilder &ab) {
  return ab.resultCotangent(0).value;
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

LogicalResult AllGatherOp::buildAdjoint(AdjointBuilder &ab) {
  Cotangent ct = ab.resultCotangent(0);
  Value x = getInput();
  Ops o{ab};
  switch (getGrad()) {
  case GatherGrad::none:
    emitWarning("grad none: no gradient flows back through this all_gather, "
                "so the gradient differs from single-device training on the "
                "global batch; use grad exact (the default) unless this is "
                "intended");
    return success();
  case GatherGrad::local: {
    emitWarning("grad local: only this rank's own slot of the gathered "
                "cotangent flows back (the TorchMetrics/OpenCLIP behaviour), "
                "so the gradient differs from single-device training on the "
                "global batch; use grad exact (the default) to match it");
    Value offset = ShardOffsetOp::create(ab.b, ab.loc, x, getAxis());
    ab.addOperandCotangent(0, SliceOp::create(ab.b, ab.loc, ab.partial(ct),
                                              getAxis(), offset,
                                              o.dim(x, getAxis())));
    return success();
  }
  case GatherGrad::exact:
    break;
  }
  if (ct.kind == CotangentKind::Reduced) {
    // Every rank already holds the whole cotangent: its own block is local.
    Value offset = ShardOffsetOp::create(ab.b, ab.loc, x, getAxis());
    ab.addOperandCotangent(0, SliceOp::create(ab.b, ab.loc, ct.value, getAxis(),
                                              offset, o.dim(x, getAxis())));
    return success();
  }
  // Partial: sum the ranks' contributions, each rank keeping its own block
  // (its own size, so uneven batches are exact).
  ab.addOperandCotangent(
      0, ReduceScatterOp::create(ab.b, ab.loc, ReduceKind::sum, ct.value,
                                 getAxis(), o.dim(x, getAxis())));
  return success();
}

LogicalResult AllReduceOp::buildAdjoint(AdjointBuilder &ab) {
  Value ct = ab.reduced(ab.resultCotangent(0));
  Ops o{ab};
  switch (getKind()) {
  case ReduceKind::sum:
    ab.addOperandCotangent(0, ct);
    return success();
  case ReduceKind::mean:
    ab.addOperandCotangent(0, o.div(ct, ab.worldSize(elementTypeOf(ct))));
    return success();
  case ReduceKind::max:
  case ReduceKind::min: {
    // Route to the ranks that hold the extremum; ties share it equally.
    Value hit = o.eq(getInput(), getResult());
    Value hits = AllReduceOp::create(ab.b, ab.loc, ReduceKind::sum, hit);
    ab.addOperandCotangent(0, o.div(o.mul(ct, hit), hits));
    return success();
  }
  }
  llvm_unreachable("unknown reduce kind");
}

LogicalResult ReduceScatterOp::buildAdjoint(AdjointBuilder &ab) {
  Value ct = ab.resultCotangent(0).value;
  Ops o{ab};
  Value all =
      AllGatherOp::create(ab.b, ab.loc, ct, getAxis(), GatherGrad::exact);
  if (getKind() == ReduceKind::mean)
    all = o.div(all, ab.worldSize(elementTypeOf(ct)));
  ab.addOperandCotangent(0, all);
  return success();
}

LogicalResult BroadcastOp::buildAdjoint(AdjointBuilder &ab) {
  // Only the root's input matters: the whole cotangent goes there.
  Value ct = ab.reduced(ab.resultCotangent(0));
  Ops o{ab};
  Type elementType = elementTypeOf(ct);
  Value rank =
      CastOp::create(ab.b, ab.loc, RankedTensorType::get({}, elementType),
                     RankOp::create(ab.b, ab.loc).getResult());
  Value isRoot =
      o.eq(rank, ab.scalar(static_cast<double>(getRoot()), elementType));
  ab.addOperandCotangent(0, o.mul(ct, isRoot));
  return success();
}

LogicalResult RingShiftOp::buildAdjoint(AdjointBuilder &ab) {
  Value ct = ab.partial(ab.resultCotangent(0));
  ab.addOperandCotangent(
      0,
      RingShiftOp::create(ab.b, ab.loc, ct, -static_cast<int64_t>(getShift())));
  return success();
}

//===----------------------------------------------------------------------===//
// Ops without gradients: rank facts, indicators, integer generators.
//===----------------------------------------------------------------------===//

#define DLOSS_NO_GRADIENT(OP)                                                  \
  LogicalResult OP::buildAdjoint(AdjointBuilder &) { return success(); }
DLOSS_NO_GRADIENT(RankOp)
DLOSS_NO_GRADIENT(WorldSizeOp)
DLOSS_NO_GRADIENT(DimOp)
DLOSS_NO_GRADIENT(ShardOffsetOp)
DLOSS_NO_GRADIENT(GlobalSizeOp)
DLOSS_NO_GRADIENT(EqOp)
DLOSS_NO_GRADIENT(ArangeOp)
DLOSS_NO_GRADIENT(ZerosLikeOp)
DLOSS_NO_GRADIENT(StopGradientOp)
#undef DLOSS_NO_GRADIENT

//===----------------------------------------------------------------------===//
// Linear algebra and element-wise arithmetic
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::buildAdjoint(AdjointBuilder &ab) {
  Value g = resultCt(ab);
  Value a = getLhs(), b = getRhs();
  bool ta = getTransposeLhs(), tb = getTransposeRhs();
  auto mm = [&](Value x, Value y, bool tx, bool ty) -> Value {
    return MatmulOp::create(ab.b, ab.loc, x, y, tx, ty);
  };
  // y = op(a) op(b); d op(a) = g op(b)^T, d op(b) = op(a)^T g.
  if (!ta && !tb) {
    ab.addOperandCotangent(0, mm(g, b, false, true));
    ab.addOperandCotangent(1, mm(a, g, true, false));
  } else if (!ta && tb) {
    ab.addOperandCotangent(0, mm(g, b, false, false));
    ab.addOperandCotangent(1, mm(g, a, true, false));
  } else if (ta && !tb) {
    ab.addOperandCotangent(0, mm(b, g, false, true));
    ab.addOperandCotangent(1, mm(a, g, false, false));
  } else {
    ab.addOperandCotangent(0, mm(b, g, true, true));
    ab.addOperandCotangent(1, mm(g, a, true, true));
  }
  return success();
}

/// Adds the contributions of a binary element-wise op, summing over the
/// broadcast of a 0-d operand.
static void addBinaryCotangents(AdjointBuilder &ab, Operation *op, Value dl,
                                Value dr) {
  if (dl)
    ab.addOperandCotangent(0, ab.unbroadcast(dl, op->getOperand(0).getType()));
  if (dr)
    ab.addOperandCotangent(1, ab.unbroadcast(dr, op->getOperand(1).getType()));
}

LogicalResult AddOp::buildAdjoint(AdjointBuilder &ab) {
  Value g = resultCt(ab);
  addBinaryCotangents(ab, *this, g, g);
  return success();
}

LogicalResult SubOp::buildAdjoint(AdjointBuilder &ab) {
  Value g = resultCt(ab);
  addBinaryCotangents(ab, *this, g, Ops{ab}.neg(g));
  return success();
}

LogicalResult MulOp::buildAdjoint(AdjointBuilder &ab) {
  Value g = resultCt(ab);
  Ops o{ab};
  addBinaryCotangents(ab, *this, o.mul(g, getRhs()), o.mul(g, getLhs()));
  return success();
}

LogicalResult DivOp::buildAdjoint(AdjointBuilder &ab) {
  // d(a/b) = da / b - db * (a/b) / b.
  Value g = resultCt(ab);
  Ops o{ab};
  Value gOverB = o.div(g, getRhs());
  addBinaryCotangents(ab, *this, gOverB, o.neg(o.mul(gOverB, getResult())));
  return success();
}

LogicalResult SelectOp::buildAdjoint(AdjointBuilder &ab) {
  // Each value gets the cotangent where it was chosen and an exact zero
  // elsewhere (never ct * 0, which is NaN for an infinite cotangent); the
  // condition gets none.
  Value g = resultCt(ab);
  Value zero = ab.scalar(0.0, elementTypeOf(g));
  Value cond = getCond();
  Value dt = SelectOp::create(ab.b, ab.loc, cond, g, zero);
  Value df = SelectOp::create(ab.b, ab.loc, cond, zero, g);
  ab.addOperandCotangent(1, ab.unbroadcast(dt, getTrueValue().getType()));
  ab.addOperandCotangent(2, ab.unbroadcast(df, getFalseValue().getType()));
  return success();
}

LogicalResult NegOp::buildAdjoint(AdjointBuilder &ab) {
  ab.addOperandCotangent(0, Ops{ab}.neg(resultCt(ab)));
  return success();
}

LogicalResult ExpOp::buildAdjoint(AdjointBuilder &ab) {
  ab.addOperandCotangent(0, Ops{ab}.mul(resultCt(ab), getResult()));
  return success();
}

LogicalResult LogOp::buildAdjoint(AdjointBuilder &ab) {
  ab.addOperandCotangent(0, Ops{ab}.div(resultCt(ab), getInput()));
  return success();
}

LogicalResult SoftplusOp::buildAdjoint(AdjointBuilder &ab) {
  Value s = SigmoidOp::create(ab.b, ab.loc, getInput());
  ab.addOperandCotangent(0, Ops{ab}.mul(resultCt(ab), s));
  return success();
}

LogicalResult LogSigmoidOp::buildAdjoint(AdjointBuilder &ab) {
  // d log sigmoid(x) = sigmoid(-x).
  Ops o{ab};
  Value s = SigmoidOp::create(ab.b, ab.loc, o.neg(getInput()));
  ab.addOperandCotangent(0, o.mul(resultCt(ab), s));
  return success();
}

LogicalResult SigmoidOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  Value y = getResult();
  Value slope = o.mul(y, o.sub(o.scalar(1.0, y), y));
  ab.addOperandCotangent(0, o.mul(resultCt(ab), slope));
  return success();
}

LogicalResult CosOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  Value s = SinOp::create(ab.b, ab.loc, getInput());
  ab.addOperandCotangent(0, o.neg(o.mul(resultCt(ab), s)));
  return success();
}

LogicalResult SinOp::buildAdjoint(AdjointBuilder &ab) {
  Value c = CosOp::create(ab.b, ab.loc, getInput());
  ab.addOperandCotangent(0, Ops{ab}.mul(resultCt(ab), c));
  return success();
}

LogicalResult AcosOp::buildAdjoint(AdjointBuilder &ab) {
  // d acos(x) = -1 / sqrt(1 - x^2).
  Ops o{ab};
  Value x = getInput();
  Value root =
      SqrtOp::create(ab.b, ab.loc, o.sub(o.scalar(1.0, x), o.mul(x, x)));
  ab.addOperandCotangent(0, o.neg(o.div(resultCt(ab), root)));
  return success();
}

LogicalResult SqrtOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  Value y = getResult();
  ab.addOperandCotangent(0, o.div(o.mul(resultCt(ab), o.scalar(0.5, y)), y));
  return success();
}

LogicalResult ClampOp::buildAdjoint(AdjointBuilder &ab) {
  // The gradient passes where the input was inside [min, max] (bounds
  // included, as torch.clamp).
  Ops o{ab};
  Value inside = o.eq(getResult(), getInput());
  ab.addOperandCotangent(0, o.mul(resultCt(ab), inside));
  return success();
}

LogicalResult CastOp::buildAdjoint(AdjointBuilder &ab) {
  auto inputType = dyn_cast<RankedTensorType>(getInput().getType());
  if (!inputType || !isa<FloatType>(inputType.getElementType()) ||
      !isa<FloatType>(elementTypeOf(getResult())))
    return success();
  ab.addOperandCotangent(0,
                         CastOp::create(ab.b, ab.loc, inputType, resultCt(ab)));
  return success();
}

//===----------------------------------------------------------------------===//
// Normalisation and reductions
//===----------------------------------------------------------------------===//

LogicalResult L2NormalizeOp::buildAdjoint(AdjointBuilder &ab) {
  // One op, one pass over each row: composed of element-wise ops, the
  // backward of a normalised class matrix held several temporaries its size.
  ab.addOperandCotangent(
      0, L2NormalizeGradOp::create(ab.b, ab.loc, resultCt(ab), getInput(),
                                   getAxisAttr(), getEpsAttr()));
  return success();
}

LogicalResult L2NormalizeGradOp::buildAdjoint(AdjointBuilder &ab) {
  // dx = (g - y s) / n with y = x / n, s = sum(g y), n = max(|x|, eps).
  // Linear in g with a symmetric map, so g's cotangent is the same op on c.
  // Along x, where |x| >= eps (n follows x; else dx = g / eps is constant):
  //   ct_x = (y (3 s sum(y c) - sum(g c)) - g sum(y c) - c s) / n^2.
  Ops o{ab};
  Value c = resultCt(ab), g = getGrad(), x = getInput();
  int64_t axis = getAxis();
  ab.addOperandCotangent(0, L2NormalizeGradOp::create(ab.b, ab.loc, c, x,
                                                      getAxisAttr(),
                                                      getEpsAttr()));
  Value norm = SqrtOp::create(ab.b, ab.loc, o.sumOver(o.mul(x, x), {axis}));
  Value n = ClampOp::create(ab.b, ab.loc, norm, getEpsAttr(), FloatAttr());
  Value y = o.div(x, ab.expand(n, axis, x));
  Value s = o.sumOver(o.mul(g, y), {axis});
  Value yc = o.sumOver(o.mul(y, c), {axis});
  Value gc = o.sumOver(o.mul(g, c), {axis});
  Value along = o.sub(o.mul(o.mul(o.scalar(3.0, x), s), yc), gc);
  Value scale = o.div(o.eq(n, norm), o.mul(n, n));
  Value sum = o.sub(o.sub(o.mul(y, ab.expand(along, axis, x)),
                          o.mul(g, ab.expand(yc, axis, x))),
                    o.mul(c, ab.expand(s, axis, x)));
  ab.addOperandCotangent(1, o.mul(sum, ab.expand(scale, axis, x)));
  return success();
}

LogicalResult ReduceOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  Value g = resultCt(ab), x = getInput();
  ArrayRef<int64_t> axes = getAxes();
  Value spread = ExpandOp::create(ab.b, ab.loc, g, axes, x);
  switch (getKind()) {
  case ReduceKind::sum:
    ab.addOperandCotangent(0, spread);
    return success();
  case ReduceKind::mean: {
    Value count;
    for (int64_t axis : axes) {
      Value d = o.dim(x, axis);
      count =
          count ? arith::MulIOp::create(ab.b, ab.loc, count, d).getResult() : d;
    }
    Value countT = CastOp::create(
        ab.b, ab.loc, RankedTensorType::get({}, elementTypeOf(g)), count);
    ab.addOperandCotangent(0, o.div(spread, countT));
    return success();
  }
  case ReduceKind::max:
  case ReduceKind::min: {
    // To the positions of the extremum; ties share it equally.
    Value hit = o.eq(x, ExpandOp::create(ab.b, ab.loc, getResult(), axes, x));
    Value hits = ExpandOp::create(ab.b, ab.loc, o.sumOver(hit, axes), axes, x);
    ab.addOperandCotangent(0, o.div(o.mul(spread, hit), hits));
    return success();
  }
  }
  llvm_unreachable("unknown reduce kind");
}

/// softmax(x) along `axis`, from x and its logsumexp.
static Value softmax(AdjointBuilder &ab, Value x, Value lse, int64_t axis) {
  Ops o{ab};
  return ExpOp::create(ab.b, ab.loc, o.sub(x, ab.expand(lse, axis, x)));
}

LogicalResult LogSumExpOp::buildAdjoint(AdjointBuilder &ab) {
  Value x = getInput();
  Value p = softmax(ab, x, getResult(), getAxis());
  ab.addOperandCotangent(0,
                         Ops{ab}.mul(ab.expand(resultCt(ab), getAxis(), x), p));
  return success();
}

LogicalResult CrossEntropyOp::buildAdjoint(AdjointBuilder &ab) {
  // d/dlogits = g * (softmax(logits) - onehot(targets)).
  Ops o{ab};
  Value g = resultCt(ab), x = getLogits(), t = getTargets();
  int64_t axis = getAxis();
  Value lse = LogSumExpOp::create(ab.b, ab.loc, x, axis);
  Value dx = o.mul(ab.expand(g, axis, x), softmax(ab, x, lse, axis));
  Value atTarget = o.sub(TakeAlongOp::create(ab.b, ab.loc, dx, t, axis), g);
  ab.addOperandCotangent(
      0, PutAlongOp::create(ab.b, ab.loc, dx, t, atTarget, axis));
  return success();
}

//===----------------------------------------------------------------------===//
// Indexing and shapes
//===----------------------------------------------------------------------===//

LogicalResult TakeAlongOp::buildAdjoint(AdjointBuilder &ab) {
  Value zeros = ZerosLikeOp::create(ab.b, ab.loc, getInput());
  ab.addOperandCotangent(0,
                         PutAlongOp::create(ab.b, ab.loc, zeros, getIndices(),
                                            resultCt(ab), getAxis()));
  return success();
}

LogicalResult PutAlongOp::buildAdjoint(AdjointBuilder &ab) {
  Value g = resultCt(ab);
  Value zeros = ZerosLikeOp::create(ab.b, ab.loc, getValues());
  ab.addOperandCotangent(
      0, PutAlongOp::create(ab.b, ab.loc, g, getIndices(), zeros, getAxis()));
  ab.addOperandCotangent(
      2, TakeAlongOp::create(ab.b, ab.loc, g, getIndices(), getAxis()));
  return success();
}

LogicalResult ExpandOp::buildAdjoint(AdjointBuilder &ab) {
  ab.addOperandCotangent(0, Ops{ab}.sumOver(resultCt(ab), getAxes()));
  return success();
}

LogicalResult SliceOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  Value total = o.dim(getInput(), getAxis());
  Value end = arith::AddIOp::create(ab.b, ab.loc, getOffset(), getSize());
  Value after = arith::SubIOp::create(ab.b, ab.loc, total, end);
  ab.addOperandCotangent(0, PadOp::create(ab.b, ab.loc, resultCt(ab), getAxis(),
                                          getOffset(), after));
  return success();
}

LogicalResult PadOp::buildAdjoint(AdjointBuilder &ab) {
  Ops o{ab};
  ab.addOperandCotangent(0, SliceOp::create(ab.b, ab.loc, resultCt(ab),
                                            getAxis(), getLow(),
                                            o.dim(getInput(), getAxis())));
  return success();
}

//===----------------------------------------------------------------------===//
// Fused ops: each forward op's adjoint is its `_grad` op, which recomputes
// the tiles from the saved row statistics.
//===----------------------------------------------------------------------===//

/// The cotangent of result `i` of a varying result, or zeros of its type.
static Value ctOrZeros(AdjointBuilder &ab, unsigned i, Value result) {
  if (Value ct = ab.resultCotangent(i).value)
    return ct;
  return ZerosLikeOp::create(ab.b, ab.loc, result);
}

/// Fails when a result that only the backward should read has a cotangent.
static LogicalResult noCotangent(Operation *op, AdjointBuilder &ab, unsigned i,
                                 StringRef name) {
  if (!ab.resultCotangent(i))
    return success();
  return op->emitOpError() << "result " << name
                           << " is saved for the backward and cannot be "
                              "differentiated; use the loss results";
}

LogicalResult RingSoftmaxCEOp::buildAdjoint(AdjointBuilder &ab) {
  if (failed(noCotangent(*this, ab, 2, "row_lse")) ||
      failed(noCotangent(*this, ab, 3, "col_lse")))
    return failure();
  if (!ab.resultCotangent(0) && !ab.resultCotangent(1))
    return success();
  Value ctRow = ctOrZeros(ab, 0, getRowCe());
  Value ctCol = ctOrZeros(ab, 1, getColCe());
  auto grad = RingSoftmaxCEGradOp::create(
      ab.b, ab.loc,
      TypeRange{getRows().getType(), getCols().getType(), getScale().getType()},
      getRows(), getCols(), getScale(), getRowTargets(), getColTargets(),
      getRowLse(), getColLse(), ctRow, ctCol);
  ab.addOperandCotangent(0, grad.getDRows());
  ab.addOperandCotangent(1, grad.getDCols());
  ab.addOperandCotangent(2, grad.getDScale());
  return success();
}

LogicalResult RingSigmoidPairsOp::buildAdjoint(AdjointBuilder &ab) {
  if (!ab.resultCotangent(0) && !ab.resultCotangent(1))
    return success();
  Value ctPair = ctOrZeros(ab, 0, getPairSum());
  Value ctPositive = ctOrZeros(ab, 1, getPositive());
  auto grad = RingSigmoidPairsGradOp::create(
      ab.b, ab.loc,
      TypeRange{getRows().getType(), getCols().getType(), getScale().getType(),
                getBias().getType()},
      getRows(), getCols(), getScale(), getBias(), getTargets(), ctPair,
      ctPositive);
  ab.addOperandCotangent(0, grad.getDRows());
  ab.addOperandCotangent(1, grad.getDCols());
  ab.addOperandCotangent(2, grad.getDScale());
  ab.addOperandCotangent(3, grad.getDBias());
  return success();
}

LogicalResult ShardedSoftmaxOp::buildAdjoint(AdjointBuilder &ab) {
  Cotangent lse = ab.resultCotangent(0), target = ab.resultCotangent(1);
  if (!lse && !target)
    return success();
  // The statistics are invariant: the shard's gradients need the full
  // cotangent of every row.
  Value ctLse =
      lse ? ab.reduced(lse) : ZerosLikeOp::create(ab.b, ab.loc, getLseRest());
  Value ctTarget = target ? ab.reduced(target)
                          : ZerosLikeOp::create(ab.b, ab.loc, getTargetDot());
  auto grad = ShardedSoftmaxGradOp::create(
      ab.b, ab.loc,
      TypeRange{getRows().getType(), getWeights().getType(),
                getScale().getType()},
      getRows(), getWeights(), getScale(), getTargets(), getLseRest(), ctLse,
      ctTarget);
  ab.addOperandCotangent(0, grad.getDRows(), CotangentKind::Partial);
  ab.addOperandCotangent(1, grad.getDWeights());
  ab.addOperandCotangent(2, grad.getDScale(), CotangentKind::Partial);
  return success();
}

LogicalResult FusedSimilarityOp::buildAdjoint(AdjointBuilder &ab) {
  bool any = false;
  for (unsigned i = 0; i < getNumResults(); ++i)
    any |= static_cast<bool>(ab.resultCotangent(i));
  if (!any)
    return success();
  SmallVector<Value> extra(getLeaves());
  llvm::append_range(extra, getResults());
  // Over class shards the results are invariant: each shard's gradients
  // need every row's full cotangent. Otherwise each rank differentiates
  // its own share: an invariant result's cotangent in its per-rank partial
  // form (every rank computes the same rows when they are invariant), so
  // the gradients are partial too (a collective's invariant operands get
  // partial cotangents) and their sum over ranks is the full gradient.
  for (auto [i, result] : llvm::enumerate(getResults())) {
    Cotangent ct = ab.resultCotangent(i);
    extra.push_back(!ct            ? ZerosLikeOp::create(ab.b, ab.loc, result)
                    : getSharded() ? ab.reduced(ct)
                                   : ab.partial(ct));
  }
  Type element = cast<ShapedType>(getRows().getType()).getElementType();
  int64_t dyn = ShapedType::kDynamic;
  auto grad = FusedSimilarityGradOp::create(
      ab.b, ab.loc,
      TypeRange{getRows().getType(), getCols().getType(),
                RankedTensorType::get({dyn, dyn}, element),
                RankedTensorType::get({dyn}, element)},
      getRows(), getCols(), extra, getRowLeavesAttr(), getColLeavesAttr(),
      getProgramAttr(), getOutputsAttr(), getColOutputsAttr(), getPicksAttr(),
      getColPicksAttr(), getLsePairsAttr(), getClassTargetsAttr(),
      getGatheredAttr(), getShardedAttr());
  std::optional<CotangentKind> partial;
  if (getSharded())
    partial = CotangentKind::Partial; // this shard's part of the rows'
  ab.addOperandCotangent(0, grad.getDRows(), partial);
  ab.addOperandCotangent(1, grad.getDCols());
  // One row of the stacked leaf gradients per float per-row leaf, one
  // element of d_scalars per float 0-d leaf (integer leaves get none).
  auto pick = [&](Value stacked, int64_t k) {
    Value offset = arith::ConstantIndexOp::create(ab.b, ab.loc, k);
    Value one = arith::ConstantIndexOp::create(ab.b, ab.loc, 1);
    Value slice = SliceOp::create(ab.b, ab.loc, stacked, 0, offset, one);
    return ReduceOp::create(ab.b, ab.loc, ReduceKind::sum, slice,
                            ArrayRef<int64_t>{0});
  };
  int64_t rowLeaves = getRowLeaves(), firstScalar = rowLeaves + getColLeaves();
  for (auto [k, leaf] : llvm::enumerate(getLeaves())) {
    auto i = static_cast<int64_t>(k);
    if (!isa<FloatType>(cast<ShapedType>(leaf.getType()).getElementType()) ||
        (i >= rowLeaves && i < firstScalar))
      continue;
    Value ct = i < rowLeaves ? pick(grad.getDRowLeaves(), i)
                             : pick(grad.getDScalars(), i - firstScalar);
    ab.addOperandCotangent(2 + k, ct, partial);
  }
  return success();
}

#define DLOSS_NO_SECOND_DERIVATIVE(OP)                                         \
  LogicalResult OP::buildAdjoint(AdjointBuilder &) {                           \
    return emitOpError("is a backward op: second derivatives of fused ops "    \
                       "are not supported; compile with --no-fuse to "         \
                       "differentiate the unfused IR");                        \
  }
DLOSS_NO_SECOND_DERIVATIVE(RingSoftmaxCEGradOp)
DLOSS_NO_SECOND_DERIVATIVE(RingSigmoidPairsGradOp)
DLOSS_NO_SECOND_DERIVATIVE(ShardedSoftmaxGradOp)
DLOSS_NO_SECOND_DERIVATIVE(FusedSimilarityGradOp)
#undef DLOSS_NO_SECOND_DERIVATIVE

LogicalResult FusedElementwiseOp::buildAdjoint(AdjointBuilder &) {
  // dloss-fuse-elementwise runs after autodiff, on derived IR only.
  return emitOpError("is made after autodiff and has no adjoint: run "
                     "dloss-fuse-elementwise after dloss-autodiff");
}
