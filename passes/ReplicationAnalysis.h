// Which values are invariant (equal on every rank) and which vary, for one
// function.
#ifndef DLOSS_PASSES_REPLICATIONANALYSIS_H
#define DLOSS_PASSES_REPLICATIONANALYSIS_H

#include "dialect/Adjoint.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::dloss {

/// A forward dataflow to a fixpoint over one function (values only move from
/// invariant to varying). Arguments are varying unless marked
/// `dloss.replicated`; dloss ops apply their ReplicationOpInterface rule;
/// other ops are invariant when all their operands are. Region ops that
/// implement RegionBranchOpInterface (scf.if, scf.for, scf.while,
/// scf.index_switch, scf.execute_region, ...) carry values along their
/// control-flow edges, and what they forward varies when the operand that
/// chooses the path (a condition, bounds, a switch value) does.
class ReplicationAnalysis {
public:
  explicit ReplicationAnalysis(FunctionOpInterface func);

  /// The function the analysis describes.
  FunctionOpInterface getFunction() const { return func; }

  Replication lookup(Value value) const;
  bool isVarying(Value value) const {
    return lookup(value) == Replication::Varying;
  }

  /// Explains why `value` varies: attaches a note at the argument or op where
  /// the variation starts (a `dloss.rank`, an argument not marked
  /// `dloss.replicated`, ...).
  void explainVarying(Value value, InFlightDiagnostic &diag) const;

private:
  void visit(Operation *op, bool &changed);
  void visitRegionBranch(RegionBranchOpInterface op, bool &changed);
  void update(Value value, Replication replication, bool &changed);

  mutable FunctionOpInterface func;
  llvm::DenseMap<Value, Replication> state;
};

/// "invariant" or "varying".
llvm::StringRef stringifyReplication(Replication replication);

} // namespace mlir::dloss

#endif // DLOSS_PASSES_REPLICATIONANALYSIS_H
