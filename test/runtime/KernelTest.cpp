// Each runtime kernel against a direct ATen or hand computation (world size 1).
#include "PlanTestUtil.h"

#include "runtime/comm/Engines.h"
#include "runtime/kernels/KernelTable.h"
#include "runtime/support/Error.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

namespace {

using namespace dloss::test;

std::string show(const at::Tensor &tensor) {
  std::ostringstream out;
  out << tensor;
  return out.str();
}

// Same dtype and shape, values within tolerance (NaNs must match).
void expectClose(const at::Tensor &actual, const at::Tensor &expected,
                 double rtol = 1e-6, double atol = 1e-7) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(actual, expected, rtol, atol, /*equal_nan=*/true))
      << "actual:\n"
      << show(actual) << "\nexpected:\n"
      << show(expected);
}

void expectEqual(const at::Tensor &actual, const at::Tensor &expected) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(at::equal(actual, expected)) << "actual:\n"
                                           << show(actual) << "\nexpected:\n"
                                           << show(expected);
}

at::Tensor randn(std::vector<int64_t> shape, at::ScalarType type = at::kFloat) {
  return at::randn(shape, at::TensorOptions(type));
}

at::Tensor longs(std::vector<int64_t> values) {
  return at::tensor(values, at::TensorOptions(at::kLong));
}

TEST(KernelTest, ElementwiseBinaryWithZeroDBroadcast) {
  at::manual_seed(1);
  at::Tensor a = randn({3, 4}), b = randn({3, 4}), s = randn({});
  at::Tensor ia = longs({5, -7, 9}), ib = longs({2, 3, -4});
  struct Case {
    const char *op;
    at::Tensor (*expected)(const at::Tensor &, const at::Tensor &);
  };
  Case cases[] = {
      {"dloss.add",
       [](const at::Tensor &x, const at::Tensor &y) { return x + y; }},
      {"dloss.sub",
       [](const at::Tensor &x, const at::Tensor &y) { return x - y; }},
      {"dloss.mul",
       [](const at::Tensor &x, const at::Tensor &y) { return x * y; }},
      {"dloss.div",
       [](const at::Tensor &x, const at::Tensor &y) { return x / y; }},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.op);
    expectClose(runOp(c.op, {a, b}), c.expected(a, b));
    expectClose(runOp(c.op, {a, s}), c.expected(a, s.expand({3, 4})));
    expectClose(runOp(c.op, {s, b}), c.expected(s.expand({3, 4}), b));
    expectClose(runOp(c.op, {s, s}), c.expected(s, s));
  }
  {
    SCOPED_TRACE("integer tensors stay integer");
    expectEqual(runOp("dloss.add", {ia, ib}), longs({7, -4, 5}));
    expectEqual(runOp("dloss.sub", {ia, ib}), longs({3, -10, 13}));
    expectEqual(runOp("dloss.mul", {ia, longs({2}).reshape({})}),
                longs({10, -14, 18}));
  }
  {
    SCOPED_TRACE("eq is an indicator in the operand type");
    at::Tensor x = at::tensor({1.0f, 2.0f, 3.0f}),
               y = at::tensor({1.0f, 0.0f, 3.0f});
    expectEqual(runOp("dloss.eq", {x, y}), at::tensor({1.0f, 0.0f, 1.0f}));
    expectEqual(runOp("dloss.eq", {x, at::scalar_tensor(2.0f)}),
                at::tensor({0.0f, 1.0f, 0.0f}));
    expectEqual(runOp("dloss.eq", {ia, longs({5, 3, 9})}), longs({1, 0, 1}));
  }
  {
    SCOPED_TRACE("select picks per element; a 0-d value broadcasts");
    at::Tensor cond = longs({1, 0, 1}), x = at::tensor({1.0f, 2.0f, 3.0f}),
               y = at::tensor({4.0f, 5.0f, 6.0f});
    float inf = std::numeric_limits<float>::infinity();
    expectEqual(runOp("dloss.select", {cond, x, y}),
                at::tensor({1.0f, 5.0f, 3.0f}));
    expectEqual(runOp("dloss.select", {cond, at::scalar_tensor(-inf), y}),
                at::tensor({-inf, 5.0f, -inf}));
    std::string message = errorOf([&] {
      runOp("dloss.select", {cond, at::tensor({1.0f, 2.0f}), y});
    });
    EXPECT_NE(message.find("condition has shape [3] but a value has [2]"),
              std::string::npos)
        << message;
  }
  {
    SCOPED_TRACE("only 0-d operands broadcast");
    std::string message = errorOf([&] {
      runOp("dloss.add", {a, randn({1, 4})});
    });
    EXPECT_NE(message.find("[3, 4] and [1, 4] differ"), std::string::npos)
        << message;
    EXPECT_NE(message.find("op dloss.add at test.mlir:1:1"), std::string::npos)
        << message;
  }
}

TEST(KernelTest, UnaryFunctionsAndClamp) {
  at::manual_seed(2);
  at::Tensor x = randn({4, 5});
  at::Tensor positive = x.abs() + 0.1;
  at::Tensor unit = at::tanh(x);
  expectClose(runOp("dloss.neg", {x}), -x);
  expectClose(runOp("dloss.exp", {x}), at::exp(x));
  expectClose(runOp("dloss.log", {positive}), at::log(positive));
  expectClose(runOp("dloss.sqrt", {positive}), at::sqrt(positive));
  expectClose(runOp("dloss.sin", {x}), at::sin(x));
  expectClose(runOp("dloss.cos", {x}), at::cos(x));
  expectClose(runOp("dloss.acos", {unit}), at::acos(unit));
  expectClose(runOp("dloss.sigmoid", {x}), 1 / (1 + at::exp(-x)));
  expectEqual(runOp("dloss.zeros_like", {x}), at::zeros({4, 5}));
  expectEqual(runOp("dloss.zeros_like", {longs({1, 2})}), longs({0, 0}));
  {
    SCOPED_TRACE("clamp");
    expectClose(runOp("dloss.clamp", {x}, {realAttr("min", -0.5)}),
                at::clamp_min(x, -0.5));
    expectClose(runOp("dloss.clamp", {x}, {realAttr("max", 0.25)}),
                at::clamp_max(x, 0.25));
    at::Tensor both =
        runOp("dloss.clamp", {x},
              {realAttr("min", -0.9999999), realAttr("max", 0.9999999)});
    expectClose(both, at::clamp(x, -0.9999999, 0.9999999));
    EXPECT_LE(both.max().item<float>(), 0.9999999f);
    std::string message = errorOf([&] { runOp("dloss.clamp", {x}); });
    EXPECT_NE(message.find("neither 'min' nor 'max'"), std::string::npos)
        << message;
  }
}

// softplus, log_sigmoid and logsumexp at inputs where the naive formulas
// overflow or lose everything, against double-precision hand computations.
TEST(KernelTest, StableFunctionsAtExtremeInputs) {
  std::vector<double> xs = {-1000, -100, -30, -20, -1, 0, 1, 20, 30, 100, 1000};
  at::Tensor x64 = at::tensor(xs, at::TensorOptions(at::kDouble));
  at::Tensor x32 = x64.to(at::kFloat);
  std::vector<double> softplus, logSigmoid;
  for (double x : xs) {
    // log(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact in double.
    softplus.push_back(std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x))));
    logSigmoid.push_back(
        -(std::max(-x, 0.0) + std::log1p(std::exp(-std::abs(x)))));
  }
  at::Tensor sp = at::tensor(softplus, at::TensorOptions(at::kDouble));
  at::Tensor ls = at::tensor(logSigmoid, at::TensorOptions(at::kDouble));
  {
    SCOPED_TRACE("softplus");
    at::Tensor r64 = runOp("dloss.softplus", {x64});
    // Above 20 ATen returns x: 2.1e-9 absolute below the exact value.
    expectClose(r64, sp, 1e-12, 3e-9);
    // Tiny values keep their relative precision (no log(1 + tiny) = 0).
    EXPECT_NEAR(r64[2].item<double>() / sp[2].item<double>(), 1.0, 1e-12);
    at::Tensor r32 = runOp("dloss.softplus", {x32});
    EXPECT_TRUE(at::isfinite(r32).all().item<bool>()) << show(r32);
    expectClose(r32, sp.to(at::kFloat), 1e-6, 1e-30);
  }
  {
    SCOPED_TRACE("log_sigmoid");
    expectClose(runOp("dloss.log_sigmoid", {x64}), ls, 1e-12, 3e-9);
    at::Tensor r32 = runOp("dloss.log_sigmoid", {x32});
    EXPECT_TRUE(at::isfinite(r32).all().item<bool>()) << show(r32);
    expectClose(r32, ls.to(at::kFloat), 1e-6, 1e-30);
  }
  {
    SCOPED_TRACE("logsumexp");
    at::Tensor rows = at::tensor({1000.0f, 999.0f, -1000.0f, -1000.0f, -1001.0f,
                                  -1002.0f, 0.0f, 0.0f, 0.0f})
                          .reshape({3, 3});
    at::Tensor result = runOp("dloss.logsumexp", {rows}, {intAttr("axis", 1)});
    double a = 1000 + std::log1p(std::exp(-1.0) + std::exp(-2000.0));
    double b = -1000 + std::log(1 + std::exp(-1.0) + std::exp(-2.0));
    double c = std::log(3.0);
    expectClose(result,
                at::tensor({static_cast<float>(a), static_cast<float>(b),
                            static_cast<float>(c)}),
                1e-6, 1e-6);
    expectClose(runOp("dloss.logsumexp", {rows}, {intAttr("axis", -2)}),
                at::logsumexp(rows, {0}));
  }
}

TEST(KernelTest, MatmulAndL2Normalize) {
  at::manual_seed(3);
  at::Tensor a = randn({3, 5}), b = randn({5, 4});
  at::Tensor aT = a.t().contiguous(), bT = b.t().contiguous();
  at::Tensor expected = at::mm(a, b);
  expectClose(runOp("dloss.matmul", {a, b}), expected, 1e-5, 1e-5);
  expectClose(runOp("dloss.matmul", {aT, b}, {unitAttr("transpose_lhs")}),
              expected, 1e-5, 1e-5);
  expectClose(runOp("dloss.matmul", {a, bT}, {unitAttr("transpose_rhs")}),
              expected, 1e-5, 1e-5);
  expectClose(runOp("dloss.matmul", {aT, bT},
                    {unitAttr("transpose_lhs"), unitAttr("transpose_rhs")}),
              expected, 1e-5, 1e-5);
  std::string message = errorOf([&] { runOp("dloss.matmul", {a, a}); });
  EXPECT_NE(message.find("inner dimensions differ: [3, 5] x [3, 5]"),
            std::string::npos)
      << message;

  at::Tensor x = randn({4, 3});
  x[2].zero_(); // a zero row divides by eps, not by 0
  auto hand = [](const at::Tensor &v, int64_t axis, double eps) {
    return v / at::clamp_min((v * v).sum({axis}, true).sqrt(), eps);
  };
  at::Tensor rows = runOp("dloss.l2_normalize", {x}, {intAttr("axis", 1)});
  expectClose(rows, hand(x, 1, 1e-12));
  EXPECT_TRUE(at::isfinite(rows).all().item<bool>());
  expectClose(runOp("dloss.l2_normalize", {x},
                    {intAttr("axis", 0), realAttr("eps", 10.0)}),
              hand(x, 0, 10.0));
}

TEST(KernelTest, L2NormalizeGradIsAutogradsVjp) {
  // Both kernels (last axis: the row loop; axis 0: ATen) against autograd of
  // torch's normalize, with rows on either side of eps and a zero row.
  at::manual_seed(13);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    at::Tensor x = randn({6, 5}).to(dtype);
    x[1].zero_();
    x[3].mul_(0.01);
    at::Tensor g = randn({6, 5}).to(dtype);
    for (int64_t axis : {1, 0, -1}) {
      for (double eps : {1e-12, 0.5}) {
        at::Tensor leaf = x.clone().requires_grad_(true);
        at::Tensor y =
            at::div(leaf, at::clamp_min(at::norm(leaf, 2, {axis}, true), eps));
        at::Tensor expected =
            torch::autograd::grad({y}, {leaf}, {g}, false, false, true)[0];
        at::Tensor got = runOp("dloss.l2_normalize_grad", {g, x},
                               {intAttr("axis", axis), realAttr("eps", eps)});
        ASSERT_EQ(got.scalar_type(), dtype);
        // The zero row's autograd gradient is NaN (0/0 in the norm's); the
        // op's is g / eps there, as the IR's eps branch says.
        at::Tensor finite = at::isfinite(expected);
        EXPECT_TRUE(at::isfinite(got).all().item<bool>())
            << "axis " << axis << " eps " << eps;
        expectClose(at::where(finite, got, at::zeros_like(got)),
                    at::where(finite, expected, at::zeros_like(expected)), 1e-5,
                    1e-5);
      }
    }
  }
  std::string message = errorOf([&] {
    runOp("dloss.l2_normalize_grad", {randn({2, 3}), randn({3, 2})},
          {intAttr("axis", 1)});
  });
  EXPECT_NE(message.find("differ"), std::string::npos) << message;
}

TEST(KernelTest, Reductions) {
  at::manual_seed(4);
  at::Tensor x = randn({3, 4, 5});
  struct Case {
    const char *kind;
    at::Tensor (*expected)(const at::Tensor &, std::vector<int64_t>);
  };
  Case cases[] = {
      {"sum",
       [](const at::Tensor &v, std::vector<int64_t> d) { return v.sum(d); }},
      {"mean",
       [](const at::Tensor &v, std::vector<int64_t> d) { return v.mean(d); }},
      {"max",
       [](const at::Tensor &v, std::vector<int64_t> d) { return v.amax(d); }},
      {"min",
       [](const at::Tensor &v, std::vector<int64_t> d) { return v.amin(d); }},
  };
  std::vector<std::vector<int64_t>> axesList = {{0}, {1}, {0, 2}, {0, 1, 2}};
  for (const Case &c : cases) {
    for (const std::vector<int64_t> &axes : axesList) {
      SCOPED_TRACE(std::string(c.kind) + " over " +
                   std::to_string(axes.size()) + " axes");
      expectClose(runOp("dloss.reduce", {x},
                        {textAttr("kind", c.kind), intsAttr("axes", axes)}),
                  c.expected(x, axes), 1e-5, 1e-6);
    }
  }
  // Negative axes count from the end; no axes is the identity (where ATen
  // would reduce everything).
  expectClose(runOp("dloss.reduce", {x},
                    {textAttr("kind", "sum"), intsAttr("axes", {-1})}),
              x.sum({2}), 1e-5, 1e-6);
  expectEqual(runOp("dloss.reduce", {x},
                    {textAttr("kind", "sum"), intsAttr("axes", {})}),
              x);
  expectEqual(runOp("dloss.reduce", {longs({3, -1, 7})},
                    {textAttr("kind", "max"), intsAttr("axes", {0})}),
              longs({7}).reshape({}));
  // fp32 stays fp32, and accumulates well: 2^20 values of 0.1 sum to within
  // a few ulp of the double result (naive fp32 accumulation is off by 1%).
  at::Tensor many = at::full({1 << 20}, 0.1f);
  at::Tensor total = runOp("dloss.reduce", {many},
                           {textAttr("kind", "sum"), intsAttr("axes", {0})});
  EXPECT_EQ(total.scalar_type(), at::kFloat);
  EXPECT_NEAR(total.item<float>(), (1 << 20) * static_cast<double>(0.1f),
              (1 << 20) * 0.1 * 1e-5);
}

TEST(KernelTest, TakeAlongPutAlongAndCrossEntropy) {
  at::Tensor x = at::arange(12, at::TensorOptions(at::kFloat)).reshape({3, 4});
  at::Tensor idx = longs({2, 0, 3});
  expectEqual(runOp("dloss.take_along", {x, idx}, {intAttr("axis", 1)}),
              at::tensor({2.0f, 4.0f, 11.0f}));
  expectEqual(
      runOp("dloss.take_along", {x, longs({1, 2, 0, 1})}, {intAttr("axis", 0)}),
      at::tensor({4.0f, 9.0f, 2.0f, 7.0f}));
  expectEqual(
      runOp("dloss.take_along", {x, idx.to(at::kInt)}, {intAttr("axis", -1)}),
      at::tensor({2.0f, 4.0f, 11.0f}));

  at::Tensor values = at::tensor({-1.0f, -2.0f, -3.0f});
  at::Tensor copy = x.clone();
  at::Tensor put =
      runOp("dloss.put_along", {x, idx, values}, {intAttr("axis", 1)});
  at::Tensor expected = x.clone();
  expected[0][2] = -1.0f;
  expected[1][0] = -2.0f;
  expected[2][3] = -3.0f;
  expectEqual(put, expected);
  expectEqual(x, copy); // out of place
  at::Tensor putRows =
      runOp("dloss.put_along", {x, longs({0, 2, 1, 0}), at::zeros({4})},
            {intAttr("axis", 0)});
  at::Tensor expectedRows = x.clone();
  expectedRows[0][0] = 0;
  expectedRows[2][1] = 0;
  expectedRows[1][2] = 0;
  expectedRows[0][3] = 0;
  expectEqual(putRows, expectedRows);

  {
    SCOPED_TRACE("out-of-range and misshapen indices");
    // With x's columns static the preflight rejects the labels first
    // (ExecutorTest); unknown to the plan, the kernel's own check does.
    FunctionSpec dynamic = singleOpFunction(
        "dloss.take_along", {x, longs({0, 4, 1})}, {intAttr("axis", 1)});
    dynamic.args[0].shape = {-1, -1};
    auto comm = dloss::makeSingleProcessCommunicator();
    dloss::Executor executor(buildPlan({dynamic}), *comm);
    std::string message = errorOf([&] {
      executor.run("f", {x, longs({0, 4, 1})});
    });
    EXPECT_NE(message.find("index 4 is out of range [0, 4) along axis 1"),
              std::string::npos)
        << message;
    message = errorOf([&] {
      runOp("dloss.take_along", {x, longs({0, 1})}, {intAttr("axis", 1)});
    });
    EXPECT_NE(message.find("expected shape [3]"), std::string::npos) << message;
  }
  {
    SCOPED_TRACE("cross_entropy");
    at::manual_seed(5);
    at::Tensor logits = randn({6, 10}) * 30; // large logits: stability
    at::Tensor targets = longs({0, 9, 3, 3, 7, 1});
    at::Tensor reference = at::cross_entropy_loss(
        logits, targets, {}, at::Reduction::None, -100, 0.0);
    expectClose(
        runOp("dloss.cross_entropy", {logits, targets}, {intAttr("axis", 1)}),
        reference, 1e-5, 1e-4);
    at::Tensor l64 = logits.to(at::kDouble);
    expectClose(
        runOp("dloss.cross_entropy", {l64, targets}, {intAttr("axis", 1)}),
        at::cross_entropy_loss(l64, targets, {}, at::Reduction::None, -100,
                               0.0),
        1e-12, 1e-12);
    // Along axis 0: column-wise, as the other direction of CLIP's loss.
    expectClose(runOp("dloss.cross_entropy", {logits.t().contiguous(), targets},
                      {intAttr("axis", 0)}),
                reference, 1e-5, 1e-4);
  }
}

TEST(KernelTest, ShapeOps) {
  at::Tensor v = at::tensor({1.0f, 2.0f, 3.0f});
  {
    SCOPED_TRACE("expand");
    expectEqual(
        runOp("dloss.expand", {v, at::zeros({3, 2})}, {intsAttr("axes", {1})}),
        v.unsqueeze(1).expand({3, 2}));
    expectEqual(
        runOp("dloss.expand", {v, at::zeros({2, 3})}, {intsAttr("axes", {0})}),
        v.unsqueeze(0).expand({2, 3}));
    // Several axes, given out of order; `like` may have another dtype.
    at::Tensor got = runOp("dloss.expand", {v, at::zeros({2, 3, 4}, at::kLong)},
                           {intsAttr("axes", {2, 0})});
    expectEqual(got.contiguous(),
                v.reshape({1, 3, 1}).expand({2, 3, 4}).contiguous());
    at::Tensor s = at::scalar_tensor(5, at::kLong);
    expectEqual(runOp("dloss.expand", {s, at::zeros({2, 2})},
                      {intsAttr("axes", {0, 1})}),
                at::full({2, 2}, 5, at::kLong));
    std::string message = errorOf([&] {
      runOp("dloss.expand", {v, at::zeros({4, 2})}, {intsAttr("axes", {1})});
    });
    EXPECT_NE(message.find("does not fit 'like' of shape [4, 2]"),
              std::string::npos)
        << message;
  }
  at::Tensor m = at::arange(12, at::TensorOptions(at::kLong)).reshape({4, 3});
  {
    SCOPED_TRACE("slice");
    expectEqual(runOp("dloss.slice", {m, 1, 2}, {intAttr("axis", 0)}),
                m.narrow(0, 1, 2));
    expectEqual(runOp("dloss.slice", {m, 2, 1}, {intAttr("axis", 1)}),
                m.narrow(1, 2, 1));
    expectEqual(runOp("dloss.slice", {m, 4, 0}, {intAttr("axis", 0)}),
                m.narrow(0, 4, 0));
    std::string message = errorOf([&] {
      runOp("dloss.slice", {m, 3, 2}, {intAttr("axis", 0)});
    });
    EXPECT_NE(message.find("slice [3, 5) is outside axis 0 of size 4"),
              std::string::npos)
        << message;
  }
  {
    SCOPED_TRACE("pad");
    at::Tensor padded = runOp("dloss.pad", {m, 1, 2}, {intAttr("axis", 0)});
    at::Tensor expected = at::zeros({7, 3}, at::kLong);
    expected.narrow(0, 1, 4).copy_(m);
    expectEqual(padded, expected);
    at::Tensor cols = runOp("dloss.pad", {m, 0, 1}, {intAttr("axis", 1)});
    expectEqual(cols, at::cat({m, at::zeros({4, 1}, at::kLong)}, 1));
    // pad is the adjoint of slice: slicing the padding off gives m back.
    expectEqual(runOp("dloss.slice", {padded, 1, 4}, {intAttr("axis", 0)}), m);
    std::string message = errorOf([&] {
      runOp("dloss.pad", {m, -1, 0}, {intAttr("axis", 0)});
    });
    EXPECT_NE(message.find("negative padding"), std::string::npos) << message;
  }
  {
    SCOPED_TRACE("arange");
    expectEqual(runOp("dloss.arange", {5, 3}, {textAttr("dtype", "i64")}),
                longs({5, 6, 7}));
    expectEqual(runOp("dloss.arange", {-2, 4}, {textAttr("dtype", "f32")}),
                at::tensor({-2.0f, -1.0f, 0.0f, 1.0f}));
    expectEqual(runOp("dloss.arange", {7, 0},
                      {intAttr("dtype",
                               static_cast<int64_t>(dloss::plan::DType::i32))}),
                at::empty({0}, at::kInt));
    std::string message = errorOf([&] { runOp("dloss.arange", {0, 3}); });
    EXPECT_NE(
        message.find("missing dtype (result element type) attribute 'dtype'"),
        std::string::npos)
        << message;
  }
  {
    SCOPED_TRACE("cast");
    at::Tensor x = at::tensor({1.5f, -2.25f});
    expectEqual(runOp("dloss.cast", {x}, {textAttr("dtype", "bf16")}),
                x.to(at::kBFloat16));
    expectEqual(runOp("dloss.cast", {x}, {textAttr("dtype", "i32")}),
                x.to(at::kInt));
    expectEqual(runOp("dloss.cast", {int64_t(12)}, {textAttr("dtype", "f32")}),
                at::scalar_tensor(12.0f));
    expectEqual(runOp("dloss.cast", {int64_t(3)}, {textAttr("dtype", "f64")}),
                at::scalar_tensor(3.0, at::kDouble));
  }
}

TEST(KernelTest, Constants) {
  using dloss::test::FunctionSpec;
  auto runConstant = [](const AttrSpec &value) {
    FunctionSpec function;
    function.numRegisters = 1;
    function.results = {0};
    StepSpec step;
    step.op = "arith.constant";
    step.results = {0};
    step.attrs = {value};
    function.steps = {step};
    auto comm = dloss::makeSingleProcessCommunicator();
    dloss::Executor executor(buildPlan({function}), *comm);
    return executor.run("f", {})[0];
  };
  at::Tensor dense = at::tensor({1.0f, -2.0f, 3.5f, 0.0f}).reshape({2, 2});
  expectEqual(runConstant(constantAttr("value", dense)), dense);
  at::Tensor ints = longs({4, 5, 6});
  expectEqual(runConstant(constantAttr("value", ints)), ints);
  at::Tensor halves = at::tensor({0.5f, -1.0f}).to(at::kBFloat16);
  expectEqual(runConstant(constantAttr("value", halves)), halves);
  at::Tensor bools = at::tensor({1, 0, 1}, at::kLong).to(at::kBool);
  expectEqual(runConstant(constantAttr("value", bools)), bools);
  expectEqual(runConstant(splatAttr("value", at::scalar_tensor(-0.0f), {2, 3})),
              at::full({2, 3}, -0.0f));
  expectEqual(
      runConstant(splatAttr("value", at::scalar_tensor(7, at::kInt), {})),
      at::scalar_tensor(7, at::kInt));
  // An index constant (IntegerAttr) comes back as a 0-d int64 tensor.
  expectEqual(runConstant(intAttr("value", -42)),
              at::scalar_tensor(-42, at::kLong));
  AttrSpec shortData = constantAttr("value", dense);
  shortData.useRawBytes = true;
  shortData.rawBytes = {1, 2, 3};
  std::string message = errorOf([&] { runConstant(shortData); });
  EXPECT_NE(message.find("carries 3 bytes, expected 16"), std::string::npos)
      << message;
  EXPECT_NE(message.find("op arith.constant"), std::string::npos) << message;
}

/// One step's kernel run directly, as the executor would run it on a call
/// that computes on `device`: a device no CPU test can have (CUDA) is
/// stood in for by `meta`, which ATen creates tensors on without data.
class DeviceContext final : public dloss::KernelContext {
public:
  DeviceContext(std::vector<dloss::Value> operands, at::Device device)
      : operands(std::move(operands)), callDevice(device) {}
  dloss::Communicator &communicator() override { return *comm; }
  size_t numOperands() const override { return operands.size(); }
  const dloss::Value &operand(size_t i) const override {
    return operands.at(i);
  }
  void setResult(size_t i, dloss::Value value) override {
    results.resize(std::max(results.size(), i + 1));
    results[i] = std::move(value);
  }
  std::vector<int64_t> rankSizes(size_t, int64_t) override { return {}; }
  at::Device device() const override { return callDevice; }

  std::vector<dloss::Value> operands, results;

private:
  std::unique_ptr<dloss::Communicator> comm =
      dloss::makeSingleProcessCommunicator();
  at::Device callDevice;
};

/// The kernel of the first step of `function`'s plan, as the executor binds
/// it (once, for any number of calls).
dloss::BoundKernel bindFirstStep(const dloss::test::FunctionSpec &function) {
  auto plan = buildPlan({function});
  return dloss::bindKernel(*plan->plan().functions()->Get(0)->steps()->Get(0));
}

TEST(KernelTest, PlanMadeTensorsAreOnTheCallsDevice) {
  // Kernels that make a tensor from indices or attributes alone make it on
  // the call's device, where it meets the call's other tensors (an unfused
  // plan's labels gathered from CUDA logits, say); the executor's call
  // device is preflight::callDevice, its inputs'.
  using dloss::Value;
  for (at::Device device : {at::Device(at::kCPU), at::Device(at::kMeta)}) {
    SCOPED_TRACE(device.str());
    {
      SCOPED_TRACE("arange");
      DeviceContext context({Value::ofIndex(5), Value::ofIndex(3)}, device);
      bindFirstStep(
          singleOpFunction("dloss.arange", {5, 3}, {textAttr("dtype", "i64")}))
          .run(context);
      const at::Tensor &result = context.results.at(0).tensor();
      EXPECT_EQ(result.device(), device);
      EXPECT_EQ(result.sizes(), at::IntArrayRef({3}));
      if (device.is_cpu())
        expectEqual(result, longs({5, 6, 7}));
    }
    {
      SCOPED_TRACE("cast of an index");
      DeviceContext context({Value::ofIndex(12)}, device);
      bindFirstStep(singleOpFunction("dloss.cast", {int64_t(12)},
                                     {textAttr("dtype", "f32")}))
          .run(context);
      const at::Tensor &result = context.results.at(0).tensor();
      EXPECT_EQ(result.device(), device);
      if (device.is_cpu())
        expectEqual(result, at::scalar_tensor(12.0f));
    }
    for (bool splat : {false, true}) {
      SCOPED_TRACE(splat ? "splat constant" : "dense constant");
      dloss::test::FunctionSpec function;
      function.numRegisters = 1;
      function.results = {0};
      StepSpec step;
      step.op = "arith.constant";
      step.results = {0};
      at::Tensor dense = at::tensor({1.0f, -2.0f, 3.5f, 0.0f}).reshape({2, 2});
      step.attrs = {splat ? splatAttr("value", at::scalar_tensor(2.5f), {2, 2})
                          : constantAttr("value", dense)};
      function.steps = {step};
      // Twice: the second call takes the copy the first made.
      dloss::BoundKernel kernel = bindFirstStep(function);
      for (int call = 0; call < 2; ++call) {
        DeviceContext context({}, device);
        kernel.run(context);
        const at::Tensor &result = context.results.at(0).tensor();
        EXPECT_EQ(result.device(), device);
        EXPECT_EQ(result.sizes(), at::IntArrayRef({2, 2}));
        if (device.is_cpu())
          expectEqual(result, splat ? at::full({2, 2}, 2.5f) : dense);
      }
    }
  }
}

TEST(KernelTest, IndexArithmetic) {
  EXPECT_EQ(runIndexOp("arith.addi", {3, 4}), 7);
  EXPECT_EQ(runIndexOp("arith.subi", {3, 4}), -1);
  EXPECT_EQ(runIndexOp("arith.muli", {-3, 4}), -12);
  EXPECT_EQ(runIndexOp("arith.divsi", {7, 2}), 3);
  EXPECT_EQ(runIndexOp("arith.divsi", {-7, 2}), -3); // toward zero
  EXPECT_EQ(runIndexOp("arith.maxsi", {-3, 2}), 2);
  EXPECT_EQ(runIndexOp("arith.minsi", {-3, 2}), -3);
  EXPECT_EQ(runIndexOp("arith.index_cast", {9}), 9);
  std::string message = errorOf([] { runIndexOp("arith.divsi", {7, 0}); });
  EXPECT_NE(message.find("divides 7 by zero"), std::string::npos) << message;

  struct Case {
    const char *predicate;
    int64_t lhs, rhs;
    int64_t expected;
  };
  Case cases[] = {
      {"eq", 2, 2, 1},   {"ne", 2, 2, 0},   {"slt", -1, 0, 1},
      {"sle", 0, 0, 1},  {"sgt", -1, 0, 0}, {"sge", 0, -1, 1},
      {"ult", -1, 0, 0}, {"ule", 0, -1, 1}, {"ugt", -1, 0, 1},
      {"uge", 3, 4, 0},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.predicate);
    EXPECT_EQ(runIndexOp("arith.cmpi", {c.lhs, c.rhs},
                         {textAttr("predicate", c.predicate)}),
              c.expected);
  }
  EXPECT_EQ(runIndexOp("arith.select", {1, 10, 20}), 10);
  EXPECT_EQ(runIndexOp("arith.select", {0, 10, 20}), 20);
  message = errorOf([] {
    runIndexOp("arith.cmpi", {1, 2}, {textAttr("predicate", "lt")});
  });
  EXPECT_NE(message.find("unknown arith.cmpi predicate 'lt'"),
            std::string::npos)
      << message;
  message = errorOf([] { runOp("arith.addi", {at::ones({2}), 1}); });
  EXPECT_NE(message.find("operand 0 must be an index, but holds a tensor"),
            std::string::npos)
      << message;
}

// World size 1: rank facts and collectives on an argument (sizes known from
// the preflight) and on a computed value (sizes exchanged at the step).
TEST(KernelTest, RankFactsAndCollectivesOnOneRank) {
  at::manual_seed(6);
  at::Tensor x = randn({5, 3});
  EXPECT_EQ(runIndexOp("dloss.rank", {}), 0);
  EXPECT_EQ(runIndexOp("dloss.world_size", {}), 1);
  EXPECT_EQ(runIndexOp("dloss.dim", {x}, {intAttr("axis", 0)}), 5);
  EXPECT_EQ(runIndexOp("dloss.dim", {x}, {intAttr("axis", -1)}), 3);
  EXPECT_EQ(runIndexOp("dloss.shard_offset", {x}, {intAttr("axis", 0)}), 0);
  EXPECT_EQ(runIndexOp("dloss.global_size", {x}, {intAttr("axis", 0)}), 5);
  EXPECT_EQ(runIndexOp("dloss.global_size", {x}, {intAttr("axis", 1)}), 3);
  expectEqual(runOp("dloss.all_gather", {x},
                    {intAttr("axis", 0), textAttr("grad", "none")}),
              x);
  for (const char *kind : {"sum", "mean", "max", "min"}) {
    SCOPED_TRACE(kind);
    expectEqual(runOp("dloss.all_reduce", {x}, {textAttr("kind", kind)}), x);
  }
  expectEqual(runOp("dloss.reduce_scatter", {x, 5},
                    {textAttr("kind", "sum"), intAttr("axis", 0)}),
              x);
  expectEqual(runOp("dloss.reduce_scatter", {x},
                    {textAttr("kind", "sum"), intAttr("axis", 0)}),
              x);
  std::string message = errorOf([&] {
    runOp("dloss.reduce_scatter", {x, 4},
          {textAttr("kind", "sum"), intAttr("axis", 0)});
  });
  EXPECT_NE(message.find("slice sizes [4] add up to 4, not to the size 5"),
            std::string::npos)
      << message;
  expectEqual(runOp("dloss.broadcast", {x}, {intAttr("root", 0)}), x);
  message =
      errorOf([&] { runOp("dloss.broadcast", {x}, {intAttr("root", 1)}); });
  EXPECT_NE(message.find("broadcast root 1 is not a rank"), std::string::npos)
      << message;
  expectEqual(runOp("dloss.ring_shift", {x}, {intAttr("shift", 1)}), x);
  message = errorOf([&] {
    runOp("dloss.all_gather", {x},
          {intAttr("axis", 0), textAttr("grad", "all")});
  });
  EXPECT_NE(message.find("unknown all_gather grad 'all'"), std::string::npos)
      << message;

  // On a computed value: r1 = neg(x); global_size(r1), shard_offset(r1).
  FunctionSpec function;
  function.args = {tensorArg("x", x, {0})};
  function.numRegisters = 4;
  function.steps = {
      StepSpec{"dloss.neg", {0}, {1}, {}},
      StepSpec{"dloss.global_size", {1}, {2}, {intAttr("axis", 0)}},
      StepSpec{
          "dloss.shard_offset", {1}, {3}, {intAttr("axis", 0)}, "t:1:1", {1}},
  };
  function.results = {2, 3};
  auto comm = dloss::makeSingleProcessCommunicator();
  dloss::Executor executor(buildPlan({function}), *comm);
  std::vector<at::Tensor> results = executor.run("f", {x});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].item<int64_t>(), 5);
  EXPECT_EQ(results[1].item<int64_t>(), 0);
}

} // namespace
