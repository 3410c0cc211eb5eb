// The dloss dialect's interfaces: per-op replication, adjoint and cost rules, the enums' case names.
#ifndef DLOSS_INTERFACES_TD
#define DLOSS_INTERFACES_TD

include "mlir/IR/OpBase.td"

// Marks the ops that communicate: every rank must run them, in the same order.
def Dloss_Collective : NativeOpTrait<"IsCollective"> {
  let cppNamespace = "::mlir::dloss";
}

// Facts about an op that consumers outside the compiler need: the generated
// op table (dialect/gen_op_table.py -> runtime/kernels/OpTable.inc) carries
// them to the runtime and the Python layer, so none of them keeps a list of
// op names.

// Marks the ops that users never build: passes produce them (a derivative, a
// fused op), so front ends (dloss::Graph, dloss.Graph, the @dloss.loss
// tracer) have no builder for them.
def Dloss_Internal : NativeOpTrait<"IsInternal"> {
  let cppNamespace = "::mlir::dloss";
}

// Marks the fused ring-tiled ops, which replace an all_gather + similarity +
// loss pattern by one kernel (docs/Fusion.md). Only fusion produces them, so
// Dloss_Fused makes them internal too.
def Dloss_IsFused : NativeOpTrait<"IsFused"> {
  let cppNamespace = "::mlir::dloss";
}
def Dloss_Fused : TraitList<[Dloss_Internal, Dloss_IsFused]>;

// Marks the ops whose operand `indices` holds, per row, an index into
// dimension `axis` (the op's `axis` attribute) of operand `data`: a label
// picking one class. The runtime's preflight checks such values against the
// dimension's static size, so a bad label fails every rank in the same call.
class Dloss_IndexOperand<int data, int indices>
    : ParamNativeOpTrait<"IndexOperand", data # ", " # indices> {
  let cppNamespace = "::mlir::dloss";
  int dataOperand = data;
  int indicesOperand = indices;
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
