// The tile programs the runtime's tests share (TilePrograms.h).
#include "TilePrograms.h"

#include <limits>

namespace dloss::test {

namespace {

using epilogue::Op;
using epilogue::Reduce;

constexpr double kInf = std::numeric_limits<double>::infinity();

at::Tensor scalar(double value) {
  return at::scalar_tensor(value, at::kDouble);
}

/// InfoNCE: lse(s S) and the logit at the row's (global) target column.
ProgramCase infoNce() {
  Program p;
  p.rowLeaves = 1;
  int64_t sim = p.emit(Op::Sim), s = p.emit(Op::Scalar, 0);
  int64_t logits = p.emit(Op::Mul, sim, s);
  int64_t hit = p.emit(Op::Eq, p.emit(Op::ColId), p.emit(Op::RowLeaf, 0));
  int64_t picked = p.emit(Op::Select, hit, logits, p.constant(0));
  p.output(logits, Reduce::LogSumExp);
  p.output(picked, Reduce::Sum, Pick{logits, 0});
  p.classTargets = {0};
  return {"InfoNCE", p, [](int64_t N, int64_t M) {
            return std::vector<at::Tensor>{at::randint(M, {N}, at::kLong),
                                           scalar(2.5)};
          }};
}

/// NT-Xent: the self pair (column index == global row index) masked with
/// -inf, a temperature, the logit at the partner (an int32 per-row leaf).
ProgramCase ntXent() {
  Program p;
  p.rowLeaves = 1;
  int64_t sim = p.emit(Op::Sim), t = p.emit(Op::Scalar, 0);
  int64_t logits = p.emit(Op::Div, sim, t);
  int64_t col = p.emit(Op::ColId);
  int64_t self = p.emit(Op::Eq, col, p.emit(Op::RowId));
  int64_t masked = p.emit(Op::Select, self, p.constant(-kInf), logits);
  int64_t partner = p.emit(Op::Eq, col, p.emit(Op::RowLeaf, 0));
  int64_t positive = p.emit(Op::Select, partner, logits, p.constant(0));
  p.output(masked, Reduce::LogSumExp);
  p.output(positive, Reduce::Sum, Pick{logits, 0});
  p.classTargets = {0};
  return {"NT-Xent", p, [](int64_t N, int64_t M) {
            return std::vector<at::Tensor>{
                at::randint(M, {N}, at::TensorOptions(at::kInt)), scalar(0.3)};
          }};
}

/// SupCon: the positives are the columns with the row's label (an int64
/// per-row and an int16 per-column leaf): the sum of their logits, their
/// count, and the lse of every logit.
ProgramCase supCon() {
  Program p;
  p.rowLeaves = 1;
  p.colLeaves = 1;
  int64_t sim = p.emit(Op::Sim), s = p.emit(Op::Scalar, 0);
  int64_t logits = p.emit(Op::Mul, s, sim);
  int64_t same = p.emit(Op::Eq, p.emit(Op::RowLeaf, 0), p.emit(Op::ColLeaf, 0));
  int64_t positive = p.emit(Op::Select, same, logits, p.constant(0));
  p.output(logits, Reduce::LogSumExp);
  p.output(positive, Reduce::Sum);
  p.output(same, Reduce::Sum);
  return {"SupCon", p, [](int64_t N, int64_t M) {
            return std::vector<at::Tensor>{
                at::randint(3, {N}, at::kLong),
                at::randint(3, {M}, at::TensorOptions(at::kShort)),
                scalar(1.5)};
          }};
}

/// Every transcendental opcode, a float per-row leaf (an additive angular
/// margin) and a float 0-d scale, both with a gradient; the clamp cuts some
/// similarities (no gradient there).
ProgramCase transcendental() {
  Program p;
  p.rowLeaves = 1;
  int64_t sim = p.emit(Op::Sim);
  int64_t cosine = p.clamp(sim, -0.6, 0.6);
  int64_t angle =
      p.emit(Op::Add, p.emit(Op::Acos, cosine), p.emit(Op::RowLeaf, 0));
  int64_t logit =
      p.emit(Op::Mul, p.emit(Op::Cos, angle), p.emit(Op::Scalar, 0));
  int64_t positive =
      p.emit(Op::Add, p.emit(Op::Sigmoid, logit), p.constant(1.5));
  int64_t ratio = p.emit(Op::Div, p.emit(Op::Log, positive), positive);
  int64_t root = p.emit(Op::Sqrt, p.emit(Op::Exp, p.emit(Op::Sin, sim)));
  int64_t mixed = p.emit(Op::Sub, p.emit(Op::Softplus, logit),
                         p.emit(Op::LogSigmoid, p.emit(Op::Neg, root)));
  p.output(ratio, Reduce::Sum);
  p.output(mixed, Reduce::LogSumExp);
  p.output(logit, Reduce::LogSumExp);
  return {"transcendental", p, [](int64_t N, int64_t) {
            return std::vector<at::Tensor>{
                at::rand({N}, at::kDouble).mul_(0.4).add_(0.05), scalar(3.0)};
          }};
}

/// CLIP's two directions from one tile: row results (lse, the logit at the
/// row's target column) and column results (lse over every rank's rows, the
/// logit at the column's target row, an int64 per-column leaf). With a
/// large `scale`, logits hundreds apart: the kernels' one-exp folds and
/// seeds fall back to a shift per row and column.
ProgramCase clip(double scale = 1.75, const char *name = "CLIP") {
  Program p;
  p.rowLeaves = 1;
  p.colLeaves = 1;
  int64_t logits = p.emit(Op::Mul, p.emit(Op::Sim), p.emit(Op::Scalar, 0));
  int64_t zero = p.constant(0);
  int64_t rowHit = p.emit(Op::Eq, p.emit(Op::ColId), p.emit(Op::RowLeaf, 0));
  int64_t colHit = p.emit(Op::Eq, p.emit(Op::RowId), p.emit(Op::ColLeaf, 0));
  p.output(logits, Reduce::LogSumExp);
  p.output(p.emit(Op::Select, rowHit, logits, zero), Reduce::Sum,
           Pick{logits, 0});
  p.colOutput(logits, Reduce::LogSumExp, {}, /*pairedRow=*/0);
  p.colOutput(p.emit(Op::Select, colHit, logits, zero), Reduce::Sum,
              Pick{logits, 0});
  p.classTargets = {0};
  return {name, p, [scale](int64_t N, int64_t M) {
            return std::vector<at::Tensor>{at::randint(M, {N}, at::kLong),
                                           at::randint(N, {M}, at::kLong),
                                           scalar(scale)};
          }};
}

/// Uniform operands whose cotangents the reverse sweep sums in the adjoint
/// loop: a float per-row leaf times the 0-d scale (both summed), the scale
/// squared (one register read twice), the leaf over a varying value (the
/// left operand summed), a subtraction of a uniform value.
ProgramCase uniformOperands() {
  Program p;
  p.rowLeaves = 1;
  int64_t sim = p.emit(Op::Sim), s = p.emit(Op::Scalar, 0);
  int64_t margin = p.emit(Op::RowLeaf, 0);
  int64_t shift = p.emit(Op::Mul, margin, s);
  int64_t squared = p.emit(Op::Mul, s, s);
  int64_t logits = p.emit(Op::Sub, p.emit(Op::Mul, sim, squared), shift);
  p.output(logits, Reduce::LogSumExp);
  p.output(p.emit(Op::Div, margin, p.emit(Op::Exp, sim)), Reduce::Sum);
  return {"uniform operands", p, [](int64_t N, int64_t) {
            return std::vector<at::Tensor>{
                at::rand({N}, at::kDouble).mul_(0.5).add_(0.1), scalar(1.25)};
          }};
}

/// CLIP without the facts: every result on the kernels' general path (a
/// sum over the masked tile, each direction's log-sum-exp on its own).
ProgramCase clipWithoutFacts() {
  ProgramCase pc = clip(1.75, "CLIP, no picks or pairs");
  pc.program = pc.program.withoutFacts();
  return pc;
}

/// DCL (decoupled contrastive): the positive (column index == global row
/// index) left out of the log-sum-exp, and the positive's logit (no leaf
/// names its column: no pick fact, the general path).
ProgramCase dcl() {
  Program p;
  int64_t logits = p.emit(Op::Mul, p.emit(Op::Sim), p.emit(Op::Scalar, 0));
  int64_t positive = p.emit(Op::Eq, p.emit(Op::ColId), p.emit(Op::RowId));
  p.output(p.emit(Op::Select, positive, p.constant(-kInf), logits),
           Reduce::LogSumExp);
  p.output(p.emit(Op::Select, positive, logits, p.constant(0)), Reduce::Sum);
  return {"DCL", p, [](int64_t, int64_t) {
            return std::vector<at::Tensor>{scalar(2.0)};
          }};
}

/// ArcFace (examples/arcface.mlir's structure): at the label's class the
/// cosine becomes cos(acos(clamp(cosine)) + 0.5), every logit is scaled by a
/// float 0-d leaf, and the results are the log-sum-exp and the target's
/// logit (picked at the label). The clamp at 0.99 (the example's is
/// 0.9999999) and the scale of 8 (the example's 64) keep f32's error in a
/// similarity from growing a hundredfold through acos' slope near 1.
ProgramCase arcFace() {
  Program p;
  p.rowLeaves = 1;
  int64_t cosine = p.emit(Op::Sim);
  int64_t label = p.emit(Op::Eq, p.emit(Op::ColId), p.emit(Op::RowLeaf, 0));
  int64_t angle = p.emit(Op::Acos, p.clamp(cosine, -0.99, 0.99));
  int64_t margin = p.emit(Op::Cos, p.emit(Op::Add, angle, p.constant(0.5)));
  int64_t logits = p.emit(Op::Mul, p.emit(Op::Select, label, margin, cosine),
                          p.emit(Op::Scalar, 0));
  p.output(logits, Reduce::LogSumExp);
  p.output(p.emit(Op::Select, label, logits, p.constant(0)), Reduce::Sum,
           Pick{logits, 0});
  p.classTargets = {0};
  return {"ArcFace", p, [](int64_t N, int64_t M) {
            return std::vector<at::Tensor>{at::randint(M, {N}, at::kLong),
                                           scalar(8.0)};
          }};
}

/// sentence-transformers' hardness weighting: a stop-gradient copy of the
/// similarity, times a weight, added to every logit but the row's own
/// (column id == global row id). The weight is w_i s under stop_gradient,
/// so the float per-row leaf w and the 0-d scale s get gradients only from
/// their direct uses: s in the logits, w in the second result, sum_j
/// stop_gradient(S) w_i (no gradient to S there).
ProgramCase hardness() {
  Program p;
  p.rowLeaves = 1;
  int64_t sim = p.emit(Op::Sim), s = p.emit(Op::Scalar, 0);
  int64_t w = p.emit(Op::RowLeaf, 0);
  int64_t logits = p.emit(Op::Mul, sim, s);
  int64_t held = p.emit(Op::StopGradient, sim);
  int64_t weight = p.emit(Op::StopGradient, p.emit(Op::Mul, w, s));
  int64_t penalty = p.emit(Op::Mul, held, weight);
  int64_t own = p.emit(Op::Eq, p.emit(Op::ColId), p.emit(Op::RowId));
  int64_t hard =
      p.emit(Op::Add, logits, p.emit(Op::Select, own, p.constant(0), penalty));
  p.output(hard, Reduce::LogSumExp);
  p.output(p.emit(Op::Mul, held, w), Reduce::Sum);
  return {"hardness", p, [](int64_t N, int64_t) {
            return std::vector<at::Tensor>{
                at::rand({N}, at::kDouble).mul_(3.0).add_(0.5), scalar(2.0)};
          }};
}

} // namespace

std::vector<ProgramCase> tilePrograms() {
  return {infoNce(),
          ntXent(),
          supCon(),
          dcl(),
          arcFace(),
          transcendental(),
          clip(),
          clip(60, "CLIP, far logits"),
          clipWithoutFacts(),
          uniformOperands(),
          hardness()};
}

} // namespace dloss::test
