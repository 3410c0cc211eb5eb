// dloss-verify-collectives: every rank must reach every collective, in the same
// order.
#include "passes/Passes.h"
#include "passes/ReplicationAnalysis.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

namespace mlir::dloss {
#define GEN_PASS_DEF_VERIFYCOLLECTIVESPASS
#include "passes/Passes.h.inc"
} // namespace mlir::dloss

using namespace mlir;
using namespace mlir::dloss;

namespace {

/// The value that decides whether (or how often) `parent` runs its body, and
/// what to call it in a message; null for control flow every rank follows.
struct Control {
  Value value;
  StringRef what;
};

static SmallVector<Control> controlsOf(Operation *parent) {
  if (auto ifOp = dyn_cast<scf::IfOp>(parent))
    return {{ifOp.getCondition(), "condition"}};
  if (auto forOp = dyn_cast<scf::ForOp>(parent))
    return {{forOp.getLowerBound(), "lower bound"},
            {forOp.getUpperBound(), "upper bound"},
            {forOp.getStep(), "step"}};
  if (auto whileOp = dyn_cast<scf::WhileOp>(parent))
    return {{whileOp.getConditionOp().getCondition(), "condition"}};
  return {};
}

struct VerifyCollectivesPass
    : dloss::impl::VerifyCollectivesPassBase<VerifyCollectivesPass> {
  void runOnOperation() override {
    bool failed = false;
    getOperation()->walk([&](FunctionOpInterface func) {
      if (func.isExternal())
        return;
      ReplicationAnalysis analysis(func);
      func->walk([&](Operation *op) {
        if (!op->hasTrait<IsCollective>())
          return;
        if (::failed(verifyReached(op, func, analysis)))
          failed = true;
      });
    });
    if (failed)
      signalPassFailure();
  }

  LogicalResult verifyReached(Operation *collective, FunctionOpInterface func,
                              const ReplicationAnalysis &analysis) {
    for (Operation *parent = collective->getParentOp();
         parent && parent != func.getOperation();
         parent = parent->getParentOp()) {
      if (isa<scf::ExecuteRegionOp>(parent))
        continue; // runs exactly once, on every rank that reaches it
      if (!isa<scf::IfOp, scf::ForOp, scf::WhileOp>(parent)) {
        collective->emitOpError()
            << "is nested in '" << parent->getName()
            << "', which dloss cannot prove every rank runs the same way; "
               "move the collective out of it"
            << "";
        return failure();
      }
      for (Control control : controlsOf(parent)) {
        if (!analysis.isVarying(control.value))
          continue;
        bool isIf = isa<scf::IfOp>(parent);
        InFlightDiagnostic diag = collective->emitOpError();
        diag << (isIf
                     ? "is reached only on some ranks"
                     : "may run a different number of times on different ranks")
             << ": it is inside an '" << parent->getName() << "' whose "
             << control.what
             << " varies across ranks, and every rank must run every "
                "collective in the same order or the job hangs. Hoist the "
                "collective out of the '"
             << parent->getName()
             << "' (run it on every rank and use its result only where "
                "needed), or make the "
             << control.what
             << " invariant (combine it across ranks with dloss.all_reduce "
                "first)";
        if (Operation *def = control.value.getDefiningOp())
          diag.attachNote(def->getLoc())
              << "the " << control.what << " is computed here";
        analysis.explainVarying(control.value, diag);
        return failure();
      }
    }
    return success();
  }
};

} // namespace
