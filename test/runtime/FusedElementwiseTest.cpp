// dloss.fused_elementwise's CPU pass against the same chains in ATen.
#include "PlanTestUtil.h"

#include "runtime/comm/Engines.h"
#include "runtime/plan/TileEncoding.h"
#include "runtime/support/Error.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace {

using namespace dloss::test;
using dloss::epilogue::doubleToBits;
using dloss::epilogue::Op;

/// Builds a program: each call appends one instruction, returns its register.
struct Program {
  std::vector<int64_t> code;
  int64_t operator()(Op op, int64_t a = 0, int64_t b = 0) {
    code.insert(code.end(), {static_cast<int64_t>(op), a, b, 0});
    return static_cast<int64_t>(code.size() / 4 - 1);
  }
};

std::vector<at::Tensor> runChain(const std::vector<at::Tensor> &operands,
                                 int64_t elements, int64_t rows, int64_t cols,
                                 const Program &p,
                                 const std::vector<int64_t> &outputs,
                                 const std::vector<int64_t> &colSums = {}) {
  auto comm = dloss::makeSingleProcessCommunicator();
  std::vector<AttrSpec> attrs = {
      intAttr("elements", elements), intAttr("row_leaves", rows),
      intAttr("col_leaves", cols), intsAttr("program", p.code),
      intsAttr("outputs", outputs)};
  if (!colSums.empty())
    attrs.push_back(intsAttr("col_sums", colSums));
  return runFused(*comm, "dloss.fused_elementwise", operands,
                  static_cast<int>(outputs.size() + colSums.size()), {}, attrs);
}

void expectSame(const at::Tensor &actual, const at::Tensor &expected) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  // The same IEEE operations in the same order: equal up to rounding of
  // none (a tolerance would hide a wrong broadcast of a small value).
  EXPECT_TRUE(at::allclose(actual, expected, /*rtol=*/1e-6, /*atol=*/0))
      << "max difference " << (actual - expected).abs().max().item<double>();
}

// Batch norm's forward: (x - mean) / sqrt(var + eps) with per-column
// statistics and a 0-d eps, over rows wider than one chunk (3000 columns:
// a full chunk and a partial one per row).
TEST(FusedElementwiseTest, BatchNormChainMatchesAten) {
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(c10::toString(type));
    at::manual_seed(3);
    auto options = at::TensorOptions(type);
    at::Tensor x = at::randn({37, 3000}, options);
    at::Tensor mean = at::randn({3000}, options);
    at::Tensor var = at::rand({3000}, options) + 0.5;
    at::Tensor eps = at::full({}, 1e-5, options);
    Program p;
    int64_t rx = p(Op::Element, 0), rm = p(Op::ColLeaf, 0);
    int64_t dev = p(Op::Sub, rx, rm);
    int64_t rv = p(Op::ColLeaf, 1), re = p(Op::Scalar, 0);
    int64_t sd = p(Op::Sqrt, p(Op::Add, rv, re));
    int64_t y = p(Op::Div, dev, sd);
    std::vector<at::Tensor> out =
        runChain({x, mean, var, eps}, 1, 0, 2, p, {y, dev});
    ASSERT_EQ(out.size(), 2u);
    expectSame(out[0], (x - mean) / at::sqrt(var + eps));
    expectSame(out[1], x - mean);
  }
}

// Per-row leaves, negation and constants; and a chain of full-size values
// and 0-d ones alone, which runs over the tensor as one flat row (also for
// a rank with no rows).
TEST(FusedElementwiseTest, RowLeavesConstantsAndFlatChains) {
  at::manual_seed(4);
  auto options = at::TensorOptions(at::kDouble);
  at::Tensor x = at::randn({9, 5}, options), z = at::randn({9, 5}, options);
  at::Tensor r = at::randn({9}, options), s = at::randn({}, options);
  {
    Program p;
    int64_t prod = p(Op::Mul, p(Op::Element, 0), p(Op::RowLeaf, 0));
    int64_t y = p(Op::Neg, p(Op::Sub, prod, p(Op::Const, doubleToBits(0.25))));
    std::vector<at::Tensor> out = runChain({x, r}, 1, 1, 0, p, {y});
    expectSame(out[0], -(x * r.unsqueeze(1) - 0.25));
  }
  for (int64_t rows : {9, 0}) {
    SCOPED_TRACE(rows);
    at::Tensor a = x.narrow(0, 0, rows), b = z.narrow(0, 0, rows);
    Program p;
    int64_t ra = p(Op::Element, 0);
    int64_t y = p(Op::Add, p(Op::Mul, ra, ra),
                  p(Op::Div, p(Op::Element, 1), p(Op::Scalar, 0)));
    std::vector<at::Tensor> out = runChain({a, b, s}, 2, 0, 0, p, {y});
    expectSame(out[0], a * a + b / s);
  }
}

// Sums over the rows (batch norm's backward: sum(g * x_hat) and sum(g))
// as further results, over rows wider than a chunk, and a rank with no
// rows.
TEST(FusedElementwiseTest, ColumnSumsMatchAten) {
  for (int64_t rows : {300, 0}) {
    SCOPED_TRACE(rows);
    at::manual_seed(6);
    at::Tensor g = at::randn({rows, 2500}), x = at::randn({rows, 2500});
    at::Tensor m = at::randn({2500});
    Program p;
    int64_t rg = p(Op::Element, 0);
    int64_t hat = p(Op::Sub, p(Op::Element, 1), p(Op::ColLeaf, 0));
    int64_t prod = p(Op::Mul, rg, hat);
    std::vector<at::Tensor> out =
        runChain({g, x, m}, 2, 0, 1, p, {hat}, {prod, rg});
    ASSERT_EQ(out.size(), 3u);
    expectSame(out[0], x - m);
    ASSERT_EQ(out[1].sizes(), at::IntArrayRef({2500}));
    // Summed in double here, in float by ATen: equal up to its rounding.
    EXPECT_TRUE(at::allclose(out[1], (g * (x - m)).sum(0), 1e-5, 1e-4));
    EXPECT_TRUE(at::allclose(out[2], g.sum(0), 1e-5, 1e-4));
  }
}

// Results may name a leaf or repeat a register: each is a tensor of its own
// holding that value.
TEST(FusedElementwiseTest, ResultsOfLeavesAndRepeatedRegisters) {
  at::manual_seed(5);
  at::Tensor x = at::randn({4, 6}), c = at::randn({6});
  Program p;
  int64_t rx = p(Op::Element, 0), rc = p(Op::ColLeaf, 0);
  int64_t y = p(Op::Mul, rx, rc);
  std::vector<at::Tensor> out = runChain({x, c}, 1, 0, 1, p, {y, rc, y});
  ASSERT_EQ(out.size(), 3u);
  expectSame(out[0], x * c);
  expectSame(out[1], c.expand({4, 6}));
  expectSame(out[2], x * c);
  EXPECT_NE(out[0].data_ptr(), out[2].data_ptr());
}

/// f(x, m) = fused(neg(x), m) when `consumed`, else fused(x, m) (x a
/// caller's input); the fused step is the last reader of its first operand,
/// and its program reads that leaf again after computing the result.
std::vector<at::Tensor> runOnIntermediate(const at::Tensor &x,
                                          const at::Tensor &m, bool consumed) {
  Program p;
  int64_t e = p(Op::Element, 0), c = p(Op::ColLeaf, 0);
  int64_t d = p(Op::Sub, e, c);
  int64_t sq = p(Op::Mul, e, e);
  FunctionSpec f;
  f.args = {tensorArg("x", x, {0}), tensorArg("m", m)};
  StepSpec fused;
  fused.op = "dloss.fused_elementwise";
  fused.attrs = {intAttr("elements", 1),   intAttr("row_leaves", 0),
                 intAttr("col_leaves", 1), intsAttr("program", p.code),
                 intsAttr("outputs", {d}), intsAttr("col_sums", {sq})};
  fused.operands = {consumed ? 2 : 0, 1};
  fused.results = {3, 4};
  fused.free = {fused.operands[0]};
  if (consumed) {
    StepSpec neg;
    neg.op = "dloss.neg";
    neg.operands = {0};
    neg.results = {2};
    f.steps.push_back(neg);
  }
  f.steps.push_back(fused);
  f.results = {3, 4};
  f.numRegisters = 5;
  auto comm = dloss::makeSingleProcessCommunicator();
  dloss::Executor executor(buildPlan({f}), *comm);
  return executor.run("f", {x, m});
}

// A result may go into the buffer of an intermediate that dies at the
// step (KernelContext::consumable): written once the chunk's reads of
// that leaf are done, so the sum of its square, read after the result is
// computed, still sees the leaf. A caller's input is never written.
TEST(FusedElementwiseTest, ResultIntoADyingIntermediate) {
  at::manual_seed(8);
  at::Tensor x = at::randn({37, 3000}), m = at::randn({3000});
  const at::Tensor before = x.clone();
  for (bool consumed : {true, false}) {
    SCOPED_TRACE(consumed ? "an intermediate" : "the caller's input");
    const at::Tensor leaf = consumed ? -x : x;
    std::vector<at::Tensor> out = runOnIntermediate(x, m, consumed);
    ASSERT_EQ(out.size(), 2u);
    expectSame(out[0], leaf - m);
    EXPECT_TRUE(at::allclose(out[1], (leaf * leaf).sum(0), 1e-5, 1e-4));
    EXPECT_TRUE(at::equal(x, before));
    EXPECT_NE(out[0].data_ptr(), x.data_ptr());
  }
}

std::string errorOf(const std::function<void()> &fn) {
  try {
    fn();
  } catch (const dloss::Error &e) {
    return e.what();
  }
  return "(no error)";
}

// What the kernel refuses: an instruction outside its set, and operands
// whose shapes do not fit the iteration space.
TEST(FusedElementwiseTest, RefusesForeignInstructionsAndMismatchedShapes) {
  at::Tensor x = at::randn({4, 6}), c = at::randn({5});
  Program bad;
  int64_t e = bad(Op::Exp, bad(Op::Element, 0));
  EXPECT_NE(errorOf([&] {
              runChain({x}, 1, 0, 0, bad, {e});
            }).find("exp is not an instruction of a fused element-wise"),
            std::string::npos);
  Program p;
  int64_t y = p(Op::Mul, p(Op::Element, 0), p(Op::ColLeaf, 0));
  std::string message = errorOf([&] { runChain({x, c}, 1, 0, 1, p, {y}); });
  EXPECT_NE(message.find("operand 1 of dloss.fused_elementwise (per column) "
                         "has shape [5]"),
            std::string::npos)
      << message;
}

} // namespace
