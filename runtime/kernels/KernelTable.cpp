// The kernel table: every op the runtime runs, keyed by MLIR op name, with its
// arity; bindKernel looks a step up in it.
//
// Every op's operand and result counts are written here, in buildTable(),
// one {min operands, max operands, results} per op; the rules (AtenKernels.h,
// fused/FusedKernels.h) only bind kernels to attributes.
#include "runtime/kernels/KernelTable.h"

#include "runtime/fused/FusedKernels.h"
#include "runtime/kernels/AtenKernels.h"
#include "runtime/support/Error.h"

#include <algorithm>

namespace dloss {

namespace {

using namespace aten;

std::unordered_map<std::string, KernelRule> buildTable() {
  std::unordered_map<std::string, KernelRule> table;
  // Every op's {min operands, max operands, results}, checked by bindKernel
  // before its rule runs.
  auto add = [&table](const char *op, Arity arity, KernelBinding binding) {
    table.emplace(op, KernelRule{std::move(binding.bind), arity.minOperands,
                                 arity.maxOperands, arity.numResults,
                                 binding.shapeFlow});
  };
  // Element-wise.
  add("dloss.add", {2, 2, 1},
      binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::add(a, b);
      }));
  add("dloss.sub", {2, 2, 1},
      binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::sub(a, b);
      }));
  add("dloss.mul", {2, 2, 1},
      binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::mul(a, b);
      }));
  add("dloss.div", {2, 2, 1},
      binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::div(a, b);
      }));
  add("dloss.eq", {2, 2, 1}, binaryRule(eqIndicator));
  add("dloss.neg", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::neg(x); }));
  add("dloss.exp", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::exp(x); }));
  add("dloss.log", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::log(x); }));
  add("dloss.sqrt", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::sqrt(x); }));
  add("dloss.sin", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::sin(x); }));
  add("dloss.cos", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::cos(x); }));
  add("dloss.acos", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::acos(x); }));
  add("dloss.sigmoid", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::sigmoid(x); }));
  // ATen's softplus is exact below its threshold (log1p(exp(x))) and returns
  // x above 20, where the difference is < 2.1e-9 absolute. at::logaddexp
  // (1.13) loses exp(x) for x < -17 in fp32, so it is not used.
  add("dloss.softplus", {1, 1, 1}, unaryRule([](const at::Tensor &x) {
        return at::softplus(x, /*beta=*/1, /*threshold=*/20);
      }));
  add("dloss.log_sigmoid", {1, 1, 1},
      unaryRule([](const at::Tensor &x) { return at::log_sigmoid(x); }));
  add("dloss.zeros_like", {1, 1, 1}, unaryRule([](const at::Tensor &x) {
        return at::zeros_like(x, at::MemoryFormat::Contiguous);
      }));
  add("dloss.clamp", {1, 1, 1}, clampRule());
  add("dloss.cast", {1, 1, 1}, castRule());
  // Linear algebra, reductions, indexing.
  add("dloss.matmul", {2, 2, 1}, matmulRule());
  add("dloss.l2_normalize", {1, 1, 1}, l2NormalizeRule());
  add("dloss.reduce", {1, 1, 1}, reduceRule());
  add("dloss.logsumexp", {1, 1, 1}, axisRule(logsumexpKernel));
  add("dloss.take_along", {2, 2, 1}, axisRule(takeAlongKernel));
  add("dloss.put_along", {3, 3, 1},
      withFlow(axisRule(putAlongKernel), ShapeFlow::Operand0));
  add("dloss.cross_entropy", {2, 2, 1}, axisRule(crossEntropyKernel));
  add("dloss.arange", {2, 2, 1}, arangeRule());
  add("dloss.expand", {2, 2, 1}, expandRule());
  add("dloss.slice", {3, 3, 1}, axisRule(sliceKernel));
  add("dloss.pad", {3, 3, 1}, axisRule(padKernel));
  // Rank facts.
  add("dloss.rank", {0, 0, 1}, plainRule(rankKernel));
  add("dloss.world_size", {0, 0, 1}, plainRule(worldSizeKernel));
  add("dloss.dim", {1, 1, 1}, axisRule(dimKernel));
  add("dloss.shard_offset", {1, 1, 1}, axisRule(shardOffsetKernel));
  add("dloss.global_size", {1, 1, 1}, axisRule(globalSizeKernel));
  // Collectives.
  add("dloss.all_gather", {1, 1, 1}, allGatherRule());
  add("dloss.all_reduce", {1, 1, 1}, allReduceRule());
  add("dloss.reduce_scatter", {1, 2, 1}, reduceScatterRule());
  add("dloss.broadcast", {1, 1, 1}, broadcastRule());
  add("dloss.ring_shift", {1, 1, 1}, ringShiftRule());
  // arith: constants and index arithmetic.
  add("arith.constant", {0, 0, 1}, constantRule());
  add("arith.addi", {2, 2, 1}, indexBinaryRule(wrapAdd));
  add("arith.subi", {2, 2, 1}, indexBinaryRule(wrapSub));
  add("arith.muli", {2, 2, 1}, indexBinaryRule(wrapMul));
  add("arith.divsi", {2, 2, 1}, indexBinaryRule(divsi));
  add("arith.maxsi", {2, 2, 1},
      indexBinaryRule([](int64_t a, int64_t b) { return std::max(a, b); }));
  add("arith.minsi", {2, 2, 1},
      indexBinaryRule([](int64_t a, int64_t b) { return std::min(a, b); }));
  add("arith.cmpi", {2, 2, 1}, cmpiRule());
  add("arith.select", {3, 3, 1}, plainRule(selectKernel));
  add("arith.index_cast", {1, 1, 1}, plainRule(indexCastKernel));
  // Fused similarity ops (ring-tiled; runtime/fused/). The backward ops'
  // result 0 (d rows) has the shape of operand 0 (rows).
  auto fusedBinding = [](void (*fn)(KernelContext &),
                         ShapeFlow flow = ShapeFlow::None) {
    return KernelBinding{[fn](const StepAttrs &) -> Kernel { return fn; },
                         flow};
  };
  add("dloss.ring_softmax_ce", {5, 5, 4}, fusedBinding(fused::ringSoftmaxCE));
  add("dloss.ring_softmax_ce_grad", {9, 9, 3},
      fusedBinding(fused::ringSoftmaxCEGrad, ShapeFlow::Operand0));
  add("dloss.ring_sigmoid_pairs", {5, 5, 2},
      fusedBinding(fused::ringSigmoidPairs));
  add("dloss.ring_sigmoid_pairs_grad", {7, 7, 4},
      fusedBinding(fused::ringSigmoidPairsGrad, ShapeFlow::Operand0));
  add("dloss.sharded_softmax", {4, 4, 2}, fusedBinding(fused::shardedSoftmax));
  add("dloss.sharded_softmax_grad", {7, 7, 3},
      fusedBinding(fused::shardedSoftmaxGrad, ShapeFlow::Operand0));
  return table;
}

} // namespace

const std::unordered_map<std::string, KernelRule> &kernelTable() {
  static const std::unordered_map<std::string, KernelRule> table = buildTable();
  return table;
}

BoundKernel bindKernel(const plan::Step &step) {
  std::string op = step.op()->str();
  std::string loc = step.loc() ? step.loc()->str() : std::string();
  const auto &table = kernelTable();
  auto it = table.find(op);
  if (it == table.end())
    throw Error("the runtime does not support op '" + op + "' yet",
                "Report it, or rewrite the loss without this op")
        .withOp(op)
        .withLocation(loc);
  const KernelRule &rule = it->second;
  int operands =
      step.operands() ? static_cast<int>(step.operands()->size()) : 0;
  int results = step.results() ? static_cast<int>(step.results()->size()) : 0;
  try {
    if (operands < rule.minOperands || operands > rule.maxOperands)
      fail("the step has " + std::to_string(operands) + " operands, expected " +
               (rule.minOperands == rule.maxOperands
                    ? std::to_string(rule.minOperands)
                    : std::to_string(rule.minOperands) + " to " +
                          std::to_string(rule.maxOperands)),
           kPlanBugHint);
    if (results != rule.numResults)
      fail("the step has " + std::to_string(results) + " results, expected " +
               std::to_string(rule.numResults),
           kPlanBugHint);
    return BoundKernel{rule.bind(StepAttrs(step)), rule.shapeFlow};
  } catch (const Error &error) {
    throw error.withOp(op).withLocation(loc);
  } catch (const c10::Error &error) {
    throw Error(error.what_without_backtrace(), kPlanBugHint)
        .withOp(op)
        .withLocation(loc);
  }
}

} // namespace dloss
