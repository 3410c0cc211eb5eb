// The kernel table: every op the runtime runs, keyed by MLIR op name, with its
// operand and result counts; binding a step to its kernel.
//
// Operand and result counts are given here, op by op, in buildTable(): the
// generic rule builders (AtenKernels.h) fix them for the ops they build, the
// other rules take them as arguments.
#include "runtime/kernels/KernelTable.h"

#include "runtime/fused/FusedKernels.h"
#include "runtime/kernels/AtenKernels.h"
#include "runtime/support/Error.h"

#include <algorithm>

namespace dloss {

namespace {

using namespace aten;

[[noreturn]] void fail(std::string problem, std::string hint = {}) {
  throw Error(std::move(problem), std::move(hint));
}

std::unordered_map<std::string, KernelRule> buildTable() {
  std::unordered_map<std::string, KernelRule> table;
  // Element-wise.
  table.emplace("dloss.add",
                binaryRule([](const at::Tensor &a, const at::Tensor &b) {
                  return at::add(a, b);
                }));
  table.emplace("dloss.sub",
                binaryRule([](const at::Tensor &a, const at::Tensor &b) {
                  return at::sub(a, b);
                }));
  table.emplace("dloss.mul",
                binaryRule([](const at::Tensor &a, const at::Tensor &b) {
                  return at::mul(a, b);
                }));
  table.emplace("dloss.div",
                binaryRule([](const at::Tensor &a, const at::Tensor &b) {
                  return at::div(a, b);
                }));
  table.emplace("dloss.eq", binaryRule(eqIndicator));
  table.emplace("dloss.neg",
                unaryRule([](const at::Tensor &x) { return at::neg(x); }));
  table.emplace("dloss.exp",
                unaryRule([](const at::Tensor &x) { return at::exp(x); }));
  table.emplace("dloss.log",
                unaryRule([](const at::Tensor &x) { return at::log(x); }));
  table.emplace("dloss.sqrt",
                unaryRule([](const at::Tensor &x) { return at::sqrt(x); }));
  table.emplace("dloss.sin",
                unaryRule([](const at::Tensor &x) { return at::sin(x); }));
  table.emplace("dloss.cos",
                unaryRule([](const at::Tensor &x) { return at::cos(x); }));
  table.emplace("dloss.acos",
                unaryRule([](const at::Tensor &x) { return at::acos(x); }));
  table.emplace("dloss.sigmoid",
                unaryRule([](const at::Tensor &x) { return at::sigmoid(x); }));
  // ATen's softplus is exact below its threshold (log1p(exp(x))) and returns
  // x above 20, where the difference is < 2.1e-9 absolute. at::logaddexp
  // (1.13) loses exp(x) for x < -17 in fp32, so it is not used.
  table.emplace("dloss.softplus", unaryRule([](const at::Tensor &x) {
                  return at::softplus(x, /*beta=*/1, /*threshold=*/20);
                }));
  table.emplace("dloss.log_sigmoid", unaryRule([](const at::Tensor &x) {
                  return at::log_sigmoid(x);
                }));
  table.emplace("dloss.zeros_like", unaryRule([](const at::Tensor &x) {
                  return at::zeros_like(x, at::MemoryFormat::Contiguous);
                }));
  table.emplace("dloss.clamp", clampRule());
  table.emplace("dloss.cast", castRule());
  // Linear algebra, reductions, indexing.
  table.emplace("dloss.matmul", matmulRule());
  table.emplace("dloss.l2_normalize", l2NormalizeRule());
  table.emplace("dloss.reduce", reduceRule());
  table.emplace("dloss.logsumexp", axisRule(logsumexpKernel, 1));
  table.emplace("dloss.take_along", axisRule(takeAlongKernel, 2));
  table.emplace("dloss.put_along",
                withFlow(axisRule(putAlongKernel, 3), ShapeFlow::Operand0));
  table.emplace("dloss.cross_entropy", axisRule(crossEntropyKernel, 2));
  table.emplace("dloss.arange", arangeRule());
  table.emplace("dloss.expand", expandRule());
  table.emplace("dloss.slice", axisRule(sliceKernel, 3));
  table.emplace("dloss.pad", axisRule(padKernel, 3));
  // Rank facts.
  table.emplace("dloss.rank", plainRule(rankKernel, 0, 0));
  table.emplace("dloss.world_size", plainRule(worldSizeKernel, 0, 0));
  table.emplace("dloss.dim", axisRule(dimKernel, 1));
  table.emplace("dloss.shard_offset", axisRule(shardOffsetKernel, 1));
  table.emplace("dloss.global_size", axisRule(globalSizeKernel, 1));
  // Collectives.
  table.emplace("dloss.all_gather", allGatherRule());
  table.emplace("dloss.all_reduce", allReduceRule());
  table.emplace("dloss.reduce_scatter", reduceScatterRule());
  table.emplace("dloss.broadcast", broadcastRule());
  table.emplace("dloss.ring_shift", ringShiftRule());
  // arith: constants and index arithmetic.
  table.emplace("arith.constant", constantRule());
  table.emplace("arith.addi", indexBinaryRule(wrapAdd));
  table.emplace("arith.subi", indexBinaryRule(wrapSub));
  table.emplace("arith.muli", indexBinaryRule(wrapMul));
  table.emplace("arith.divsi", indexBinaryRule(divsi));
  table.emplace("arith.maxsi", indexBinaryRule([](int64_t a, int64_t b) {
                  return std::max(a, b);
                }));
  table.emplace("arith.minsi", indexBinaryRule([](int64_t a, int64_t b) {
                  return std::min(a, b);
                }));
  table.emplace("arith.cmpi", cmpiRule());
  table.emplace("arith.select", plainRule(selectKernel, 3, 3));
  table.emplace("arith.index_cast", plainRule(indexCastKernel, 1, 1));
  // Fused similarity ops (ring-tiled; runtime/fused/). The backward ops'
  // result 0 (d rows) has the shape of operand 0 (rows).
  auto fusedRule = [](void (*fn)(KernelContext &), int operands, int results,
                      ShapeFlow flow = ShapeFlow::None) {
    return KernelRule{[fn](const StepAttrs &) -> Kernel { return fn; },
                      operands, operands, results, flow};
  };
  table.emplace("dloss.ring_softmax_ce", fusedRule(fused::ringSoftmaxCE, 5, 4));
  table.emplace("dloss.ring_softmax_ce_grad",
                fusedRule(fused::ringSoftmaxCEGrad, 9, 3, ShapeFlow::Operand0));
  table.emplace("dloss.ring_sigmoid_pairs",
                fusedRule(fused::ringSigmoidPairs, 5, 2));
  table.emplace(
      "dloss.ring_sigmoid_pairs_grad",
      fusedRule(fused::ringSigmoidPairsGrad, 7, 4, ShapeFlow::Operand0));
  table.emplace("dloss.sharded_softmax",
                fusedRule(fused::shardedSoftmax, 4, 2));
  table.emplace(
      "dloss.sharded_softmax_grad",
      fusedRule(fused::shardedSoftmaxGrad, 7, 3, ShapeFlow::Operand0));
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
