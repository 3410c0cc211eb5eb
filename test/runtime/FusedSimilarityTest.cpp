// dloss.fused_similarity and its _grad on real Gloo processes: every tile
// program against an ATen interpreter of the same program (and autograd) on
// the global matrices.
#include "PlanTestUtil.h"

#include "runtime/fused/Epilogue.h"
#include "runtime/fused/FusedKernels.h"
#include "runtime/plan/PlanVersion.h"
#include "runtime/support/Error.h"
#include "test/runtime/MultiProcess.h"

#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>

namespace {

using namespace dloss::test;
using dloss::Communicator;
using dloss::epilogue::Op;
using dloss::epilogue::Reduce;

constexpr int64_t kWidth = 6;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// How results are compared: f64 absolutely, f32 relative to the largest
/// magnitude of the reference.
struct Precision {
  at::ScalarType type;
  double tolerance;
  bool relative;
};
const Precision kF64{at::kDouble, 1e-10, false};
const Precision kF32{at::kFloat, 2e-5, true};

/// Where the columns come from.
enum class Mode {
  Gathered, ///< every rank's columns, round the ring
  Local,    ///< one class matrix, the same on every rank, tiled in place
  Sharded,  ///< the classes sharded; the rows the same on every rank
};

const char *modeName(Mode mode) {
  return mode == Mode::Gathered ? "gathered"
         : mode == Mode::Local  ? "local"
                                : "sharded";
}

/// Every rank's size along axis 0 of the rows and the columns.
struct Layout {
  std::vector<int64_t> rows, cols;
};

std::vector<int64_t> firstOf(std::vector<int64_t> sizes, int worldSize) {
  sizes.resize(worldSize);
  return sizes;
}

/// Uneven shards, then uneven shards where a rank holds none (N >= 2).
std::vector<Layout> layouts(int worldSize) {
  return {{firstOf({5, 3, 7, 1}, worldSize), firstOf({4, 6, 2, 5}, worldSize)},
          {firstOf({4, 0, 6, 2}, worldSize), firstOf({3, 5, 0, 4}, worldSize)}};
}

std::string describe(const std::vector<int64_t> &sizes) {
  std::string out;
  for (int64_t size : sizes)
    out += (out.empty() ? "" : ",") + std::to_string(size);
  return "{" + out + "}";
}

/// `got` (in the tested type) against the f64 reference `want`.
void expectClose(const at::Tensor &got, const at::Tensor &want,
                 const Precision &precision, const std::string &what) {
  CHILD_CHECK(got.scalar_type() == precision.type,
              what << ": dtype " << got.scalar_type());
  CHILD_CHECK(got.sizes() == want.sizes(), what << ": shape " << got.sizes()
                                                << ", expected "
                                                << want.sizes());
  at::Tensor actual = got.to(at::kDouble), expected = want.detach();
  double tol = precision.tolerance;
  if (precision.relative && expected.numel() > 0)
    tol *= std::max(1.0, expected.abs().max().item<double>());
  CHILD_CHECK(!expected.isnan().any().item<bool>(),
              what << ": the reference has NaNs (a defect of the test)");
  at::Tensor differ = actual != expected;
  double error =
      differ.any().item<bool>()
          ? (actual - expected).abs().masked_select(differ).max().item<double>()
          : 0.0;
  CHILD_CHECK(at::allclose(actual, expected, 0, tol),
              what << ": max error " << error << " > " << tol << "\ngot\n"
                   << actual << "\nexpected\n"
                   << expected);
}

//===----------------------------------------------------------------------===//
// Tile programs and their ATen interpreter
//===----------------------------------------------------------------------===//

/// A result that picks register `reg` at the place leaf `leaf` names (the
/// `picks` fact, runtime/plan/TileEncoding.h); -1: not a pick.
struct Pick {
  int64_t reg = -1, leaf = -1;
};

/// A tile program being written: each call appends one instruction and
/// returns its register. The facts the compiler would write beside it are
/// stated with the results (the runtime matches nothing itself).
struct Program {
  std::vector<int64_t> code, outputs, colOutputs;
  int64_t rowLeaves = 0, colLeaves = 0;
  std::vector<int64_t> picks, colPicks, lsePairs, classTargets;

  int64_t emit(Op op, int64_t a = 0, int64_t b = 0, int64_t c = 0) {
    code.insert(code.end(), {static_cast<int64_t>(op), a, b, c});
    return static_cast<int64_t>(code.size()) / 4 - 1;
  }
  int64_t constant(double value) {
    return emit(Op::Const, dloss::epilogue::doubleToBits(value));
  }
  int64_t clamp(int64_t x, double lo, double hi) {
    return emit(Op::Clamp, x, dloss::epilogue::doubleToBits(lo),
                dloss::epilogue::doubleToBits(hi));
  }
  void output(int64_t reg, Reduce kind, Pick pick = {}) {
    outputs.insert(outputs.end(), {reg, static_cast<int64_t>(kind)});
    picks.insert(picks.end(), {pick.reg, pick.leaf});
  }
  /// A column result (gathered steps only); `pairedRow`: the row result
  /// that is the log-sum-exp of the same register.
  void colOutput(int64_t reg, Reduce kind, Pick pick = {},
                 int64_t pairedRow = -1) {
    colOutputs.insert(colOutputs.end(), {reg, static_cast<int64_t>(kind)});
    colPicks.insert(colPicks.end(), {pick.reg, pick.leaf});
    lsePairs.push_back(pairedRow);
  }
  /// The same program with no picks and no pairs: the kernels' general
  /// path for every result.
  Program withoutFacts() const {
    Program p = *this;
    std::fill(p.picks.begin(), p.picks.end(), -1);
    std::fill(p.colPicks.begin(), p.colPicks.end(), -1);
    std::fill(p.lsePairs.begin(), p.lsePairs.end(), -1);
    return p;
  }
  int64_t numOutputs() const {
    return static_cast<int64_t>(outputs.size()) / 2;
  }
  int64_t numColOutputs() const {
    return static_cast<int64_t>(colOutputs.size()) / 2;
  }

  std::vector<AttrSpec> attrs(Mode mode) const {
    std::vector<AttrSpec> out = {intAttr("row_leaves", rowLeaves),
                                 intAttr("col_leaves", colLeaves),
                                 intsAttr("program", code),
                                 intsAttr("outputs", outputs),
                                 intsAttr("picks", picks),
                                 intsAttr("class_targets", classTargets)};
    if (!colOutputs.empty()) {
      out.push_back(intsAttr("col_outputs", colOutputs));
      out.push_back(intsAttr("col_picks", colPicks));
      out.push_back(intsAttr("lse_pairs", lsePairs));
    }
    if (mode == Mode::Gathered)
      out.push_back(unitAttr("gathered"));
    if (mode == Mode::Sharded)
      out.push_back(unitAttr("sharded"));
    return out;
  }
};

/// The global leaves: per-row [N], per-column [M], then 0-d. Float leaves are
/// f64 (the kernel gets them in the tested type), integer ones any type.
using LeafMaker = std::function<std::vector<at::Tensor>(int64_t N, int64_t M)>;

/// One tested program.
struct ProgramCase {
  std::string name;
  Program program;
  LeafMaker leaves;
};

/// The program on the global S [N, M] with ATen ops: each row result [N],
/// then each column result [M]. Leaves and S carry autograd.
std::vector<at::Tensor> interpret(const Program &program, const at::Tensor &S,
                                  const std::vector<at::Tensor> &leaves) {
  using dloss::epilogue::bitsToDouble;
  const int64_t N = S.size(0), M = S.size(1);
  auto f64 = at::TensorOptions(at::kDouble);
  auto real = [](const at::Tensor &t) {
    return at::isFloatingType(t.scalar_type()) ? t : t.to(at::kDouble);
  };
  auto softplus = [](const at::Tensor &x) {
    return x.clamp_min(0) + (-x.abs()).exp().log1p();
  };
  std::vector<at::Tensor> reg;
  for (size_t t = 0; t < program.code.size() / 4; ++t) {
    auto op = static_cast<Op>(program.code[4 * t]);
    int64_t a = program.code[4 * t + 1], b = program.code[4 * t + 2],
            c = program.code[4 * t + 3];
    auto A = [&] { return reg[a]; };
    auto B = [&] { return reg[b]; };
    at::Tensor v;
    switch (op) {
    case Op::Sim:
      v = S;
      break;
    case Op::ColId:
      v = at::arange(M, f64).unsqueeze(0);
      break;
    case Op::RowId:
      v = at::arange(N, f64).unsqueeze(1);
      break;
    case Op::RowLeaf:
      v = real(leaves[a]).unsqueeze(1);
      break;
    case Op::ColLeaf:
      v = real(leaves[program.rowLeaves + a]).unsqueeze(0);
      break;
    case Op::Scalar:
      v = real(leaves[program.rowLeaves + program.colLeaves + a]);
      break;
    case Op::Const:
      v = at::scalar_tensor(bitsToDouble(a), f64);
      break;
    case Op::Add:
      v = A() + B();
      break;
    case Op::Sub:
      v = A() - B();
      break;
    case Op::Mul:
      v = A() * B();
      break;
    case Op::Div:
      v = A() / B();
      break;
    case Op::Neg:
      v = -A();
      break;
    case Op::Exp:
      v = A().exp();
      break;
    case Op::Log:
      v = A().log();
      break;
    case Op::Softplus:
      v = softplus(A());
      break;
    case Op::LogSigmoid:
      v = -softplus(-A());
      break;
    case Op::Sigmoid:
      v = A().sigmoid();
      break;
    case Op::Cos:
      v = A().cos();
      break;
    case Op::Acos:
      v = A().acos();
      break;
    case Op::Sin:
      v = A().sin();
      break;
    case Op::Sqrt:
      v = A().sqrt();
      break;
    case Op::Clamp:
      v = A().clamp(bitsToDouble(b), bitsToDouble(c));
      break;
    case Op::Eq:
      v = (A() == B()).to(at::kDouble);
      break;
    case Op::Select:
      v = at::where(A() != 0, B(), reg[c]);
      break;
    }
    reg.push_back(v);
  }
  std::vector<at::Tensor> results;
  auto reduce = [&](const std::vector<int64_t> &outputs, int64_t dim) {
    for (size_t k = 0; k < outputs.size() / 2; ++k) {
      at::Tensor e = reg[outputs[2 * k]].expand({N, M});
      results.push_back(static_cast<Reduce>(outputs[2 * k + 1]) == Reduce::Sum
                            ? e.sum(dim)
                            : e.logsumexp(dim));
    }
  };
  reduce(program.outputs, 1);
  reduce(program.colOutputs, 0);
  return results;
}

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

std::vector<ProgramCase> programs() {
  return {infoNce(),          ntXent(),         supCon(),
          transcendental(),   clip(),           clip(60, "CLIP, far logits"),
          clipWithoutFacts(), uniformOperands()};
}

//===----------------------------------------------------------------------===//
// One case: the global problem, this rank's operands, the references
//===----------------------------------------------------------------------===//

void checkProgram(Communicator &comm, const ProgramCase &pc, Mode mode,
                  const Layout &layout, const Precision &precision,
                  const std::string &context) {
  const int rank = comm.rank();
  const Program &p = pc.program;
  // Sharded: the rows are the same everywhere (7 of them), the classes are
  // sharded by layout.cols. Local: 7 classes on every rank.
  const int64_t N = mode == Mode::Sharded ? 7 : total(layout.rows);
  const int64_t M = mode == Mode::Local ? 7 : total(layout.cols);
  const bool rowsSharded = mode != Mode::Sharded;
  const bool colsSharded = mode != Mode::Local;
  auto byRow = [&](const at::Tensor &t) {
    return rowsSharded ? shard(t, layout.rows, rank) : t;
  };
  auto byCol = [&](const at::Tensor &t) {
    return colsSharded ? shard(t, layout.cols, rank) : t;
  };
  auto in = [&](const at::Tensor &t) {
    return at::isFloatingType(t.scalar_type()) ? t.to(precision.type) : t;
  };

  at::manual_seed(21);
  auto randn = [&](std::vector<int64_t> shape, double scale) {
    return (at::randn(shape, at::kDouble) * scale)
        .to(precision.type)
        .to(at::kDouble);
  };
  at::Tensor rows = randn({N, kWidth}, 0.5), cols = randn({M, kWidth}, 0.5);
  std::vector<at::Tensor> leaves = pc.leaves(N, M);
  for (at::Tensor &leaf : leaves)
    if (at::isFloatingType(leaf.scalar_type()))
      leaf = leaf.to(precision.type).to(at::kDouble);
  // Row results' cotangents [N], then column results' [M].
  const int64_t numResults = p.numOutputs() + p.numColOutputs();
  auto isRowResult = [&](int64_t k) { return k < p.numOutputs(); };
  std::vector<at::Tensor> cts;
  for (int64_t k = 0; k < numResults; ++k)
    cts.push_back(randn({isRowResult(k) ? N : M}, 1.0));

  // The reference: results on the global matrices; gradients of the loss
  // sum_k ct_k . r_k, over every row (`all`) and over this rank's (`mine`).
  at::Tensor R = rows.clone().requires_grad_(true);
  at::Tensor C = cols.clone().requires_grad_(true);
  std::vector<at::Tensor> leafVars;
  for (const at::Tensor &leaf : leaves)
    leafVars.push_back(at::isFloatingType(leaf.scalar_type())
                           ? leaf.clone().requires_grad_(true)
                           : leaf);
  std::vector<at::Tensor> want = interpret(p, R.mm(C.t()), leafVars);
  at::Tensor mine = at::zeros({N}, at::kDouble);
  if (rowsSharded)
    mine.narrow(0, offsetOf(layout.rows, rank), layout.rows[rank]).fill_(1);
  else
    mine.fill_(1);
  // A rank's share of a 0-d leaf's gradient: its rows' row results and its
  // own columns' column results.
  at::Tensor mineCols = at::zeros({M}, at::kDouble);
  if (colsSharded)
    mineCols.narrow(0, offsetOf(layout.cols, rank), layout.cols[rank]).fill_(1);
  else
    mineCols.fill_(1);
  at::Tensor lossAll = at::zeros({}, at::kDouble), lossMine = lossAll;
  for (int64_t k = 0; k < numResults; ++k) {
    lossAll = lossAll + (cts[k] * want[k]).sum();
    lossMine = lossMine +
               (cts[k] * (isRowResult(k) ? mine : mineCols) * want[k]).sum();
  }
  auto byResult = [&](int64_t k, const at::Tensor &t) {
    return isRowResult(k) ? byRow(t) : byCol(t);
  };
  std::vector<at::Tensor> floatLeaves;
  for (const at::Tensor &leaf : leafVars)
    if (leaf.requires_grad())
      floatLeaves.push_back(leaf);
  std::vector<at::Tensor> wrt = {R, C};
  wrt.insert(wrt.end(), floatLeaves.begin(), floatLeaves.end());
  std::vector<at::Tensor> gradAll = torch::autograd::grad(
      {lossAll}, wrt, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
  std::vector<at::Tensor> gradMine = torch::autograd::grad(
      {lossMine}, wrt, {}, /*retain_graph=*/false, false, true);
  auto orZero = [](const at::Tensor &grad, const at::Tensor &like) {
    return grad.defined() ? grad : at::zeros_like(like);
  };

  // This rank's operands.
  std::vector<at::Tensor> operands = {in(byRow(rows)), in(byCol(cols))};
  std::vector<size_t> replicated;
  if (!rowsSharded)
    replicated.push_back(0);
  if (!colsSharded)
    replicated.push_back(1);
  for (size_t k = 0; k < leaves.size(); ++k) {
    bool isRow = static_cast<int64_t>(k) < p.rowLeaves;
    bool isCol = !isRow && static_cast<int64_t>(k) < p.rowLeaves + p.colLeaves;
    if ((isRow && !rowsSharded) || (isCol && !colsSharded))
      replicated.push_back(operands.size());
    operands.push_back(in(isRow   ? byRow(leaves[k])
                          : isCol ? byCol(leaves[k])
                                  : leaves[k]));
  }
  std::vector<dloss::test::AttrSpec> attrs = p.attrs(mode);
  std::string where = context + ", " + pc.name + ", " + modeName(mode);

  std::vector<at::Tensor> forward =
      runFused(comm, "dloss.fused_similarity", operands,
               static_cast<int>(numResults), replicated, attrs);
  for (int64_t k = 0; k < numResults; ++k)
    expectClose(forward[k], byResult(k, want[k]), precision,
                where + ": result " + std::to_string(k));

  // The backward, fed with the forward's results. (Column results exist
  // only in gathered steps, whose operands all differ along axis 0.)
  std::vector<at::Tensor> gradOperands = operands;
  for (int64_t k = 0; k < numResults; ++k) {
    if (!rowsSharded)
      replicated.push_back(gradOperands.size());
    gradOperands.push_back(forward[k]);
  }
  for (int64_t k = 0; k < numResults; ++k) {
    if (!rowsSharded)
      replicated.push_back(gradOperands.size());
    gradOperands.push_back(in(byResult(k, cts[k])));
  }
  std::vector<at::Tensor> got = runFused(comm, "dloss.fused_similarity_grad",
                                         gradOperands, 4, replicated, attrs);

  // The references of d_row_leaves ([row_leaves, n]) and d_scalars.
  // Per-row leaves: the whole gradient of this rank's rows' values (`rowGrads`,
  // normally gradAll); 0-d leaves: `grads`.
  auto leafGradients = [&](const std::vector<at::Tensor> &grads,
                           const std::vector<at::Tensor> &rowGradsFrom) {
    std::vector<at::Tensor> rowGrads, scalarGrads;
    size_t next = 2;
    for (size_t k = 0; k < leaves.size(); ++k) {
      bool isFloat = leafVars[k].requires_grad();
      at::Tensor grad = isFloat ? orZero(grads[next], leaves[k])
                                : at::zeros(leaves[k].sizes(), at::kDouble);
      at::Tensor rowGrad =
          isFloat ? orZero(rowGradsFrom[next], leaves[k]) : grad;
      next += isFloat;
      if (static_cast<int64_t>(k) < p.rowLeaves)
        rowGrads.push_back(byRow(rowGrad));
      else if (static_cast<int64_t>(k) >= p.rowLeaves + p.colLeaves)
        scalarGrads.push_back(grad);
    }
    int64_t n = rowsSharded ? layout.rows[rank] : N;
    return std::make_pair(rowGrads.empty() ? at::zeros({0, n}, at::kDouble)
                                           : at::stack(rowGrads),
                          scalarGrads.empty() ? at::zeros({0}, at::kDouble)
                                              : at::stack(scalarGrads));
  };

  auto summed = [&](const at::Tensor &partial) {
    return comm.allReduce(partial, dloss::Reduction::Sum);
  };
  if (mode == Mode::Sharded) {
    // The results are invariant and the cotangents the full ones: d_cols is
    // exact, d_rows and the leaves' gradients are this shard's parts.
    auto [rowLeafGrads, scalarGrads] = leafGradients(gradAll, gradAll);
    expectClose(summed(got[0]), orZero(gradAll[0], rows), precision,
                where + ": d_rows summed over ranks");
    expectClose(got[1], byCol(orZero(gradAll[1], cols)), precision,
                where + ": d_cols");
    expectClose(summed(got[2]), rowLeafGrads, precision,
                where + ": d_row_leaves summed over ranks");
    expectClose(summed(got[3]), scalarGrads, precision,
                where + ": d_scalars summed over ranks");
    return;
  }
  auto [rowLeafGrads, scalarGrads] = leafGradients(gradMine, gradAll);
  expectClose(got[0], byRow(orZero(gradAll[0], rows)), precision,
              where + ": d_rows");
  // Gathered: the columns' gradient from every rank's rows; local: from
  // this rank's rows.
  expectClose(got[1],
              mode == Mode::Gathered ? byCol(orZero(gradAll[1], cols))
                                     : orZero(gradMine[1], cols),
              precision, where + ": d_cols");
  expectClose(got[2], rowLeafGrads, precision, where + ": d_row_leaves");
  expectClose(got[3], scalarGrads, precision, where + ": d_scalars");
}

void checkAll(Communicator &comm, const Precision &precision,
              const std::vector<std::string> &tiles,
              const std::vector<Mode> &modes) {
  for (const Layout &layout : layouts(comm.worldSize()))
    for (const std::string &tile : tiles) {
      TileEnv env(tile);
      std::string context = "rank " + std::to_string(comm.rank()) + ", rows " +
                            describe(layout.rows) + " cols " +
                            describe(layout.cols) + ", tile '" + tile + "'";
      for (const ProgramCase &pc : programs())
        for (Mode mode : modes)
          if (pc.program.colOutputs.empty() || mode == Mode::Gathered)
            checkProgram(comm, pc, mode, layout, precision, context);
    }
}

const std::vector<Mode> kModes = {Mode::Gathered, Mode::Local, Mode::Sharded};

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

class FusedSimilarityTest : public ::testing::TestWithParam<int> {};

// Tiles that divide no size (3x5, 2x1) and the default one.
TEST_P(FusedSimilarityTest, EveryProgramMatchesTheGlobalReference) {
  runGloo(GetParam(), [](Communicator &comm) {
    checkAll(comm, kF64, {"3x5", "2x1", ""}, kModes);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FusedSimilarityTest,
                         ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int> &info) {
                           return "N" + std::to_string(info.param);
                         });

// f32 inputs compute in f32: within 2e-5 of the f64 reference, relative.
TEST(FusedSimilarityF32Test, EveryProgramMatchesTheF64Reference) {
  runGloo(3, [](Communicator &comm) {
    checkAll(comm, kF32, {"3x5", ""}, kModes);
  });
}

// The backward evaluates only the values an adjoint declares it reads
// (epilogue::adjointReads): with every other value NaN, each opcode's
// adjoint gives the same cotangents.
TEST(FusedSimilarityEpilogueTest, AdjointReadsOnlyWhatItDeclares) {
  namespace ep = dloss::epilogue;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t code = 0; code < ep::kOpCount; ++code) {
    const auto op = static_cast<Op>(code);
    if (ep::registerOperands(op) == 0)
      continue;
    for (double a : {0.3, 0.0, -0.8}) {
      ep::Instr ins{op, 0, ep::doubleToBits(-0.5), ep::doubleToBits(0.5)};
      const double b = 0.7, c = -0.2, ct = 1.3;
      double out = 0;
      ep::dispatch(op, [&](auto tag) {
        out = ep::apply<decltype(tag)::value, double>(a, b, c, ins);
      });
      const int reads = ep::adjointReads(op);
      auto keep = [&](double v, int bit) { return reads & bit ? v : nan; };
      double all[3] = {0, 0, 0}, declared[3] = {0, 0, 0};
      ep::dispatch(op, [&](auto tag) {
        constexpr Op O = decltype(tag)::value;
        ep::adjoint<O, double>(a, b, c, out, ct, ins, all[0], all[1], all[2]);
        ep::adjoint<O, double>(keep(a, ep::kReadsA), keep(b, ep::kReadsB),
                               keep(c, ep::kReadsC), keep(out, ep::kReadsOut),
                               ct, ins, declared[0], declared[1], declared[2]);
      });
      for (int k = 0; k < 3; ++k) // sqrt(-0.8)'s NaN is its own
        EXPECT_TRUE(all[k] == declared[k] ||
                    (std::isnan(all[k]) && std::isnan(declared[k])))
            << ep::opName(op) << " at a = " << a << ": operand " << k;
    }
  }
}

// A row whose every element is -inf has log-sum-exp -inf, and passes no
// gradient (no NaN from exp(-inf - -inf)).
TEST(FusedSimilarityEdgeTest, AllMinusInfinityRowGivesMinusInfinity) {
  runGloo(2, [](Communicator &comm) {
    Program p;
    p.rowLeaves = 1;
    int64_t sim = p.emit(Op::Sim);
    int64_t drop = p.emit(Op::Eq, p.emit(Op::RowLeaf, 0), p.constant(1));
    int64_t masked = p.emit(Op::Select, drop, p.constant(-kInf), sim);
    p.output(masked, Reduce::LogSumExp);
    at::manual_seed(22 + comm.rank());
    at::Tensor rows = at::randn({3, kWidth}, at::kDouble);
    at::Tensor cols = at::randn({2, kWidth}, at::kDouble);
    at::Tensor flags = at::tensor({0, 1, 0}, at::kLong);
    std::vector<at::Tensor> forward =
        runFused(comm, "dloss.fused_similarity", {rows, cols, flags}, 1, {},
                 p.attrs(Mode::Gathered));
    at::Tensor all = comm.allGather(cols, 0, {2, 2});
    at::Tensor want = rows.mm(all.t()).logsumexp(1);
    want[1] = -kInf;
    expectClose(forward[0], want, kF64, "lse");
    std::vector<at::Tensor> got =
        runFused(comm, "dloss.fused_similarity_grad",
                 {rows, cols, flags, forward[0], at::ones({3}, at::kDouble)}, 4,
                 {}, p.attrs(Mode::Gathered));
    CHILD_CHECK(!got[0].isnan().any().item<bool>(), "d_rows " << got[0]);
    CHILD_CHECK(got[0][1].abs().max().item<double>() == 0, "d_rows " << got[0]);
    CHILD_CHECK(got[2].sizes() == at::IntArrayRef({1, 3}),
                "d_row_leaves " << got[2].sizes());
  });
}

/// The message of the error the forward raises on these operands.
std::string forwardError(Communicator &comm, const Program &p,
                         const std::vector<at::Tensor> &operands) {
  return errorOf([&] {
    runFused(comm, "dloss.fused_similarity", operands,
             static_cast<int>(p.numOutputs()), {}, p.attrs(Mode::Local));
  });
}

void expectParts(const std::string &message,
                 const std::vector<std::string> &parts) {
  for (const std::string &part : parts)
    CHILD_CHECK(message.find(part) != std::string::npos,
                "'" << part << "' missing from: " << message);
}

// Malformed programs and operands raise a dloss::Error naming the op, the
// rank, the instruction or operand and what to do.
TEST(FusedSimilarityErrorTest, MalformedProgramsAndOperandsAreExplained) {
  runGloo(1, [](Communicator &comm) {
    at::Tensor rows = at::randn({3, kWidth}), cols = at::randn({4, kWidth});
    {
      Program p; // instruction 1 reads register 2, defined later
      p.emit(Op::Sim);
      p.emit(Op::Exp, 2);
      p.emit(Op::Sim);
      p.output(1, Reduce::Sum);
      expectParts(forwardError(comm, p, {rows, cols}),
                  {"op dloss.fused_similarity", "rank 0",
                   "malformed tile program",
                   "instruction 1: exp reads register 2, not an earlier "
                   "instruction",
                   "recompile the loss"});
    }
    {
      Program p; // a per-row leaf that is not there
      p.rowLeaves = 1;
      p.output(p.emit(Op::RowLeaf, 1), Reduce::Sum);
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"instruction 0: row reads leaf 1 of 1"});
    }
    {
      Program p; // an unknown opcode and an unknown reduction
      p.code = {99, 0, 0, 0};
      p.outputs = {0, 0};
      expectParts(forwardError(comm, p, {rows, cols}),
                  {"instruction 0: unknown opcode 99"});
      p.code = {0, 0, 0, 0};
      p.outputs = {0, 7};
      expectParts(forwardError(comm, p, {rows, cols}),
                  {"result 0 has unknown reduction 7"});
    }
    {
      Program p; // more leaves announced than passed
      p.rowLeaves = 2;
      p.output(p.emit(Op::Sim), Reduce::Sum);
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"fewer than row_leaves = 2"});
    }
    {
      Program p; // a per-row leaf of the wrong length
      p.rowLeaves = 1;
      p.output(p.emit(Op::RowLeaf, 0), Reduce::Sum);
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({4})}),
                  {"per-row leaf 0 (operand 2) has shape [4], expected [3]"});
    }
    {
      Program p; // f32 cannot hold this label exactly
      p.rowLeaves = 1;
      p.output(p.emit(Op::Eq, p.emit(Op::RowLeaf, 0), p.emit(Op::ColId)),
               Reduce::Sum);
      p.classTargets = {0};
      at::Tensor labels = at::tensor({1, 1 << 24, 2}, at::kLong);
      expectParts(forwardError(comm, p, {rows, cols, labels}),
                  {"per-row leaf 0 (operand 2) holds 16777216 (element 1)",
                   "below 2^24", "Compute in float64"});
      // f64 holds it.
      runFused(comm, "dloss.fused_similarity",
               {rows.to(at::kDouble), cols.to(at::kDouble), labels}, 1, {},
               p.attrs(Mode::Local));
    }
    {
      Program p; // rows and cols of different types
      p.output(p.emit(Op::Sim), Reduce::Sum);
      expectParts(forwardError(comm, p, {rows, cols.to(at::kDouble)}),
                  {"same float type"});
    }
    {
      Program p; // facts naming a register, a leaf that are not there
      p.rowLeaves = 1;
      p.output(p.emit(Op::Sim), Reduce::Sum, Pick{4, 0});
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"the tile program's facts do not fit it",
                   "`picks` entry 0 names register 4 of 1",
                   "recompile the loss"});
      p.picks = {0, 1};
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"`picks` entry 0 names per-row leaf 1 of 1"});
      p.picks = {};
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"`picks` holds 0 integers, expected 2"});
      p.picks = {-1, -1};
      p.classTargets = {2};
      expectParts(forwardError(comm, p, {rows, cols, at::zeros({3})}),
                  {"`class_targets` must list per-row leaves (of 1)"});
    }
  });
}

// A plan whose fused step lacks the facts (written before the compiler
// wrote them, at plan version 1) is refused with the plan-version error,
// never run on a guess.
TEST(FusedSimilarityPlanTest, PlanWithoutFactsIsRefusedByVersion) {
  Program p;
  p.output(p.emit(Op::Sim), Reduce::Sum);
  std::vector<AttrSpec> old = {
      intAttr("row_leaves", 0), intAttr("col_leaves", 0),
      intsAttr("program", p.code), intsAttr("outputs", p.outputs)};
  at::Tensor rows = at::randn({3, kWidth});
  FunctionSpec f =
      singleOpFunction("dloss.fused_similarity", {rows, rows}, old);
  ASSERT_GE(dloss::kPlanVersion, 2) << "the facts came with version 2";
  std::vector<uint8_t> bytes = buildPlanBytes({f}, 0x1234, /*version=*/1);
  std::string message =
      errorOf([&] { dloss::PlanFile::fromBytes(bytes, "old.plan"); });
  EXPECT_NE(message.find("plan 'old.plan' has plan format version 1, this "
                         "runtime reads version " +
                         std::to_string(dloss::kPlanVersion)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Recompile"), std::string::npos) << message;
}

} // namespace
