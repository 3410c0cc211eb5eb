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

def FuseGatherSimilarityPass : Pass<"dloss-fuse-gather-similarity", "ModuleOp"> {
  let summary = "Fuses all_gather + similarity matmul + loss into ring-tiled ops";
  let description = [{
    Recognises three patterns and replaces each by one fused op whose kernel
    never builds the `B_local x B_global` similarity matrix:

    * CLIP: `cross_entropy(s * matmul(A, all_gather(B))^T, tA)` together with
      its mirror `cross_entropy(s * matmul(B, all_gather(A))^T, tB)` (same
      `s`) become one `dloss.ring_softmax_ce`: both directions from one tile.
    * SigLIP: `L = s * matmul(A, all_gather(B))^T + b` used only by
      `reduce sum (softplus L)` and `take_along(L, t)` becomes
      `dloss.ring_sigmoid_pairs`.
    * Class-sharded softmax (PartialFC): `cross_entropy(s * C', t)` where `C =
      all_gather(matmul(R, W)^T, axis 1)` (R gathered rows, W this rank's
      class shard) and `C'` is `C` or `put_along(C, t, f(take_along(C, t)))`
      (a margin on the target logit) becomes `dloss.sharded_softmax`; the
      margin `f` stays ordinary IR on the target's dot product.

    The pass runs before `dloss-autodiff`: each fused op's adjoint rule emits
    its fused backward op, so forward and backward are both fused. The
    similarity and its scaling must have no other users and gathers must be
    `grad exact`; anything else stays unfused and keeps working.
  }];
  let options = [
    Option<"dedicated", "dedicated", "bool", "true",
           "Use the dedicated CLIP, SigLIP and class-sharded ops where they "
           "match (false: every similarity goes to dloss.fused_similarity)">,
  ];
  let dependentDialects = ["::mlir::dloss::DlossDialect", "::mlir::arith::ArithDialect"];
}

def FuseElementwisePass : Pass<"dloss-fuse-elementwise", "ModuleOp"> {
  let summary = "Fuses chains of element-wise ops into one pass over memory";
  let description = [{
    Runs after autodiff (dlossc and the JIT run it between the
    derive-backward pipeline and dloss-lower-to-plan). Groups connected
    element-wise ops (`add sub mul div neg sqrt`) of one float type, whose
    operands are values of that type, 0-d values, or per-row / per-column
    vectors broadcast by `dloss.expand`, into one `dloss.fused_elementwise`
    that evaluates the group's program chunk by chunk in cache and writes
    only the values used outside the group. An op joins the group of its
    operands only when no op outside the group reads the group's values
    before it, so the fused op can take the place of the group's last op
    and no other op moves (collectives keep their order). A group of one
    op fuses only when it reads an expanded vector (the expand then never
    reaches memory). A sum over the batch (`reduce sum axes [0]` of a
    matrix) of a group's value joins it as a column sum, under the same
    rule, after moving up to just after its operand; other reductions stay
    separate ops. A value read only by other groups is recomputed in them
    where that costs at most one more read of memory in all, and is then
    never written.
  }];
  let dependentDialects = ["::mlir::dloss::DlossDialect"];
}

def CoalesceAllReducesPass : Pass<"dloss-coalesce-all-reduces", "ModuleOp"> {
  let summary = "Runs independent small all-reduces as one collective";
  let description = [{
    Runs last before dloss-lower-to-plan (after dloss-fuse-elementwise).
    A small collective's cost is its round trip, and on ranks that share
    cores its wait for the slowest peer: Barlow Twins' batch norm makes
    four O(d) all-reduces per view and direction, two of which are
    independent of the other view's two. For each `dloss.all_reduce` of at
    most `max-bytes` (a static shape, not 0-d: the runtime defers those to
    ride on a later gather), every later one of the same kind and
    element type that does not depend on it (nor on one joined to it) joins
    it: the ops it reads that come after the first one move above it
    (never a collective, nor an op with a result over `max-bytes`: the
    order of collectives and the peak memory stay), and it moves to just
    after the group's last one. The first of a group of n carries
    `coalesce = n`; the runtime runs the n adjacent all-reduces as one
    (their operands flattened into one buffer).
  }];
  let options = [
    Option<"maxBytes", "max-bytes", "int64_t", /*default=*/"1048576",
           "The largest operand (in bytes) that joins a group">,
  ];
  let dependentDialects = ["::mlir::dloss::DlossDialect"];
}

def LowerToPlanPass : Pass<"dloss-lower-to-plan", "ModuleOp"> {
  let summary = "Writes the module's functions as a runtime plan";
  let description = [{
    Lowers every function with a body to the plan that the MLIR-free runtime
    executes (`runtime/plan/Plan.fbs`): one step per op over numbered registers,
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
