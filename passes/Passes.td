// The dloss pass pipeline: verify collectives, infer replication, derive the backward pass.
#ifndef DLOSS_PASSES_TD
#define DLOSS_PASSES_TD

include "mlir/Pass/PassBase.td"

def VerifyCollectivesPass : Pass<"dloss-verify-collectives", "ModuleOp"> {
  let summary = "Rejects collectives that not every rank reaches in the same order";
  let description = [{
    A collective must be reached by every rank, in the same order, or the job
    hangs. This pass is the static half of that guarantee: it rejects any
    collective nested in an `scf.if` whose condition, or an `scf.for` /
    `scf.while` whose bounds or condition, vary across ranks (they derive from
    `dloss.rank` or from varying data), pointing at both the collective and the
    condition. Collectives under invariant control flow are accepted: every
    rank takes the same path.
  }];
  let dependentDialects = ["::mlir::dloss::DlossDialect"];
}

def InferReplicationPass : Pass<"dloss-infer-replication", "ModuleOp"> {
  let summary = "Infers which values are invariant (equal on every rank) or varying";
  let description = [{
    A forward dataflow over every function: arguments are varying unless
    marked `dloss.replicated`; each dloss op applies its own rule
    (ReplicationOpInterface); other ops are invariant when all their operands
    are; control flow with a varying condition makes its results varying.

    Errors: a loss entry (`dloss.loss`) whose result is varying (naming the op
    that made it varying), and a call that passes a varying value to a
    `dloss.replicated` parameter.

    With `annotate`, every op gets `dloss.replication`: one of
    `"invariant"` / `"varying"` per result.
  }];
  let options = [
    Option<"annotate", "annotate", "bool", "false",
           "Attach the inferred replication to every op as dloss.replication">,
  ];
  let dependentDialects = ["::mlir::dloss::DlossDialect"];
}

def AutodiffPass : Pass<"dloss-autodiff", "ModuleOp"> {
  let summary = "Derives @<name>_grad for every loss entry point";
  let description = [{
    For every `func.func` marked `dloss.loss`, emits `@<name>_grad`, which
    returns the loss followed by one gradient per `dloss.grad` argument, in
    argument order. Each op's adjoint comes from its own rule
    (AdjointOpInterface). The gradient contract (`dloss.grad_mode`, default
    `"ddp"`) is explicit in the emitted IR: the N scaling of `ddp` is a
    multiplication by the world size, and `global` mode all-reduces the
    gradients of replicated parameters.

    Policy for values the backward needs: every forward value is kept (the
    backward reads the forward's SSA values directly); nothing is recomputed.
    The fusion pass refines this for the fused losses.
  }];
  let dependentDialects = ["::mlir::dloss::DlossDialect", "::mlir::arith::ArithDialect"];
}

def LowerToPlanPass : Pass<"dloss-lower-to-plan", "ModuleOp"> {
  let summary = "Writes the module's functions as a runtime plan";
  let description = [{
    Lowers every function with a body to the plan that the MLIR-free runtime
    executes (`runtime/Plan.fbs`): one step per op over numbered registers,
    with its attributes, its source location and the registers whose last use
    it is. Fails, pointing at the op, on what the runtime cannot run (control
    flow, calls, unsupported types). `dlossc -o x.plan` runs it after the
    derive-backward pipeline.
  }];
  let options = [
    Option<"output", "output", "std::string", "\"\"",
           "Write the binary plan to this file">,
    Option<"text", "text", "std::string", "\"\"",
           "Write the plan's text form to this file ('-' for stdout)">,
  ];
}

#endif // DLOSS_PASSES_TD
