// The ATen kernels of the plan's generic ops (element-wise, linear algebra,
// reductions, indexing, rank facts, collectives, index arithmetic).
//
// Semantics follow docs/DlossDialect.md; test/numeric/dloss_sim.py is the
// executable reference. Each rule parses its attributes once, when the
// executor binds the step, and returns a closure that only does the math.
#include "runtime/kernels/AtenKernels.h"

#include "runtime/kernels/DTypes.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

namespace dloss::aten {

namespace {

std::string describe(const at::Tensor &tensor) {
  std::string dtype = c10::toString(tensor.scalar_type());
  if (auto planType = toPlanDType(tensor.scalar_type()))
    dtype = dtypeName(*planType);
  return dtype + " tensor of shape " + shapeText(tensor.sizes());
}

/// `axis` of a `rank`-D tensor, negative values counting from the end.
int64_t normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail("axis " + std::to_string(axis) + " is out of range for a " +
             std::to_string(rank) + "-D operand",
         kPlanBugHint);
  return axis < 0 ? axis + rank : axis;
}

Reduction parseReduction(const std::string &kind) {
  if (std::optional<Reduction> op = reductionFromName(kind))
    return *op;
  fail("unknown reduction kind '" + kind + "' (expected sum, mean, max or min)",
       kPlanBugHint);
}

/// `sizes` without dimension `axis`.
std::vector<int64_t> dropAxis(at::IntArrayRef sizes, int64_t axis) {
  std::vector<int64_t> out(sizes.begin(), sizes.end());
  out.erase(out.begin() + axis);
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Rule builders
//===----------------------------------------------------------------------===//

KernelRule unaryRule(UnaryFn fn) {
  return {[fn](const StepAttrs &) -> Kernel {
            return [fn](KernelContext &ctx) {
              ctx.setResult(0, fn(ctx.tensor(0)));
            };
          },
          ShapeFlow::Operand0};
}

/// Element-wise binary ops: equal shapes, or one 0-d operand broadcast to
/// the other. General broadcasting is refused: it would hide plan bugs.
KernelRule binaryRule(BinaryFn fn) {
  return {[fn](const StepAttrs &) -> Kernel {
            return [fn](KernelContext &ctx) {
              const at::Tensor &lhs = ctx.tensor(0);
              const at::Tensor &rhs = ctx.tensor(1);
              if (lhs.dim() != 0 && rhs.dim() != 0 &&
                  lhs.sizes() != rhs.sizes())
                fail("operand shapes " + shapeText(lhs.sizes()) + " and " +
                         shapeText(rhs.sizes()) +
                         " differ (only a 0-d operand is broadcast)",
                     "Check the shapes of the function's inputs");
              ctx.setResult(0, fn(lhs, rhs));
            };
          },
          ShapeFlow::Elementwise};
}

/// dloss.select: the condition has the result's shape; each value has it too
/// or is 0-d (general broadcasting would hide plan bugs, as for binaryRule).
KernelRule selectValuesRule() {
  return {[](const StepAttrs &) -> Kernel {
            return [](KernelContext &ctx) {
              const at::Tensor &cond = ctx.tensor(0);
              for (size_t i : {1, 2}) {
                const at::Tensor &value = ctx.tensor(i);
                if (value.dim() != 0 && value.sizes() != cond.sizes())
                  fail("the condition has shape " + shapeText(cond.sizes()) +
                           " but a value has " + shapeText(value.sizes()) +
                           " (only a 0-d value is broadcast)",
                       "Check the shapes of the function's inputs");
              }
              ctx.setResult(
                  0, at::where(cond.ne(0), ctx.tensor(1), ctx.tensor(2)));
            };
          },
          ShapeFlow::Operand0};
}

/// A rule whose kernel needs nothing from the attributes.
KernelRule plainRule(void (*fn)(KernelContext &)) {
  return {[fn](const StepAttrs &) -> Kernel { return fn; }};
}

/// A rule with a single `axis` attribute, normalised against operand 0.
KernelRule axisRule(void (*fn)(KernelContext &, int64_t axis)) {
  return {[fn](const StepAttrs &attrs) -> Kernel {
    int64_t axis = attrs.integer("axis");
    return [fn, axis](KernelContext &ctx) {
      fn(ctx, normalizeAxis(axis, ctx.tensor(0).dim()));
    };
  }};
}

KernelRule withFlow(KernelRule rule, ShapeFlow flow) {
  rule.shapeFlow = flow;
  return rule;
}

KernelRule indexBinaryRule(IndexFn fn) {
  return {[fn](const StepAttrs &) -> Kernel {
    return [fn](KernelContext &ctx) {
      ctx.setResult(0, Value::ofIndex(fn(ctx.index(0), ctx.index(1))));
    };
  }};
}

// Index arithmetic wraps like MLIR's `index` type (two's complement), which
// unsigned arithmetic gives without undefined behaviour.
int64_t wrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) +
                              static_cast<uint64_t>(b));
}
int64_t wrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) -
                              static_cast<uint64_t>(b));
}
int64_t wrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) *
                              static_cast<uint64_t>(b));
}

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

size_t elementSize(plan::DType dtype) {
  switch (dtype) {
  case plan::DType::f16:
  case plan::DType::bf16:
  case plan::DType::i16:
    return 2;
  case plan::DType::f32:
  case plan::DType::i32:
    return 4;
  case plan::DType::f64:
  case plan::DType::i64:
    return 8;
  case plan::DType::i8:
  case plan::DType::u8:
  case plan::DType::boolean:
    return 1;
  }
  fail("unknown dtype code " + std::to_string(static_cast<int>(dtype)),
       kPlanBugHint);
}

/// The tensor of a dense constant. Built once, when the step is bound, and
/// shared by every call: tensors in registers are never written in place.
at::Tensor materializeConstant(const plan::Constant &constant) {
  std::vector<int64_t> shape;
  if (constant.shape())
    shape.assign(constant.shape()->begin(), constant.shape()->end());
  int64_t numel = 1;
  for (int64_t size : shape) {
    if (size < 0)
      fail("a constant has the dynamic shape " + shapeText(shape),
           kPlanBugHint);
    numel *= size;
  }
  at::ScalarType type = toScalarType(constant.dtype());
  size_t itemSize = elementSize(constant.dtype());
  size_t stored = constant.data() ? constant.data()->size() : 0;
  size_t expected = constant.splat() ? itemSize : numel * itemSize;
  if (stored != expected)
    fail("a " + dtypeName(constant.dtype()) + " constant of shape " +
             shapeText(shape) + (constant.splat() ? " (splat)" : "") +
             " carries " + std::to_string(stored) + " bytes, expected " +
             std::to_string(expected),
         kPlanBugHint);
  at::Tensor tensor;
  if (constant.splat()) {
    at::Tensor element = at::empty({}, at::TensorOptions(type));
    std::memcpy(element.data_ptr(), constant.data()->data(), itemSize);
    tensor = at::empty(shape, at::TensorOptions(type));
    tensor.copy_(element);
  } else {
    tensor = at::empty(shape, at::TensorOptions(type));
    if (expected)
      std::memcpy(tensor.data_ptr(), constant.data()->data(), expected);
  }
  return tensor;
}

/// A dense constant: made on the host when the step is bound, copied to a
/// call's device the first time a call computes there (a synchronous copy,
/// so it is complete on every stream), then shared by every later call.
class DeviceConstant {
public:
  explicit DeviceConstant(at::Tensor host) : host(std::move(host)) {}

  at::Tensor on(const at::Device &device) {
    if (device == host.device())
      return host;
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto &[where, copy] : copies)
      if (where == device)
        return copy;
    copies.emplace_back(device, host.to(device));
    return copies.back().second;
  }

private:
  at::Tensor host;
  std::mutex mutex;
  std::vector<std::pair<at::Device, at::Tensor>> copies;
};

KernelRule constantRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    const plan::Attr *value = attrs.find("value");
    if (!value)
      fail("arith.constant has no 'value' attribute", kPlanBugHint);
    if (value->kind() == plan::AttrKind::integer) {
      Value index = Value::ofIndex(value->i());
      return [index](KernelContext &ctx) { ctx.setResult(0, index); };
    }
    if (value->kind() == plan::AttrKind::constant && value->constant()) {
      auto constant = std::make_shared<DeviceConstant>(
          materializeConstant(*value->constant()));
      return [constant](KernelContext &ctx) {
        ctx.setResult(0, constant->on(ctx.device()));
      };
    }
    fail("arith.constant's 'value' is neither an integer nor a dense "
         "constant (only index, i1 and dense tensor constants run)",
         kPlanBugHint);
  }};
}

//===----------------------------------------------------------------------===//
// Index arithmetic (arith.*)
//===----------------------------------------------------------------------===//

using Predicate = bool (*)(int64_t, int64_t);

Predicate parsePredicate(const std::string &name) {
  static const std::unordered_map<std::string, Predicate> predicates = {
      {"eq", [](int64_t a, int64_t b) { return a == b; }},
      {"ne", [](int64_t a, int64_t b) { return a != b; }},
      {"slt", [](int64_t a, int64_t b) { return a < b; }},
      {"sle", [](int64_t a, int64_t b) { return a <= b; }},
      {"sgt", [](int64_t a, int64_t b) { return a > b; }},
      {"sge", [](int64_t a, int64_t b) { return a >= b; }},
      {"ult",
       [](int64_t a, int64_t b) {
         return static_cast<uint64_t>(a) < static_cast<uint64_t>(b);
       }},
      {"ule",
       [](int64_t a, int64_t b) {
         return static_cast<uint64_t>(a) <= static_cast<uint64_t>(b);
       }},
      {"ugt",
       [](int64_t a, int64_t b) {
         return static_cast<uint64_t>(a) > static_cast<uint64_t>(b);
       }},
      {"uge",
       [](int64_t a, int64_t b) {
         return static_cast<uint64_t>(a) >= static_cast<uint64_t>(b);
       }},
  };
  auto it = predicates.find(name);
  if (it == predicates.end())
    fail("unknown arith.cmpi predicate '" + name +
             "' (expected eq, ne, slt, sle, sgt, sge, ult, ule, ugt or uge)",
         kPlanBugHint);
  return it->second;
}

KernelRule cmpiRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    Predicate predicate = parsePredicate(attrs.text("predicate"));
    return [predicate](KernelContext &ctx) {
      ctx.setResult(0, Value::ofIndex(predicate(ctx.index(0), ctx.index(1))));
    };
  }};
}

void selectKernel(KernelContext &ctx) {
  // The condition is an i1 register; the chosen value may be of any kind.
  const Value &chosen = ctx.operand(ctx.index(0) != 0 ? 1 : 2);
  if (chosen.isEmpty())
    fail("arith.select chose a register that holds no value", kPlanBugHint);
  ctx.setResult(0, chosen);
}

void indexCastKernel(KernelContext &ctx) {
  // index <-> i64/i32 scalars share one 64-bit representation here.
  ctx.setResult(0, Value::ofIndex(ctx.index(0)));
}

int64_t divsi(int64_t a, int64_t b) {
  if (b == 0)
    fail("arith.divsi divides " + std::to_string(a) + " by zero",
         "Check the sizes the loss divides by (an empty shard?)");
  if (a == std::numeric_limits<int64_t>::min() && b == -1)
    fail("arith.divsi overflows (" + std::to_string(a) + " / -1)");
  return a / b; // C++ truncates toward zero, as divsi does.
}

//===----------------------------------------------------------------------===//
// Rank facts
//===----------------------------------------------------------------------===//

void rankKernel(KernelContext &ctx) {
  ctx.setResult(0, Value::ofIndex(ctx.communicator().rank()));
}

void worldSizeKernel(KernelContext &ctx) {
  ctx.setResult(0, Value::ofIndex(ctx.communicator().worldSize()));
}

void dimKernel(KernelContext &ctx, int64_t axis) {
  ctx.setResult(0, Value::ofIndex(ctx.tensor(0).size(axis)));
}

void shardOffsetKernel(KernelContext &ctx, int64_t axis) {
  std::vector<int64_t> sizes = ctx.rankSizes(0, axis);
  int rank = ctx.communicator().rank();
  ctx.setResult(0, Value::ofIndex(std::accumulate(
                       sizes.begin(), sizes.begin() + rank, int64_t(0))));
}

void globalSizeKernel(KernelContext &ctx, int64_t axis) {
  std::vector<int64_t> sizes = ctx.rankSizes(0, axis);
  ctx.setResult(0, Value::ofIndex(std::accumulate(sizes.begin(), sizes.end(),
                                                  int64_t(0))));
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

KernelRule allGatherRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    int64_t axis = attrs.integer("axis");
    // `grad` only changes the backward plan; check it is well formed.
    if (attrs.has("grad")) {
      std::string grad = attrs.text("grad");
      if (grad != "exact" && grad != "local" && grad != "none")
        fail("unknown all_gather grad '" + grad +
                 "' (expected exact, local or none)",
             kPlanBugHint);
    }
    return [axis](KernelContext &ctx) {
      const at::Tensor &input = ctx.tensor(0);
      int64_t dim = normalizeAxis(axis, input.dim());
      std::vector<int64_t> sizes = ctx.rankSizes(0, dim);
      ctx.setResult(
          0, ctx.communicator().allGather(input.contiguous(), dim, sizes));
    };
  }};
}

KernelRule allReduceRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
            Reduction kind = parseReduction(attrs.text("kind"));
            return [kind](KernelContext &ctx) {
              ctx.setResult(0, ctx.communicator().allReduce(
                                   ctx.tensor(0).contiguous(), kind));
            };
          },
          ShapeFlow::Operand0};
}

KernelRule reduceScatterRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    Reduction kind = parseReduction(attrs.text("kind"));
    int64_t axis = attrs.integer("axis");
    return [kind, axis](KernelContext &ctx) {
      const at::Tensor &input = ctx.tensor(0);
      int64_t dim = normalizeAxis(axis, input.dim());
      int64_t total = input.size(dim);
      Communicator &comm = ctx.communicator();
      int64_t worldSize = comm.worldSize();
      std::vector<int64_t> sizes;
      if (ctx.numOperands() == 2) {
        // Exchange before validating, so that every rank sees the same
        // sizes and raises the same error (none raises alone).
        sizes = comm.allGatherInts({ctx.index(1)});
      } else {
        if (total % worldSize != 0)
          fail("reduce_scatter without 'size' splits axis " +
                   std::to_string(dim) + " of size " + std::to_string(total) +
                   " evenly, but it does not "
                   "divide by " +
                   std::to_string(worldSize) + " ranks",
               "Give the op a 'size' operand (the per-rank sizes)");
        sizes.assign(worldSize, total / worldSize);
      }
      int64_t sum = 0;
      for (int64_t size : sizes) {
        if (size < 0)
          fail("reduce_scatter slice sizes " + shapeText(sizes) +
               " include a negative size");
        sum += size;
      }
      if (sum != total)
        fail("reduce_scatter slice sizes " + shapeText(sizes) + " add up to " +
                 std::to_string(sum) + ", not to the size " +
                 std::to_string(total) + " of axis " + std::to_string(dim),
             "The slices of all ranks must cover the axis exactly");
      ctx.setResult(0,
                    comm.reduceScatter(input.contiguous(), kind, dim, sizes));
    };
  }};
}

KernelRule broadcastRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
            int64_t root = attrs.integer("root");
            return [root](KernelContext &ctx) {
              int worldSize = ctx.communicator().worldSize();
              if (root < 0 || root >= worldSize)
                fail("broadcast root " + std::to_string(root) +
                         " is not a rank of this job (world size " +
                         std::to_string(worldSize) + ")",
                     "Run with more ranks or change the root");
              ctx.setResult(
                  0, ctx.communicator().broadcast(ctx.tensor(0).contiguous(),
                                                  static_cast<int>(root)));
            };
          },
          ShapeFlow::Operand0};
}

KernelRule ringShiftRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    int64_t shift = attrs.integer("shift");
    return [shift](KernelContext &ctx) {
      ctx.setResult(
          0, ctx.communicator().ringShift(ctx.tensor(0).contiguous(), shift));
    };
  }};
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

KernelRule castRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
            at::ScalarType type = attrs.resultType();
            return [type](KernelContext &ctx) {
              const Value &input = ctx.operand(0);
              if (input.isIndex())
                ctx.setResult(
                    0, at::scalar_tensor(
                           input.index(),
                           at::TensorOptions(type).device(ctx.device())));
              else
                ctx.setResult(0, ctx.tensor(0).to(type));
            };
          },
          ShapeFlow::Operand0};
}

KernelRule clampRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
            std::optional<double> lo = attrs.optionalReal("min");
            std::optional<double> hi = attrs.optionalReal("max");
            if (!lo && !hi)
              fail("dloss.clamp has neither 'min' nor 'max'", kPlanBugHint);
            // ATen takes c10::optional (not std::optional in LibTorch 1.13).
            c10::optional<at::Scalar> min, max;
            if (lo)
              min = *lo;
            if (hi)
              max = *hi;
            return [min, max](KernelContext &ctx) {
              ctx.setResult(0, at::clamp(ctx.tensor(0), min, max));
            };
          },
          ShapeFlow::Operand0};
}

KernelRule matmulRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    bool transposeLhs = attrs.flag("transpose_lhs");
    bool transposeRhs = attrs.flag("transpose_rhs");
    return [transposeLhs, transposeRhs](KernelContext &ctx) {
      at::Tensor lhs = ctx.tensor(0);
      at::Tensor rhs = ctx.tensor(1);
      if (lhs.dim() != 2 || rhs.dim() != 2)
        fail("matmul operands must be 2-D, got " + describe(lhs) + " and " +
             describe(rhs));
      // Transposed views: at::mm hands the strides to BLAS.
      if (transposeLhs)
        lhs = lhs.t();
      if (transposeRhs)
        rhs = rhs.t();
      if (lhs.size(1) != rhs.size(0))
        fail("matmul inner dimensions differ: " + shapeText(lhs.sizes()) +
                 " x " + shapeText(rhs.sizes()) + " (after transposition)",
             "Check the shapes of the function's inputs");
      ctx.setResult(0, at::mm(lhs, rhs));
    };
  }};
}

KernelRule l2NormalizeRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
            int64_t axis = attrs.integer("axis");
            // torch.nn.functional.normalize's default.
            double eps = attrs.optionalReal("eps").value_or(1e-12);
            return [axis, eps](KernelContext &ctx) {
              const at::Tensor &input = ctx.tensor(0);
              int64_t dim = normalizeAxis(axis, input.dim());
              // Exactly torch.nn.functional.normalize: x / max(||x||, eps).
              at::Tensor norm =
                  at::norm(input, 2, {dim}, /*keepdim=*/true).clamp_min(eps);
              ctx.setResult(0, input / norm);
            };
          },
          ShapeFlow::Operand0};
}

namespace {

/// l2_normalize's gradient along the last axis of contiguous rows: per row,
/// |x| and sum(g x) in one sweep (accumulated in double), then the result.
template <typename T>
void l2NormalizeGradRows(const T *g, const T *x, T *dx, int64_t rows,
                         int64_t width, double eps) {
  int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T *gr = g + r * width, *xr = x + r * width;
      T *out = dx + r * width;
      double squares = 0, dot = 0;
      for (int64_t i = 0; i < width; ++i) {
        squares += double(xr[i]) * double(xr[i]);
        dot += double(gr[i]) * double(xr[i]);
      }
      double norm = std::sqrt(squares);
      double n = std::max(norm, eps);
      // Where n follows |x|: s = sum(g y) = dot / n; below eps n is constant.
      T inv = T(1.0 / n);
      T along = norm >= eps ? T(dot / (n * n)) : T(0);
      for (int64_t i = 0; i < width; ++i)
        out[i] = (gr[i] - xr[i] * along) * inv;
    }
  });
}

} // namespace

KernelRule l2NormalizeGradRule() {
  return {
      [](const StepAttrs &attrs) -> Kernel {
        int64_t axis = attrs.integer("axis");
        double eps = attrs.optionalReal("eps").value_or(1e-12);
        return [axis, eps](KernelContext &ctx) {
          const at::Tensor &grad = ctx.tensor(0);
          const at::Tensor &input = ctx.tensor(1);
          int64_t dim = normalizeAxis(axis, input.dim());
          if (grad.sizes() != input.sizes() ||
              grad.scalar_type() != input.scalar_type())
            fail("dloss.l2_normalize_grad: the gradient (" + describe(grad) +
                     ") and the input (" + describe(input) + ") differ",
                 kPlanBugHint);
          auto type = input.scalar_type();
          if (dim == input.dim() - 1 && input.device().is_cpu() &&
              (type == at::kFloat || type == at::kDouble)) {
            at::Tensor g = grad.contiguous(), x = input.contiguous();
            at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
            int64_t width = x.dim() ? x.size(-1) : 1;
            int64_t rows = width ? x.numel() / width : 0;
            if (type == at::kFloat)
              l2NormalizeGradRows(g.data_ptr<float>(), x.data_ptr<float>(),
                                  dx.data_ptr<float>(), rows, width, eps);
            else
              l2NormalizeGradRows(g.data_ptr<double>(), x.data_ptr<double>(),
                                  dx.data_ptr<double>(), rows, width, eps);
            ctx.setResult(0, dx);
            return;
          }
          // Other axes, half types, devices: the same arithmetic in ATen.
          at::Tensor norm = at::norm(input, 2, {dim}, /*keepdim=*/true);
          at::Tensor n = norm.clamp_min(eps);
          at::Tensor y = input / n;
          at::Tensor along = (grad * y).sum(dim, /*keepdim=*/true) *
                             norm.ge(eps).to(input.scalar_type());
          ctx.setResult(0, (grad - y * along) / n);
        };
      },
      ShapeFlow::Operand0};
}

KernelRule reduceRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    Reduction kind = parseReduction(attrs.text("kind"));
    std::vector<int64_t> axes = attrs.integers("axes");
    return [kind, axes](KernelContext &ctx) {
      const at::Tensor &input = ctx.tensor(0);
      std::vector<int64_t> dims;
      for (int64_t axis : axes)
        dims.push_back(normalizeAxis(axis, input.dim()));
      // ATen reads an empty dim list as "all dims"; dloss means none.
      if (dims.empty()) {
        ctx.setResult(0, input);
        return;
      }
      switch (kind) {
      case Reduction::Sum:
        ctx.setResult(0, at::sum(input, dims));
        return;
      case Reduction::Mean:
        ctx.setResult(0, at::mean(input, dims));
        return;
      case Reduction::Max:
        ctx.setResult(0, at::amax(input, dims));
        return;
      case Reduction::Min:
        ctx.setResult(0, at::amin(input, dims));
        return;
      }
    };
  }};
}

void logsumexpKernel(KernelContext &ctx, int64_t axis) {
  ctx.setResult(0, at::logsumexp(ctx.tensor(0), {axis}, /*keepdim=*/false));
}

/// Checks that `indices` has `input`'s shape without `axis` and selects
/// within it, and returns them as int64 (what gather/scatter take).
at::Tensor checkedIndices(const at::Tensor &input, const at::Tensor &indices,
                          int64_t axis) {
  if (at::isFloatingType(indices.scalar_type()) ||
      indices.scalar_type() == at::kBool)
    fail("indices must be integers, got a " + describe(indices));
  std::vector<int64_t> expected = dropAxis(input.sizes(), axis);
  if (indices.sizes() != at::IntArrayRef(expected))
    fail("indices of shape " + shapeText(indices.sizes()) +
             " do not fit an input of shape " + shapeText(input.sizes()) +
             " along axis " + std::to_string(axis) + " (expected shape " +
             shapeText(expected) + ")",
         "Pass one target per row");
  at::Tensor longIndices = indices.to(at::kLong);
  // ATen's own bounds error names no axis; this check costs two small
  // reductions (and a host sync once kernels run on GPUs).
  if (longIndices.numel() > 0) {
    int64_t lo = longIndices.min().item<int64_t>();
    int64_t hi = longIndices.max().item<int64_t>();
    int64_t size = input.size(axis);
    if (lo < 0 || hi >= size)
      fail("index " + std::to_string(lo < 0 ? lo : hi) +
               " is out of range [0, " + std::to_string(size) +
               ") along axis " + std::to_string(axis),
           "Check the targets (labels) passed to the loss");
  }
  return longIndices;
}

at::Tensor takeAlong(const at::Tensor &input, const at::Tensor &indices,
                     int64_t axis) {
  at::Tensor index = checkedIndices(input, indices, axis).unsqueeze(axis);
  return at::gather(input, axis, index).squeeze(axis);
}

void takeAlongKernel(KernelContext &ctx, int64_t axis) {
  ctx.setResult(0, takeAlong(ctx.tensor(0), ctx.tensor(1), axis));
}

void putAlongKernel(KernelContext &ctx, int64_t axis) {
  const at::Tensor &input = ctx.tensor(0);
  const at::Tensor &values = ctx.tensor(2);
  at::Tensor index = checkedIndices(input, ctx.tensor(1), axis);
  if (values.sizes() != index.sizes())
    fail("put_along values of shape " + shapeText(values.sizes()) +
         " do not match its indices of shape " + shapeText(index.sizes()));
  // Out of place: the input register may still be read later.
  ctx.setResult(0, at::scatter(input, axis, index.unsqueeze(axis),
                               values.to(input.scalar_type()).unsqueeze(axis)));
}

void crossEntropyKernel(KernelContext &ctx, int64_t axis) {
  const at::Tensor &logits = ctx.tensor(0);
  at::Tensor target = takeAlong(logits, ctx.tensor(1), axis);
  ctx.setResult(0, at::logsumexp(logits, {axis}, /*keepdim=*/false) - target);
}

KernelRule arangeRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    at::ScalarType type = attrs.resultType();
    return [type](KernelContext &ctx) {
      int64_t start = ctx.index(0);
      int64_t count = ctx.index(1);
      if (count < 0)
        fail("arange with a negative count " + std::to_string(count));
      // Counted in int64 so the length is exact whatever the dtype.
      at::Tensor values =
          at::arange(start, start + count,
                     at::TensorOptions(at::kLong).device(ctx.device()));
      ctx.setResult(0, values.to(type));
    };
  }};
}

KernelRule expandRule() {
  return {[](const StepAttrs &attrs) -> Kernel {
    std::vector<int64_t> axes = attrs.integers("axes");
    return [axes](KernelContext &ctx) {
      at::Tensor input = ctx.tensor(0);
      const at::Tensor &like = ctx.tensor(1);
      int64_t rank = input.dim() + static_cast<int64_t>(axes.size());
      if (like.dim() != rank)
        fail("expand of a " + describe(input) + " along " +
             std::to_string(axes.size()) +
             " new axes cannot take the "
             "shape " +
             shapeText(like.sizes()));
      std::vector<int64_t> dims;
      for (int64_t axis : axes)
        dims.push_back(normalizeAxis(axis, rank));
      std::sort(dims.begin(), dims.end());
      if (std::adjacent_find(dims.begin(), dims.end()) != dims.end())
        fail("expand axes " + shapeText(axes) + " repeat an axis",
             kPlanBugHint);
      // Inserting in increasing order puts each at its final place.
      for (int64_t dim : dims)
        input = input.unsqueeze(dim);
      for (int64_t d = 0; d < rank; ++d)
        if (!std::binary_search(dims.begin(), dims.end(), d) &&
            input.size(d) != like.size(d))
          fail("expand: input of shape " + shapeText(ctx.tensor(0).sizes()) +
                   " does not fit 'like' of shape " + shapeText(like.sizes()) +
                   " without axes " + shapeText(axes),
               "Check the shapes of the function's inputs");
      // A stride-0 view: repeating costs no memory.
      ctx.setResult(0, input.expand(like.sizes()));
    };
  }};
}

void sliceKernel(KernelContext &ctx, int64_t axis) {
  const at::Tensor &input = ctx.tensor(0);
  int64_t offset = ctx.index(1);
  int64_t size = ctx.index(2);
  int64_t extent = input.size(axis);
  if (offset < 0 || size < 0 || offset > extent - size)
    fail("slice [" + std::to_string(offset) + ", " +
             std::to_string(offset + size) + ") is outside axis " +
             std::to_string(axis) + " of size " + std::to_string(extent),
         "Check the per-rank sizes the slice is computed from");
  if (size == extent) {
    ctx.setResult(0, input);
    return;
  }
  // Copied, not a view: a view would keep the whole (often gathered) input
  // alive after its register is freed.
  ctx.setResult(0, input.narrow(axis, offset, size).clone());
}

void padKernel(KernelContext &ctx, int64_t axis) {
  const at::Tensor &input = ctx.tensor(0);
  int64_t low = ctx.index(1);
  int64_t high = ctx.index(2);
  if (low < 0 || high < 0)
    fail("pad with negative padding low=" + std::to_string(low) +
         " high=" + std::to_string(high));
  // constant_pad_nd lists (low, high) pairs from the last dimension back.
  std::vector<int64_t> pad(2 * (input.dim() - axis), 0);
  pad[pad.size() - 2] = low;
  pad[pad.size() - 1] = high;
  ctx.setResult(0, at::constant_pad_nd(input, pad, 0));
}

at::Tensor eqIndicator(const at::Tensor &lhs, const at::Tensor &rhs) {
  // An indicator in the operands' type, not a boolean (see the op's doc).
  return at::eq(lhs, rhs).to(at::result_type(lhs, rhs));
}

} // namespace dloss::aten
