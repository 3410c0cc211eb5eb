// dloss-fuse-gather-similarity: all_gather + similarity matmul + loss -> one ring-tiled op.
//
// The three patterns (CLIP, SigLIP, class-sharded softmax) are matched on the
// forward program, before autodiff: each fused op's adjoint rule
// (dialect/DlossAdjoints.cpp) emits its fused backward op, so the backward is
// fused too without matching the derived IR. docs/Fusion.md describes the
// schedules and the memory they need.
#include "passes/Passes.h"
#include "passes/ReplicationAnalysis.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dominance.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_FUSEGATHERSIMILARITYPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

namespace {

bool isScalarTensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && type.getRank() == 0;
}

/// `x * s` (either operand order, `s` 0-d) or `x` alone (no scale).
struct Scaled {
  Value x;
  Value scale;           ///< null when unscaled
  Operation *mul = nullptr;
};

/// `value` as a scaling whose product feeds nothing else, or nullopt (fusing
/// a product that other ops read would not remove the matrix).
std::optional<Scaled> matchScaled(Value value) {
  auto mul = value.getDefiningOp<MulOp>();
  if (!mul)
    return Scaled{value, Value(), nullptr};
  if (!mul.getResult().hasOneUse())
    return std::nullopt;
  if (isScalarTensor(mul.getRhs()) && !isScalarTensor(mul.getLhs()))
    return Scaled{mul.getLhs(), mul.getRhs(), mul};
  if (isScalarTensor(mul.getLhs()) && !isScalarTensor(mul.getRhs()))
    return Scaled{mul.getRhs(), mul.getLhs(), mul};
  return Scaled{value, Value(), nullptr};
}

/// `matmul(rows, all_gather(cols, axis 0, grad exact)) transpose_rhs`.
struct Similarity {
  MatmulOp matmul;
  AllGatherOp gather;
  Value rows, cols;
};

/// The similarity must feed nothing but the pattern.
std::optional<Similarity> matchSimilarity(Value value) {
  auto matmul = value.getDefiningOp<MatmulOp>();
  if (!matmul || matmul.getTransposeLhs() || !matmul.getTransposeRhs() ||
      !matmul.getResult().hasOneUse())
    return std::nullopt;
  auto gather = matmul.getRhs().getDefiningOp<AllGatherOp>();
  if (!gather || gather.getAxis() != 0 || gather.getGrad() != GatherGrad::exact)
    return std::nullopt;
  return Similarity{matmul, gather, matmul.getLhs(), gather.getInput()};
}

/// The value `scale`, or a 0-d constant `fill` of the element type of `like`.
Value scaleOr(OpBuilder &b, Location loc, Value scale, Value like, double fill) {
  if (scale)
    return scale;
  Type element = cast<ShapedType>(like.getType()).getElementType();
  auto type = RankedTensorType::get({}, element);
  return arith::ConstantOp::create(
      b, loc, DenseElementsAttr::get(type, b.getFloatAttr(element, fill)));
}

/// Erases `ops` in order, each once it has no users left (collectives too:
/// every rank compiles the same plan, so all drop the same gathers).
void eraseDead(ArrayRef<Operation *> ops) {
  for (Operation *op : ops)
    if (op && op->use_empty())
      op->erase();
}

class Fuser {
public:
  Fuser(func::FuncOp func) : func(func), dominance(func), replication(func) {}

  void run() {
    SmallVector<CrossEntropyOp> entropies;
    SmallVector<SoftplusOp> softpluses;
    func.walk([&](Operation *op) {
      if (auto ce = dyn_cast<CrossEntropyOp>(op))
        entropies.push_back(ce);
      else if (auto sp = dyn_cast<SoftplusOp>(op))
        softpluses.push_back(sp);
    });
    llvm::SmallPtrSet<Operation *, 8> done;
    for (CrossEntropyOp ce : entropies) {
      if (done.contains(ce))
        continue;
      if (CrossEntropyOp mirror = fuseClip(ce)) {
        done.insert(mirror);
        continue;
      }
      fuseShardedSoftmax(ce);
    }
    for (SoftplusOp sp : softpluses)
      fuseSiglip(sp);
  }

private:
  /// Makes a fused op's operands usable before `at`: each one that is
  /// defined later must be a constant, which is copied there; a missing
  /// scale (operand `scaleIndex`) becomes a constant 1. Fails without
  /// touching the IR when an operand is defined later and is not a constant.
  LogicalResult prepareOperands(OpBuilder &b, Location loc, Operation *at,
                                MutableArrayRef<Value> operands,
                                unsigned scaleIndex) {
    auto later = [&](Value v) {
      return v && !dominance.properlyDominates(v, at);
    };
    for (Value v : operands)
      if (later(v) && !v.getDefiningOp<arith::ConstantOp>())
        return failure();
    for (Value &v : operands)
      if (later(v))
        v = b.clone(*v.getDefiningOp())->getResult(0);
    operands[scaleIndex] =
        scaleOr(b, loc, operands[scaleIndex], operands[0], 1.0);
    return success();
  }

  /// A cross-entropy over axis 1 of `s * matmul(rows, all_gather(cols))^T`
  /// whose similarity and scaling feed nothing else.
  struct ClipSide {
    CrossEntropyOp ce;
    Scaled scaled;
    Similarity sim;
  };

  std::optional<ClipSide> matchClipSide(CrossEntropyOp ce) {
    if (ce.getAxis() != 1)
      return std::nullopt;
    std::optional<Scaled> scaled = matchScaled(ce.getLogits());
    if (!scaled)
      return std::nullopt;
    std::optional<Similarity> sim = matchSimilarity(scaled->x);
    if (!sim)
      return std::nullopt;
    return ClipSide{ce, *scaled, *sim};
  }

  /// CLIP: `ce` and its mirror (rows and cols swapped, same scale) become one
  /// dloss.ring_softmax_ce. Returns the mirror when fused.
  CrossEntropyOp fuseClip(CrossEntropyOp ce) {
    std::optional<ClipSide> row = matchClipSide(ce);
    if (!row)
      return {};
    std::optional<ClipSide> col;
    func.walk([&](CrossEntropyOp other) {
      if (other == ce || col)
        return;
      std::optional<ClipSide> side = matchClipSide(other);
      if (side && side->sim.rows == row->sim.cols &&
          side->sim.cols == row->sim.rows &&
          side->scaled.scale == row->scaled.scale &&
          side->ce->getBlock() == ce->getBlock())
        col = side;
    });
    if (!col)
      return {};
    Operation *at = ce->isBeforeInBlock(col->ce) ? ce : col->ce;
    OpBuilder b(at);
    Location loc = b.getFusedLoc({ce.getLoc(), col->ce.getLoc()});
    Value operands[] = {row->sim.rows, row->sim.cols, row->scaled.scale,
                        ce.getTargets(), col->ce.getTargets()};
    if (failed(prepareOperands(b, loc, at, operands, 2)))
      return {};
    Type rowType = ce.getResult().getType(), colType = col->ce.getResult().getType();
    auto fused = RingSoftmaxCEOp::create(
        b, loc, TypeRange{rowType, colType, rowType, colType}, operands[0],
        operands[1], operands[2], operands[3], operands[4]);
    ce.getResult().replaceAllUsesWith(fused.getRowCe());
    col->ce.getResult().replaceAllUsesWith(fused.getColCe());
    CrossEntropyOp mirror = col->ce;
    eraseDead({ce, mirror, row->scaled.mul, col->scaled.mul, row->sim.matmul,
               col->sim.matmul, row->sim.gather, col->sim.gather});
    return mirror;
  }

  /// SigLIP: `L = s * matmul(rows, all_gather(cols))^T + b`, used by
  /// `softplus` (summed over rows and columns, or over columns) and by one
  /// `take_along(L, t, axis 1)`.
  void fuseSiglip(SoftplusOp sp) {
    auto add = sp.getInput().getDefiningOp<AddOp>();
    if (!add)
      return;
    Value logits = add.getResult();
    Value bias, body;
    if (isScalarTensor(add.getRhs()) && !isScalarTensor(add.getLhs()))
      bias = add.getRhs(), body = add.getLhs();
    else if (isScalarTensor(add.getLhs()) && !isScalarTensor(add.getRhs()))
      bias = add.getLhs(), body = add.getRhs();
    else
      return;
    std::optional<Scaled> scaled = matchScaled(body);
    if (!scaled)
      return;
    std::optional<Similarity> sim = matchSimilarity(scaled->x);
    if (!sim)
      return;
    // The pair sum: softplus feeds one reduce sum over [1] or [0, 1].
    if (!sp.getResult().hasOneUse())
      return;
    auto sum = dyn_cast<ReduceOp>(*sp.getResult().getUsers().begin());
    if (!sum || sum.getKind() != ReduceKind::sum)
      return;
    ArrayRef<int64_t> axes = sum.getAxes();
    bool rowsToo = axes.size() == 2 && axes[0] == 0 && axes[1] == 1;
    if (!rowsToo && !(axes.size() == 1 && axes[0] == 1))
      return;
    // The positives: exactly one take_along, and nothing else reads L.
    TakeAlongOp positives;
    for (Operation *user : logits.getUsers()) {
      if (user == sp)
        continue;
      auto take = dyn_cast<TakeAlongOp>(user);
      if (!take || take.getAxis() != 1 || positives)
        return;
      positives = take;
    }
    if (!positives || positives->getBlock() != sp->getBlock() ||
        sum->getBlock() != sp->getBlock())
      return;
    Operation *at = positives->isBeforeInBlock(sp) ? positives.getOperation()
                                                   : sp.getOperation();
    OpBuilder b(at);
    Location loc = b.getFusedLoc({sp.getLoc(), positives.getLoc()});
    Value operands[] = {sim->rows, sim->cols, scaled->scale, bias,
                        positives.getIndices()};
    if (failed(prepareOperands(b, loc, at, operands, 2)))
      return;
    Type perRow = positives.getResult().getType();
    auto fused = RingSigmoidPairsOp::create(b, loc, TypeRange{perRow, perRow},
                                            operands[0], operands[1],
                                            operands[2], operands[3],
                                            operands[4]);
    positives.getResult().replaceAllUsesWith(fused.getPositive());
    Value pairs = fused.getPairSum();
    if (rowsToo) {
      b.setInsertionPoint(sum);
      pairs = ReduceOp::create(b, sum.getLoc(), ReduceKind::sum, pairs,
                               ArrayRef<int64_t>{0});
    }
    sum.getResult().replaceAllUsesWith(pairs);
    eraseDead({sum, sp, positives, add, scaled->mul, sim->matmul, sim->gather});
  }

  /// PartialFC: `cross_entropy(s * C', t)` over `C = all_gather(matmul(R,
  /// W)^T, axis 1)`, `C'` = `C` or `put_along(C, t, f(take_along(C, t)))`.
  void fuseShardedSoftmax(CrossEntropyOp ce) {
    if (ce.getAxis() != 1)
      return;
    Value targets = ce.getTargets();
    std::optional<Scaled> scaled = matchScaled(ce.getLogits());
    if (!scaled)
      return;
    PutAlongOp put = scaled->x.getDefiningOp<PutAlongOp>();
    Value classes = put ? put.getInput() : scaled->x;
    if (put && (put.getAxis() != 1 || put.getIndices() != targets ||
                !put.getResult().hasOneUse()))
      return;
    auto gather = classes.getDefiningOp<AllGatherOp>();
    if (!gather || gather.getAxis() != 1 || gather.getGrad() != GatherGrad::exact)
      return;
    auto matmul = gather.getInput().getDefiningOp<MatmulOp>();
    if (!matmul || matmul.getTransposeLhs() || !matmul.getTransposeRhs() ||
        !matmul.getResult().hasOneUse())
      return;
    Value rows = matmul.getLhs(), weights = matmul.getRhs();
    // Every shard must see the same rows and targets.
    if (replication.isVarying(rows) || replication.isVarying(targets))
      return;
    // Users of C: the scaling (no margin), or put_along and one take_along.
    TakeAlongOp take;
    for (Operation *user : classes.getUsers()) {
      if (user == put || (!put && user == scaled->mul) || (!put && user == ce))
        continue;
      auto t = dyn_cast<TakeAlongOp>(user);
      if (!put || !t || take || t.getAxis() != 1 || t.getIndices() != targets)
        return;
      take = t;
    }
    if (put && !take)
      return;
    Operation *at = take ? take.getOperation() : ce.getOperation();
    if (at->getBlock() != ce->getBlock())
      return;
    OpBuilder b(at);
    Location loc = b.getFusedLoc({matmul.getLoc(), ce.getLoc()});
    Value operands[] = {rows, weights, scaled->scale, targets};
    if (failed(prepareOperands(b, loc, at, operands, 2)))
      return;
    Value scale = operands[2];
    Type perRow = ce.getResult().getType();
    auto fused = ShardedSoftmaxOp::create(b, loc, TypeRange{perRow, perRow},
                                          operands[0], operands[1], scale,
                                          operands[3]);
    // The target logit: s * f(c) with a margin, s * c without.
    Value target = fused.getTargetDot();
    if (take) {
      take.getResult().replaceAllUsesWith(target);
      target = put.getValues();
    }
    // `at` is `ce` or precedes it, so the scale is usable there.
    b.setInsertionPoint(ce);
    Value targetLogit = MulOp::create(b, loc, target, scale);
    // logsumexp over every class = logaddexp(lse_rest, target logit), so
    // ce = lse_rest + softplus(target - lse_rest) - target.
    Value rest = fused.getLseRest();
    Value gap = SubOp::create(b, loc, targetLogit, rest);
    Value lse = AddOp::create(b, loc, rest, SoftplusOp::create(b, loc, gap));
    Value loss = SubOp::create(b, loc, lse, targetLogit);
    ce.getResult().replaceAllUsesWith(loss);
    eraseDead({ce, scaled->mul, put, take, gather, matmul});
  }

  func::FuncOp func;
  DominanceInfo dominance;
  ReplicationAnalysis replication;
};

struct FuseGatherSimilarityPass
    : dloss::impl::FuseGatherSimilarityPassBase<FuseGatherSimilarityPass> {
  using Base::Base;

  void runOnOperation() override {
    getOperation().walk([](func::FuncOp func) {
      if (!func.isExternal())
        Fuser(func).run();
    });
  }
};

} // namespace
