// dloss.fused_similarity and its _grad on real Gloo processes: every tile
// program against an ATen interpreter of the same program (and autograd) on
// the global matrices.
#include "PlanTestUtil.h"
#include "TilePrograms.h"

#include "runtime/fused/Epilogue.h"
#include "runtime/fused/FusedKernels.h"
#include "runtime/fused/Schedule.h"
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
#include <stdexcept>
#include <tuple>

namespace {

using namespace dloss::test;
namespace fused = dloss::fused;
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
// The ATen interpreter of a tile program
//===----------------------------------------------------------------------===//

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
    case Op::StopGradient:
      v = A().detach();
      break;
    case Op::Element: // a leaf of element-wise programs only
      throw std::logic_error("interpret: Op::Element in a similarity program");
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
      for (const ProgramCase &pc : tilePrograms())
        for (Mode mode : modes)
          if (pc.program.colOutputs.empty() || mode == Mode::Gathered)
            checkProgram(comm, pc, mode, layout, precision, context);
    }
}

const std::vector<Mode> kModes = {Mode::Gathered, Mode::Local, Mode::Sharded};

//===----------------------------------------------------------------------===//
// Tests
//===----------------------------------------------------------------------===//

/// (world size, schedule): every program runs as the ring and as the gather
/// (fused/Schedule.h), each against the same global reference.
class FusedSimilarityTest
    : public ::testing::TestWithParam<std::tuple<int, fused::Schedule>> {};

// Tiles that divide no size (3x5, 2x1) and the default one.
TEST_P(FusedSimilarityTest, EveryProgramMatchesTheGlobalReference) {
  runGloo(std::get<0>(GetParam()),
          [schedule = std::get<1>(GetParam())](Communicator &comm) {
            fused::ScheduleScope scope(schedule);
            checkAll(comm, kF64, {"3x5", "2x1", ""}, kModes);
          });
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, FusedSimilarityTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(fused::Schedule::Ring,
                                         fused::Schedule::Gather)),
    [](const ::testing::TestParamInfo<FusedSimilarityTest::ParamType> &info) {
      return "N" + std::to_string(std::get<0>(info.param)) + "_" +
             fused::scheduleName(std::get<1>(info.param));
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

} // namespace
