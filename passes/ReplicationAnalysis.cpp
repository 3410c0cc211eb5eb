// The replication dataflow shared by dloss-infer-replication, dloss-verify-collectives and dloss-autodiff.
#include "passes/ReplicationAnalysis.h"

#include "dialect/DlossOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace mlir::dloss;

StringRef mlir::dloss::stringifyReplication(Replication replication) {
  return replication == Replication::Invariant ? "invariant" : "varying";
}

ReplicationAnalysis::ReplicationAnalysis(FunctionOpInterface func) : func(func) {
  if (func.isExternal())
    return;
  for (BlockArgument arg : func.getArguments()) {
    bool replicated = static_cast<bool>(func.getArgAttr(
        arg.getArgNumber(), DlossDialect::kReplicatedAttrName));
    state[arg] = replicated ? Replication::Invariant : Replication::Varying;
  }
  bool changed = true;
  while (changed) {
    changed = false;
    func->walk<WalkOrder::PreOrder>([&](Operation *op) {
      if (op != func.getOperation())
        visit(op, changed);
    });
  }
}

Replication ReplicationAnalysis::lookup(Value value) const {
  // Values not reached yet start invariant; the fixpoint raises them.
  auto it = state.find(value);
  return it == state.end() ? Replication::Invariant : it->second;
}

void ReplicationAnalysis::update(Value value, Replication replication,
                                 bool &changed) {
  Replication &current = state.try_emplace(value, Replication::Invariant).first->second;
  if (current == Replication::Invariant && replication == Replication::Varying) {
    current = Replication::Varying;
    changed = true;
  }
}

static Replication joinValues(const ReplicationAnalysis &analysis, ValueRange values,
                              Replication start = Replication::Invariant) {
  Replication result = start;
  for (Value v : values)
    if (analysis.isVarying(v))
      result = Replication::Varying;
  return result;
}

void ReplicationAnalysis::visit(Operation *op, bool &changed) {
  Replication operands = joinValues(*this, op->getOperands());

  if (auto ifOp = dyn_cast<scf::IfOp>(op)) {
    // A varying condition sends ranks down different branches.
    for (auto [i, result] : llvm::enumerate(ifOp.getResults())) {
      Replication r = joinValues(*this, ifOp.getCondition());
      for (Region *region : {&ifOp.getThenRegion(), &ifOp.getElseRegion()})
        if (!region->empty())
          r = joinValues(*this, region->front().getTerminator()->getOperand(i), r);
      update(result, r, changed);
    }
    return;
  }
  if (auto forOp = dyn_cast<scf::ForOp>(op)) {
    Replication bounds = joinValues(
        *this, {forOp.getLowerBound(), forOp.getUpperBound(), forOp.getStep()});
    update(forOp.getInductionVar(), bounds, changed);
    Operation *yield = forOp.getBody()->getTerminator();
    for (auto [i, arg] : llvm::enumerate(forOp.getRegionIterArgs())) {
      Replication r = joinValues(
          *this, {forOp.getInitArgs()[i], yield->getOperand(i)}, bounds);
      update(arg, r, changed);
      update(forOp.getResult(i), r, changed);
    }
    return;
  }
  if (auto whileOp = dyn_cast<scf::WhileOp>(op)) {
    Operation *yield = whileOp.getAfterBody()->getTerminator();
    for (auto [i, arg] : llvm::enumerate(whileOp.getBeforeArguments()))
      update(arg, joinValues(*this, {whileOp.getInits()[i], yield->getOperand(i)}),
             changed);
    scf::ConditionOp condition = whileOp.getConditionOp();
    Replication stop = joinValues(*this, condition.getCondition());
    for (auto [i, arg] : llvm::enumerate(whileOp.getAfterArguments())) {
      Replication r = joinValues(*this, condition.getArgs()[i], stop);
      update(arg, r, changed);
      update(whileOp.getResult(i), r, changed);
    }
    return;
  }

  Replication results = operands;
  if (auto rule = dyn_cast<ReplicationOpInterface>(op)) {
    SmallVector<Replication> each;
    for (Value v : op->getOperands())
      each.push_back(lookup(v));
    results = rule.inferReplication(each);
  }
  for (Value result : op->getResults())
    update(result, results, changed);
  // Block arguments of other region ops: as varying as the op's operands.
  for (Region &region : op->getRegions())
    for (Block &block : region)
      for (BlockArgument arg : block.getArguments())
        update(arg, operands, changed);
}

void ReplicationAnalysis::explainVarying(Value value,
                                         InFlightDiagnostic &diag) const {
  llvm::SmallPtrSet<Value, 16> seen;
  Value current = value;
  while (current && seen.insert(current).second && isVarying(current)) {
    if (auto arg = dyn_cast<BlockArgument>(current)) {
      Operation *owner = arg.getOwner()->getParentOp();
      if (owner == func.getOperation()) {
        diag.attachNote(arg.getLoc())
            << "it varies across ranks because argument #" << arg.getArgNumber()
            << " of @" << func.getName()
            << " is not marked dloss.replicated (each rank passes its own)";
        return;
      }
      // A loop-carried or branch value: explain through the owner's operands.
      current = nullptr;
      for (Value operand : owner->getOperands())
        if (isVarying(operand)) {
          current = operand;
          break;
        }
      if (!current) {
        diag.attachNote(owner->getLoc())
            << "it varies across ranks through this '" << owner->getName() << "'";
        return;
      }
      continue;
    }
    Operation *def = current.getDefiningOp();
    Value next;
    if (auto ifOp = dyn_cast<scf::IfOp>(def); ifOp && isVarying(ifOp.getCondition()))
      next = ifOp.getCondition();
    // Prefer an operand computed by an op: loop-carried block arguments
    // explain less than the op that made them vary.
    for (Value operand : def->getOperands())
      if (!next && isVarying(operand) && operand.getDefiningOp())
        next = operand;
    for (Value operand : def->getOperands())
      if (!next && isVarying(operand))
        next = operand;
    if (!next) {
      diag.attachNote(def->getLoc())
          << "it varies across ranks because of this '" << def->getName()
          << "', whose result differs from rank to rank";
      return;
    }
    current = next;
  }
}
