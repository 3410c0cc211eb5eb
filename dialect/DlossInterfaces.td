// The dloss dialect's interfaces: per-op replication, adjoint and cost rules, the enums' case names.
#ifndef DLOSS_INTERFACES_TD
#define DLOSS_INTERFACES_TD

include "mlir/IR/OpBase.td"

// Marks the ops that communicate: every rank must run them, in the same order.
def Dloss_Collective : NativeOpTrait<"IsCollective"> {
  let cppNamespace = "::mlir::dloss";
}

def Dloss_ReplicationOpInterface : OpInterface<"ReplicationOpInterface"> {
  let cppNamespace = "::mlir::dloss";
  let description = [{
    The replication rule of an op: whether each result is invariant (equal on
    every rank) or varying, given the replication of its operands. The default
    is the rule of local computation: invariant when every operand is.
  }];
  let methods = [
    InterfaceMethod<
      "Returns the replication of the op's results.",
      "::mlir::dloss::Replication", "inferReplication",
      (ins "::llvm::ArrayRef<::mlir::dloss::Replication>":$operands), [{}], [{
        return ::mlir::dloss::joinReplication(operands);
      }]>,
  ];
}

def Dloss_AdjointOpInterface : OpInterface<"AdjointOpInterface"> {
  let cppNamespace = "::mlir::dloss";
  let description = [{
    The reverse-mode rule of an op (as Enzyme-MLIR's
    ReverseAutoDiffOpInterface): given the cotangents of its results, build the
    cotangent contributions to its operands with `AdjointBuilder`. Ops whose
    results carry no gradient (integers, indices, indicators) contribute
    nothing. The autodiff pass owns the bookkeeping: accumulation, the kind of
    an invariant value's cotangent (reduced or per-rank partial) and the
    gradient contract's scaling.
  }];
  let methods = [
    InterfaceMethod<
      "Adds the cotangent contributions of the op's operands.",
      "::llvm::LogicalResult", "buildAdjoint",
      (ins "::mlir::dloss::AdjointBuilder &":$adjoint)>,
  ];
}

def Dloss_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::dloss";
  let description = [{
    The cost rule of an op, for the cost report (`dlossc --report`): under
    the concrete sizes of one representative rank, the op's results (their
    shapes through the op's shape rule in dialect/ShapeFunctions.h, or the
    values of index results), the bytes one rank sends per call under the
    runtime's algorithm, and the temporaries its kernel allocates beyond its
    results. The rules live in dialect/DlossCosts.cpp (dialect/CostModel.h is
    their contract); arith's ops get theirs as external models.
  }];
  let methods = [
    InterfaceMethod<
      "Sets the concrete value of every result in `evaluator` and returns "
      "what the call costs; emits an error at the op when the sizes "
      "contradict the op.",
      "::llvm::LogicalResult", "evaluateCost",
      (ins "::mlir::dloss::CostEvaluator &":$evaluator,
           "::mlir::dloss::OpCost &":$cost)>,
  ];
}

def Dloss_EnumAttrInterface : AttrInterface<"EnumAttrInterface"> {
  let cppNamespace = "::mlir::dloss";
  let description = [{
    An attribute holding one case of a dloss enum. Consumers outside the
    compiler (the plan, the simulator) receive enums by case name, which stays
    stable when cases are reordered; this interface gives that name for any
    dloss enum attribute, so they need not know which op holds which enum.
  }];
  let methods = [
    InterfaceMethod<
      "Returns the name of the case the attribute holds (`sum`, `exact`, ...).",
      "::llvm::StringRef", "getCaseName", (ins), [{}], [{
        return stringifyEnum($_attr.getValue());
      }]>,
  ];
}

#endif // DLOSS_INTERFACES_TD
