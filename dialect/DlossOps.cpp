// The dloss ops: verifiers, result-type inference (through
// dialect/ShapeFunctions.h) and folders.
#include "dialect/DlossOps.h"
#include "dialect/ShapeFunctions.h"
#include "runtime/plan/TileEncoding.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::dloss;

/// The shape rules' errors for op `OpT` at an optional location: inference
/// runs while parsing, before any verifier, and reports in the same words as
/// emitOpError.
template <typename OpT>
static shapes::Errors errorsFor(std::optional<Location> loc) {
  return shapes::Errors(loc, OpT::getOperationName());
}

template <typename OpT> static shapes::Errors errorsFor(OpT op) {
  return shapes::Errors(op.getLoc(), OpT::getOperationName());
}

/// Appends the result of a shape rule to `results`.
static LogicalResult inferred(FailureOr<RankedTensorType> type,
                              SmallVectorImpl<Type> &results) {
  if (failed(type))
    return failure();
  results.push_back(*type);
  return success();
}

static RankedTensorType tensorType(Value value) {
  return cast<RankedTensorType>(value.getType());
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

LogicalResult AllGatherOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  return inferred(shapes::allGather(errorsFor<AllGatherOp>(loc),
                                    tensorType(adaptor.getInput()),
                                    adaptor.getAxis(), std::nullopt),
                  results);
}

LogicalResult
ReduceScatterOp::inferReturnTypes(MLIRContext *, std::optional<Location> loc,
                                  Adaptor adaptor,
                                  SmallVectorImpl<Type> &results) {
  // Each rank keeps its own slice: a run-time size.
  return inferred(shapes::resizeAxis(errorsFor<ReduceScatterOp>(loc),
                                     tensorType(adaptor.getInput()),
                                     adaptor.getAxis(), std::nullopt),
                  results);
}

LogicalResult ReduceScatterOp::verify() {
  if (getKind() != ReduceKind::sum && getKind() != ReduceKind::mean)
    return emitOpError("combines with sum or mean, not ")
           << stringifyReduceKind(getKind()) << "; use dloss.all_reduce "
           << stringifyReduceKind(getKind()) << " and keep this rank's slice";
  return success();
}

LogicalResult BroadcastOp::verify() {
  if (static_cast<int64_t>(getRoot()) < 0)
    return emitOpError("root ") << static_cast<int64_t>(getRoot())
                                << " is negative; ranks count from 0";
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

template <typename OpT> static LogicalResult verifyAxisSizeOp(OpT op) {
  return shapes::checkAxis(
      errorsFor(op), cast<ShapedType>(op.getInput().getType()), op.getAxis());
}

LogicalResult DimOp::verify() { return verifyAxisSizeOp(*this); }
LogicalResult ShardOffsetOp::verify() { return verifyAxisSizeOp(*this); }
LogicalResult GlobalSizeOp::verify() { return verifyAxisSizeOp(*this); }

namespace {
/// reduce sum|mean (neg x) -> neg (reduce sum|mean x), when the negation has
/// no other use: autodiff negates whole batches (the adjoints of sub and
/// div) only to sum them over the batch, and one pass over the reduced
/// value replaces one over the batch.
struct NegateAfterReducing : OpRewritePattern<ReduceOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ReduceOp op,
                                PatternRewriter &rewriter) const override {
    auto neg = op.getInput().getDefiningOp<NegOp>();
    if (!neg || !neg->hasOneUse() ||
        (op.getKind() != ReduceKind::sum && op.getKind() != ReduceKind::mean))
      return failure();
    Value reduced = ReduceOp::create(rewriter, op.getLoc(), op.getKind(),
                                     neg.getInput(), op.getAxes());
    rewriter.replaceOpWithNewOp<NegOp>(op, reduced);
    return success();
  }
};
} // namespace

void ReduceOp::getCanonicalizationPatterns(RewritePatternSet &patterns,
                                           MLIRContext *context) {
  patterns.add<NegateAfterReducing>(context);
}

OpFoldResult DimOp::fold(FoldAdaptor) {
  auto type = cast<ShapedType>(getInput().getType());
  auto axis = static_cast<int64_t>(getAxis());
  if (axis < 0 || axis >= type.getRank() || type.isDynamicDim(axis))
    return {};
  return IntegerAttr::get(IndexType::get(getContext()), type.getDimSize(axis));
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  return inferred(
      shapes::matmul(errorsFor<MatmulOp>(loc), tensorType(adaptor.getLhs()),
                     tensorType(adaptor.getRhs()), adaptor.getTransposeLhs(),
                     adaptor.getTransposeRhs()),
      results);
}

#define DLOSS_ELEMENTWISE_INFER(OP)                                            \
  LogicalResult OP::inferReturnTypes(                                          \
      MLIRContext *, std::optional<Location> loc, Adaptor adaptor,             \
      SmallVectorImpl<Type> &results) {                                        \
    return inferred(shapes::elementwise(errorsFor<OP>(loc),                    \
                                        tensorType(adaptor.getLhs()),          \
                                        tensorType(adaptor.getRhs())),         \
                    results);                                                  \
  }
DLOSS_ELEMENTWISE_INFER(AddOp)
DLOSS_ELEMENTWISE_INFER(SubOp)
DLOSS_ELEMENTWISE_INFER(MulOp)
DLOSS_ELEMENTWISE_INFER(DivOp)
DLOSS_ELEMENTWISE_INFER(EqOp)
#undef DLOSS_ELEMENTWISE_INFER

LogicalResult SelectOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  return inferred(shapes::select(errorsFor<SelectOp>(loc),
                                 tensorType(adaptor.getCond()),
                                 tensorType(adaptor.getTrueValue()),
                                 tensorType(adaptor.getFalseValue())),
                  results);
}

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
      return emitOpError("casts an index to a 0-d tensor, not to ")
             << Type(result);
    return success();
  }
  auto input = cast<RankedTensorType>(getInput().getType());
  if (failed(verifyCompatibleShape(input, result)))
    return emitOpError("changes only the element type; shapes ")
           << shapes::formatShape(input.getShape()) << " and "
           << shapes::formatShape(result.getShape()) << " differ";
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType())
    return getInput();
  return {};
}

/// l2_normalize and its gradient: the axis names one of the input's, eps > 0.
template <typename Op> static LogicalResult verifyNormalize(Op op) {
  if (failed(shapes::checkAxis(errorsFor(op), op.getInput().getType(),
                               op.getAxis())))
    return failure();
  if (!(op.getEps().convertToDouble() > 0.0))
    return op.emitOpError("eps must be positive, got ")
           << op.getEps().convertToDouble();
  return success();
}

LogicalResult L2NormalizeOp::verify() { return verifyNormalize(*this); }

LogicalResult L2NormalizeGradOp::verify() { return verifyNormalize(*this); }

LogicalResult ReduceOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  return inferred(shapes::reduce(errorsFor<ReduceOp>(loc),
                                 tensorType(adaptor.getInput()),
                                 adaptor.getAxes()),
                  results);
}

LogicalResult LogSumExpOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  return inferred(shapes::dropAxis(errorsFor<LogSumExpOp>(loc),
                                   tensorType(adaptor.getInput()),
                                   adaptor.getAxis()),
                  results);
}

LogicalResult TakeAlongOp::inferReturnTypes(MLIRContext *,
                                            std::optional<Location> loc,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &results) {
  return inferred(shapes::perRowPick(errorsFor<TakeAlongOp>(loc),
                                     tensorType(adaptor.getInput()),
                                     tensorType(adaptor.getIndices()),
                                     adaptor.getAxis()),
                  results);
}

LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext *,
                                               std::optional<Location> loc,
                                               Adaptor adaptor,
                                               SmallVectorImpl<Type> &results) {
  return inferred(shapes::perRowPick(errorsFor<CrossEntropyOp>(loc),
                                     tensorType(adaptor.getLogits()),
                                     tensorType(adaptor.getTargets()),
                                     adaptor.getAxis()),
                  results);
}

LogicalResult PutAlongOp::inferReturnTypes(MLIRContext *,
                                           std::optional<Location> loc,
                                           Adaptor adaptor,
                                           SmallVectorImpl<Type> &results) {
  return inferred(shapes::putAlong(errorsFor<PutAlongOp>(loc),
                                   tensorType(adaptor.getInput()),
                                   tensorType(adaptor.getIndices()),
                                   tensorType(adaptor.getValues()),
                                   adaptor.getAxis()),
                  results);
}

LogicalResult ArangeOp::verify() {
  auto result = cast<RankedTensorType>(getResult().getType());
  if (result.getRank() != 1)
    return emitOpError("produces a 1-D tensor, not ") << Type(result);
  return success();
}

LogicalResult ExpandOp::inferReturnTypes(MLIRContext *,
                                         std::optional<Location> loc,
                                         Adaptor adaptor,
                                         SmallVectorImpl<Type> &results) {
  return inferred(
      shapes::expand(errorsFor<ExpandOp>(loc), tensorType(adaptor.getInput()),
                     tensorType(adaptor.getLike()), adaptor.getAxes()),
      results);
}

// Slice and pad change one axis by run-time amounts: it becomes dynamic.
LogicalResult SliceOp::inferReturnTypes(MLIRContext *,
                                        std::optional<Location> loc,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &results) {
  return inferred(shapes::resizeAxis(errorsFor<SliceOp>(loc),
                                     tensorType(adaptor.getInput()),
                                     adaptor.getAxis(), std::nullopt),
                  results);
}

LogicalResult PadOp::inferReturnTypes(MLIRContext *,
                                      std::optional<Location> loc,
                                      Adaptor adaptor,
                                      SmallVectorImpl<Type> &results) {
  return inferred(shapes::resizeAxis(errorsFor<PadOp>(loc),
                                     tensorType(adaptor.getInput()),
                                     adaptor.getAxis(), std::nullopt),
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
  LogicalResult similarity(Value rows, Value cols, StringRef colsName,
                           Value scale) {
    return success(succeeded(features(rows, "rows")) &&
                   succeeded(features(cols, colsName)) &&
                   succeeded(sameFeatureSize(rows, cols)) &&
                   succeeded(this->scalar(scale, "scale")));
  }
  LogicalResult like(Value value, Value reference, StringRef name) {
    if (value.getType() != reference.getType())
      return op->emitOpError()
             << name << " must have type " << reference.getType() << ", got "
             << value.getType();
    return success();
  }
};

FusedChecks fusedChecks(Operation *op, Value features) {
  return {op, cast<ShapedType>(features.getType()).getElementType()};
}
} // namespace

LogicalResult RingSoftmaxCEOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(
      succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
      succeeded(c.vector(getRowTargets(), "row_targets", true)) &&
      succeeded(c.vector(getColTargets(), "col_targets", true)) &&
      succeeded(c.vector(getRowCe(), "row_ce")) &&
      succeeded(c.vector(getColCe(), "col_ce")) &&
      succeeded(c.vector(getRowLse(), "row_lse")) &&
      succeeded(c.vector(getColLse(), "col_lse")));
}

LogicalResult RingSoftmaxCEGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(
      succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
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
  return success(
      succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
      succeeded(c.scalar(getBias(), "bias")) &&
      succeeded(c.vector(getTargets(), "targets", true)) &&
      succeeded(c.vector(getPairSum(), "pair_sum")) &&
      succeeded(c.vector(getPositive(), "positive")));
}

LogicalResult RingSigmoidPairsGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(
      succeeded(c.similarity(getRows(), getCols(), "cols", getScale())) &&
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
  return success(
      succeeded(c.similarity(getRows(), getWeights(), "weights", getScale())) &&
      succeeded(c.vector(getTargets(), "targets", true)) &&
      succeeded(c.vector(getLseRest(), "lse_rest")) &&
      succeeded(c.vector(getTargetDot(), "target_dot")));
}

LogicalResult ShardedSoftmaxGradOp::verify() {
  FusedChecks c = fusedChecks(*this, getRows());
  return success(
      succeeded(c.similarity(getRows(), getWeights(), "weights", getScale())) &&
      succeeded(c.vector(getTargets(), "targets", true)) &&
      succeeded(c.vector(getLseRest(), "lse_rest")) &&
      succeeded(c.vector(getCtLse(), "ct_lse")) &&
      succeeded(c.vector(getCtTarget(), "ct_target")) &&
      succeeded(c.like(getDRows(), getRows(), "d_rows")) &&
      succeeded(c.like(getDWeights(), getWeights(), "d_weights")) &&
      succeeded(c.like(getDScale(), getScale(), "d_scale")));
}

namespace {
/// The facts of a general fused op's program, as the runtime reads them.
template <typename FusedOp>
::dloss::epilogue::ProgramFacts programFacts(FusedOp op) {
  using ::dloss::epilogue::intsOf;
  return {intsOf(op.getPicks()),
          intsOf(op.getColPicks().value_or(ArrayRef<int64_t>())),
          intsOf(op.getLsePairs().value_or(ArrayRef<int64_t>())),
          intsOf(op.getClassTargets())};
}

/// The checks both general fused ops share: features, leaf groups, the
/// tile program and its facts (runtime/plan/TileEncoding.h's checkProgram
/// and checkFacts, which the runtime runs too).
LogicalResult verifyFusedSimilarity(
    Operation *op, Value rows, Value cols, ValueRange leaves, int64_t rowLeaves,
    int64_t colLeaves, ArrayRef<int64_t> program, ArrayRef<int64_t> outputs,
    std::optional<ArrayRef<int64_t>> colOutputs,
    const ::dloss::epilogue::ProgramFacts &facts, bool gathered, bool sharded) {
  if (gathered && sharded)
    return op->emitOpError()
           << "is both gathered (columns round a ring) and sharded (class "
              "shards, rows the same everywhere); choose one";
  FusedChecks c = fusedChecks(op, rows);
  if (failed(c.features(rows, "rows")) || failed(c.features(cols, "cols")) ||
      failed(c.sameFeatureSize(rows, cols)))
    return failure();
  int64_t count = static_cast<int64_t>(leaves.size());
  if (rowLeaves < 0 || colLeaves < 0 || rowLeaves + colLeaves > count)
    return op->emitOpError()
           << "has " << count << " leaves, fewer than " << rowLeaves
           << " per-row and " << colLeaves << " per-column ones";
  for (auto [i, leaf] : llvm::enumerate(leaves)) {
    int64_t want = static_cast<int64_t>(i) < rowLeaves + colLeaves ? 1 : 0;
    if (cast<RankedTensorType>(leaf.getType()).getRank() != want)
      return op->emitOpError() << "leaf " << i << " must be "
                               << (want ? (static_cast<int64_t>(i) < rowLeaves
                                               ? "a per-row 1-D"
                                               : "a per-column 1-D")
                                        : "a 0-d")
                               << " tensor, got " << leaf.getType();
  }
  std::string problem = ::dloss::epilogue::checkProgram(
      program.data(), static_cast<int64_t>(program.size()), outputs.data(),
      static_cast<int64_t>(outputs.size()), rowLeaves, colLeaves,
      count - rowLeaves - colLeaves);
  if (!problem.empty())
    return op->emitOpError() << "has a malformed tile program: " << problem;
  if (colOutputs) {
    if (!gathered)
      return op->emitOpError()
             << "reduces along columns (col_outputs) but is not gathered: "
                "a local class matrix's columns see this rank's rows only";
    problem = ::dloss::epilogue::checkOutputs(
        colOutputs->data(), static_cast<int64_t>(colOutputs->size()),
        static_cast<int64_t>(program.size()) / 4, "column result");
    if (!problem.empty())
      return op->emitOpError() << "has a malformed tile program: " << problem;
  }
  using ::dloss::epilogue::intsOf;
  problem = ::dloss::epilogue::checkFacts(
      intsOf(program), intsOf(outputs),
      intsOf(colOutputs.value_or(ArrayRef<int64_t>())), rowLeaves, colLeaves,
      facts);
  if (!problem.empty())
    return op->emitOpError()
           << "has facts that do not fit its tile program: " << problem;
  // In range is not enough: the kernels trust the facts in place of the
  // program (a pick replaces its sum), so they must be the program's own.
  ::dloss::epilogue::DerivedFacts derived = ::dloss::epilogue::deriveFacts(
      intsOf(program), intsOf(outputs),
      intsOf(colOutputs.value_or(ArrayRef<int64_t>())));
  auto text = [](ArrayRef<int64_t> values) {
    std::string out = "[";
    for (size_t k = 0; k < values.size(); ++k)
      out += (k ? ", " : "") + std::to_string(values[k]);
    return out + "]";
  };
  const std::pair<const char *, std::pair<::dloss::epilogue::Ints,
                                          const std::vector<int64_t> *>>
      written[] = {
          {"picks", {facts.picks, &derived.picks}},
          {"col_picks", {facts.colPicks, &derived.colPicks}},
          {"lse_pairs", {facts.lsePairs, &derived.lsePairs}},
          {"class_targets", {facts.classTargets, &derived.classTargets}}};
  for (const auto &[name, pair] : written) {
    ArrayRef<int64_t> have(pair.first.data, pair.first.size);
    if (have != ArrayRef<int64_t>(*pair.second))
      return op->emitOpError()
             << "has `" << name << "` = " << text(have)
             << " but its tile program gives " << text(*pair.second)
             << ": the facts are derived from the program (leave them to "
                "the compiler, or write these)";
  }
  return success();
}

int64_t colResults(std::optional<ArrayRef<int64_t>> colOutputs) {
  return colOutputs ? static_cast<int64_t>(colOutputs->size()) / 2 : 0;
}
} // namespace

LogicalResult FusedSimilarityOp::verify() {
  if (failed(verifyFusedSimilarity(
          *this, getRows(), getCols(), getLeaves(), getRowLeaves(),
          getColLeaves(), getProgram(), getOutputs(), getColOutputs(),
          programFacts(*this), getGathered(), getSharded())))
    return failure();
  int64_t outputs = static_cast<int64_t>(getOutputs().size()) / 2 +
                    colResults(getColOutputs());
  if (static_cast<int64_t>(getResults().size()) != outputs)
    return emitOpError() << "has " << getResults().size()
                         << " results but its program has " << outputs
                         << " outputs";
  FusedChecks c = fusedChecks(*this, getRows());
  for (Value result : getResults())
    if (failed(c.vector(result, "each result")))
      return failure();
  return success();
}

LogicalResult FusedSimilarityGradOp::verify() {
  int64_t results = static_cast<int64_t>(getOutputs().size()) / 2 +
                    colResults(getColOutputs());
  int64_t leaves = static_cast<int64_t>(getExtra().size()) - 2 * results;
  if (leaves < 0)
    return emitOpError() << "has " << getExtra().size()
                         << " extra operands, fewer than the forward results "
                            "and their cotangents ("
                         << 2 * results << ")";
  ValueRange extra = getExtra();
  if (failed(verifyFusedSimilarity(
          *this, getRows(), getCols(), extra.take_front(leaves), getRowLeaves(),
          getColLeaves(), getProgram(), getOutputs(), getColOutputs(),
          programFacts(*this), getGathered(), getSharded())))
    return failure();
  FusedChecks c = fusedChecks(*this, getRows());
  for (Value v : extra.drop_front(leaves))
    if (failed(c.vector(v, "each forward result and cotangent")))
      return failure();
  auto stacked = cast<RankedTensorType>(getDRowLeaves().getType());
  auto scalars = cast<RankedTensorType>(getDScalars().getType());
  if (stacked.getRank() != 2 || scalars.getRank() != 1 ||
      stacked.getElementType() != c.element ||
      scalars.getElementType() != c.element)
    return emitOpError() << "d_row_leaves must be 2-D and d_scalars 1-D, of "
                         << c.element;
  return success(succeeded(c.like(getDRows(), getRows(), "d_rows")) &&
                 succeeded(c.like(getDCols(), getCols(), "d_cols")));
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
// The general op's results follow its rows: with a gathered operand every
// rank's columns are seen, so only the rows tell ranks apart; tiled over a
// local class matrix, so can the classes and the leaves; over class shards
// the statistics are all-reduced.
Replication
FusedSimilarityOp::inferReplication(ArrayRef<Replication> operands) {
  if (getSharded())
    return Replication::Invariant; // all-reduced across the class shards
  if (getGathered())
    return operands[0];
  return joinReplication(operands);
}
Replication FusedSimilarityGradOp::inferReplication(ArrayRef<Replication>) {
  return Replication::Varying;
}

LogicalResult FusedElementwiseOp::verify() {
  ValueRange leaves = getLeaves();
  const int64_t count = static_cast<int64_t>(leaves.size());
  const int64_t elements = getElements(), rows = getRowLeaves(),
                cols = getColLeaves();
  if (elements < 1 || rows < 0 || cols < 0 || elements + rows + cols > count)
    return emitOpError() << "has " << count << " leaves, not " << elements
                         << " (at least 1) of the space's shape, " << rows
                         << " per-row and " << cols << " per-column ones";
  ArrayRef<int64_t> colSums = getColSums().value_or(ArrayRef<int64_t>());
  const int64_t full = static_cast<int64_t>(getOutputs().size());
  if (static_cast<int64_t>(getResults().size()) !=
      full + static_cast<int64_t>(colSums.size()))
    return emitOpError() << "has " << getResults().size()
                         << " results but its program has " << full
                         << " outputs and " << colSums.size() << " column sums";
  // The iteration space is the type of the first leaf.
  auto space = cast<RankedTensorType>(leaves.front().getType());
  // Per-row and per-column vectors need rows and columns to index.
  if ((rows > 0 || cols > 0 || !colSums.empty()) && space.getRank() != 2)
    return emitOpError() << "has per-row or per-column leaves or sums but "
                            "iterates over "
                         << space << ", which is not a matrix";
  for (auto [i, result] : llvm::enumerate(getResults())) {
    auto type = cast<RankedTensorType>(result.getType());
    const bool whole = static_cast<int64_t>(i) < full;
    const bool ok =
        whole ? type == space
              : type.getRank() == 1 &&
                    type.getElementType() == space.getElementType() &&
                    succeeded(verifyCompatibleDims(
                        {type.getDimSize(0), space.getShape().back()}));
    if (!ok)
      return emitOpError() << "result " << i << " has type " << type
                           << ", expected "
                           << (whole ? "the iteration space's type "
                                     : "one value per column of ")
                           << space;
  }
  for (auto [i, leaf] : llvm::enumerate(leaves)) {
    auto type = cast<RankedTensorType>(leaf.getType());
    const int64_t k = static_cast<int64_t>(i);
    const char *want = k < elements                 ? "of the space's type"
                       : k < elements + rows        ? "a per-row 1-D tensor"
                       : k < elements + rows + cols ? "a per-column 1-D tensor"
                                                    : "a 0-d tensor";
    bool ok = type.getElementType() == space.getElementType();
    if (k < elements)
      ok = ok && type == space;
    else if (k < elements + rows + cols)
      ok = ok && type.getRank() == 1;
    else
      ok = ok && type.getRank() == 0;
    if (ok && k >= elements + rows && k < elements + rows + cols)
      ok = succeeded(
          verifyCompatibleDims({type.getDimSize(0), space.getShape().back()}));
    if (!ok)
      return emitOpError() << "leaf " << k << " must be " << want << " of "
                           << space.getElementType() << ", got " << type;
  }
  using ::dloss::epilogue::intsOf;
  std::string problem = ::dloss::epilogue::checkElementwiseProgram(
      intsOf(getProgram()), intsOf(getOutputs()), intsOf(colSums), elements,
      rows, cols, count - elements - rows - cols);
  if (!problem.empty())
    return emitOpError() << "has a malformed program: " << problem;
  return success();
}
