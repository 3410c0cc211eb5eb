// dloss-fuse-gather-similarity: all_gather + similarity matmul + loss -> one
// ring-tiled op.
//
// One rewrite pattern per fused family (CLIP, SigLIP, class-sharded softmax),
// matched on the forward program, before autodiff: each fused op's adjoint
// rule (dialect/DlossAdjoints.cpp) emits its fused backward op, so the
// backward is fused too without matching the derived IR. docs/Fusion.md
// describes the schedules and the memory they need.
#include "passes/Passes.h"
#include "passes/ReplicationAnalysis.h"
#include "passes/TileProgram.h"
#include "runtime/plan/TileEncoding.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dominance.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Rewrite/FrozenRewritePatternSet.h"
#include "mlir/Rewrite/PatternApplicator.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <limits>

namespace mlir::dloss {
#define GEN_PASS_DEF_FUSEGATHERSIMILARITYPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

namespace {

//===----------------------------------------------------------------------===//
// Pieces the patterns share
//===----------------------------------------------------------------------===//

bool isScalarTensor(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && type.getRank() == 0;
}

/// `x * s` (either operand order, `s` 0-d) or `x` alone (no scale).
struct Scaled {
  Value x;
  Value scale; ///< null when unscaled
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
Value scaleOr(OpBuilder &b, Location loc, Value scale, Value like,
              double fill) {
  if (scale)
    return scale;
  Type element = cast<ShapedType>(like.getType()).getElementType();
  auto type = RankedTensorType::get({}, element);
  return arith::ConstantOp::create(
      b, loc, DenseElementsAttr::get(type, b.getFloatAttr(element, fill)));
}

/// Makes a fused op's operands usable at the rewriter's insertion point, just
/// before `at`: each one that is defined later must be a constant, which is
/// copied there; a missing scale (operand `scaleIndex`) becomes a constant 1.
/// Fails without touching the IR when an operand is defined later and is not
/// a constant.
LogicalResult prepareOperands(PatternRewriter &rewriter,
                              const DominanceInfo &dominance, Location loc,
                              Operation *at, MutableArrayRef<Value> operands,
                              unsigned scaleIndex) {
  auto later = [&](Value v) {
    return v && !dominance.properlyDominates(v, at);
  };
  for (Value v : operands)
    if (later(v) && !v.getDefiningOp<arith::ConstantOp>())
      return failure();
  for (Value &v : operands)
    if (later(v))
      v = rewriter.clone(*v.getDefiningOp())->getResult(0);
  operands[scaleIndex] =
      scaleOr(rewriter, loc, operands[scaleIndex], operands[0], 1.0);
  return success();
}

/// Erases `ops` in order, each once it has no users left (collectives too:
/// every rank compiles the same plan, so all drop the same gathers). An op
/// listed twice (one gather feeding both CLIP directions) is erased once.
void eraseDead(PatternRewriter &rewriter, ArrayRef<Operation *> ops) {
  llvm::SmallPtrSet<Operation *, 8> erased;
  // Until nothing changes: an op listed early may be read by one listed
  // later (an expand shaped `like` the similarity).
  for (bool progress = true; progress;) {
    progress = false;
    for (Operation *op : ops)
      if (op && !erased.contains(op) && op->use_empty()) {
        erased.insert(op);
        rewriter.eraseOp(op);
        progress = true;
      }
  }
}

//===----------------------------------------------------------------------===//
// CLIP
//===----------------------------------------------------------------------===//

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

/// CLIP: a cross-entropy and its mirror (rows and cols swapped, same scale,
/// same block; the first such in the block) become one dloss.ring_softmax_ce
/// placed at the earlier of the two.
struct ClipFusion : OpRewritePattern<CrossEntropyOp> {
  ClipFusion(MLIRContext *context, const DominanceInfo &dominance)
      : OpRewritePattern(context), dominance(dominance) {}

  LogicalResult matchAndRewrite(CrossEntropyOp ce,
                                PatternRewriter &rewriter) const override {
    std::optional<ClipSide> row = matchClipSide(ce);
    if (!row)
      return rewriter.notifyMatchFailure(ce,
                                         "not a scaled gathered similarity");
    std::optional<ClipSide> col;
    for (CrossEntropyOp other : ce->getBlock()->getOps<CrossEntropyOp>()) {
      if (other == ce)
        continue;
      std::optional<ClipSide> side = matchClipSide(other);
      if (side && side->sim.rows == row->sim.cols &&
          side->sim.cols == row->sim.rows &&
          side->scaled.scale == row->scaled.scale) {
        col = side;
        break;
      }
    }
    if (!col)
      return rewriter.notifyMatchFailure(ce, "no mirrored cross-entropy");
    Operation *at = ce->isBeforeInBlock(col->ce) ? ce : col->ce;
    rewriter.setInsertionPoint(at);
    Location loc = rewriter.getFusedLoc({ce.getLoc(), col->ce.getLoc()});
    Value operands[] = {row->sim.rows, row->sim.cols, row->scaled.scale,
                        ce.getTargets(), col->ce.getTargets()};
    if (failed(prepareOperands(rewriter, dominance, loc, at, operands, 2)))
      return rewriter.notifyMatchFailure(ce, "an operand is defined too late");
    Type rowType = ce.getResult().getType(),
         colType = col->ce.getResult().getType();
    auto fused = RingSoftmaxCEOp::create(
        rewriter, loc, TypeRange{rowType, colType, rowType, colType},
        operands[0], operands[1], operands[2], operands[3], operands[4]);
    rewriter.replaceAllUsesWith(ce.getResult(), fused.getRowCe());
    rewriter.replaceAllUsesWith(col->ce.getResult(), fused.getColCe());
    eraseDead(rewriter,
              {ce, col->ce, row->scaled.mul, col->scaled.mul, row->sim.matmul,
               col->sim.matmul, row->sim.gather, col->sim.gather});
    return success();
  }

  const DominanceInfo &dominance;
};

//===----------------------------------------------------------------------===//
// SigLIP
//===----------------------------------------------------------------------===//

/// SigLIP: `L = s * matmul(rows, all_gather(cols))^T + b`, used by
/// `softplus` (summed over rows and columns, or over columns) and by one
/// `take_along(L, t, axis 1)`, becomes one dloss.ring_sigmoid_pairs.
struct SiglipFusion : OpRewritePattern<SoftplusOp> {
  SiglipFusion(MLIRContext *context, const DominanceInfo &dominance)
      : OpRewritePattern(context), dominance(dominance) {}

  LogicalResult matchAndRewrite(SoftplusOp sp,
                                PatternRewriter &rewriter) const override {
    auto add = sp.getInput().getDefiningOp<AddOp>();
    if (!add)
      return rewriter.notifyMatchFailure(sp, "not a softplus of a sum");
    Value logits = add.getResult();
    Value bias, body;
    if (isScalarTensor(add.getRhs()) && !isScalarTensor(add.getLhs()))
      bias = add.getRhs(), body = add.getLhs();
    else if (isScalarTensor(add.getLhs()) && !isScalarTensor(add.getRhs()))
      bias = add.getLhs(), body = add.getRhs();
    else
      return rewriter.notifyMatchFailure(sp, "no 0-d bias");
    std::optional<Scaled> scaled = matchScaled(body);
    if (!scaled)
      return rewriter.notifyMatchFailure(
          sp, "the scaled similarity has other users");
    std::optional<Similarity> sim = matchSimilarity(scaled->x);
    if (!sim)
      return rewriter.notifyMatchFailure(sp, "not a gathered similarity");
    // The pair sum: softplus feeds one reduce sum over [1] or [0, 1].
    if (!sp.getResult().hasOneUse())
      return rewriter.notifyMatchFailure(sp, "the pairs have other users");
    auto sum = dyn_cast<ReduceOp>(*sp.getResult().getUsers().begin());
    if (!sum || sum.getKind() != ReduceKind::sum)
      return rewriter.notifyMatchFailure(sp, "the pairs are not summed");
    ArrayRef<int64_t> axes = sum.getAxes();
    bool rowsToo = axes.size() == 2 && axes[0] == 0 && axes[1] == 1;
    if (!rowsToo && !(axes.size() == 1 && axes[0] == 1))
      return rewriter.notifyMatchFailure(sp,
                                         "the pairs are summed over rows only");
    // The positives: exactly one take_along, and nothing else reads L.
    TakeAlongOp positives;
    for (Operation *user : logits.getUsers()) {
      if (user == sp)
        continue;
      auto take = dyn_cast<TakeAlongOp>(user);
      if (!take || take.getAxis() != 1 || positives)
        return rewriter.notifyMatchFailure(sp, "the logits have other users");
      positives = take;
    }
    if (!positives || positives->getBlock() != sp->getBlock() ||
        sum->getBlock() != sp->getBlock())
      return rewriter.notifyMatchFailure(sp, "no positives in this block");
    Operation *at = positives->isBeforeInBlock(sp) ? positives.getOperation()
                                                   : sp.getOperation();
    rewriter.setInsertionPoint(at);
    Location loc = rewriter.getFusedLoc({sp.getLoc(), positives.getLoc()});
    Value operands[] = {sim->rows, sim->cols, scaled->scale, bias,
                        positives.getIndices()};
    if (failed(prepareOperands(rewriter, dominance, loc, at, operands, 2)))
      return rewriter.notifyMatchFailure(sp, "an operand is defined too late");
    Type perRow = positives.getResult().getType();
    auto fused = RingSigmoidPairsOp::create(
        rewriter, loc, TypeRange{perRow, perRow}, operands[0], operands[1],
        operands[2], operands[3], operands[4]);
    rewriter.replaceAllUsesWith(positives.getResult(), fused.getPositive());
    Value pairs = fused.getPairSum();
    if (rowsToo) {
      rewriter.setInsertionPoint(sum);
      pairs = ReduceOp::create(rewriter, sum.getLoc(), ReduceKind::sum, pairs,
                               ArrayRef<int64_t>{0});
    }
    rewriter.replaceAllUsesWith(sum.getResult(), pairs);
    eraseDead(rewriter,
              {sum, sp, positives, add, scaled->mul, sim->matmul, sim->gather});
    return success();
  }

  const DominanceInfo &dominance;
};

//===----------------------------------------------------------------------===//
// The general family: any similarity read element-wise and reduced by rows
//===----------------------------------------------------------------------===//

/// A dloss.fused_similarity over a local class matrix (or, `sharded`, this
/// rank's class shard) computing, per row, the log-sum-exp of `scale * S`
/// over every class but the target, and the target's similarity: the
/// statistics of a softmax with a margin on the target logit.
FusedSimilarityOp localMarginSoftmax(PatternRewriter &rewriter, Location loc,
                                     Type perRow, Value rows, Value weights,
                                     Value scale, Value targets, bool sharded) {
  namespace ep = ::dloss::epilogue;
  auto code = [](ep::Op op) { return static_cast<int64_t>(op); };
  int64_t ninf = ep::doubleToBits(-std::numeric_limits<double>::infinity());
  int64_t zero = ep::doubleToBits(0.0);
  SmallVector<int64_t> program = {
      code(ep::Op::Sim),     0,    0, 0, // %0 = S
      code(ep::Op::Scalar),  0,    0, 0, // %1 = scale
      code(ep::Op::Mul),     0,    1, 0, // %2 = scale * S
      code(ep::Op::ColId),   0,    0, 0, // %3 = class
      code(ep::Op::RowLeaf), 0,    0, 0, // %4 = target
      code(ep::Op::Eq),      3,    4, 0, // %5 = class == target
      code(ep::Op::Const),   ninf, 0, 0, // %6
      code(ep::Op::Select),  5,    6, 2, // %7 = the other classes' logits
      code(ep::Op::Const),   zero, 0, 0, // %8
      code(ep::Op::Select),  5,    0, 8, // %9 = the target's similarity
  };
  SmallVector<int64_t> outputs = {
      7, static_cast<int64_t>(ep::Reduce::LogSumExp), // lse_rest
      9, static_cast<int64_t>(ep::Reduce::Sum)};      // target_dot
  return createFusedSimilarity(rewriter, loc, perRow, rows, weights,
                               ValueRange{targets, scale}, /*rowLeaves=*/1,
                               /*colLeaves=*/0, program, outputs,
                               /*colOutputs=*/{}, /*gathered=*/false, sharded);
}

/// Any similarity `matmul(rows, all_gather(cols))^T` (or over a local class
/// matrix) whose every reader is an element-wise op of the tile program or a
/// row reduction becomes one dloss.fused_similarity. Runs after the
/// dedicated patterns (their kernels are specialised); when it declines, it
/// says why in a remark at the similarity.
struct SimilarityFusion : OpRewritePattern<MatmulOp> {
  SimilarityFusion(MLIRContext *context, const DominanceInfo &dominance)
      : OpRewritePattern(context), dominance(dominance) {}

  LogicalResult matchAndRewrite(MatmulOp matmul,
                                PatternRewriter &rewriter) const override {
    if (matmul.getTransposeLhs() || !matmul.getTransposeRhs())
      return rewriter.notifyMatchFailure(matmul, "not rows x cols^T");
    auto derived = deriveTileProgram(matmul, dominance);
    if (auto *no = std::get_if<TileDecline>(&derived)) {
      InFlightDiagnostic remark = matmul.emitRemark()
                                  << "similarity not fused: " << no->reason;
      if (no->op && no->op != matmul.getOperation())
        remark.attachNote(no->op->getLoc()) << "here";
      return rewriter.notifyMatchFailure(matmul, no->reason);
    }
    TileProgram p = std::move(std::get<TileProgram>(derived));
    // CLIP's second direction: the mirrored similarity's rows are this
    // one's columns, so its row reductions are this op's column results,
    // from the same tiles.
    if (MatmulOp mirror = findMirror(p)) {
      auto other = deriveTileProgram(mirror, dominance);
      if (auto *q = std::get_if<TileProgram>(&other)) {
        TileProgram merged = p;
        if (succeeded(mergeMirror(merged, *q)) &&
            definedBefore(merged, firstTerminal(merged)))
          p = std::move(merged);
      }
    }
    simplifyProgram(p);
    Operation *at = firstTerminal(p);
    rewriter.setInsertionPoint(at);
    SmallVector<Location> locs = {matmul.getLoc()};
    for (const TileTerminal &t : p.terminals)
      locs.push_back(t.op->getLoc());
    Location loc = rewriter.getFusedLoc(locs);
    Type element = cast<ShapedType>(matmul.getType()).getElementType();
    Type perRow = RankedTensorType::get({ShapedType::kDynamic}, element);
    SmallVector<Value> leaves(p.rowLeaves);
    llvm::append_range(leaves, p.colLeaves);
    llvm::append_range(leaves, p.scalars);
    FusedSimilarityOp fused = createFusedSimilarity(
        rewriter, loc, perRow, p.rows, p.cols, leaves, p.rowLeaves.size(),
        p.colLeaves.size(), p.program, p.outputs, p.colOutputs,
        /*gathered=*/static_cast<bool>(p.gather), /*sharded=*/false);
    for (const TileTerminal &t : p.terminals) {
      Value first = fused.getResult(t.first);
      Value replacement = first;
      rewriter.setInsertionPoint(t.op);
      if (isa<CrossEntropyOp>(t.op))
        replacement = SubOp::create(rewriter, t.op->getLoc(), first,
                                    fused.getResult(t.first + 1));
      else if (auto reduce = dyn_cast<ReduceOp>(t.op);
               reduce && reduce.getAxes().size() == 2)
        replacement =
            ReduceOp::create(rewriter, t.op->getLoc(), ReduceKind::sum, first,
                             ArrayRef<int64_t>{0});
      if (replacement.getType() != t.op->getResult(0).getType())
        replacement = CastOp::create(rewriter, t.op->getLoc(),
                                     t.op->getResult(0).getType(), replacement);
      rewriter.replaceAllUsesWith(t.op->getResult(0), replacement);
    }
    SmallVector<Operation *> dead;
    for (const TileTerminal &t : p.terminals)
      dead.push_back(t.op);
    for (Operation *op : llvm::reverse(p.region))
      dead.push_back(op);
    dead.push_back(matmul);
    dead.push_back(p.gather);
    llvm::append_range(dead, p.leafOps);
    eraseDead(rewriter, dead);
    return success();
  }

  /// Whether every operand of the fused op is available before `at`.
  bool definedBefore(const TileProgram &p, Operation *at) const {
    auto early = [&](Value v) { return dominance.properlyDominates(v, at); };
    return early(p.rows) && early(p.cols) && llvm::all_of(p.rowLeaves, early) &&
           llvm::all_of(p.colLeaves, early) && llvm::all_of(p.scalars, early);
  }

  const DominanceInfo &dominance;
};

//===----------------------------------------------------------------------===//
// Class-sharded softmax (PartialFC)
//===----------------------------------------------------------------------===//

/// PartialFC: `cross_entropy(s * C', t)` over `C = all_gather(matmul(R,
/// W)^T, axis 1)`, `C'` = `C` or `put_along(C, t, f(take_along(C, t)))`,
/// becomes one dloss.sharded_softmax; the margin `f` stays ordinary IR and
/// the cross-entropy is rebuilt from the op's statistics.
struct ShardedSoftmaxFusion : OpRewritePattern<CrossEntropyOp> {
  /// `shards`: the class-sharded form becomes the dedicated op; otherwise
  /// the general op in its sharded mode.
  ShardedSoftmaxFusion(MLIRContext *context,
                       const ReplicationAnalysis &replication,
                       const DominanceInfo &dominance, bool shards)
      : OpRewritePattern(context), replication(replication),
        dominance(dominance), shards(shards) {}

  LogicalResult matchAndRewrite(CrossEntropyOp ce,
                                PatternRewriter &rewriter) const override {
    // The analysis answers only for its own function (unknown values read
    // as invariant), and the rows must truly be invariant.
    if (ce->getParentOfType<FunctionOpInterface>() != replication.getFunction())
      return rewriter.notifyMatchFailure(ce, "replication of another function");
    if (ce.getAxis() != 1)
      return rewriter.notifyMatchFailure(ce, "not over classes (axis 1)");
    Value targets = ce.getTargets();
    std::optional<Scaled> scaled = matchScaled(ce.getLogits());
    if (!scaled)
      return rewriter.notifyMatchFailure(ce,
                                         "the scaled logits have other users");
    PutAlongOp put = scaled->x.getDefiningOp<PutAlongOp>();
    Value classes = put ? put.getInput() : scaled->x;
    if (put && (put.getAxis() != 1 || put.getIndices() != targets ||
                !put.getResult().hasOneUse()))
      return rewriter.notifyMatchFailure(ce, "not a margin on the targets");
    // Class shards: C = all_gather(matmul(R, W)^T, axis 1). A local (or
    // replicated) class matrix: C = matmul(x, W)^T itself, tiled over the
    // classes by the general fused op.
    auto gather = classes.getDefiningOp<AllGatherOp>();
    if (gather &&
        (gather.getAxis() != 1 || gather.getGrad() != GatherGrad::exact))
      return rewriter.notifyMatchFailure(ce,
                                         "not an exact gather of class shards");
    auto matmul = gather ? gather.getInput().getDefiningOp<MatmulOp>()
                         : classes.getDefiningOp<MatmulOp>();
    if (!matmul || matmul.getTransposeLhs() || !matmul.getTransposeRhs() ||
        (gather && !matmul.getResult().hasOneUse()) ||
        (!gather && matmul.getRhs().getDefiningOp<AllGatherOp>()))
      return rewriter.notifyMatchFailure(ce, "not a similarity with the shard");
    Value rows = matmul.getLhs(), weights = matmul.getRhs();
    // Every shard must see the same rows and targets.
    if (gather &&
        (replication.isVarying(rows) || replication.isVarying(targets)))
      return rewriter.notifyMatchFailure(ce,
                                         "rows or targets vary across ranks");
    // Users of C: the scaling (no margin), or put_along and one take_along.
    TakeAlongOp take;
    for (Operation *user : classes.getUsers()) {
      if (user == put || (!put && user == scaled->mul) || (!put && user == ce))
        continue;
      auto t = dyn_cast<TakeAlongOp>(user);
      if (!put || !t || take || t.getAxis() != 1 || t.getIndices() != targets)
        return rewriter.notifyMatchFailure(ce, "the classes have other users");
      take = t;
    }
    if (put && !take)
      return rewriter.notifyMatchFailure(ce, "the margin reads no target");
    Operation *at = take ? take.getOperation() : ce.getOperation();
    if (at->getBlock() != ce->getBlock())
      return rewriter.notifyMatchFailure(ce,
                                         "the target is read in another block");
    rewriter.setInsertionPoint(at);
    Location loc = rewriter.getFusedLoc({matmul.getLoc(), ce.getLoc()});
    Value operands[] = {rows, weights, scaled->scale, targets};
    if (failed(prepareOperands(rewriter, dominance, loc, at, operands, 2)))
      return rewriter.notifyMatchFailure(ce, "an operand is defined too late");
    Value scale = operands[2];
    Type perRow = ce.getResult().getType();
    Value lseRest, targetDot;
    if (gather && shards) {
      auto fused = ShardedSoftmaxOp::create(
          rewriter, loc, TypeRange{perRow, perRow}, operands[0], operands[1],
          scale, operands[3]);
      lseRest = fused.getLseRest();
      targetDot = fused.getTargetDot();
    } else {
      auto fused =
          localMarginSoftmax(rewriter, loc, perRow, operands[0], operands[1],
                             scale, operands[3], static_cast<bool>(gather));
      lseRest = fused.getResult(0);
      targetDot = fused.getResult(1);
    }
    // The target logit: s * f(c) with a margin, s * c without.
    Value target = targetDot;
    if (take) {
      rewriter.replaceAllUsesWith(take.getResult(), target);
      target = put.getValues();
    }
    // `at` is `ce` or precedes it, so the scale is usable there.
    rewriter.setInsertionPoint(ce);
    Value targetLogit = MulOp::create(rewriter, loc, target, scale);
    // logsumexp over every class = logaddexp(lse_rest, target logit), so
    // ce = lse_rest + softplus(target - lse_rest) - target.
    Value rest = lseRest;
    Value gap = SubOp::create(rewriter, loc, targetLogit, rest);
    Value lse = AddOp::create(rewriter, loc, rest,
                              SoftplusOp::create(rewriter, loc, gap));
    Value loss = SubOp::create(rewriter, loc, lse, targetLogit);
    rewriter.replaceAllUsesWith(ce.getResult(), loss);
    eraseDead(rewriter, {ce, scaled->mul, put, take, gather, matmul});
    return success();
  }

  const ReplicationAnalysis &replication;
  const DominanceInfo &dominance;
  bool shards;
};

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

/// Records the ops a rewrite erases, so the driver skips them.
struct ErasedOps : RewriterBase::Listener {
  void notifyOperationErased(Operation *op) override { erased.insert(op); }
  llvm::DenseSet<Operation *> erased;
};

/// Applies `patterns` once to every op of `func` that exists when it starts,
/// in program order; ops a rewrite erases are skipped and ops it creates are
/// not visited. `rewritten` runs after each successful rewrite.
///
/// Neither upstream driver fits: the greedy driver also erases trivially dead
/// ops and orders its worklist itself, so the result would differ from a
/// single pass in program order, and walkAndApplyPatterns forbids erasing ops
/// other than the matched one (CLIP erases its mirror, SigLIP the sum after
/// the softplus).
void applyOnceInProgramOrder(func::FuncOp func,
                             const FrozenRewritePatternSet &patterns,
                             function_ref<void()> rewritten) {
  SmallVector<Operation *> ops;
  func.walk([&](Operation *op) {
    if (op != func.getOperation())
      ops.push_back(op);
  });
  ErasedOps listener;
  PatternRewriter rewriter(func.getContext());
  rewriter.setListener(&listener);
  PatternApplicator applicator(patterns);
  applicator.applyDefaultCostModel();
  for (Operation *op : ops)
    if (!listener.erased.contains(op) &&
        succeeded(applicator.matchAndRewrite(op, rewriter)))
      rewritten();
}

struct FuseGatherSimilarityPass
    : mlir::dloss::impl::FuseGatherSimilarityPassBase<
          FuseGatherSimilarityPass> {
  using Base::Base;

  void runOnOperation() override {
    SmallVector<func::FuncOp> funcs;
    getOperation().walk([&](func::FuncOp func) {
      if (!func.isExternal())
        funcs.push_back(func);
    });
    for (func::FuncOp func : funcs) {
      // The patterns hold these by reference; both are brought up to date
      // after every rewrite, so a later match sees the function as it is.
      ReplicationAnalysis replication(func);
      DominanceInfo dominance(func);
      RewritePatternSet patterns(&getContext());
      populateFuseGatherSimilarityPatterns(patterns, replication, dominance,
                                           dedicated);
      FrozenRewritePatternSet frozen(std::move(patterns));
      auto refresh = [&] {
        replication = ReplicationAnalysis(func);
        dominance.invalidate();
      };
      applyOnceInProgramOrder(func, frozen, refresh);
      // The general family second: the dedicated patterns start at the
      // reductions, after the similarity they would share with it.
      RewritePatternSet general(&getContext());
      populateFuseSimilarityPatterns(general, dominance);
      applyOnceInProgramOrder(func, FrozenRewritePatternSet(std::move(general)),
                              refresh);
    }
  }
};

} // namespace

void mlir::dloss::populateFuseGatherSimilarityPatterns(
    RewritePatternSet &patterns, const ReplicationAnalysis &replication,
    const DominanceInfo &dominance, bool dedicated) {
  MLIRContext *context = patterns.getContext();
  if (dedicated)
    patterns.add<ClipFusion, SiglipFusion>(context, dominance);
  patterns.add<ShardedSoftmaxFusion>(context, replication, dominance,
                                     dedicated);
}

void mlir::dloss::populateFuseSimilarityPatterns(
    RewritePatternSet &patterns, const DominanceInfo &dominance) {
  patterns.add<SimilarityFusion>(patterns.getContext(), dominance);
}
