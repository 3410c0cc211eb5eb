// dloss-infer-replication: invariant/varying for every value; a loss must be
// invariant.
#include "passes/Passes.h"
#include "passes/ReplicationAnalysis.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_INFERREPLICATIONPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

namespace {

struct InferReplicationPass
    : dloss::impl::InferReplicationPassBase<InferReplicationPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool failed = false;
    module.walk([&](func::FuncOp func) {
      if (func.isExternal())
        return;
      ReplicationAnalysis analysis(func);
      if (func->hasAttr(DlossDialect::kLossAttrName) &&
          ::failed(verifyLossInvariant(func, analysis)))
        failed = true;
      func.walk([&](func::CallOp call) {
        if (::failed(verifyCall(call, module, analysis)))
          failed = true;
      });
      if (annotate)
        annotateOps(func, analysis);
    });
    if (failed)
      signalPassFailure();
  }

  static LogicalResult
  verifyLossInvariant(func::FuncOp func, const ReplicationAnalysis &analysis) {
    Operation *ret = func.getBody().back().getTerminator();
    Value loss = ret->getOperand(0);
    if (!analysis.isVarying(loss))
      return success();
    InFlightDiagnostic diag =
        ret->emitError()
        << "the loss returned by @" << func.getName()
        << " varies across ranks, but a loss must be the same on every rank";
    if (Operation *def = loss.getDefiningOp())
      diag.attachNote(def->getLoc())
          << "the returned value is computed here by '" << def->getName()
          << "' on each rank's own data; combine it across ranks with "
             "`dloss.all_reduce sum` (or mean) before returning it";
    analysis.explainVarying(loss, diag);
    return failure();
  }

  static LogicalResult verifyCall(func::CallOp call, ModuleOp module,
                                  const ReplicationAnalysis &analysis) {
    auto callee = module.lookupSymbol<func::FuncOp>(call.getCallee());
    if (!callee)
      return success();
    for (auto [i, operand] : llvm::enumerate(call.getOperands())) {
      if (!callee.getArgAttr(i, DlossDialect::kReplicatedAttrName) ||
          !analysis.isVarying(operand))
        continue;
      InFlightDiagnostic diag =
          call.emitOpError()
          << "passes a value that varies across ranks as argument #" << i
          << " of @" << callee.getName()
          << ", which is marked dloss.replicated (the same on every rank); "
             "pass an invariant value, for example the result of a "
             "dloss.all_reduce or dloss.broadcast";
      analysis.explainVarying(operand, diag);
      return failure();
    }
    return success();
  }

  static void annotateOps(func::FuncOp func,
                          const ReplicationAnalysis &analysis) {
    Builder b(func.getContext());
    func.walk([&](Operation *op) {
      if (op->getNumResults() == 0)
        return;
      SmallVector<Attribute> each;
      for (Value result : op->getResults())
        each.push_back(
            b.getStringAttr(stringifyReplication(analysis.lookup(result))));
      op->setAttr(DlossDialect::kReplicationAttrName,
                  each.size() == 1 ? each.front() : b.getArrayAttr(each));
    });
  }
};

} // namespace
