// The kernel table: every op the runtime runs, keyed by MLIR op name;
// bindKernel checks a step against its op's spec, then binds it.
//
// The rules (AtenKernels.h, fused/FusedKernels.h) only bind kernels to
// attributes. Operand and result counts and attribute kinds come from the
// ops' ODS definitions (OpTable.h, generated), never typed in here.
#include "runtime/kernels/KernelTable.h"

#include "runtime/fused/FusedKernels.h"
#include "runtime/kernels/AtenKernels.h"
#include "runtime/kernels/OpTable.h"
#include "runtime/support/Error.h"

#include <algorithm>

namespace dloss {

namespace {

using namespace aten;

std::unordered_map<std::string, KernelRule> buildTable() {
  std::unordered_map<std::string, KernelRule> table;
  auto add = [&table](const char *op, KernelRule rule) {
    table.emplace(op, std::move(rule));
  };
  // Element-wise.
  add("dloss.add", binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::add(a, b);
      }));
  add("dloss.sub", binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::sub(a, b);
      }));
  add("dloss.mul", binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::mul(a, b);
      }));
  add("dloss.div", binaryRule([](const at::Tensor &a, const at::Tensor &b) {
        return at::div(a, b);
      }));
  add("dloss.eq", binaryRule(eqIndicator));
  add("dloss.select", selectValuesRule());
  add("dloss.neg", unaryRule([](const at::Tensor &x) { return at::neg(x); }));
  // The value passes unchanged; its gradient is the compiler's business.
  add("dloss.stop_gradient", unaryRule([](const at::Tensor &x) { return x; }));
  add("dloss.exp", unaryRule([](const at::Tensor &x) { return at::exp(x); }));
  add("dloss.log", unaryRule([](const at::Tensor &x) { return at::log(x); }));
  add("dloss.sqrt", unaryRule([](const at::Tensor &x) { return at::sqrt(x); }));
  add("dloss.sin", unaryRule([](const at::Tensor &x) { return at::sin(x); }));
  add("dloss.cos", unaryRule([](const at::Tensor &x) { return at::cos(x); }));
  add("dloss.acos", unaryRule([](const at::Tensor &x) { return at::acos(x); }));
  add("dloss.sigmoid",
      unaryRule([](const at::Tensor &x) { return at::sigmoid(x); }));
  // ATen's softplus is exact below its threshold (log1p(exp(x))) and returns
  // x above 20, where the difference is < 2.1e-9 absolute. at::logaddexp
  // (1.13) loses exp(x) for x < -17 in fp32, so it is not used.
  add("dloss.softplus", unaryRule([](const at::Tensor &x) {
        return at::softplus(x, /*beta=*/1, /*threshold=*/20);
      }));
  add("dloss.log_sigmoid",
      unaryRule([](const at::Tensor &x) { return at::log_sigmoid(x); }));
  add("dloss.zeros_like", unaryRule([](const at::Tensor &x) {
        return at::zeros_like(x, at::MemoryFormat::Contiguous);
      }));
  add("dloss.clamp", clampRule());
  add("dloss.cast", castRule());
  // Linear algebra, reductions, indexing.
  add("dloss.matmul", matmulRule());
  add("dloss.l2_normalize", l2NormalizeRule());
  add("dloss.l2_normalize_grad", l2NormalizeGradRule());
  add("dloss.reduce", reduceRule());
  add("dloss.logsumexp", axisRule(logsumexpKernel));
  add("dloss.take_along", axisRule(takeAlongKernel));
  add("dloss.put_along",
      withFlow(axisRule(putAlongKernel), ShapeFlow::Operand0));
  add("dloss.cross_entropy", axisRule(crossEntropyKernel));
  add("dloss.arange", arangeRule());
  add("dloss.expand", expandRule());
  add("dloss.slice", axisRule(sliceKernel));
  add("dloss.pad", axisRule(padKernel));
  // Rank facts.
  add("dloss.rank", plainRule(rankKernel));
  add("dloss.world_size", plainRule(worldSizeKernel));
  add("dloss.dim", axisRule(dimKernel));
  add("dloss.shard_offset", axisRule(shardOffsetKernel));
  add("dloss.global_size", axisRule(globalSizeKernel));
  // Collectives.
  add("dloss.all_gather", allGatherRule());
  add("dloss.all_reduce", allReduceRule());
  add("dloss.reduce_scatter", reduceScatterRule());
  add("dloss.broadcast", broadcastRule());
  add("dloss.ring_shift", ringShiftRule());
  // arith: constants and index arithmetic.
  add("arith.constant", constantRule());
  add("arith.addi", indexBinaryRule(wrapAdd));
  add("arith.subi", indexBinaryRule(wrapSub));
  add("arith.muli", indexBinaryRule(wrapMul));
  add("arith.divsi", indexBinaryRule(divsi));
  add("arith.maxsi",
      indexBinaryRule([](int64_t a, int64_t b) { return std::max(a, b); }));
  add("arith.minsi",
      indexBinaryRule([](int64_t a, int64_t b) { return std::min(a, b); }));
  add("arith.cmpi", cmpiRule());
  add("arith.select", plainRule(selectKernel));
  add("arith.index_cast", plainRule(indexCastKernel));
  // Fused similarity ops (ring-tiled; runtime/fused/). The backward ops'
  // result 0 (d rows) has the shape of operand 0 (rows).
  auto fusedBinding = [](void (*fn)(KernelContext &),
                         ShapeFlow flow = ShapeFlow::None,
                         std::vector<int> fold = {}) {
    return KernelRule{[fn](const StepAttrs &) -> Kernel { return fn; }, flow,
                      std::move(fold)};
  };
  // CLIP's and SigLIP's gathers take the rows (operand 0) and columns (1):
  // the gather of both sides, and SigLIP's backward after its forward.
  add("dloss.ring_softmax_ce",
      fusedBinding(fused::ringSoftmaxCE, ShapeFlow::None, {0, 1}));
  add("dloss.ring_softmax_ce_grad",
      fusedBinding(fused::ringSoftmaxCEGrad, ShapeFlow::Operand0));
  add("dloss.ring_sigmoid_pairs",
      fusedBinding(fused::ringSigmoidPairs, ShapeFlow::None, {0, 1}));
  add("dloss.ring_sigmoid_pairs_grad",
      fusedBinding(fused::ringSigmoidPairsGrad, ShapeFlow::Operand0));
  add("dloss.sharded_softmax", fusedBinding(fused::shardedSoftmax));
  add("dloss.sharded_softmax_grad",
      fusedBinding(fused::shardedSoftmaxGrad, ShapeFlow::Operand0));
  // The general fused op: its tile program is checked against the operands
  // when it runs (the leaf counts follow from them).
  auto similarityBinding = [](void (*fn)(KernelContext &,
                                         const fused::SimilarityProgram &),
                              ShapeFlow flow = ShapeFlow::None) {
    return KernelRule{[fn](const StepAttrs &attrs) -> Kernel {
                        fused::SimilarityProgram program;
                        program.rowLeaves = attrs.integer("row_leaves");
                        program.colLeaves = attrs.integer("col_leaves");
                        program.program = attrs.integers("program");
                        program.outputs = attrs.integers("outputs");
                        program.picks = attrs.integers("picks");
                        program.classTargets = attrs.integers("class_targets");
                        if (attrs.has("col_outputs"))
                          program.colOutputs = attrs.integers("col_outputs");
                        if (attrs.has("col_picks"))
                          program.colPicks = attrs.integers("col_picks");
                        if (attrs.has("lse_pairs"))
                          program.lsePairs = attrs.integers("lse_pairs");
                        program.gathered = attrs.flag("gathered");
                        program.sharded = attrs.flag("sharded");
                        return [fn, program](KernelContext &ctx) {
                          fn(ctx, program);
                        };
                      },
                      flow};
  };
  // Its gather takes the columns (operand 1).
  KernelRule similarity = similarityBinding(fused::fusedSimilarity);
  similarity.foldOperands = {1};
  add("dloss.fused_similarity", std::move(similarity));
  add("dloss.fused_similarity_grad",
      similarityBinding(fused::fusedSimilarityGrad, ShapeFlow::Operand0));
  // A chain of element-wise ops; its results have the shape of operand 0
  // (an element leaf).
  add("dloss.fused_elementwise",
      KernelRule{[](const StepAttrs &attrs) -> Kernel {
                   fused::ElementwiseProgram program;
                   program.elements = attrs.integer("elements");
                   program.rowLeaves = attrs.integer("row_leaves");
                   program.colLeaves = attrs.integer("col_leaves");
                   program.program = attrs.integers("program");
                   program.outputs = attrs.integers("outputs");
                   if (attrs.has("col_sums"))
                     program.colSums = attrs.integers("col_sums");
                   return [program](KernelContext &ctx) {
                     fused::fusedElementwise(ctx, program);
                   };
                 },
                 ShapeFlow::Operand0,
                 {}});
  return table;
}

/// The step's operand and result counts fit the op's ODS definition.
void checkArity(const OpSpec &spec, int operands, int results) {
  bool unbounded = spec.maxOperands < 0;
  if (operands < spec.minOperands ||
      (!unbounded && operands > spec.maxOperands))
    fail("the step has " + std::to_string(operands) + " operands, expected " +
             (spec.minOperands == spec.maxOperands
                  ? std::to_string(spec.minOperands)
              : unbounded ? "at least " + std::to_string(spec.minOperands)
                          : std::to_string(spec.minOperands) + " to " +
                                std::to_string(spec.maxOperands)),
         kPlanBugHint);
  if (spec.numResults >= 0 && results != spec.numResults)
    fail("the step has " + std::to_string(results) + " results, expected " +
             std::to_string(spec.numResults),
         kPlanBugHint);
}

/// Every attribute the op's ODS definition declares is present unless it may
/// be absent, and of the kind the plan carries it as. StepAttrs's accessors
/// raise the errors, so they read as they do when a kernel reads the
/// attribute; the kernels decode an enum's case with their own message.
/// (Attributes the definition does not declare are left alone: plans built by
/// hand name a result type.)
void checkAttributes(const OpSpec &spec, const StepAttrs &attrs) {
  for (const OpAttrSpec &attr : spec.attrs) {
    const char *name = attr.name.c_str();
    if (attr.mayBeAbsent && !attrs.has(name))
      continue;
    switch (attr.kind) {
    case OpAttrKind::Integer:
    case OpAttrKind::Flag:
      (void)attrs.integer(name);
      break;
    case OpAttrKind::Real:
      (void)attrs.real(name);
      break;
    case OpAttrKind::Integers:
      (void)attrs.integers(name);
      break;
    case OpAttrKind::Text: // an enum's case: its kernel decodes it
      (void)attrs.text(name);
      break;
    case OpAttrKind::Any: // a typed constant: its kernel reads it
      break;
    }
  }
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
  const OpSpec *spec = findOpSpec(op);
  int operands =
      step.operands() ? static_cast<int>(step.operands()->size()) : 0;
  int results = step.results() ? static_cast<int>(step.results()->size()) : 0;
  try {
    if (!spec)
      fail("the runtime has a kernel but no op-table entry for this op",
           "Regenerate runtime/kernels/OpTable.inc: cmake --build build "
           "--target dloss-op-table");
    checkArity(*spec, operands, results);
    StepAttrs attrs(step);
    checkAttributes(*spec, attrs);
    return BoundKernel{rule.bind(attrs), rule.shapeFlow, rule.foldOperands};
  } catch (const Error &error) {
    throw error.withOp(op).withLocation(loc);
  } catch (const c10::Error &error) {
    throw Error(error.what_without_backtrace(), kPlanBugHint)
        .withOp(op)
        .withLocation(loc);
  }
}

} // namespace dloss
