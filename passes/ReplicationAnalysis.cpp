// The replication dataflow shared by dloss-infer-replication,
// dloss-verify-collectives and dloss-autodiff.
#include "passes/ReplicationAnalysis.h"

#include "dialect/DlossOps.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "llvm/ADT/SmallBitVector.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace mlir::dloss;

StringRef mlir::dloss::stringifyReplication(Replication replication) {
  return replication == Replication::Invariant ? "invariant" : "varying";
}

ReplicationAnalysis::ReplicationAnalysis(FunctionOpInterface func)
    : func(func) {
  if (func.isExternal())
    return;
  for (BlockArgument arg : func.getArguments()) {
    bool replicated = static_cast<bool>(
        func.getArgAttr(arg.getArgNumber(), DlossDialect::kReplicatedAttrName));
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
  Replication &current =
      state.try_emplace(value, Replication::Invariant).first->second;
  if (current == Replication::Invariant &&
      replication == Replication::Varying) {
    current = Replication::Varying;
    changed = true;
  }
}

static Replication joinValues(const ReplicationAnalysis &analysis,
                              ValueRange values,
                              Replication start = Replication::Invariant) {
  Replication result = start;
  for (Value v : values)
    if (analysis.isVarying(v))
      result = Replication::Varying;
  return result;
}

/// The operands of a region-branch op that it forwards to no region or result
/// (a condition, loop bounds, a switch value): they choose the path.
static SmallVector<Value> choosingOperands(RegionBranchOpInterface op) {
  SmallVector<RegionSuccessor> entries;
  op.getSuccessorRegions(RegionBranchPoint::parent(), entries);
  llvm::SmallBitVector forwarded(op->getNumOperands());
  for (const RegionSuccessor &entry : entries) {
    OperandRange range = op.getEntrySuccessorOperands(entry);
    if (!range.empty())
      forwarded.set(range.getBeginOperandIndex(),
                    range.getBeginOperandIndex() + range.size());
  }
  SmallVector<Value> choosing;
  for (OpOperand &operand : op->getOpOperands())
    if (!forwarded.test(operand.getOperandNumber()))
      choosing.push_back(operand.get());
  return choosing;
}

/// A region-branch op (scf.if, scf.for, scf.while, scf.index_switch, ...)
/// forwards values along its edges: its operands into a region or its
/// results, a terminator's operands into a region or the results. What an
/// edge delivers is as varying as what it forwards. When an operand that
/// chooses the path (choosingOperands; for a terminator, its operands that it
/// forwards nowhere, such as scf.condition's condition) varies, ranks may take
/// different paths, so everything reached from that choice varies.
void ReplicationAnalysis::visitRegionBranch(RegionBranchOpInterface op,
                                            bool &changed) {
  Replication choice = joinValues(*this, choosingOperands(op));
  llvm::SmallPtrSet<Value, 8> fed;
  auto forward = [&](OperandRange from, ValueRange to, Replication base) {
    for (auto [value, input] : llvm::zip(from, to)) {
      update(input, joinValues(*this, value, base), changed);
      fed.insert(input);
    }
  };

  SmallVector<RegionSuccessor> entries;
  op.getSuccessorRegions(RegionBranchPoint::parent(), entries);
  for (const RegionSuccessor &entry : entries)
    forward(op.getEntrySuccessorOperands(entry), entry.getSuccessorInputs(),
            choice);

  for (Region &region : op->getRegions())
    for (Block &block : region) {
      if (block.empty())
        continue;
      auto terminator =
          dyn_cast<RegionBranchTerminatorOpInterface>(block.back());
      if (!terminator)
        continue;
      SmallVector<RegionSuccessor> successors;
      op.getSuccessorRegions(RegionBranchPoint(terminator), successors);
      llvm::SmallBitVector forwarded(terminator->getNumOperands());
      for (const RegionSuccessor &successor : successors) {
        OperandRange range = terminator.getSuccessorOperands(successor);
        if (!range.empty())
          forwarded.set(range.getBeginOperandIndex(),
                        range.getBeginOperandIndex() + range.size());
      }
      Replication branch = choice;
      for (OpOperand &operand : terminator->getOpOperands())
        if (!forwarded.test(operand.getOperandNumber()) &&
            isVarying(operand.get()))
          branch = Replication::Varying;
      for (const RegionSuccessor &successor : successors)
        forward(terminator.getSuccessorOperands(successor),
                successor.getSuccessorInputs(), branch);
    }

  // Block arguments that no edge feeds are the op's own (an induction
  // variable, derived from the bounds): as varying as the path's choice.
  for (Region &region : op->getRegions())
    for (Block &block : region)
      for (BlockArgument arg : block.getArguments())
        if (!fed.contains(arg))
          update(arg, choice, changed);
  // Results that no edge feeds: as varying as anything the op reads.
  for (Value result : op->getResults())
    if (!fed.contains(result))
      update(result, joinValues(*this, op->getOperands()), changed);
}

void ReplicationAnalysis::visit(Operation *op, bool &changed) {
  if (auto branch = dyn_cast<RegionBranchOpInterface>(op))
    return visitRegionBranch(branch, changed);

  Replication operands = joinValues(*this, op->getOperands());
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
            << "it varies across ranks through this '" << owner->getName()
            << "'";
        return;
      }
      continue;
    }
    Operation *def = current.getDefiningOp();
    Value next;
    // A region-branch op whose path differs between ranks: that choice.
    if (auto branch = dyn_cast<RegionBranchOpInterface>(def))
      for (Value choosing : choosingOperands(branch))
        if (!next && isVarying(choosing))
          next = choosing;
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
