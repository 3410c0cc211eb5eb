// Operations of the dloss dialect: collectives, rank facts and compute.
#ifndef DLOSS_OPS_TD
#define DLOSS_OPS_TD

include "dialect/DlossBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Collectives. None is Pure: a collective must never be CSE'd, hoisted or
// dropped, or the ranks could disagree on which collectives they run.
//===----------------------------------------------------------------------===//

def Dloss_AllGatherOp : Dloss_CollectiveOp<"all_gather",
    [InferTypeOpAdaptor]> {
  let summary = "concatenates every rank's tensor along an axis";
  let description = [{
    Every rank contributes its local tensor; every rank receives the
    concatenation in rank order along `axis`. Ranks may contribute different
    sizes along `axis` (uneven batches); all other dimensions must agree. The
    result is invariant (equal on every rank) and its `axis` dimension is
    dynamic.

    `grad` selects the gradient that flows back: `exact` (default), `local`
    or `none` (see the GatherGrad enum below).

    ```mlir
    %all = dloss.all_gather %text axis 0 : tensor<?x256xf32>
    %ids = dloss.all_gather %labels axis 0 grad none : tensor<?xi64>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, I64Attr:$axis,
                   DefaultValuedAttr<Dloss_GatherGradAttr, "GatherGrad::exact">:$grad);
  let results = (outs Dloss_NumTensor:$result);
  // `` before an enum: its attribute writes its own leading space (DlossBase.td).
  let assemblyFormat = "$input `axis` $axis (`grad` `` $grad^)? attr-dict `:` type($input)";
}

def Dloss_AllReduceOp : Dloss_CollectiveOp<"all_reduce", [SameOperandsAndResultType]> {
  let summary = "combines a tensor element-wise across all ranks";
  let description = [{
    Every rank receives the element-wise `sum`, `mean`, `max` or `min` of the
    ranks' tensors, which must all have the same shape. The result is
    invariant.

    ```mlir
    %total = dloss.all_reduce sum %local : tensor<f32>
    ```
  }];
  let arguments = (ins Dloss_ReduceKindAttr:$kind, Dloss_NumTensor:$input);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "`` $kind $input attr-dict `:` type($input)";
}

def Dloss_ReduceScatterOp : Dloss_CollectiveOp<"reduce_scatter",
    [InferTypeOpAdaptor]> {
  let summary = "sums a tensor across ranks and keeps this rank's slice";
  let description = [{
    The inverse layout of `dloss.all_gather`: every rank holds a tensor whose
    `axis` dimension is the global size; the ranks' tensors are combined
    element-wise (`sum` or `mean`) and rank r keeps rows
    `[offset_r, offset_r + size_r)` along `axis`.

    `size` is this rank's slice length. The slices of all ranks must add up to
    the `axis` dimension of the input; the runtime exchanges the sizes. Without
    `size` the axis is split evenly (it must divide by the number of ranks).
    The adjoint of an `all_gather` of `%x` is a `reduce_scatter` with
    `size = dloss.dim %x`, so uneven batches round-trip exactly.

    ```mlir
    %n = dloss.dim %x axis 0 : tensor<?x256xf32>
    %mine = dloss.reduce_scatter sum %ct axis 0 size %n : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_ReduceKindAttr:$kind, Dloss_NumTensor:$input,
                   I64Attr:$axis, Optional<Index>:$size);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    `` $kind $input `axis` $axis (`size` $size^)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Dloss_BroadcastOp : Dloss_CollectiveOp<"broadcast", [SameOperandsAndResultType]> {
  let summary = "sends the root rank's tensor to every rank";
  let description = [{
    Every rank receives the tensor held by rank `root`; the other ranks' inputs
    only provide the shape, which must agree. The result is invariant.

    ```mlir
    %w0 = dloss.broadcast %w root 0 : tensor<1000x256xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, I64Attr:$root);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "$input `root` $root attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Dloss_RingShiftOp : Dloss_CollectiveOp<"ring_shift", [SameOperandsAndResultType]> {
  let summary = "sends a tensor to rank + k and receives rank - k's tensor";
  let description = [{
    Rank r sends its tensor to rank `(r + shift) mod N` and receives the tensor
    of rank `(r - shift) mod N`. This is the step of ring algorithms; tensors
    of different sizes along dynamic dimensions travel as they are. A shift of
    0 (or a multiple of N) is the identity.

    ```mlir
    %next = dloss.ring_shift %chunk by 1 : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, I64Attr:$shift);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "$input `by` $shift attr-dict `:` type($input)";
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Rank facts
//===----------------------------------------------------------------------===//

def Dloss_RankOp : Dloss_ReplicationRuleOp<"rank", [Pure]> {
  let summary = "this rank's index in [0, world_size)";
  let description = [{
    ```mlir
    %r = dloss.rank
    ```
    Varying: code whose control flow depends on it must not contain
    collectives.
  }];
  let results = (outs Index:$result);
  let assemblyFormat = "attr-dict";
}

def Dloss_WorldSizeOp : Dloss_Op<"world_size", [Pure]> {
  let summary = "the number of ranks";
  let description = [{
    ```mlir
    %n = dloss.world_size
    ```
  }];
  let results = (outs Index:$result);
  let assemblyFormat = "attr-dict";
}

class Dloss_AxisSizeOp<string mnemonic, string summaryText, string descriptionText>
    : Dloss_ReplicationRuleOp<mnemonic, [Pure]> {
  let summary = summaryText;
  let description = descriptionText;
  let arguments = (ins AnyRankedTensor:$input, I64Attr:$axis);
  let results = (outs Index:$result);
  let assemblyFormat = "$input `axis` $axis attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Dloss_DimOp : Dloss_AxisSizeOp<"dim", "this rank's size along an axis", [{
    The local size of `axis`; folds to a constant when the dimension is static.

    ```mlir
    %n = dloss.dim %x axis 0 : tensor<?x256xf32>
    ```
  }]> {
  let hasFolder = 1;
}

def Dloss_ShardOffsetOp : Dloss_AxisSizeOp<"shard_offset",
    "the sum of the sizes of the lower ranks along an axis", [{
    Where this rank's rows start in the global batch: the sum over ranks
    `0 .. rank-1` of their sizes along `axis`. Use it, never `n * rank`, to
    label positives: it is right for uneven batches.

    ```mlir
    %off = dloss.shard_offset %x axis 0 : tensor<?x256xf32>
    ```
  }]>;

def Dloss_GlobalSizeOp : Dloss_AxisSizeOp<"global_size",
    "the sum over all ranks of the sizes along an axis", [{
    The size of the global batch along `axis` (invariant).

    ```mlir
    %b = dloss.global_size %x axis 0 : tensor<?x256xf32>
    ```
  }]>;

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

def Dloss_MatmulOp : Dloss_Op<"matmul",
    [Pure, InferTypeOpAdaptor]> {
  let summary = "matrix product of two 2-D tensors, either transposed";
  let description = [{
    `op(lhs) x op(rhs)` where `op` transposes its operand when
    `transpose_lhs` / `transpose_rhs` is set. Both operands are 2-D with the
    same element type; their inner dimensions must agree when static.

    ```mlir
    %logits = dloss.matmul %img, %txt_all transpose_rhs
        : tensor<?x256xf32>, tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$lhs, Dloss_FloatTensor:$rhs,
                   UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs (`transpose_lhs` $transpose_lhs^)? (`transpose_rhs` $transpose_rhs^)?
    attr-dict `:` type($lhs) `,` type($rhs)
  }];
}

// Element-wise ops with 0-d broadcasting.
class Dloss_BinaryOp<string mnemonic, Type operandType, string what>
    : Dloss_Op<mnemonic, [Pure, InferTypeOpAdaptor]> {
  let summary = "element-wise " # what;
  let description = [{
    Element-wise on operands of the same shape and element type; a 0-d operand
    is broadcast to the other's shape.

    ```mlir
    %y = dloss.}] # mnemonic # [{ %a, %b : tensor<?x?xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins operandType:$lhs, operandType:$rhs);
  let results = (outs operandType:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs)";
}

def Dloss_AddOp : Dloss_BinaryOp<"add", Dloss_NumTensor, "addition">;
def Dloss_SubOp : Dloss_BinaryOp<"sub", Dloss_NumTensor, "subtraction">;
def Dloss_MulOp : Dloss_BinaryOp<"mul", Dloss_NumTensor, "multiplication">;
def Dloss_DivOp : Dloss_BinaryOp<"div", Dloss_FloatTensor, "division">;
def Dloss_EqOp : Dloss_BinaryOp<"eq", Dloss_NumTensor,
    "equality indicator: 1 where the operands are equal, 0 elsewhere, in their element type"> {
  let description = [{
    An indicator, not a boolean: masks such as "where was the maximum" or
    "which rank is the root" multiply cotangents directly. It carries no
    gradient.

    ```mlir
    %is_max = dloss.eq %x, %max : tensor<?x?xf32>, tensor<?x?xf32>
    ```
  }];
}

def Dloss_SelectOp : Dloss_Op<"select", [Pure, InferTypeOpAdaptor]> {
  let summary = "element-wise choice: true_value where cond is nonzero, else false_value";
  let description = [{
    `result[i] = cond[i] != 0 ? true_value[i] : false_value[i]`. `cond` is an
    indicator (as `dloss.eq` makes, any element type) with the result's
    shape; either value may be 0-d, broadcast to it. The gradient flows to
    the chosen value only, and none to `cond`, so masking with an infinity is
    exact (`b + cond * (a - b)` is NaN where `a` or `b` is infinite).
    NT-Xent removes each row's similarity with itself this way:

    ```mlir
    %ninf = arith.constant dense<0xFF800000> : tensor<f32>
    %masked = dloss.select %is_self, %ninf, %logits
        : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$cond, Dloss_NumTensor:$true_value,
                   Dloss_NumTensor:$false_value);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $cond `,` $true_value `,` $false_value attr-dict `:` type($cond) `,`
    type($true_value) `,` type($false_value)
  }];
}

class Dloss_UnaryOp<string mnemonic, string what, list<Trait> traits = []>
    : Dloss_Op<mnemonic, !listconcat([Pure, SameOperandsAndResultType], traits)> {
  let summary = "element-wise " # what;
  let description = [{
    ```mlir
    %y = dloss.}] # mnemonic # [{ %x : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$input);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def Dloss_NegOp : Dloss_UnaryOp<"neg", "negation">;
def Dloss_ExpOp : Dloss_UnaryOp<"exp", "exponential">;
def Dloss_LogOp : Dloss_UnaryOp<"log", "natural logarithm">;
def Dloss_SoftplusOp : Dloss_UnaryOp<"softplus", "softplus, log(1 + exp(x)), computed stably">;
def Dloss_LogSigmoidOp : Dloss_UnaryOp<"log_sigmoid", "log-sigmoid, -softplus(-x), computed stably">;
def Dloss_CosOp : Dloss_UnaryOp<"cos", "cosine">;
def Dloss_AcosOp : Dloss_UnaryOp<"acos", "arc cosine (clamp the input into [-1, 1] first)">;
def Dloss_SinOp : Dloss_UnaryOp<"sin", "sine">;
def Dloss_SqrtOp : Dloss_UnaryOp<"sqrt", "square root">;
def Dloss_SigmoidOp : Dloss_UnaryOp<"sigmoid", "logistic sigmoid, 1 / (1 + exp(-x))">;
// torch's x.detach(): the value passes, its gradient is zero (a DINO
// teacher's target, DCLW's weights, a hardness weighting).
def Dloss_StopGradientOp : Dloss_UnaryOp<"stop_gradient",
    "identity whose gradient is zero (torch's x.detach())">;

def Dloss_ClampOp : Dloss_Op<"clamp", [Pure, SameOperandsAndResultType]> {
  let summary = "element-wise clamp into [min, max]";
  let description = [{
    Either bound may be omitted, not both. The gradient is zero where the input
    was clamped. ArcFace clamps cosines before `dloss.acos`:

    ```mlir
    %c = dloss.clamp %cos min -0.9999999 max 0.9999999 : tensor<?xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$input, OptionalAttr<F64Attr>:$min,
                   OptionalAttr<F64Attr>:$max);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = "$input (`min` $min^)? (`max` $max^)? attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Dloss_CastOp : Dloss_Op<"cast", [Pure]> {
  let summary = "converts element types, or an index into a 0-d tensor";
  let description = [{
    Converts a tensor to another element type of the same shape, or an `index`
    (such as `dloss.global_size`) into a 0-d tensor, for example to divide a
    sum by the global batch size.

    ```mlir
    %h = dloss.cast %x : tensor<?x256xf32> to tensor<?x256xbf16>
    %b = dloss.cast %n : index to tensor<f32>
    ```
  }];
  let arguments = (ins AnyTypeOf<[Dloss_NumTensor, Index]>:$input);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Dloss_L2NormalizeOp : Dloss_Op<"l2_normalize", [Pure, SameOperandsAndResultType]> {
  let summary = "divides by the L2 norm along an axis";
  let description = [{
    `x / max(||x||_2, eps)` along `axis` (as `torch.nn.functional.normalize`).

    ```mlir
    %u = dloss.l2_normalize %x axis 1 : tensor<?x256xf32>
    %v = dloss.l2_normalize %x axis 1 eps 1.0e-06 : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$input, I64Attr:$axis,
                   DefaultValuedAttr<F64Attr, "1.0e-12">:$eps);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = "$input `axis` $axis (`eps` $eps^)? attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Dloss_L2NormalizeGradOp : Dloss_Op<"l2_normalize_grad",
    [Pure, SameOperandsAndResultType, Dloss_Internal]> {
  let summary = "the gradient of l2_normalize, in one pass over each row";
  let description = [{
    The adjoint of `dloss.l2_normalize %input axis $axis eps $eps` for the
    result's cotangent `grad`: with `n = max(||x||_2, eps)` and `y = x / n`
    along `axis`, `(grad - y * sum(grad * y)) / n` where `||x|| >= eps`, and
    `grad / eps` where `||x|| < eps` (`n` is then a constant). Autodiff emits
    it so that the backward of a normalised matrix (ArcFace's class weights)
    holds no temporary of its size: the kernel reads `grad` and `input` once
    per row and writes only the result.

    ```mlir
    %dx = dloss.l2_normalize_grad %g, %x axis 1 : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$grad, Dloss_FloatTensor:$input,
                   I64Attr:$axis, DefaultValuedAttr<F64Attr, "1.0e-12">:$eps);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = [{
    $grad `,` $input `axis` $axis (`eps` $eps^)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Dloss_ReduceOp : Dloss_Op<"reduce",
    [Pure, InferTypeOpAdaptor]> {
  let summary = "reduces a tensor over some of its axes on this rank";
  let description = [{
    Local reduction (`sum`, `mean`, `max`, `min`) over `axes`, which are
    removed from the result. For a global reduction follow it with
    `dloss.all_reduce`.

    ```mlir
    %s = dloss.reduce sum %x axes [0, 1] : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_ReduceKindAttr:$kind, Dloss_NumTensor:$input,
                   DenseI64ArrayAttr:$axes);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "`` $kind $input `axes` $axes attr-dict `:` type($input)";
  // A sum or mean of a negation negates the (smaller) reduced value.
  let hasCanonicalizer = 1;
}

def Dloss_LogSumExpOp : Dloss_Op<"logsumexp",
    [Pure, InferTypeOpAdaptor]> {
  let summary = "log(sum(exp(x))) along an axis, computed stably";
  let description = [{
    The axis is removed from the result.

    ```mlir
    %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$input, I64Attr:$axis);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = "$input `axis` $axis attr-dict `:` type($input)";
}

def Dloss_TakeAlongOp : Dloss_Op<"take_along",
    [Pure, InferTypeOpAdaptor, Dloss_IndexOperand<0, 1>]> {
  let summary = "picks one element per row along an axis";
  let description = [{
    `result[i] = input[i, indices[i]]` for `axis = 1` (in general, `indices`
    has the shape of `input` without `axis` and selects one element along it).
    Picks the target logit of each row.

    ```mlir
    %t = dloss.take_along %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, Dloss_IntTensor:$indices, I64Attr:$axis);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $input `,` $indices `axis` $axis attr-dict `:` type($input) `,` type($indices)
  }];
}

def Dloss_PutAlongOp : Dloss_Op<"put_along",
    [Pure, InferTypeOpAdaptor, Dloss_IndexOperand<0, 1>]> {
  let summary = "replaces one element per row along an axis";
  let description = [{
    A copy of `input` with `input[i, indices[i]] = values[i]` for `axis = 1`
    (in general, `indices` and `values` have the shape of `input` without
    `axis`). ArcFace and CosFace put the margin-adjusted target logit back this
    way.

    ```mlir
    %m = dloss.put_along %cos, %labels, %target axis 1
        : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, Dloss_IntTensor:$indices,
                   Dloss_NumTensor:$values, I64Attr:$axis);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $input `,` $indices `,` $values `axis` $axis attr-dict `:` type($input) `,`
    type($indices) `,` type($values)
  }];
}

def Dloss_ArangeOp : Dloss_Op<"arange", [Pure]> {
  let summary = "the 1-D tensor start, start + 1, ..., start + count - 1";
  let description = [{
    Labels of the positives on this rank are its global row numbers:

    ```mlir
    %off = dloss.shard_offset %img axis 0 : tensor<?x256xf32>
    %n = dloss.dim %img axis 0 : tensor<?x256xf32>
    %labels = dloss.arange %off, %n : tensor<?xi64>
    ```
  }];
  let arguments = (ins Index:$start, Index:$count);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "$start `,` $count attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Dloss_CrossEntropyOp : Dloss_Op<"cross_entropy",
    [Pure, InferTypeOpAdaptor, Dloss_IndexOperand<0, 1>]> {
  let summary = "per-row softmax cross-entropy against integer targets";
  let description = [{
    `logsumexp(logits, axis) - take_along(logits, targets, axis)`: one loss per
    row, not reduced.

    ```mlir
    %l = dloss.cross_entropy %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
    ```
  }];
  let arguments = (ins Dloss_FloatTensor:$logits, Dloss_IntTensor:$targets, I64Attr:$axis);
  let results = (outs Dloss_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets `axis` $axis attr-dict `:` type($logits) `,` type($targets)
  }];
}


//===----------------------------------------------------------------------===//
// Shapes: the structural ops that reverse mode needs (and users may use).
//===----------------------------------------------------------------------===//

def Dloss_ZerosLikeOp : Dloss_Op<"zeros_like", [Pure, SameOperandsAndResultType]> {
  let summary = "a tensor of zeros with the type and shape of another";
  let description = [{
    ```mlir
    %z = dloss.zeros_like %x : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def Dloss_ExpandOp : Dloss_Op<"expand", [Pure, InferTypeOpAdaptor]> {
  let summary = "repeats a tensor along new axes to the shape of another";
  let description = [{
    Inserts `axes` into `input` and repeats it to the shape of `like`, whose
    shape without `axes` must be `input`'s: `result[i, j] = input[i]` for
    `axes = [1]`. The adjoint of a reduction over `axes`; it also broadcasts
    per-row statistics against a matrix. The result has `like`'s shape and
    `input`'s element type.

    ```mlir
    %row_max = dloss.expand %max axes [1] like %logits : tensor<?xf32>, tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, DenseI64ArrayAttr:$axes,
                   AnyRankedTensor:$like);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $input `axes` $axes `like` $like attr-dict `:` type($input) `,` type($like)
  }];
}

def Dloss_SliceOp : Dloss_Op<"slice", [Pure, InferTypeOpAdaptor]> {
  let summary = "the rows [offset, offset + size) along an axis";
  let description = [{
    Offsets and sizes are run-time values, so the sliced axis is dynamic.
    Picks this rank's block out of a gathered tensor:

    ```mlir
    %mine = dloss.slice %all axis 0 offset %off size %n : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, I64Attr:$axis, Index:$offset, Index:$size);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $input `axis` $axis `offset` $offset `size` $size attr-dict `:` type($input)
  }];
}

def Dloss_PadOp : Dloss_Op<"pad", [Pure, InferTypeOpAdaptor]> {
  let summary = "adds zeros before and after along an axis";
  let description = [{
    `low` zeros before and `high` zeros after along `axis` (the adjoint of
    `dloss.slice`).

    ```mlir
    %full = dloss.pad %mine axis 0 low %before high %after : tensor<?x256xf32>
    ```
  }];
  let arguments = (ins Dloss_NumTensor:$input, I64Attr:$axis, Index:$low, Index:$high);
  let results = (outs Dloss_NumTensor:$result);
  let assemblyFormat = [{
    $input `axis` $axis `low` $low `high` $high attr-dict `:` type($input)
  }];
}

//===----------------------------------------------------------------------===//
// Fused ops. Produced only by dloss-fuse-gather-similarity (never written by
// hand): each replaces an all_gather + matmul + loss pattern, forward or
// backward, by one ring-tiled kernel that never builds the B_local x B_global
// matrix. Each forward op's adjoint is its `_grad` op; the `_grad` ops have no
// adjoint (no second derivatives). docs/Fusion.md has the schedules.
//===----------------------------------------------------------------------===//

def Dloss_RingSoftmaxCEOp : Dloss_CollectiveOp<"ring_softmax_ce", [Dloss_Fused]> {
  let summary = "CLIP's two cross-entropies from one ring of similarity tiles";
  let description = [{
    With `L = scale * rows_all x cols_all^T` (the global matrix, never built),
    `row_ce[i] = logsumexp(L[i, :]) - L[i, row_targets[i]]` for this rank's
    rows and `col_ce[j] = logsumexp(L[:, j]) - L[col_targets[j], j]` for this
    rank's columns. Targets are global indices (into `cols_all` and
    `rows_all`). Chunks of `cols` travel round the ring with their column
    statistics; `row_lse`/`col_lse` are kept for the backward.

    Replaces `cross_entropy(scale * matmul(rows, all_gather(cols))^T)` and the
    mirrored `cross_entropy(scale * matmul(cols, all_gather(rows))^T)`.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Dloss_FloatTensor:$scale, Dloss_IntTensor:$row_targets,
                   Dloss_IntTensor:$col_targets);
  let results = (outs Dloss_FloatTensor:$row_ce, Dloss_FloatTensor:$col_ce,
                      Dloss_FloatTensor:$row_lse, Dloss_FloatTensor:$col_lse);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_RingSoftmaxCEGradOp : Dloss_CollectiveOp<"ring_softmax_ce_grad", [Dloss_Fused]> {
  let summary = "the backward of dloss.ring_softmax_ce, recomputing its tiles";
  let description = [{
    Given the cotangents `ct_row`, `ct_col` of `row_ce`, `col_ce`, returns the
    gradients of `rows`, `cols` (this rank's own, after each chunk's gradient
    went round the ring to its owner) and this rank's partial gradient of
    `scale`. Three tile GEMMs: recompute, d rows, d cols.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Dloss_FloatTensor:$scale, Dloss_IntTensor:$row_targets,
                   Dloss_IntTensor:$col_targets, Dloss_FloatTensor:$row_lse,
                   Dloss_FloatTensor:$col_lse, Dloss_FloatTensor:$ct_row,
                   Dloss_FloatTensor:$ct_col);
  let results = (outs Dloss_FloatTensor:$d_rows, Dloss_FloatTensor:$d_cols,
                      Dloss_FloatTensor:$d_scale);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_RingSigmoidPairsOp : Dloss_CollectiveOp<"ring_sigmoid_pairs", [Dloss_Fused]> {
  let summary = "SigLIP's pairwise softplus sums from one ring of tiles";
  let description = [{
    With `L = scale * rows_all x cols_all^T + bias`, `pair_sum[i] = sum_j
    softplus(L[i, j])` over every global column and `positive[i] = L[i,
    targets[i]]` for this rank's rows. Chunks of `cols` travel round the ring.

    Replaces `reduce sum (softplus(L))` and `take_along(L, targets)` over
    `L = scale * matmul(rows, all_gather(cols))^T + bias`.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Dloss_FloatTensor:$scale, Dloss_FloatTensor:$bias,
                   Dloss_IntTensor:$targets);
  let results = (outs Dloss_FloatTensor:$pair_sum, Dloss_FloatTensor:$positive);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_RingSigmoidPairsGradOp : Dloss_CollectiveOp<"ring_sigmoid_pairs_grad",
    [Dloss_Fused]> {
  let summary = "the backward of dloss.ring_sigmoid_pairs, recomputing its tiles";
  let description = [{
    Given the cotangents `ct_pair`, `ct_positive`, returns the gradients of
    `rows`, `cols` (each chunk's gradient goes round the ring to its owner)
    and this rank's partial gradients of `scale` and `bias`.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Dloss_FloatTensor:$scale, Dloss_FloatTensor:$bias,
                   Dloss_IntTensor:$targets, Dloss_FloatTensor:$ct_pair,
                   Dloss_FloatTensor:$ct_positive);
  let results = (outs Dloss_FloatTensor:$d_rows, Dloss_FloatTensor:$d_cols,
                      Dloss_FloatTensor:$d_scale, Dloss_FloatTensor:$d_bias);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_ShardedSoftmaxOp : Dloss_CollectiveOp<"sharded_softmax", [Dloss_Fused]> {
  let summary = "PartialFC's class-sharded softmax statistics, tiled";
  let description = [{
    `rows` are the gathered rows (every rank the same), `weights` this rank's
    shard of the class weights (classes numbered in rank order, as
    `all_gather(weights)` would). With `L[i, c] = scale * rows[i] . w_c` over
    every class c of every shard, returns `lse_rest[i]` = logsumexp over the
    classes other than `targets[i]` and `target_dot[i] = rows[i] .
    w_{targets[i]}`, both invariant: the row maxima and sums are all-reduced
    across the class shards. The margin on the target logit stays ordinary
    IR, applied to `target_dot`.

    Replaces `cross_entropy(scale * put_along(C, t, f(take_along(C, t))), t)`
    with `C = all_gather(matmul(rows, weights^T), axis 1)` by
    `lse_rest + softplus(s f(c) - lse_rest) - s f(c)`, `c = target_dot`.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$weights,
                   Dloss_FloatTensor:$scale, Dloss_IntTensor:$targets);
  let results = (outs Dloss_FloatTensor:$lse_rest, Dloss_FloatTensor:$target_dot);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_ShardedSoftmaxGradOp : Dloss_ReplicationRuleOp<"sharded_softmax_grad",
    [Pure, Dloss_Fused]> {
  let summary = "the backward of dloss.sharded_softmax, recomputing its tiles";
  let description = [{
    Given the (full) cotangents `ct_lse`, `ct_target` of `lse_rest` and
    `target_dot`, returns this shard's partial gradient of the gathered
    `rows`, the gradient of this rank's `weights` shard and the partial
    gradient of `scale`. No communication: the autodiff pass reduce-scatters
    the rows' gradient as an all_gather's adjoint.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$weights,
                   Dloss_FloatTensor:$scale, Dloss_IntTensor:$targets,
                   Dloss_FloatTensor:$lse_rest, Dloss_FloatTensor:$ct_lse,
                   Dloss_FloatTensor:$ct_target);
  let results = (outs Dloss_FloatTensor:$d_rows, Dloss_FloatTensor:$d_weights,
                      Dloss_FloatTensor:$d_scale);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dloss_FusedSimilarityOp : Dloss_CollectiveOp<"fused_similarity", [Dloss_Fused]> {
  let summary = "row reductions of a program over the similarity tiles";
  let description = [{
    The general fused op: with `S = rows x cols_all^T` (never built), each
    result is, for each of this rank's rows i,
    `r_k[i] = reduce_k over every column j of e_k(i, j)`, where `e_k` is a
    register of the straight-line tile program `program` evaluated on the
    leaves S_ij, the column's index j, per-row values (the first
    `row_leaves` of `leaves`, read at i), per-column values (the next
    `col_leaves`, read at j) and 0-d values (the rest). `reduce_k` is `sum`
    or `logsumexp` (runtime/plan/TileEncoding.h defines the encoding:
    `program` holds (opcode, a, b, c) per instruction, `outputs` (register,
    reduction) per result).

    `gathered`: `cols` is this rank's shard of an `all_gather(cols, axis
    0)`; the columns (and the per-column values, each this rank's shard of a
    gathered vector) travel round a ring of ranks, and the column index is
    global. Otherwise `cols` is a local (or replicated) class matrix tiled
    in place, and the column index is the class index. The row index
    (`row_id`) is global: the rows' shard offset plus i.

    A gathered op may also reduce along columns: `col_outputs` (encoded as
    `outputs`) adds results over this rank's own columns j, each reducing
    `e(i, j)` over every rank's rows i, after the row results. CLIP's two
    directions come from one tile this way.

    `sharded`: `cols` is this rank's shard of the classes (numbered in rank
    order, as `all_gather(matmul(rows, cols^T), axis 1)` would) and `rows`
    and the per-row values are the same on every rank (gathered rows): each
    rank tiles its shard, and the row statistics are all-reduced across the
    shards (a max and a sum for a log-sum-exp, a sum for a sum), so the
    results are invariant. The column index is the global class index.
    PartialFC's class-sharded softmax is this mode.

    The facts about the program that the kernels use, written by the
    compiler beside it (so that the runtime never matches the program) and
    checked by the verifier against the results they describe:
    - `picks`, two integers per row result: `(x, L)` when the result is
      `sum select(eq(col_id, row leaf L), x, 0)`, the value of register x at
      the one column whose index row leaf L names; `(-1, -1)` otherwise.
    - `col_picks`, two per column result: the same with `row_id` and a
      per-column leaf.
    - `lse_pairs`, one per column result: the row result that is the
      log-sum-exp of the same register (CLIP's logits, folded from one
      exp), or -1.
    - `class_targets`: the per-row leaves that the program compares with
      `col_id` (ascending), whose values are column indices; the runtime
      range-checks them on a local class matrix.
    `col_picks` and `lse_pairs` are present exactly when `col_outputs` is.

    Produced by dloss-fuse-gather-similarity from any loss whose similarity
    feeds only elementwise ops ending in row reductions (docs/Fusion.md).
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Variadic<Dloss_NumTensor>:$leaves,
                   I64Attr:$row_leaves, I64Attr:$col_leaves,
                   DenseI64ArrayAttr:$program, DenseI64ArrayAttr:$outputs,
                   OptionalAttr<DenseI64ArrayAttr>:$col_outputs,
                   DenseI64ArrayAttr:$picks,
                   OptionalAttr<DenseI64ArrayAttr>:$col_picks,
                   OptionalAttr<DenseI64ArrayAttr>:$lse_pairs,
                   DenseI64ArrayAttr:$class_targets,
                   UnitAttr:$gathered, UnitAttr:$sharded);
  let results = (outs Variadic<Dloss_FloatTensor>:$results);
  let assemblyFormat = [{
    $rows `,` $cols (`leaves` `(` $leaves^ `)`)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The 0-d leaves: those after the per-row and per-column ones.
    int64_t getScalarCount() {
      return static_cast<int64_t>(getLeaves().size()) - getRowLeaves() -
             getColLeaves();
    }
    /// The number of results reduced along columns (after the row ones).
    int64_t getColResultCount() {
      return getColOutputs() ? static_cast<int64_t>(getColOutputs()->size()) / 2
                             : 0;
    }
  }];
}

def Dloss_FusedSimilarityGradOp : Dloss_CollectiveOp<"fused_similarity_grad",
    [Dloss_Fused]> {
  let summary = "the backward of dloss.fused_similarity, recomputing its tiles";
  let description = [{
    Operands: those of the forward op (`rows`, `cols`, its leaves), then its
    results (row results, then column results), then their cotangents
    (`extra` holds the three groups; the attributes, the program's facts
    included, are the forward op's). Each tile is recomputed, run forward
    and backward through the tile program (the reverse sweep of
    runtime/fused/Epilogue.h), and `G = dL/dS` goes through two tile GEMMs:
    `d_rows += G cols`, `d_cols += G^T rows` (for a gathered op, each
    chunk's column gradient goes round the ring to its owner).
    `d_row_leaves` [row_leaves, n] holds the gradient of each per-row value
    (zero for integer ones) and `d_scalars` [number of 0-d leaves] this
    rank's partial gradient of each 0-d value: the row results' part from
    this rank's rows, the column results' part from its own columns (their
    share travels home with their gradient). `sharded`: the cotangents are
    the full ones (the results are invariant), no communication happens,
    and `d_rows` and `d_scalars` are this shard's partial gradients.
  }];
  let arguments = (ins Dloss_FloatTensor:$rows, Dloss_FloatTensor:$cols,
                   Variadic<Dloss_NumTensor>:$extra,
                   I64Attr:$row_leaves, I64Attr:$col_leaves,
                   DenseI64ArrayAttr:$program, DenseI64ArrayAttr:$outputs,
                   OptionalAttr<DenseI64ArrayAttr>:$col_outputs,
                   DenseI64ArrayAttr:$picks,
                   OptionalAttr<DenseI64ArrayAttr>:$col_picks,
                   OptionalAttr<DenseI64ArrayAttr>:$lse_pairs,
                   DenseI64ArrayAttr:$class_targets,
                   UnitAttr:$gathered, UnitAttr:$sharded);
  let results = (outs Dloss_FloatTensor:$d_rows, Dloss_FloatTensor:$d_cols,
                      Dloss_FloatTensor:$d_row_leaves,
                      Dloss_FloatTensor:$d_scalars);
  let assemblyFormat = [{
    $rows `,` $cols (`extra` `(` $extra^ `)`)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dloss_FusedElementwiseOp : Dloss_Op<"fused_elementwise",
    [Pure, Dloss_Internal]> {
  let summary = "a chain of element-wise ops in one pass over memory";
  let description = [{
    Evaluates the straight-line program `program` at every element of an
    iteration space, the type of its first leaf (its last axis is the
    columns, the others the rows), and writes register `outputs[k]` of each
    element to result k (of that type). Then, for a matrix, each register
    `col_sums[k]` summed over the rows is one more result (1-D, one value
    per column: a batch reduction that ends the chain, so its operand never
    reaches memory). The leaves (`leaves`, in this order): `elements`
    operands of the space's type, read at the element;
    `row_leaves` per-row vectors (1-D, one value per row); `col_leaves`
    per-column vectors (1-D, one value per column); the rest 0-d. The
    encoding is runtime/plan/TileEncoding.h's, with the `element` leaf and
    the arithmetic `add sub mul div neg sqrt`.

    Produced by dloss-fuse-elementwise after autodiff from chains of
    element-wise ops and the sums over the batch that end them (batch norm's
    forward and backward), so that each chain reads its inputs and writes
    its outputs once instead of materialising every intermediate. It has no
    adjoint.

    ```mlir
    %y = dloss.fused_elementwise %x, %m, %s {elements = 1 : i64,
           row_leaves = 0 : i64, col_leaves = 2 : i64,
           program = array<i64: 25, 0, 0, 0, 3, 0, 0, 0, 7, 0, 1, 0,
                                3, 1, 0, 0, 9, 2, 3, 0>,
           outputs = array<i64: 4>}
         : (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
    ```
  }];
  let arguments = (ins Variadic<Dloss_FloatTensor>:$leaves, I64Attr:$elements,
                   I64Attr:$row_leaves, I64Attr:$col_leaves,
                   DenseI64ArrayAttr:$program, DenseI64ArrayAttr:$outputs,
                   OptionalAttr<DenseI64ArrayAttr>:$col_sums);
  let results = (outs Variadic<Dloss_FloatTensor>:$results);
  let assemblyFormat = "$leaves attr-dict `:` functional-type($leaves, results)";
  let hasVerifier = 1;
}

#endif // DLOSS_OPS_TD
