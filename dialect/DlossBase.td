// The dloss dialect, its enums and the type constraints its ops share.
#ifndef DLOSS_BASE_TD
#define DLOSS_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "dialect/DlossInterfaces.td"

def Dloss_Dialect : Dialect {
  let name = "dloss";
  let cppNamespace = "::mlir::dloss";
  let summary = "Distributed loss functions written as the program one rank runs (SPMD).";
  let description = [{
    A `dloss` program is the per-rank program of a data-parallel loss: every
    rank runs the same function on its own shard of the global batch, and
    communicates through explicit collectives (`dloss.all_gather`,
    `dloss.all_reduce`, `dloss.reduce_scatter`, `dloss.broadcast`,
    `dloss.ring_shift`). The meaning of a loss is the single-device function of
    the concatenated global batch; the compiler derives its backward pass with
    exact collective adjoints.

    Tensors are builtin ranked tensors. Batch dimensions are dynamic (`?`)
    because ranks may hold different numbers of rows; `dloss.dim`,
    `dloss.shard_offset` and `dloss.global_size` give the sizes at run time.

    Entry points are `func.func` operations carrying these attributes:

    * `dloss.loss` (unit, on the function): a loss entry point. It returns one
      0-d floating-point tensor, the loss, which must be invariant (equal on
      every rank), then one new value per `dloss.state` argument.
    * `dloss.grad_mode = "ddp" | "global"` (on the function, default `"ddp"`):
      the gradient contract. `ddp` gives rank r `N * dF/dx_r`, so that DDP's
      gradient average yields the single-device gradient; `global` gives
      `dF/dx_r` and the full gradient of replicated parameters on every rank.
    * `dloss.grad` (unit, on a floating-point tensor argument): differentiate
      the loss with respect to this argument.
    * `dloss.replicated` (unit, on an argument): the argument holds the same
      value on every rank (a loss parameter such as a logit scale or ArcFace's
      class weights). Arguments are varying otherwise.
    * `dloss.state` (unit, on a `dloss.replicated` argument without
      `dloss.grad`): loss state (a centre, an EMA). The loss returns its new
      value, invariant and of the argument's type, after the loss, in
      argument order; callers store it (docs/Autodiff.md, "Loss state").
    * `dloss.name = "text"` (string, on an argument): the input's name in
      plans and tools (`dloss-run --input text=...`). `dlossc` takes it from
      the SSA name in the source (`%text`) when absent.
    * `dloss.gradient_of = @clip` (on a function): written by
      `dloss-autodiff` on `@clip_grad`.
  }];
  let hasConstantMaterializer = 1;
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::arith::ArithDialect"];
  let extraClassDeclaration = [{
    // Registers the enum attributes (DlossAttrs.cpp, where their storage is).
    void registerAttributes();

    // Attribute names of the entry-point contract (see the dialect description).
    static constexpr ::llvm::StringLiteral kLossAttrName = "dloss.loss";
    static constexpr ::llvm::StringLiteral kGradModeAttrName = "dloss.grad_mode";
    static constexpr ::llvm::StringLiteral kGradAttrName = "dloss.grad";
    static constexpr ::llvm::StringLiteral kReplicatedAttrName = "dloss.replicated";
    // On an argument: loss state (a centre, an EMA) that the loss returns
    // updated, after the loss, one result per state argument in order.
    static constexpr ::llvm::StringLiteral kStateAttrName = "dloss.state";
    // On @<loss>_grad (written by dloss-autodiff): the loss it differentiates.
    static constexpr ::llvm::StringLiteral kGradientOfAttrName = "dloss.gradient_of";
    // On an argument: the name users give its input (dloss-run --input NAME=...).
    static constexpr ::llvm::StringLiteral kNameAttrName = "dloss.name";
    // Written by `dloss-infer-replication{annotate}` on any op.
    static constexpr ::llvm::StringLiteral kReplicationAttrName = "dloss.replication";
  }];
}

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

// The enums are dialect attributes (EnumAttr), not IntegerAttrs: the ops print
// them as a bare keyword (`dloss.all_reduce sum`), the generic form names the
// case (`kind = #dloss<reduce_kind sum>`), and every consumer (the plan
// writer, the simulator) reads the case name through
// Dloss_EnumAttrInterface instead of knowing which op holds which enum.
// Their syntax is written once for every dloss enum (DlossAttrs.cpp): one
// diagnostic for an unknown case, naming the cases. They print a space before
// the keyword (the generic form needs it after the mnemonic), so op formats
// write `` before them: "`` $kind $input".
class Dloss_EnumAttr<EnumInfo enumInfo, string name>
    : EnumAttr<Dloss_Dialect, enumInfo, name, [Dloss_EnumAttrInterface]> {
  let assemblyFormat = ?;
  let hasCustomAssemblyFormat = 1;
}

def Dloss_ReduceKind : I32Enum<"ReduceKind", "how values are combined", [
    I32EnumCase<"sum", 0>,
    I32EnumCase<"mean", 1>,
    I32EnumCase<"max", 2>,
    I32EnumCase<"min", 3>]> {
  let cppNamespace = "::mlir::dloss";
}

def Dloss_ReduceKindAttr : Dloss_EnumAttr<Dloss_ReduceKind, "reduce_kind">;

def Dloss_GatherGrad : I32Enum<"GatherGrad",
    "which gradient flows back through an all_gather", [
    I32EnumCase<"exact", 0>,
    I32EnumCase<"local", 1>,
    I32EnumCase<"none", 2>]> {
  let cppNamespace = "::mlir::dloss";
  let description = [{
    * `exact`: the true adjoint, a `reduce_scatter(sum)` of the cotangent; the
      gradient equals single-device training on the global batch.
    * `local`: only the cotangent of this rank's own slot flows back (the
      TorchMetrics / OpenCLIP "put the local tensor back" behaviour). Differs
      from single-device training; the compiler warns.
    * `none`: no gradient flows back. Differs from single-device training; the
      compiler warns.
  }];
}

def Dloss_GatherGradAttr : Dloss_EnumAttr<Dloss_GatherGrad, "gather_grad">;

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Dloss_FloatTensor : RankedTensorOf<[AnyFloat]>;
def Dloss_IntTensor : RankedTensorOf<[AnySignlessInteger]>;
def Dloss_NumTensor : RankedTensorOf<[AnyFloat, AnySignlessInteger]>;

// Every op has an adjoint rule (dialect/DlossAdjoints.cpp) and a cost rule
// (dialect/DlossCosts.cpp).
class Dloss_BaseOp<string mnemonic, list<Trait> traits>
    : Op<Dloss_Dialect, mnemonic,
         !listconcat(traits, [DeclareOpInterfaceMethods<Dloss_AdjointOpInterface>,
                              DeclareOpInterfaceMethods<Dloss_CostOpInterface>])>;

// Local computation: its results are invariant when all its operands are.
class Dloss_Op<string mnemonic, list<Trait> traits = []>
    : Dloss_BaseOp<mnemonic, !listconcat(traits, [Dloss_ReplicationOpInterface])>;

// Ops with their own replication rule (inferReplication in DlossOps.cpp).
class Dloss_ReplicationRuleOp<string mnemonic, list<Trait> traits = []>
    : Dloss_BaseOp<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<Dloss_ReplicationOpInterface, ["inferReplication"]>])>;

// Collectives communicate: never Pure, never CSE'd, hoisted or dropped.
class Dloss_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : Dloss_ReplicationRuleOp<mnemonic, !listconcat(traits, [Dloss_Collective])>;

#endif // DLOSS_BASE_TD
