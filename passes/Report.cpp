// dlossc --report: a shape interpreter with per-op memory and traffic rules.
//
// The module is compiled twice (fused and unfused); every function is then
// evaluated op by op on concrete sizes, the same on every rank. Memory counts
// every tensor as its own buffer, live from its definition to its last use,
// plus the temporaries a kernel needs; communication counts the bytes one rank
// sends per call under the algorithm the runtime uses.
#include "passes/Report.h"

#include "dialect/DlossOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/TypeUtilities.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <functional>

using namespace mlir;
using namespace mlir::dloss;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(double bytes) {
  return llvm::formatv("{0:F2}", bytes / kMiB).str();
}

/// "file:line:col" of the first file location in `loc`, file without its
/// directory so that reports read the same wherever the source lies.
std::string locationText(Location loc) {
  std::string text = "unknown";
  loc->walk([&](Location inner) {
    if (auto file = dyn_cast<FileLineColLoc>(inner)) {
      text = llvm::formatv(
                 "{0}:{1}:{2}",
                 llvm::sys::path::filename(file.getFilename().getValue()),
                 file.getLine(), file.getColumn())
                 .str();
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return text;
}

/// An error at `op`'s location that names it. (Operation::emitError would
/// append the whole op, and with it the function, as a note.)
InFlightDiagnostic fail(Operation *op) {
  return emitError(op->getLoc()) << "'" << op->getName() << "' ";
}

std::string shapeText(ArrayRef<int64_t> shape) {
  return shape.empty() ? "0-d"
                       : llvm::join(llvm::map_range(shape,
                                                    [](int64_t d) {
                                                      return std::to_string(d);
                                                    }),
                                    "x");
}

int64_t elementBytes(Type type) {
  if (type.isIndex())
    return 8;
  if (type.isIntOrFloat())
    return (type.getIntOrFloatBitWidth() + 7) / 8;
  return 0;
}

//===----------------------------------------------------------------------===//
// The shape interpreter
//===----------------------------------------------------------------------===//

/// What the report knows about one SSA value on the representative rank: a
/// tensor's concrete shape, or an index (or integer scalar)'s value.
struct Concrete {
  bool isTensor = false;
  SmallVector<int64_t> shape;
  Type element;
  int64_t value = 0;

  int64_t bytes() const {
    if (!isTensor)
      return 0;
    int64_t n = elementBytes(element);
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  std::string typeText() const {
    std::string text;
    llvm::raw_string_ostream os(text);
    for (int64_t d : shape)
      os << d << "x";
    os << element;
    return text;
  }
};

class Evaluator {
public:
  explicit Evaluator(const ReportOptions &options) : options(options) {}

  const ReportOptions &reportOptions() const { return options; }
  int64_t worldSize() const { return options.worldSize; }
  /// Rank facts (rank, shard_offset) are evaluated as on rank 0; with equal
  /// sizes no shape depends on the rank.
  int64_t rank() const { return 0; }

  const Concrete &get(Value value) const { return known.find(value)->second; }
  bool has(Value value) const { return known.count(value); }
  ArrayRef<int64_t> shape(Value value) const { return get(value).shape; }
  int64_t bytes(Value value) const { return get(value).bytes(); }
  int64_t index(Value value) const { return get(value).value; }
  int64_t elementSize(Value value) const {
    return elementBytes(getElementTypeOrSelf(value.getType()));
  }

  void setTensor(Value result, ArrayRef<int64_t> shape) {
    Concrete &c = known[result];
    c.isTensor = true;
    c.shape.assign(shape.begin(), shape.end());
    c.element = getElementTypeOrSelf(result.getType());
  }
  void setIndex(Value result, int64_t value) {
    Concrete &c = known[result];
    c.isTensor = false;
    c.value = value;
    c.element = result.getType();
  }
  void set(Value result, const Concrete &like) {
    if (like.isTensor)
      setTensor(result, like.shape);
    else
      setIndex(result, like.value);
  }

private:
  const ReportOptions &options;
  llvm::DenseMap<Value, Concrete> known;
};

/// Bytes and how they add up (for one rank's sends, or a kernel's temporaries).
struct Cost {
  double bytes = 0;
  std::string how;
};

using ShapeRule = std::function<LogicalResult(Operation *, Evaluator &)>;
using CostRule = std::function<Cost(Operation *, const Evaluator &)>;

/// The report's rules for one op: its result shapes, the bytes it sends (for
/// collectives) and the temporaries its kernel allocates beyond its results.
struct OpRules {
  ShapeRule shape;
  CostRule sent;
  CostRule workspace;
};

class RuleTable {
public:
  RuleTable();

  const OpRules *lookup(Operation *op) const {
    auto it = rules.find(op->getName().getTypeID());
    return it == rules.end() ? nullptr : &it->second;
  }

private:
  /// Sets `field` of every op in `OpTs` to `f`, which takes the op's class.
  template <typename... OpTs, typename Rule, typename F>
  void set(Rule OpRules::*field, F f) {
    (void)std::initializer_list<int>{(
        rules[TypeID::get<OpTs>()].*field =
            [f](Operation *op, auto &e) { return f(cast<OpTs>(op), e); },
        0)...};
  }
  template <typename... OpTs, typename F> void shape(F f) {
    set<OpTs...>(&OpRules::shape, f);
  }
  template <typename... OpTs, typename F> void sent(F f) {
    set<OpTs...>(&OpRules::sent, f);
  }
  template <typename... OpTs, typename F> void workspace(F f) {
    set<OpTs...>(&OpRules::workspace, f);
  }

  llvm::DenseMap<TypeID, OpRules> rules;
};

/// `axis` of a value of rank `rank`, negative axes counted from the end.
FailureOr<int64_t> checkedAxis(Operation *op, int64_t axis, size_t rank) {
  int64_t normal = axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
  if (normal < 0 || normal >= static_cast<int64_t>(rank))
    return fail(op) << "has axis " << axis << " is out of range for a " << rank
                    << "-D operand";
  return normal;
}

/// `input`'s shape with `axis` resized by `resize` (old size -> new size).
LogicalResult resizeAxis(Operation *op, Evaluator &e, Value input, int64_t axis,
                         Value result,
                         function_ref<FailureOr<int64_t>(int64_t)> resize) {
  SmallVector<int64_t> shape(e.shape(input));
  FailureOr<int64_t> a = checkedAxis(op, axis, shape.size());
  if (failed(a))
    return failure();
  FailureOr<int64_t> size = resize(shape[*a]);
  if (failed(size))
    return failure();
  if (*size < 0)
    return fail(op) << "gives axis " << *a << " the negative size " << *size
                    << " under the report's sizes";
  shape[*a] = *size;
  e.setTensor(result, shape);
  return success();
}

/// `input`'s shape without `axis`.
LogicalResult dropAxis(Operation *op, Evaluator &e, Value input, int64_t axis,
                       Value result) {
  SmallVector<int64_t> shape(e.shape(input));
  FailureOr<int64_t> a = checkedAxis(op, axis, shape.size());
  if (failed(a))
    return failure();
  shape.erase(shape.begin() + *a);
  e.setTensor(result, shape);
  return success();
}

/// Every rank sends (N-1)/N of the bytes twice (ring reduce-scatter then
/// all-gather): the bandwidth-optimal all-reduce.
double allReduceBytes(double bytes, int64_t n) {
  return 2.0 * (n - 1) * bytes / n;
}

/// Hops of a travelling accumulator that comes home after visiting every rank.
int64_t homeHops(int64_t n) { return n > 1 ? n : 0; }

std::string bytesText(int64_t bytes) { return std::to_string(bytes) + " B"; }

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

RuleTable::RuleTable() {
  // Results shaped like the first operand.
  shape<AllReduceOp, BroadcastOp, RingShiftOp, NegOp, ExpOp, LogOp, SoftplusOp,
        LogSigmoidOp, CosOp, AcosOp, SinOp, SqrtOp, SigmoidOp, ClampOp,
        L2NormalizeOp, ZerosLikeOp, PutAlongOp>(
      [](auto op, Evaluator &e) -> LogicalResult {
        e.setTensor(op->getResult(0), e.shape(op->getOperand(0)));
        return success();
      });
  // Element-wise with 0-d broadcasting.
  shape<AddOp, SubOp, MulOp, DivOp, EqOp>([](auto op,
                                             Evaluator &e) -> LogicalResult {
    ArrayRef<int64_t> lhs = e.shape(op.getLhs()), rhs = e.shape(op.getRhs());
    if (!lhs.empty() && !rhs.empty() && lhs != rhs)
      return fail(op) << "operand shapes " << shapeText(lhs) << " and "
                      << shapeText(rhs) << " disagree under the report's sizes";
    e.setTensor(op.getResult(), lhs.empty() ? rhs : lhs);
    return success();
  });
  shape<CastOp>([](CastOp op, Evaluator &e) -> LogicalResult {
    if (e.get(op.getInput()).isTensor)
      e.setTensor(op.getResult(), e.shape(op.getInput()));
    else
      e.setTensor(op.getResult(), {});
    return success();
  });

  // Collectives and rank facts, every rank holding the same sizes.
  shape<AllGatherOp>([](AllGatherOp op, Evaluator &e) {
    return resizeAxis(op, e, op.getInput(), op.getAxisAttr().getInt(),
                      op.getResult(), [&](int64_t size) -> FailureOr<int64_t> {
                        return size * e.worldSize();
                      });
  });
  shape<ReduceScatterOp>([](ReduceScatterOp op, Evaluator &e) {
    return resizeAxis(op, e, op.getInput(), op.getAxisAttr().getInt(),
                      op.getResult(), [&](int64_t total) -> FailureOr<int64_t> {
                        if (op.getSize())
                          return e.index(op.getSize());
                        if (total % e.worldSize() != 0)
                          return fail(op)
                                 << "splits an axis of size " << total
                                 << " evenly, but it does not divide by "
                                 << e.worldSize() << " ranks";
                        return total / e.worldSize();
                      });
  });
  shape<RankOp>([](RankOp op, Evaluator &e) -> LogicalResult {
    e.setIndex(op.getResult(), e.rank());
    return success();
  });
  shape<WorldSizeOp>([](WorldSizeOp op, Evaluator &e) -> LogicalResult {
    e.setIndex(op.getResult(), e.worldSize());
    return success();
  });
  shape<DimOp, ShardOffsetOp, GlobalSizeOp>(
      [](auto op, Evaluator &e) -> LogicalResult {
        ArrayRef<int64_t> shape = e.shape(op.getInput());
        FailureOr<int64_t> a =
            checkedAxis(op, op.getAxisAttr().getInt(), shape.size());
        if (failed(a))
          return failure();
        int64_t size = shape[*a];
        if (isa<ShardOffsetOp>(op.getOperation()))
          size *= e.rank();
        else if (isa<GlobalSizeOp>(op.getOperation()))
          size *= e.worldSize();
        e.setIndex(op.getResult(), size);
        return success();
      });

  // Compute.
  shape<MatmulOp>([](MatmulOp op, Evaluator &e) -> LogicalResult {
    ArrayRef<int64_t> lhs = e.shape(op.getLhs()), rhs = e.shape(op.getRhs());
    if (lhs.size() != 2 || rhs.size() != 2)
      return fail(op) << "multiplies a " << lhs.size() << "-D and a "
                      << rhs.size() << "-D operand";
    int64_t m = lhs[op.getTransposeLhs() ? 1 : 0],
            k = lhs[op.getTransposeLhs() ? 0 : 1];
    int64_t k2 = rhs[op.getTransposeRhs() ? 1 : 0],
            n = rhs[op.getTransposeRhs() ? 0 : 1];
    if (k != k2)
      return fail(op) << "multiplies " << shapeText(lhs) << " by "
                      << shapeText(rhs)
                      << " (after transposition): inner sizes " << k << " and "
                      << k2 << " disagree under the report's sizes";
    e.setTensor(op.getResult(), {m, n});
    return success();
  });
  shape<ReduceOp>([](ReduceOp op, Evaluator &e) -> LogicalResult {
    ArrayRef<int64_t> input = e.shape(op.getInput());
    llvm::SmallDenseSet<int64_t> drop;
    for (int64_t axis : op.getAxes()) {
      FailureOr<int64_t> a = checkedAxis(op, axis, input.size());
      if (failed(a))
        return failure();
      drop.insert(*a);
    }
    SmallVector<int64_t> shape;
    for (auto [i, d] : llvm::enumerate(input))
      if (!drop.contains(static_cast<int64_t>(i)))
        shape.push_back(d);
    e.setTensor(op.getResult(), shape);
    return success();
  });
  shape<LogSumExpOp, TakeAlongOp>([](auto op, Evaluator &e) -> LogicalResult {
    return dropAxis(op, e, op.getInput(), op.getAxisAttr().getInt(),
                    op.getResult());
  });
  shape<CrossEntropyOp>([](CrossEntropyOp op, Evaluator &e) -> LogicalResult {
    return dropAxis(op, e, op.getLogits(), op.getAxisAttr().getInt(),
                    op.getResult());
  });
  shape<ArangeOp>([](ArangeOp op, Evaluator &e) -> LogicalResult {
    int64_t count = e.index(op.getCount());
    if (count < 0)
      return fail(op) << "has a negative count " << count
                      << " under the report's sizes";
    e.setTensor(op.getResult(), {count});
    return success();
  });
  shape<ExpandOp>([](ExpandOp op, Evaluator &e) -> LogicalResult {
    e.setTensor(op.getResult(), e.shape(op.getLike()));
    return success();
  });
  shape<SliceOp>([](SliceOp op, Evaluator &e) {
    return resizeAxis(
        op, e, op.getInput(), op.getAxisAttr().getInt(), op.getResult(),
        [&](int64_t) -> FailureOr<int64_t> { return e.index(op.getSize()); });
  });
  shape<PadOp>([](PadOp op, Evaluator &e) {
    return resizeAxis(op, e, op.getInput(), op.getAxisAttr().getInt(),
                      op.getResult(), [&](int64_t size) -> FailureOr<int64_t> {
                        return size + e.index(op.getLow()) +
                               e.index(op.getHigh());
                      });
  });

  // Fused ops. Operands 0 and 1 are the two sides of the similarity (rows
  // and columns, or rows and class weights): 2-D, same feature size. A
  // forward op's results are vectors per row of one side; a _grad op's result
  // i is the gradient of operand i (d_rows, d_cols or d_weights, d_scale,
  // d_bias), shaped like it.
  auto similarity = [](Operation *op, const Evaluator &e) -> LogicalResult {
    ArrayRef<int64_t> x = e.shape(op->getOperand(0)),
                      y = e.shape(op->getOperand(1));
    if (x.size() != 2 || y.size() != 2 || x[1] != y[1])
      return fail(op) << "compares rows of " << shapeText(x) << " with rows of "
                      << shapeText(y)
                      << ": they need the same feature size under the "
                         "report's sizes";
    return success();
  };
  auto vectorsPerRowOf = [similarity](SmallVector<unsigned> sides) {
    return [similarity, sides](Operation *op, Evaluator &e) -> LogicalResult {
      if (failed(similarity(op, e)))
        return failure();
      for (auto [result, side] : llvm::zip_equal(op->getResults(), sides))
        e.setTensor(result, {e.shape(op->getOperand(side))[0]});
      return success();
    };
  };
  // (row_ce, col_ce, row_lse, col_lse)
  shape<RingSoftmaxCEOp>(vectorsPerRowOf({0, 1, 0, 1}));
  // (pair_sum, positive) and (lse_rest, target_dot)
  shape<RingSigmoidPairsOp, ShardedSoftmaxOp>(vectorsPerRowOf({0, 0}));
  shape<RingSoftmaxCEGradOp, RingSigmoidPairsGradOp, ShardedSoftmaxGradOp>(
      [similarity](Operation *op, Evaluator &e) -> LogicalResult {
        if (failed(similarity(op, e)))
          return failure();
        for (auto [result, operand] :
             llvm::zip(op->getResults(), op->getOperands()))
          e.setTensor(result, e.shape(operand));
        return success();
      });

  // arith: constants and the index arithmetic the runtime evaluates.
  shape<arith::ConstantOp>(
      [](arith::ConstantOp op, Evaluator &e) -> LogicalResult {
        if (auto tensor = dyn_cast<RankedTensorType>(op.getType())) {
          if (!tensor.hasStaticShape())
            return fail(op) << "has the dynamic type " << tensor;
          e.setTensor(op.getResult(), tensor.getShape());
          return success();
        }
        if (auto integer = dyn_cast<IntegerAttr>(op.getValue())) {
          e.setIndex(op.getResult(), integer.getValue().getSExtValue());
          return success();
        }
        return fail(op) << "is a constant the report cannot size: "
                        << op.getValue();
      });
  auto indexOperands = [](Operation *op, const Evaluator &e) -> LogicalResult {
    for (Value operand : op->getOperands())
      if (e.get(operand).isTensor)
        return fail(op) << "computes on tensors; the report (and the "
                           "runtime) evaluate arith only on scalars";
    return success();
  };
  auto binary = [indexOperands](auto fn) {
    return [indexOperands, fn](auto op, Evaluator &e) -> LogicalResult {
      if (failed(indexOperands(op, e)))
        return failure();
      int64_t a = e.index(op.getLhs()), b = e.index(op.getRhs());
      if (std::is_same_v<decltype(op), arith::DivSIOp> && b == 0)
        return fail(op) << "divides " << a
                        << " by zero under the "
                           "report's sizes";
      e.setIndex(op.getResult(), fn(a, b));
      return success();
    };
  };
  shape<arith::AddIOp>(binary([](int64_t a, int64_t b) { return a + b; }));
  shape<arith::SubIOp>(binary([](int64_t a, int64_t b) { return a - b; }));
  shape<arith::MulIOp>(binary([](int64_t a, int64_t b) { return a * b; }));
  shape<arith::DivSIOp>(
      binary([](int64_t a, int64_t b) { return b ? a / b : 0; }));
  shape<arith::MaxSIOp>(
      binary([](int64_t a, int64_t b) { return std::max(a, b); }));
  shape<arith::MinSIOp>(
      binary([](int64_t a, int64_t b) { return std::min(a, b); }));
  shape<arith::CmpIOp>(
      [indexOperands](arith::CmpIOp op, Evaluator &e) -> LogicalResult {
        if (failed(indexOperands(op, e)))
          return failure();
        APInt a(64, e.index(op.getLhs()), /*isSigned=*/true);
        APInt b(64, e.index(op.getRhs()), /*isSigned=*/true);
        e.setIndex(op.getResult(),
                   arith::applyCmpPredicate(op.getPredicate(), a, b));
        return success();
      });
  shape<arith::SelectOp>([](arith::SelectOp op, Evaluator &e) -> LogicalResult {
    if (e.get(op.getCondition()).isTensor)
      return fail(op) << "selects element-wise; the report evaluates "
                         "only a scalar condition";
    Value chosen =
        e.index(op.getCondition()) ? op.getTrueValue() : op.getFalseValue();
    e.set(op.getResult(), e.get(chosen));
    return success();
  });
  shape<arith::IndexCastOp>(
      [indexOperands](arith::IndexCastOp op, Evaluator &e) -> LogicalResult {
        if (failed(indexOperands(op, e)))
          return failure();
        e.setIndex(op.getResult(), e.index(op.getIn()));
        return success();
      });

  //===--------------------------------------------------------------------===//
  // Bytes one rank sends per call.
  //===--------------------------------------------------------------------===//
  sent<AllGatherOp>([](AllGatherOp op, const Evaluator &e) {
    int64_t local = e.bytes(op.getInput()), n = e.worldSize();
    return Cost{
        double((n - 1) * local),
        llvm::formatv("ring: {0} x {1}", n - 1, bytesText(local)).str()};
  });
  sent<AllReduceOp>([](AllReduceOp op, const Evaluator &e) {
    int64_t bytes = e.bytes(op.getInput());
    return Cost{allReduceBytes(bytes, e.worldSize()),
                "ring: 2(N-1)/N x " + bytesText(bytes)};
  });
  sent<ReduceScatterOp>([](ReduceScatterOp op, const Evaluator &e) {
    // The ring passes N-1 partial sums of one rank's block along: (N-1)/N of
    // the input.
    int64_t block = e.bytes(op.getResult()), n = e.worldSize();
    return Cost{
        double((n - 1) * block),
        llvm::formatv("ring: {0} x {1}", n - 1, bytesText(block)).str()};
  });
  sent<BroadcastOp>([](BroadcastOp op, const Evaluator &e) {
    int64_t bytes = e.bytes(op.getInput());
    return Cost{e.worldSize() > 1 ? double(bytes) : 0.0,
                "root sends " + bytesText(bytes) +
                    "; other ranks send nothing"};
  });
  sent<RingShiftOp>([](RingShiftOp op, const Evaluator &e) {
    int64_t bytes = e.bytes(op.getInput());
    bool moves = op.getShiftAttr().getInt() % e.worldSize() != 0;
    return Cost{moves ? double(bytes) : 0.0,
                moves ? "1 x " + bytesText(bytes) : "shift is a multiple of N"};
  });
  sent<RingSoftmaxCEOp>([](RingSoftmaxCEOp op, const Evaluator &e) {
    return ringSent(e.worldSize(),
                    e.bytes(op.getCols()) + e.bytes(op.getColTargets()),
                    "cols + col targets", 3 * e.bytes(op.getColCe()),
                    "3 column statistics");
  });
  sent<RingSoftmaxCEGradOp>([](RingSoftmaxCEGradOp op, const Evaluator &e) {
    return ringSent(e.worldSize(),
                    e.bytes(op.getCols()) + e.bytes(op.getColTargets()) +
                        e.bytes(op.getColLse()) + e.bytes(op.getCtCol()),
                    "cols + col targets + col_lse + ct_col",
                    e.bytes(op.getDCols()), "d_cols");
  });
  sent<RingSigmoidPairsOp>([](RingSigmoidPairsOp op, const Evaluator &e) {
    return ringSent(e.worldSize(), e.bytes(op.getCols()), "cols", 0, "");
  });
  sent<RingSigmoidPairsGradOp>(
      [](RingSigmoidPairsGradOp op, const Evaluator &e) {
        return ringSent(e.worldSize(), e.bytes(op.getCols()), "cols",
                        e.bytes(op.getDCols()), "d_cols");
      });
  sent<ShardedSoftmaxOp>([](ShardedSoftmaxOp op, const Evaluator &e) {
    // all_reduce max of the row maxima, then all_reduce sum of the row sums
    // and target dots.
    int64_t row = e.bytes(op.getLseRest());
    return Cost{allReduceBytes(row, e.worldSize()) +
                    allReduceBytes(2 * row, e.worldSize()),
                llvm::formatv("all_reduce max of {0} + all_reduce sum of {1}, "
                              "each 2(N-1)/N x",
                              bytesText(row), bytesText(2 * row))
                    .str()};
  });

  //===--------------------------------------------------------------------===//
  // Kernel temporaries beyond the results.
  //===--------------------------------------------------------------------===//
  workspace<CrossEntropyOp, LogSumExpOp>([](auto op, const Evaluator &e) {
    int64_t bytes = e.bytes(op->getOperand(0));
    return Cost{double(bytes),
                bytesText(bytes) + " log_softmax temporary (ATen)"};
  });
  workspace<ReduceScatterOp>([](ReduceScatterOp op, const Evaluator &e) {
    // The ring holds the block going out and the one coming in; the last
    // one comes into the result, and the first goes out of the input itself
    // when the blocks are contiguous (nothing but size-1 dims before the
    // axis).
    ArrayRef<int64_t> shape = e.shape(op.getInput());
    int64_t axis = op.getAxisAttr().getInt(); // checked by the shape rule
    if (axis < 0)
      axis += shape.size();
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d)
      outer *= shape[d];
    int64_t n = e.worldSize(), block = e.bytes(op.getResult());
    int64_t buffers =
        n < 2 ? 0 : std::min<int64_t>(2, outer == 1 ? n - 2 : n - 1);
    if (!buffers)
      return Cost{};
    return Cost{
        double(buffers * block),
        llvm::formatv("{0} x {1} ring blocks", buffers, bytesText(block))
            .str()};
  });
  auto tile = [](const ReportOptions &o, const Evaluator &e, Value rows) {
    return o.tileRows * o.tileCols * e.elementSize(rows);
  };
  // The ring kernels double-buffer the incoming chunk of cols with its
  // per-column vectors; the backward's d_cols accumulator travels too.
  auto ring = [](int64_t chunk, int64_t vectors, int64_t acc,
                 int64_t tileBytes) {
    std::string how = "2 x " + bytesText(chunk) + " cols chunk";
    if (vectors)
      how += " + " + bytesText(vectors) + " column vectors";
    if (acc)
      how += " + 2 x " + bytesText(acc) + " d_cols";
    how += " + " + bytesText(tileBytes) + " tile";
    return Cost{double(2 * chunk + vectors + 2 * acc + tileBytes), how};
  };
  workspace<RingSoftmaxCEOp>([=](RingSoftmaxCEOp op, const Evaluator &e) {
    return ring(e.bytes(op.getCols()),
                e.bytes(op.getColTargets()) + 3 * e.bytes(op.getColCe()), 0,
                tile(e.reportOptions(), e, op.getRows()));
  });
  workspace<RingSoftmaxCEGradOp>(
      [=](RingSoftmaxCEGradOp op, const Evaluator &e) {
        return ring(e.bytes(op.getCols()),
                    e.bytes(op.getColTargets()) + e.bytes(op.getColLse()) +
                        e.bytes(op.getCtCol()),
                    e.bytes(op.getDCols()),
                    tile(e.reportOptions(), e, op.getRows()));
      });
  workspace<RingSigmoidPairsOp>([=](RingSigmoidPairsOp op, const Evaluator &e) {
    return ring(e.bytes(op.getCols()), 0, 0,
                tile(e.reportOptions(), e, op.getRows()));
  });
  workspace<RingSigmoidPairsGradOp>(
      [=](RingSigmoidPairsGradOp op, const Evaluator &e) {
        return ring(e.bytes(op.getCols()), 0, e.bytes(op.getDCols()),
                    tile(e.reportOptions(), e, op.getRows()));
      });
  workspace<ShardedSoftmaxOp>([=](ShardedSoftmaxOp op, const Evaluator &e) {
    int64_t t = tile(e.reportOptions(), e, op.getRows());
    int64_t stats = 3 * e.bytes(op.getLseRest());
    return Cost{double(t + stats), bytesText(t) + " tile + " +
                                       bytesText(stats) +
                                       " row max/sum buffers"};
  });
  workspace<ShardedSoftmaxGradOp>(
      [=](ShardedSoftmaxGradOp op, const Evaluator &e) {
        int64_t t = tile(e.reportOptions(), e, op.getRows());
        return Cost{double(t), bytesText(t) + " tile"};
      });
}

const RuleTable &ruleTable() {
  static const RuleTable table;
  return table;
}

//===----------------------------------------------------------------------===//
// One function's report
//===----------------------------------------------------------------------===//

struct LiveValue {
  std::string what, type;
  int64_t bytes;
};

struct Transfer {
  std::string op, location, how;
  double bytes;
};

struct FunctionReport {
  std::string name;
  int64_t peakBytes = 0, liveBytes = 0, workspaceBytes = 0;
  std::string peakOp = "(entry)", peakLocation, workspaceHow;
  std::vector<LiveValue> largest; ///< live at the peak, largest first
  std::vector<Transfer> transfers;
  double sentBytes = 0;
};

/// The concrete shape of argument `i`: `--report-size` by name, else static
/// dims as written, dynamic dim 0 = batch, other dynamic dims = dim.
FailureOr<SmallVector<int64_t>> argumentShape(func::FuncOp func, unsigned i,
                                              const ReportOptions &options) {
  auto type = dyn_cast<RankedTensorType>(func.getArgument(i).getType());
  if (!type)
    return emitError(func.getLoc())
           << "the report sizes tensor arguments only; argument " << i
           << " of @" << func.getName() << " is "
           << func.getArgument(i).getType();
  auto name = func.getArgAttrOfType<StringAttr>(i, DlossDialect::kNameAttrName);
  if (name) {
    auto it = options.argumentShapes.find(name.getValue());
    if (it != options.argumentShapes.end()) {
      ArrayRef<int64_t> given = it->second;
      bool fits = given.size() == static_cast<size_t>(type.getRank());
      for (size_t d = 0; fits && d < given.size(); ++d)
        fits = type.isDynamicDim(d) || type.getDimSize(d) == given[d];
      if (!fits)
        return emitError(func.getLoc())
               << "--report-size gives '" << name.getValue() << "' the shape "
               << shapeText(given) << ", which does not fit its type " << type;
      return SmallVector<int64_t>(given);
    }
  }
  SmallVector<int64_t> shape;
  for (auto [d, size] : llvm::enumerate(type.getShape()))
    shape.push_back(!ShapedType::isDynamic(size) ? size
                    : d == 0                     ? options.batch
                                                 : options.dim);
  return shape;
}

std::string valueLabel(Value value) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = cast<func::FuncOp>(arg.getOwner()->getParentOp());
    auto name = func.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                  DlossDialect::kNameAttrName);
    return "argument " + (name ? name.getValue().str()
                               : "#" + std::to_string(arg.getArgNumber()));
  }
  Operation *op = value.getDefiningOp();
  std::string label = op->getName().getStringRef().str();
  if (op->getNumResults() > 1)
    label += " #" + std::to_string(cast<OpResult>(value).getResultNumber());
  return label + " " + locationText(op->getLoc());
}

FailureOr<FunctionReport> evaluate(func::FuncOp func,
                                   const ReportOptions &options) {
  FunctionReport report;
  report.name = func.getName().str();
  if (!func.getBody().hasOneBlock())
    return emitError(func.getLoc())
           << "the report evaluates straight-line functions; @"
           << func.getName() << " has " << func.getBody().getBlocks().size()
           << " blocks";
  Block &body = func.getBody().front();
  Evaluator e(options);
  for (BlockArgument arg : body.getArguments()) {
    FailureOr<SmallVector<int64_t>> shape =
        argumentShape(func, arg.getArgNumber(), options);
    if (failed(shape))
      return failure();
    e.setTensor(arg, *shape);
  }

  // Liveness: a value lives from its definition to its last use; arguments
  // throughout, returned values to the end.
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  const int64_t end = static_cast<int64_t>(ops.size());
  llvm::DenseMap<Value, int64_t> defined, lastUse;
  for (BlockArgument arg : body.getArguments()) {
    defined[arg] = -1;
    lastUse[arg] = end;
  }
  for (auto [i, op] : llvm::enumerate(ops)) {
    for (Value operand : op->getOperands())
      lastUse[operand] = std::max<int64_t>(lastUse.lookup(operand), i);
    for (Value result : op->getResults()) {
      defined[result] = i;
      lastUse[result] = i; // dead results live at their definition only
    }
  }
  for (Value value : body.getTerminator()->getOperands())
    lastUse[value] = end;
  std::vector<SmallVector<Value>> freeAfter(ops.size());
  for (auto [value, last] : lastUse)
    if (last < end)
      freeAfter[last].push_back(value);

  int64_t live = 0;
  for (BlockArgument arg : body.getArguments())
    live += e.bytes(arg);
  report.peakBytes = report.liveBytes = live;
  int64_t peakAt = -1;

  const RuleTable &rules = ruleTable();
  for (auto [i, op] : llvm::enumerate(ops)) {
    const OpRules *rule = rules.lookup(op);
    if (op->getNumRegions() != 0 || !rule || !rule->shape)
      return emitError(op->getLoc())
             << "the report has no shape rule for '" << op->getName() << "'";
    if (op->hasTrait<IsCollective>() && !rule->sent)
      return emitError(op->getLoc())
             << "the report has no communication rule for the "
                "collective '"
             << op->getName() << "'";
    if (failed(rule->shape(op, e)))
      return failure();
    // The IR's static sizes must agree with the report's.
    for (Value result : op->getResults()) {
      if (!e.has(result))
        return fail(op) << "has a result that its report rule left unsized "
                           "(a bug in passes/Report.cpp)";
      auto type = dyn_cast<RankedTensorType>(result.getType());
      if (!type)
        continue;
      ArrayRef<int64_t> shape = e.shape(result);
      bool fits = shape.size() == static_cast<size_t>(type.getRank());
      for (size_t d = 0; fits && d < shape.size(); ++d)
        fits = type.isDynamicDim(d) || type.getDimSize(d) == shape[d];
      if (!fits)
        return fail(op) << "has the shape " << shapeText(shape)
                        << " under the report's sizes, which does not "
                           "fit its type "
                        << type << "; check --report-size";
      live += e.bytes(result);
    }
    Cost workspace;
    if (rule->workspace)
      workspace = rule->workspace(op, e);
    int64_t total = live + static_cast<int64_t>(workspace.bytes);
    if (total > report.peakBytes) {
      report.peakBytes = total;
      report.liveBytes = live;
      report.workspaceBytes = static_cast<int64_t>(workspace.bytes);
      report.workspaceHow = workspace.how;
      report.peakOp = op->getName().getStringRef().str();
      report.peakLocation = locationText(op->getLoc());
      peakAt = static_cast<int64_t>(i);
    }
    if (rule->sent) {
      Cost sent = rule->sent(op, e);
      report.transfers.push_back({op->getName().getStringRef().str(),
                                  locationText(op->getLoc()), sent.how,
                                  sent.bytes});
      report.sentBytes += sent.bytes;
    }
    for (Value value : freeAfter[i])
      live -= e.bytes(value);
  }

  // The values live at the peak, largest first.
  for (auto [value, def] : defined) {
    if (def > peakAt || lastUse.lookup(value) < peakAt || e.bytes(value) == 0)
      continue;
    report.largest.push_back(
        {valueLabel(value), e.get(value).typeText(), e.bytes(value)});
  }
  llvm::stable_sort(report.largest, [](const LiveValue &a, const LiveValue &b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.what < b.what;
  });
  return report;
}

//===----------------------------------------------------------------------===//
// Output
//===----------------------------------------------------------------------===//

constexpr size_t kLargestShown = 5;

void printVariant(llvm::raw_ostream &os, const FunctionReport &r,
                  StringRef variant) {
  os << "== @" << r.name << ", " << variant << " ==\n";
  os << "peak memory: " << mib(r.peakBytes) << " MiB (" << r.peakBytes
     << " B) at " << r.peakOp;
  if (!r.peakLocation.empty())
    os << " " << r.peakLocation;
  os << "\n  live values " << mib(r.liveBytes) << " MiB + kernel workspace "
     << mib(r.workspaceBytes) << " MiB";
  if (!r.workspaceHow.empty())
    os << " (" << r.workspaceHow << ")";
  os << "\n  largest live values at the peak:\n";
  for (const LiveValue &v : llvm::ArrayRef(r.largest).take_front(kLargestShown))
    os << llvm::formatv("    {0,10} MiB  {1,-18} {2}\n", mib(v.bytes), v.type,
                        v.what);
  if (r.largest.size() > kLargestShown)
    os << "    ... " << r.largest.size() - kLargestShown << " more\n";
  os << "communicated per call (bytes each rank sends):\n";
  for (const Transfer &t : r.transfers)
    os << llvm::formatv("  {0,-28} {1,-18} {2,12} B {3,10} MiB  {4}\n", t.op,
                        t.location, std::llround(t.bytes), mib(t.bytes), t.how);
  os << llvm::formatv("  {0,-28} {1,-18} {2,12} B {3,10} MiB\n", "total", "",
                      std::llround(r.sentBytes), mib(r.sentBytes));
  os << "\n";
}

std::string ratioText(double unfused, double fused) {
  if (fused <= 0)
    return "n/a";
  return llvm::formatv("{0:F2}x", unfused / fused).str();
}

void printSummary(llvm::raw_ostream &os, const FunctionReport &fused,
                  const FunctionReport &unfused) {
  os << "@" << fused.name << ": peak memory: fused " << mib(fused.peakBytes)
     << " MiB vs unfused " << mib(unfused.peakBytes) << " MiB (unfused/fused "
     << ratioText(unfused.peakBytes, fused.peakBytes)
     << "); communicated: fused " << mib(fused.sentBytes) << " MiB vs unfused "
     << mib(unfused.sentBytes) << " MiB\n";
}

void writeJsonVariant(llvm::json::OStream &j, const FunctionReport &r) {
  j.object([&] {
    j.attribute("peak_bytes", r.peakBytes);
    j.attribute("peak_op", r.peakOp);
    j.attribute("peak_location", r.peakLocation);
    j.attribute("live_bytes", r.liveBytes);
    j.attribute("workspace_bytes", r.workspaceBytes);
    j.attribute("workspace", r.workspaceHow);
    j.attributeArray("live_at_peak", [&] {
      for (const LiveValue &v : r.largest)
        j.object([&] {
          j.attribute("value", v.what);
          j.attribute("type", v.type);
          j.attribute("bytes", v.bytes);
        });
    });
    j.attributeArray("communication", [&] {
      for (const Transfer &t : r.transfers)
        j.object([&] {
          j.attribute("op", t.op);
          j.attribute("location", t.location);
          j.attribute("bytes", static_cast<int64_t>(std::llround(t.bytes)));
          j.attribute("how", t.how);
        });
    });
    j.attribute("sent_bytes", static_cast<int64_t>(std::llround(r.sentBytes)));
  });
}

/// Succeeds when some function of `module` has an argument called `name`;
/// else an error at the first loss listing the losses' argument names.
LogicalResult checkArgumentName(ModuleOp module, StringRef name) {
  func::FuncOp first;
  SmallVector<std::string> known;
  for (func::FuncOp func : module.getOps<func::FuncOp>()) {
    if (!first || (!first->hasAttr(DlossDialect::kLossAttrName) &&
                   func->hasAttr(DlossDialect::kLossAttrName)))
      first = func;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
      auto arg =
          func.getArgAttrOfType<StringAttr>(i, DlossDialect::kNameAttrName);
      if (!arg)
        continue;
      if (arg.getValue() == name)
        return success();
      if (!llvm::is_contained(known, arg.getValue()))
        known.push_back(arg.getValue().str());
    }
  }
  Location loc = first ? first.getLoc() : module.getLoc();
  return emitError(loc) << "--report-size names '" << name
                        << "', which is no argument here (arguments: "
                        << llvm::join(known, ", ") << ")";
}

FailureOr<std::vector<FunctionReport>>
evaluateCompiled(ModuleOp module, bool fuse, const ReportOptions &options) {
  OwningOpRef<ModuleOp> clone = module.clone();
  PassManager pm(module.getContext());
  buildDeriveBackwardPipeline(pm, fuse);
  if (failed(pm.run(*clone)))
    return failure();
  std::vector<FunctionReport> reports;
  for (func::FuncOp func : clone->getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    FailureOr<FunctionReport> report = evaluate(func, options);
    if (failed(report))
      return failure();
    reports.push_back(std::move(*report));
  }
  return reports;
}

} // namespace

bool mlir::dloss::parseArgumentShape(StringRef spec, ReportOptions &options,
                                     std::string &error) {
  auto [name, dims] = spec.split('=');
  if (name.empty() || !spec.contains('=')) {
    error = "expected NAME=AxB..., got '" + spec.str() + "'";
    return false;
  }
  SmallVector<int64_t> shape;
  if (!dims.empty()) {
    SmallVector<StringRef> parts;
    dims.split(parts, 'x');
    for (StringRef part : parts) {
      int64_t size;
      if (part.getAsInteger(10, size) || size < 0) {
        error =
            "'" + part.str() + "' in '" + spec.str() +
            "' is not a size (expected NAME=AxB..., e.g. weights=25000x256)";
        return false;
      }
      shape.push_back(size);
    }
  }
  options.argumentShapes[name] = shape;
  return true;
}

LogicalResult mlir::dloss::writeReport(ModuleOp module, StringRef source,
                                       const ReportOptions &options,
                                       llvm::raw_ostream &os) {
  if (options.worldSize < 1 || options.batch < 0 || options.dim < 0)
    return emitError(module.getLoc())
           << "the report needs at least one rank and non-negative sizes";
  // Every --report-size must name an argument, or a typo would go unnoticed.
  for (const auto &entry : options.argumentShapes)
    if (failed(checkArgumentName(module, entry.getKey())))
      return failure();

  FailureOr<std::vector<FunctionReport>> fused =
      evaluateCompiled(module, true, options);
  if (failed(fused))
    return failure();
  FailureOr<std::vector<FunctionReport>> unfused =
      evaluateCompiled(module, false, options);
  if (failed(unfused))
    return failure();
  auto unfusedOf = [&](const FunctionReport &f) -> const FunctionReport * {
    for (const FunctionReport &u : *unfused)
      if (u.name == f.name)
        return &u;
    return nullptr;
  };

  if (options.json) {
    llvm::json::OStream j(os, 2);
    j.object([&] {
      j.attribute("source", source);
      j.attribute("world_size", options.worldSize);
      j.attribute("batch", options.batch);
      j.attribute("dim", options.dim);
      j.attribute("representative_rank", int64_t(0));
      j.attributeArray("tile", [&] {
        j.value(options.tileRows);
        j.value(options.tileCols);
      });
      j.attributeArray("functions", [&] {
        for (const FunctionReport &f : *fused) {
          j.object([&] {
            j.attribute("name", f.name);
            j.attributeBegin("fused");
            writeJsonVariant(j, f);
            j.attributeEnd();
            if (const FunctionReport *u = unfusedOf(f)) {
              j.attributeBegin("unfused");
              writeJsonVariant(j, *u);
              j.attributeEnd();
            }
          });
        }
      });
    });
    os << "\n";
    return success();
  }

  os << "dloss report for " << source << "\n"
     << "  " << options.worldSize
     << " ranks, every rank holding the same sizes; rank facts (rank, "
        "shard_offset) as on rank 0\n"
     << "  arguments: dynamic dim 0 = " << options.batch
     << " rows per rank, other dynamic dims = " << options.dim;
  for (const auto &entry : options.argumentShapes)
    os << ", " << entry.getKey() << " = " << shapeText(entry.getValue());
  os << "\n  memory: each tensor its own buffer, live from its definition to "
        "its last use (arguments throughout, results to the end), plus kernel "
        "temporaries; fused kernels' nominal tile "
     << options.tileRows << " x " << options.tileCols
     << " elements (the runtime sizes its tile from the L2 cache)\n"
     << "  communication: bytes one rank sends per call (ring all_gather, "
        "ring all_reduce)\n\n";
  for (const FunctionReport &f : *fused) {
    printVariant(os, f, "fused");
    if (const FunctionReport *u = unfusedOf(f))
      printVariant(os, *u, "unfused");
  }
  for (const FunctionReport &f : *fused)
    if (const FunctionReport *u = unfusedOf(f))
      printSummary(os, f, *u);
  return success();
}
