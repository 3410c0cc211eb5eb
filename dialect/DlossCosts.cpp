// The cost rule of every op (CostOpInterface): concrete results, bytes sent,
// kernel workspace.
//
// Shapes come from the ops' shape rules (dialect/ShapeFunctions.h), the same
// the ops' result-type inference uses; this file adds only what the runtime
// knows at run time (the world size, index values) and the costs of the
// runtime's algorithms.
#include "dialect/CostModel.h"
#include "dialect/DlossOps.h"
#include "runtime/comm/RingBuffers.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::dloss;

//===----------------------------------------------------------------------===//
// CostEvaluator
//===----------------------------------------------------------------------===//

static int64_t elementBytes(Type type) {
  if (type.isIndex())
    return 8;
  if (type.isIntOrFloat())
    return (type.getIntOrFloatBitWidth() + 7) / 8;
  return 0;
}

int64_t Concrete::bytes() const {
  if (!tensor)
    return 0;
  int64_t n = elementBytes(tensor.getElementType());
  for (int64_t d : tensor.getShape())
    n *= d;
  return n;
}

std::string Concrete::typeText() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  for (int64_t d : tensor.getShape())
    os << d << "x";
  os << tensor.getElementType();
  return text;
}

std::string mlir::dloss::concreteShapeText(ArrayRef<int64_t> shape) {
  return shape.empty() ? "0-d"
                       : llvm::join(llvm::map_range(shape,
                                                    [](int64_t d) {
                                                      return std::to_string(d);
                                                    }),
                                    "x");
}

int64_t CostEvaluator::elementSize(Value value) const {
  return elementBytes(getElementTypeOrSelf(value.getType()));
}

void CostEvaluator::setTensor(Value result, ArrayRef<int64_t> shape) {
  known[result] = Concrete{
      RankedTensorType::get(shape, getElementTypeOrSelf(result.getType())), 0};
}

LogicalResult CostEvaluator::setType(Value result,
                                     FailureOr<RankedTensorType> type) {
  if (failed(type))
    return failure();
  setTensor(result, type->getShape());
  return success();
}

void CostEvaluator::setIndex(Value result, int64_t value) {
  known[result] = Concrete{RankedTensorType(), value};
}

shapes::Errors CostEvaluator::errors(Operation *op) const {
  return shapes::Errors(op->getLoc(), op->getName().getStringRef(),
                        " (under the report's sizes; check --report-size)");
}

InFlightDiagnostic CostEvaluator::fail(Operation *op) const {
  return emitError(op->getLoc()) << "'" << op->getName() << "' ";
}

//===----------------------------------------------------------------------===//
// Shared rules
//===----------------------------------------------------------------------===//

namespace {

std::string bytesText(int64_t bytes) { return std::to_string(bytes) + " B"; }

/// Every rank sends (N-1)/N of the bytes twice (ring reduce-scatter then
/// all-gather): the bandwidth-optimal all-reduce.
double allReduceBytes(double bytes, int64_t n) {
  return 2.0 * (n - 1) * bytes / n;
}

/// Hops of a travelling accumulator that comes home after visiting every rank.
int64_t homeHops(int64_t n) { return n > 1 ? n : 0; }

/// A ring op's sends: its chunk (`what`) goes N-1 hops; what comes home
/// after visiting every rank (`homeWhat`, none when 0 bytes) goes N hops.
Cost ringSent(int64_t n, int64_t chunk, StringRef what, int64_t home,
              StringRef homeWhat) {
  std::string how =
      llvm::formatv("{0} hops x {1} ({2})", n - 1, bytesText(chunk), what);
  if (home)
    how += llvm::formatv(" + {0} hops x {1} ({2})", homeHops(n),
                         bytesText(home), homeWhat)
               .str();
  return Cost{double((n - 1) * chunk + homeHops(n) * home), how};
}

/// The ring kernels double-buffer the incoming chunk of cols with its
/// per-column vectors; the backward's d_cols accumulator travels too.
Cost ringWorkspace(int64_t chunk, int64_t vectors, int64_t acc,
                   int64_t tileBytes) {
  std::string how = "2 x " + bytesText(chunk) + " cols chunk";
  if (vectors)
    how += " + " + bytesText(vectors) + " column vectors";
  if (acc)
    how += " + 2 x " + bytesText(acc) + " d_cols";
  how += " + " + bytesText(tileBytes) + " tile";
  return Cost{double(2 * chunk + vectors + 2 * acc + tileBytes), how};
}

/// Ops whose result has their first operand's type (as ODS declares).
template <typename OpT> LogicalResult sameAsOperand0(OpT op, CostEvaluator &e) {
  static_assert(OpT::template hasTrait<OpTrait::SameOperandsAndResultType>(),
                "the result must have the operand's type");
  e.setTensor(op->getResult(0), e.shape(op->getOperand(0)));
  return success();
}

/// Operands 0 and 1 of a fused op are the two sides of the similarity (rows
/// and columns, or rows and class weights): 2-D, same feature size.
LogicalResult fusedSimilarity(Operation *op, const CostEvaluator &e) {
  ArrayRef<int64_t> x = e.shape(op->getOperand(0)),
                    y = e.shape(op->getOperand(1));
  if (x.size() != 2 || y.size() != 2 || x[1] != y[1])
    return e.fail(op) << "compares rows of " << concreteShapeText(x)
                      << " with rows of " << concreteShapeText(y)
                      << ": they need the same feature size under the "
                         "report's sizes";
  return success();
}

/// A fused forward op's results are vectors with one entry per row of the
/// operand `sides[i]` (0: rows, 1: cols).
LogicalResult fusedVectors(Operation *op, CostEvaluator &e,
                           ArrayRef<unsigned> sides) {
  if (failed(fusedSimilarity(op, e)))
    return failure();
  for (auto [result, side] : llvm::zip_equal(op->getResults(), sides))
    e.setTensor(result, {e.shape(op->getOperand(side))[0]});
  return success();
}

/// A fused _grad op's result i is the gradient of operand i, shaped like it.
LogicalResult fusedGradients(Operation *op, CostEvaluator &e) {
  if (failed(fusedSimilarity(op, e)))
    return failure();
  for (auto [result, operand] : llvm::zip(op->getResults(), op->getOperands()))
    e.setTensor(result, e.shape(operand));
  return success();
}

} // namespace

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

LogicalResult AllGatherOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  if (failed(e.setType(getResult(),
                       shapes::allGather(e.errors(*this), e.type(getInput()),
                                         getAxis(), e.worldSize()))))
    return failure();
  int64_t local = e.bytes(getInput()), n = e.worldSize();
  cost.sent =
      Cost{double((n - 1) * local),
           llvm::formatv("ring: {0} x {1}", n - 1, bytesText(local)).str()};
  return success();
}

LogicalResult AllReduceOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  int64_t bytes = e.bytes(getInput());
  cost.sent = Cost{allReduceBytes(bytes, e.worldSize()),
                   "ring: 2(N-1)/N x " + bytesText(bytes)};
  return sameAsOperand0(*this, e);
}

LogicalResult ReduceScatterOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  RankedTensorType input = e.type(getInput());
  int64_t axis = getAxis();
  if (failed(shapes::checkAxis(e.errors(*this), input, axis)))
    return failure();
  int64_t total = input.getDimSize(axis), n = e.worldSize();
  if (!getSize() && total % n != 0)
    return e.fail(*this) << "splits an axis of size " << total
                         << " evenly, but it does not divide by " << n
                         << " ranks";
  int64_t size = getSize() ? e.index(getSize()) : total / n;
  if (failed(e.setType(getResult(),
                       shapes::resizeAxis(e.errors(*this), input, axis, size))))
    return failure();

  // The ring passes N-1 partial sums of one rank's block along: (N-1)/N of
  // the input.
  int64_t block = e.bytes(getResult());
  cost.sent =
      Cost{double((n - 1) * block),
           llvm::formatv("ring: {0} x {1}", n - 1, bytesText(block)).str()};
  // The engine's own count of the ring's temporary blocks; its first block
  // goes out of the input when nothing but size-1 dims precede the axis.
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d)
    outer *= input.getDimSize(d);
  int64_t buffers = ::dloss::glooReduceScatterBuffers(n, outer == 1);
  if (buffers)
    cost.workspace =
        Cost{double(buffers * block),
             llvm::formatv("{0} x {1} ring blocks", buffers, bytesText(block))
                 .str()};
  return success();
}

LogicalResult BroadcastOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  int64_t bytes = e.bytes(getInput());
  cost.sent =
      Cost{e.worldSize() > 1 ? double(bytes) : 0.0,
           "root sends " + bytesText(bytes) + "; other ranks send nothing"};
  return sameAsOperand0(*this, e);
}

LogicalResult RingShiftOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  int64_t bytes = e.bytes(getInput());
  bool moves = getShift() % e.worldSize() != 0;
  cost.sent =
      Cost{moves ? double(bytes) : 0.0,
           moves ? "1 x " + bytesText(bytes) : "shift is a multiple of N"};
  return sameAsOperand0(*this, e);
}

//===----------------------------------------------------------------------===//
// Rank facts (every rank holding the same sizes)
//===----------------------------------------------------------------------===//

LogicalResult RankOp::evaluateCost(CostEvaluator &e, OpCost &) {
  e.setIndex(getResult(), e.rank());
  return success();
}

LogicalResult WorldSizeOp::evaluateCost(CostEvaluator &e, OpCost &) {
  e.setIndex(getResult(), e.worldSize());
  return success();
}

/// dim, shard_offset and global_size: this rank's size along the axis, times
/// the number of ranks before this one or of all ranks.
static LogicalResult axisSize(Operation *op, Value input, int64_t axis,
                              int64_t ranks, CostEvaluator &e) {
  RankedTensorType type = e.type(input);
  if (failed(shapes::checkAxis(e.errors(op), type, axis)))
    return failure();
  e.setIndex(op->getResult(0), type.getDimSize(axis) * ranks);
  return success();
}

LogicalResult DimOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return axisSize(*this, getInput(), getAxis(), 1, e);
}

LogicalResult ShardOffsetOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return axisSize(*this, getInput(), getAxis(), e.rank(), e);
}

LogicalResult GlobalSizeOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return axisSize(*this, getInput(), getAxis(), e.worldSize(), e);
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

LogicalResult MatmulOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::matmul(e.errors(*this), e.type(getLhs()),
                                  e.type(getRhs()), getTransposeLhs(),
                                  getTransposeRhs()));
}

#define DLOSS_ELEMENTWISE_COST(OP)                                             \
  LogicalResult OP::evaluateCost(CostEvaluator &e, OpCost &) {                 \
    return e.setType(getResult(),                                              \
                     shapes::elementwise(e.errors(*this), e.type(getLhs()),    \
                                         e.type(getRhs())));                   \
  }
DLOSS_ELEMENTWISE_COST(AddOp)
DLOSS_ELEMENTWISE_COST(SubOp)
DLOSS_ELEMENTWISE_COST(MulOp)
DLOSS_ELEMENTWISE_COST(DivOp)
DLOSS_ELEMENTWISE_COST(EqOp)
#undef DLOSS_ELEMENTWISE_COST

LogicalResult SelectOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::select(e.errors(*this), e.type(getCond()),
                                  e.type(getTrueValue()),
                                  e.type(getFalseValue())));
}

#define DLOSS_SAME_TYPE_COST(OP)                                               \
  LogicalResult OP::evaluateCost(CostEvaluator &e, OpCost &) {                 \
    return sameAsOperand0(*this, e);                                           \
  }
DLOSS_SAME_TYPE_COST(NegOp)
DLOSS_SAME_TYPE_COST(ExpOp)
DLOSS_SAME_TYPE_COST(LogOp)
DLOSS_SAME_TYPE_COST(SoftplusOp)
DLOSS_SAME_TYPE_COST(LogSigmoidOp)
DLOSS_SAME_TYPE_COST(CosOp)
DLOSS_SAME_TYPE_COST(AcosOp)
DLOSS_SAME_TYPE_COST(SinOp)
DLOSS_SAME_TYPE_COST(SqrtOp)
DLOSS_SAME_TYPE_COST(StopGradientOp)
DLOSS_SAME_TYPE_COST(SigmoidOp)
DLOSS_SAME_TYPE_COST(ClampOp)
DLOSS_SAME_TYPE_COST(L2NormalizeOp)
DLOSS_SAME_TYPE_COST(L2NormalizeGradOp)
DLOSS_SAME_TYPE_COST(ZerosLikeOp)
#undef DLOSS_SAME_TYPE_COST

LogicalResult FusedElementwiseOp::evaluateCost(CostEvaluator &e, OpCost &) {
  // Full results have the shape of leaf 0, column sums one value per
  // column (the verifier's rule).
  ArrayRef<int64_t> space = e.shape(getLeaves().front());
  const size_t full = getOutputs().size();
  for (auto [k, result] : llvm::enumerate(getResults()))
    e.setTensor(result, k < full ? space : space.take_back(1));
  return success();
}

LogicalResult CastOp::evaluateCost(CostEvaluator &e, OpCost &) {
  // An index becomes a 0-d tensor.
  const Concrete &input = e.get(getInput());
  e.setTensor(getResult(),
              input.isTensor() ? input.tensor.getShape() : ArrayRef<int64_t>());
  return success();
}

LogicalResult ReduceOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(), shapes::reduce(e.errors(*this),
                                               e.type(getInput()), getAxes()));
}

LogicalResult LogSumExpOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  int64_t bytes = e.bytes(getInput());
  cost.workspace =
      Cost{double(bytes), bytesText(bytes) + " log_softmax temporary (ATen)"};
  return e.setType(
      getResult(),
      shapes::dropAxis(e.errors(*this), e.type(getInput()), getAxis()));
}

LogicalResult TakeAlongOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::perRowPick(e.errors(*this), e.type(getInput()),
                                      e.type(getIndices()), getAxis()));
}

LogicalResult PutAlongOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::putAlong(e.errors(*this), e.type(getInput()),
                                    e.type(getIndices()), e.type(getValues()),
                                    getAxis()));
}

LogicalResult CrossEntropyOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  int64_t bytes = e.bytes(getLogits());
  cost.workspace =
      Cost{double(bytes), bytesText(bytes) + " log_softmax temporary (ATen)"};
  return e.setType(getResult(),
                   shapes::perRowPick(e.errors(*this), e.type(getLogits()),
                                      e.type(getTargets()), getAxis()));
}

LogicalResult ArangeOp::evaluateCost(CostEvaluator &e, OpCost &) {
  int64_t count = e.index(getCount());
  if (count < 0)
    return e.fail(*this) << "has a negative count " << count
                         << " under the report's sizes";
  e.setTensor(getResult(), {count});
  return success();
}

LogicalResult ExpandOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::expand(e.errors(*this), e.type(getInput()),
                                  e.type(getLike()), getAxes()));
}

LogicalResult SliceOp::evaluateCost(CostEvaluator &e, OpCost &) {
  return e.setType(getResult(),
                   shapes::resizeAxis(e.errors(*this), e.type(getInput()),
                                      getAxis(), e.index(getSize())));
}

LogicalResult PadOp::evaluateCost(CostEvaluator &e, OpCost &) {
  RankedTensorType input = e.type(getInput());
  if (failed(shapes::checkAxis(e.errors(*this), input, getAxis())))
    return failure();
  int64_t size =
      input.getDimSize(getAxis()) + e.index(getLow()) + e.index(getHigh());
  return e.setType(getResult(),
                   shapes::resizeAxis(e.errors(*this), input, getAxis(), size));
}

//===----------------------------------------------------------------------===//
// Fused ops
//===----------------------------------------------------------------------===//

LogicalResult RingSoftmaxCEOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  // (row_ce, col_ce, row_lse, col_lse)
  if (failed(fusedVectors(*this, e, {0, 1, 0, 1})))
    return failure();
  cost.sent = ringSent(
      e.worldSize(), e.bytes(getCols()) + e.bytes(getColTargets()),
      "cols + col targets", 3 * e.bytes(getColCe()), "3 column statistics");
  cost.workspace = ringWorkspace(
      e.bytes(getCols()), e.bytes(getColTargets()) + 3 * e.bytes(getColCe()), 0,
      e.tileBytes(getRows()));
  return success();
}

LogicalResult RingSoftmaxCEGradOp::evaluateCost(CostEvaluator &e,
                                                OpCost &cost) {
  if (failed(fusedGradients(*this, e)))
    return failure();
  int64_t vectors =
      e.bytes(getColTargets()) + e.bytes(getColLse()) + e.bytes(getCtCol());
  cost.sent = ringSent(e.worldSize(), e.bytes(getCols()) + vectors,
                       "cols + col targets + col_lse + ct_col",
                       e.bytes(getDCols()), "d_cols");
  cost.workspace = ringWorkspace(e.bytes(getCols()), vectors,
                                 e.bytes(getDCols()), e.tileBytes(getRows()));
  return success();
}

LogicalResult RingSigmoidPairsOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  // (pair_sum, positive)
  if (failed(fusedVectors(*this, e, {0, 0})))
    return failure();
  cost.sent = ringSent(e.worldSize(), e.bytes(getCols()), "cols", 0, "");
  cost.workspace =
      ringWorkspace(e.bytes(getCols()), 0, 0, e.tileBytes(getRows()));
  return success();
}

LogicalResult RingSigmoidPairsGradOp::evaluateCost(CostEvaluator &e,
                                                   OpCost &cost) {
  if (failed(fusedGradients(*this, e)))
    return failure();
  cost.sent = ringSent(e.worldSize(), e.bytes(getCols()), "cols",
                       e.bytes(getDCols()), "d_cols");
  cost.workspace = ringWorkspace(e.bytes(getCols()), 0, e.bytes(getDCols()),
                                 e.tileBytes(getRows()));
  return success();
}

/// The bytes of the per-column leaves of a general fused op (they travel
/// with the chunk when it is gathered).
static int64_t columnLeafBytes(CostEvaluator &e, ValueRange leaves,
                               int64_t rowLeaves, int64_t colLeaves) {
  int64_t bytes = 0;
  for (Value leaf : leaves.drop_front(rowLeaves).take_front(colLeaves))
    bytes += e.bytes(leaf);
  return bytes;
}

LogicalResult FusedSimilarityOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  if (failed(fusedSimilarity(*this, e)))
    return failure();
  int64_t rowResults = static_cast<int64_t>(getOutputs().size()) / 2;
  for (auto [k, result] : llvm::enumerate(getResults()))
    e.setTensor(result,
                {e.shape(static_cast<int64_t>(k) < rowResults ? getRows()
                                                              : getCols())[0]});
  int64_t vectors =
      columnLeafBytes(e, getLeaves(), getRowLeaves(), getColLeaves());
  // One tile of the similarity and the program's registers over one tile
  // row (a few KiB, counted with the tile).
  if (getSharded()) {
    // Per log-sum-exp result an all_reduce max and a sum; per sum result
    // a sum (the statistics of all results travel together).
    int64_t row = e.bytes(getResults().front());
    int64_t lse = 0;
    for (size_t k = 1; k < getOutputs().size(); k += 2)
      lse += getOutputs()[k] == 1;
    int64_t results = static_cast<int64_t>(getResults().size());
    cost.sent = Cost{allReduceBytes(lse * row, e.worldSize()) +
                         allReduceBytes((results + lse) * row, e.worldSize()),
                     llvm::formatv("all_reduce max of {0} + all_reduce sum "
                                   "of {1}",
                                   bytesText(lse * row),
                                   bytesText((results + lse) * row))
                         .str()};
  }
  if (!getGathered()) {
    cost.workspace = Cost{double(e.tileBytes(getRows())),
                          bytesText(e.tileBytes(getRows())) + " tile"};
    return success();
  }
  cost.sent = ringSent(e.worldSize(), e.bytes(getCols()) + vectors,
                       vectors ? "cols + column leaves" : "cols", 0, "");
  cost.workspace =
      ringWorkspace(e.bytes(getCols()), vectors, 0, e.tileBytes(getRows()));
  return success();
}

LogicalResult FusedSimilarityGradOp::evaluateCost(CostEvaluator &e,
                                                  OpCost &cost) {
  if (failed(fusedSimilarity(*this, e)))
    return failure();
  int64_t results =
      static_cast<int64_t>(getOutputs().size()) / 2 +
      (getColOutputs() ? static_cast<int64_t>(getColOutputs()->size()) / 2 : 0);
  ValueRange leaves = getExtra().drop_back(2 * results);
  int64_t n = e.shape(getRows())[0];
  int64_t scalars =
      static_cast<int64_t>(leaves.size()) - getRowLeaves() - getColLeaves();
  e.setTensor(getDRows(), e.shape(getRows()));
  e.setTensor(getDCols(), e.shape(getCols()));
  e.setTensor(getDRowLeaves(), {static_cast<int64_t>(getRowLeaves()), n});
  e.setTensor(getDScalars(), {scalars});
  int64_t vectors = columnLeafBytes(e, leaves, getRowLeaves(), getColLeaves());
  // The recomputed tile and the tile of its gradient.
  int64_t tiles = 2 * e.tileBytes(getRows());
  if (!getGathered()) {
    cost.workspace =
        Cost{double(tiles), bytesText(tiles) + " tile + gradient tile"};
    return success();
  }
  cost.sent = ringSent(e.worldSize(), e.bytes(getCols()) + vectors,
                       vectors ? "cols + column leaves" : "cols",
                       e.bytes(getDCols()), "d_cols");
  cost.workspace =
      ringWorkspace(e.bytes(getCols()), vectors, e.bytes(getDCols()), tiles);
  return success();
}

LogicalResult ShardedSoftmaxOp::evaluateCost(CostEvaluator &e, OpCost &cost) {
  // (lse_rest, target_dot)
  if (failed(fusedVectors(*this, e, {0, 0})))
    return failure();
  // all_reduce max of the row maxima, then all_reduce sum of the row sums
  // and target dots.
  int64_t row = e.bytes(getLseRest());
  cost.sent = Cost{allReduceBytes(row, e.worldSize()) +
                       allReduceBytes(2 * row, e.worldSize()),
                   llvm::formatv("all_reduce max of {0} + all_reduce sum of "
                                 "{1}, each 2(N-1)/N x",
                                 bytesText(row), bytesText(2 * row))
                       .str()};
  int64_t tile = e.tileBytes(getRows()), stats = 3 * row;
  cost.workspace =
      Cost{double(tile + stats), bytesText(tile) + " tile + " +
                                     bytesText(stats) + " row max/sum buffers"};
  return success();
}

LogicalResult ShardedSoftmaxGradOp::evaluateCost(CostEvaluator &e,
                                                 OpCost &cost) {
  if (failed(fusedGradients(*this, e)))
    return failure();
  int64_t tile = e.tileBytes(getRows());
  cost.workspace = Cost{double(tile), bytesText(tile) + " tile"};
  return success();
}

//===----------------------------------------------------------------------===//
// arith: constants and the index arithmetic the runtime evaluates
//===----------------------------------------------------------------------===//

namespace {

/// The runtime (and so the report) evaluates arith only on scalars.
LogicalResult indexOperands(Operation *op, const CostEvaluator &e) {
  for (Value operand : op->getOperands())
    if (e.get(operand).isTensor())
      return e.fail(op) << "computes on tensors; the report (and the "
                           "runtime) evaluate arith only on scalars";
  return success();
}

struct ConstantCost
    : CostOpInterface::ExternalModel<ConstantCost, arith::ConstantOp> {
  LogicalResult evaluateCost(Operation *op, CostEvaluator &e, OpCost &) const {
    auto constant = cast<arith::ConstantOp>(op);
    if (auto tensor = dyn_cast<RankedTensorType>(constant.getType())) {
      if (!tensor.hasStaticShape())
        return e.fail(op) << "has the dynamic type " << tensor;
      e.setTensor(constant.getResult(), tensor.getShape());
      return success();
    }
    if (auto integer = dyn_cast<IntegerAttr>(constant.getValue())) {
      e.setIndex(constant.getResult(), integer.getValue().getSExtValue());
      return success();
    }
    return e.fail(op) << "is a constant the report cannot size: "
                      << constant.getValue();
  }
};

/// An index binary op computing `Fn{}(a, b)`.
template <typename OpT, typename Fn>
struct IndexBinaryCost
    : CostOpInterface::ExternalModel<IndexBinaryCost<OpT, Fn>, OpT> {
  LogicalResult evaluateCost(Operation *op, CostEvaluator &e, OpCost &) const {
    if (failed(indexOperands(op, e)))
      return failure();
    auto binary = cast<OpT>(op);
    int64_t a = e.index(binary.getLhs()), b = e.index(binary.getRhs());
    if (std::is_same_v<OpT, arith::DivSIOp> && b == 0)
      return e.fail(op) << "divides " << a
                        << " by zero under the report's sizes";
    e.setIndex(binary.getResult(), Fn{}(a, b));
    return success();
  }
};

struct Add {
  int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};
struct Sub {
  int64_t operator()(int64_t a, int64_t b) const { return a - b; }
};
struct Mul {
  int64_t operator()(int64_t a, int64_t b) const { return a * b; }
};
struct Div {
  int64_t operator()(int64_t a, int64_t b) const { return b ? a / b : 0; }
};
struct Max {
  int64_t operator()(int64_t a, int64_t b) const { return std::max(a, b); }
};
struct Min {
  int64_t operator()(int64_t a, int64_t b) const { return std::min(a, b); }
};

struct CmpICost : CostOpInterface::ExternalModel<CmpICost, arith::CmpIOp> {
  LogicalResult evaluateCost(Operation *op, CostEvaluator &e, OpCost &) const {
    if (failed(indexOperands(op, e)))
      return failure();
    auto cmp = cast<arith::CmpIOp>(op);
    APInt a(64, e.index(cmp.getLhs()), /*isSigned=*/true);
    APInt b(64, e.index(cmp.getRhs()), /*isSigned=*/true);
    e.setIndex(cmp.getResult(),
               arith::applyCmpPredicate(cmp.getPredicate(), a, b));
    return success();
  }
};

struct SelectCost
    : CostOpInterface::ExternalModel<SelectCost, arith::SelectOp> {
  LogicalResult evaluateCost(Operation *op, CostEvaluator &e, OpCost &) const {
    auto select = cast<arith::SelectOp>(op);
    if (e.get(select.getCondition()).isTensor())
      return e.fail(op) << "selects element-wise; the report evaluates "
                           "only a scalar condition";
    Value chosen = e.index(select.getCondition()) ? select.getTrueValue()
                                                  : select.getFalseValue();
    e.set(select.getResult(), e.get(chosen));
    return success();
  }
};

struct IndexCastCost
    : CostOpInterface::ExternalModel<IndexCastCost, arith::IndexCastOp> {
  LogicalResult evaluateCost(Operation *op, CostEvaluator &e, OpCost &) const {
    if (failed(indexOperands(op, e)))
      return failure();
    auto cast_ = cast<arith::IndexCastOp>(op);
    e.setIndex(cast_.getResult(), e.index(cast_.getIn()));
    return success();
  }
};

} // namespace

void mlir::dloss::registerArithCostModels(DialectRegistry &registry) {
  registry.addExtension(+[](MLIRContext *context, arith::ArithDialect *) {
    arith::ConstantOp::attachInterface<ConstantCost>(*context);
    arith::AddIOp::attachInterface<IndexBinaryCost<arith::AddIOp, Add>>(
        *context);
    arith::SubIOp::attachInterface<IndexBinaryCost<arith::SubIOp, Sub>>(
        *context);
    arith::MulIOp::attachInterface<IndexBinaryCost<arith::MulIOp, Mul>>(
        *context);
    arith::DivSIOp::attachInterface<IndexBinaryCost<arith::DivSIOp, Div>>(
        *context);
    arith::MaxSIOp::attachInterface<IndexBinaryCost<arith::MaxSIOp, Max>>(
        *context);
    arith::MinSIOp::attachInterface<IndexBinaryCost<arith::MinSIOp, Min>>(
        *context);
    arith::CmpIOp::attachInterface<CmpICost>(*context);
    arith::SelectOp::attachInterface<SelectCost>(*context);
    arith::IndexCastOp::attachInterface<IndexCastCost>(*context);
  });
}
