// RUN: dloss-opt %s --split-input-file --dloss-fuse-gather-similarity | FileCheck %s
// RUN: dloss-opt %s --split-input-file --dloss-fuse-gather-similarity --dloss-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: dloss-opt %s --split-input-file --dloss-fuse-gather-similarity=dedicated=false | FileCheck %s --check-prefix=GENERAL
// What dloss-fuse-gather-similarity fuses (CLIP, SigLIP, the class-sharded
// softmax, and the general dloss.fused_similarity family) and what it leaves
// alone. dloss_fuse_gather_similarity_remarks.mlir checks the remark that
// says why a similarity stays unfused.

// CLIP: both cross-entropies, from one ring op; the gathers and matmuls go.
// CHECK-LABEL: func.func @clip(
// CHECK-SAME: %[[IMG:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[TXT:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[S:[^:]*]]: tensor<f32>
// CHECK-NOT: dloss.all_gather
// CHECK-NOT: dloss.matmul
// CHECK: %[[L:.*]] = dloss.arange
// CHECK: %[[ROW:.*]], %[[COL:.*]], %{{.*}}, %{{.*}} = dloss.ring_softmax_ce %[[IMG]], %[[TXT]], %[[S]], %[[L]], %[[L]]
// CHECK-NOT: dloss.cross_entropy
// CHECK: dloss.reduce sum %[[ROW]]
// CHECK: dloss.reduce sum %[[COL]]
// The backward is the fused op's adjoint: one ring_softmax_ce_grad fed by
// the saved row and column log-sum-exps; no reduce_scatter.
// GRAD-LABEL: func.func @clip_grad(
// GRAD: %{{.*}}, %{{.*}}, %[[RL:.*]], %[[CL:.*]] = dloss.ring_softmax_ce
// GRAD-NOT: dloss.reduce_scatter
// GRAD: dloss.ring_softmax_ce_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[RL]], %[[CL]]
// GRAD-NOT: dloss.reduce_scatter
// GRAD: return
// Without the dedicated ops, CLIP is one general op: the mirrored
// similarity's row reductions are its column results (col_outputs), the
// mirror's column ids its row ids (row_id, opcode 23), the duplicated
// scaling shared.
// GENERAL-LABEL: func.func @clip(
// GENERAL-NOT: dloss.all_gather
// GENERAL-NOT: dloss.matmul
// GENERAL: %[[F:.*]]:4 = dloss.fused_similarity %arg0, %arg1 leaves(%[[L:.*]], %[[L]], %arg2) {class_targets = array<i64: 0>, col_leaves = 1 : i64, col_outputs = array<i64: 2, 1, 11, 0>, col_picks = array<i64: -1, -1, 2, 0>, gathered, lse_pairs = array<i64: 0, -1>, outputs = array<i64: 2, 1, 7, 0>, picks = array<i64: -1, -1, 2, 0>, program = array<i64: 0, 0, 0, 0, 4, 0, 0, 0, 8, 0, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 21, 3, 4, 0, 5, 0, 0, 0, 22, 5, 2, 6, 23, 0, 0, 0, 3, 0, 0, 0, 21, 8, 9, 0, 22, 10, 2, 6>, row_leaves = 1 : i64}
// GENERAL: dloss.sub %[[F]]#0, %[[F]]#1
// GENERAL: dloss.sub %[[F]]#2, %[[F]]#3
func.func @clip(%image: tensor<?x?xf32> {dloss.grad}, %text: tensor<?x?xf32> {dloss.grad},
                %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %image_all = dloss.all_gather %image axis 0 : tensor<?x?xf32>
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>
  %offset = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %rows = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %rows : tensor<?xi64>
  %sim_i = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_i = dloss.mul %sim_i, %scale : tensor<?x?xf32>, tensor<f32>
  %sim_t = dloss.matmul %text, %image_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_t = dloss.mul %scale, %sim_t : tensor<f32>, tensor<?x?xf32>
  %ce_i = dloss.cross_entropy %logits_i, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %ce_t = dloss.cross_entropy %logits_t, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum_i = dloss.reduce sum %ce_i axes [0] : tensor<?xf32>
  %sum_t = dloss.reduce sum %ce_t axes [0] : tensor<?xf32>
  %local = dloss.add %sum_i, %sum_t : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  return %total : tensor<f32>
}

// -----

// One direction only (InfoNCE): not the CLIP pattern, but the general one:
// the cross-entropy is a logsumexp (result 0) minus the target's logit
// picked by a column-id mask (result 1), over the ring of gathered columns.
// CHECK-LABEL: func.func @one_direction(
// CHECK-SAME: %[[A:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[B:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[T:[^:]*]]: tensor<?xi64>
// CHECK-NOT: dloss.all_gather
// CHECK-NOT: dloss.matmul
// CHECK: %[[F:.*]]:2 = dloss.fused_similarity %[[A]], %[[B]] leaves(%[[T]]) {class_targets = array<i64: 0>, col_leaves = 0 : i64, gathered,
// CHECK-SAME: outputs = array<i64: 0, 1, 5, 0>, picks = array<i64: -1, -1, 0, 0>, program = array<i64: 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 21, 1, 2, 0, 5, 0, 0, 0, 22, 3, 0, 4>, row_leaves = 1 : i64}
// CHECK: %[[CE:.*]] = dloss.sub %[[F]]#0, %[[F]]#1
// CHECK: dloss.reduce sum %[[CE]] axes [0]
// CHECK-NOT: dloss.cross_entropy
// GRAD-LABEL: func.func @one_direction_grad(
// GRAD: %[[F:.*]]:2 = dloss.fused_similarity
// GRAD: dloss.fused_similarity_grad %{{.*}}, %{{.*}} extra(%{{.*}}, %[[F]]#0, %[[F]]#1, %{{.*}}, %{{.*}}) {class_targets = array<i64: 0>, {{.*}}gathered, outputs = array<i64: 0, 1, 5, 0>, picks = array<i64: -1, -1, 0, 0>,
// GRAD-NOT: dloss.reduce_scatter
// GRAD: return
func.func @one_direction(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                         %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce = dloss.cross_entropy %sim, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// The similarity has another user (here the logits feed an accuracy-style
// max): fusing would not save the matrix, so that direction stays; the
// other direction alone is a general fused op.
// CHECK-LABEL: func.func @logits_reused(
// CHECK-NOT: dloss.ring_softmax_ce
// CHECK: %[[S1:.*]] = dloss.matmul
// CHECK: dloss.cross_entropy %[[S1]]
// CHECK: dloss.fused_similarity
// CHECK: dloss.reduce max %[[S1]]
func.func @logits_reused(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                         %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %a_all = dloss.all_gather %a axis 0 : tensor<?x?xf32>
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  %s1 = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %s2 = dloss.matmul %b, %a_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce1 = dloss.cross_entropy %s1, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %ce2 = dloss.cross_entropy %s2, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %m = dloss.reduce max %s1 axes [0, 1] : tensor<?x?xf32>
  %sum1 = dloss.reduce sum %ce1 axes [0] : tensor<?xf32>
  %sum2 = dloss.reduce sum %ce2 axes [0] : tensor<?xf32>
  %l = dloss.add %sum1, %sum2 : tensor<f32>, tensor<f32>
  %l2 = dloss.add %l, %m : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %l2 : tensor<f32>
  return %total : tensor<f32>
}

// -----

// A gather with grad local keeps its (non-exact) gradient: not fused.
// CHECK-LABEL: func.func @local_grad(
// CHECK-NOT: dloss.ring_softmax_ce
// CHECK: return
func.func @local_grad(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                      %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %a_all = dloss.all_gather %a axis 0 grad local : tensor<?x?xf32>
  %b_all = dloss.all_gather %b axis 0 grad local : tensor<?x?xf32>
  %s1 = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %s2 = dloss.matmul %b, %a_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce1 = dloss.cross_entropy %s1, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %ce2 = dloss.cross_entropy %s2, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum1 = dloss.reduce sum %ce1 axes [0] : tensor<?xf32>
  %sum2 = dloss.reduce sum %ce2 axes [0] : tensor<?xf32>
  %l = dloss.add %sum1, %sum2 : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %l : tensor<f32>
  return %total : tensor<f32>
}

// -----

// SigLIP: softplus summed over both axes and the diagonal positives become
// one ring op; the pair sum is reduced over rows afterwards.
// CHECK-LABEL: func.func @siglip(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[Y:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[T:[^:]*]]: tensor<f32> {{.*}}, %[[B:[^:]*]]: tensor<f32>
// CHECK-NOT: dloss.all_gather
// CHECK: %[[PAIRS:.*]], %[[POS:.*]] = dloss.ring_sigmoid_pairs %[[X]], %[[Y]], %[[T]], %[[B]], %{{.*}}
// CHECK: dloss.reduce sum %[[PAIRS]] axes [0]
// CHECK: dloss.reduce sum %[[POS]] axes [0]
// CHECK-NOT: dloss.softplus
// GRAD-LABEL: func.func @siglip_grad(
// GRAD: dloss.ring_sigmoid_pairs_grad
// GRAD-NOT: dloss.reduce_scatter
// GRAD: return
// GENERAL-LABEL: func.func @siglip(
// GENERAL-NOT: dloss.softplus
// GENERAL: dloss.fused_similarity {{.*}}gathered, outputs = array<i64: 5, 0, 10, 0>
func.func @siglip(%image: tensor<?x?xf32> {dloss.grad}, %text: tensor<?x?xf32> {dloss.grad},
                  %t: tensor<f32> {dloss.grad, dloss.replicated},
                  %bias: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>
  %offset = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %rows = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %rows : tensor<?xi64>
  %sim = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %scaled = dloss.mul %sim, %t : tensor<?x?xf32>, tensor<f32>
  %logits = dloss.add %bias, %scaled : tensor<f32>, tensor<?x?xf32>
  %pairs = dloss.softplus %logits : tensor<?x?xf32>
  %pairs_sum = dloss.reduce sum %pairs axes [0, 1] : tensor<?x?xf32>
  %positives = dloss.take_along %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %positives_sum = dloss.reduce sum %positives axes [0] : tensor<?xf32>
  %local = dloss.sub %pairs_sum, %positives_sum : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  return %total : tensor<f32>
}

// -----

// SigLIP without its positives: not the SigLIP pattern (it needs the
// take_along), but the general one: the softplus is the tile program's and
// the sum over both axes a row sum reduced over rows afterwards.
// CHECK-LABEL: func.func @pairs_only(
// CHECK-NOT: dloss.ring_sigmoid_pairs
// CHECK: %[[F:.*]] = dloss.fused_similarity %{{.*}}, %{{.*}} leaves(%{{.*}}) {class_targets = array<i64>, col_leaves = 0 : i64, gathered, outputs = array<i64: 3, 0>, picks = array<i64: -1, -1>, program = array<i64: 0, 0, 0, 0, 4, 0, 0, 0, 6, 0, 1, 0, 13, 2, 0, 0>, row_leaves = 0 : i64}
// CHECK: dloss.reduce sum %[[F]] axes [0]
// CHECK-NOT: dloss.softplus
func.func @pairs_only(%image: tensor<?x?xf32> {dloss.grad}, %text: tensor<?x?xf32> {dloss.grad},
                      %bias: tensor<f32> {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.add %sim, %bias : tensor<?x?xf32>, tensor<f32>
  %pairs = dloss.softplus %logits : tensor<?x?xf32>
  %pairs_sum = dloss.reduce sum %pairs axes [0, 1] : tensor<?x?xf32>
  %total = dloss.all_reduce sum %pairs_sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// Class-sharded softmax with a CosFace margin: the target's dot product comes
// from the fused op, the margin stays ordinary IR, and the cross-entropy is
// rebuilt as lse_rest + softplus(target - lse_rest) - target.
// CHECK-LABEL: func.func @cosface_sharded(
// CHECK: %[[XALL:.*]] = dloss.all_gather %{{.*}} axis 0
// CHECK: %[[YALL:.*]] = dloss.all_gather %{{.*}} axis 0
// CHECK-NOT: dloss.all_gather
// CHECK: %[[S:.*]] = arith.constant dense<3.000000e+01>
// CHECK: %[[REST:.*]], %[[DOT:.*]] = dloss.sharded_softmax %[[XALL]], %{{.*}}, %[[S]], %[[YALL]]
// CHECK: %[[M:.*]] = dloss.sub %[[DOT]], %{{.*}}
// CHECK: %[[TL:.*]] = dloss.mul %[[M]], %[[S]]
// CHECK: %[[GAP:.*]] = dloss.sub %[[TL]], %[[REST]]
// CHECK: %[[SP:.*]] = dloss.softplus %[[GAP]]
// CHECK: %[[LSE:.*]] = dloss.add %[[REST]], %[[SP]]
// CHECK: %[[CE:.*]] = dloss.sub %[[LSE]], %[[TL]]
// CHECK: dloss.reduce sum %[[CE]]
// CHECK-NOT: dloss.cross_entropy
// CHECK-NOT: dloss.put_along
// GRAD-LABEL: func.func @cosface_sharded_grad(
// GRAD: dloss.sharded_softmax_grad
// GRAD: dloss.reduce_scatter
// GRAD: return
// Without the dedicated ops: the general op in its sharded mode (invariant
// results, all-reduced across the class shards), the same rewrite around it.
// GENERAL-LABEL: func.func @cosface_sharded(
// GENERAL: %[[F:.*]]:2 = dloss.fused_similarity %{{.*}}, %{{.*}} leaves(%{{.*}}, %{{.*}}) {class_targets = array<i64: 0>, col_leaves = 0 : i64, outputs = array<i64: 7, 1, 9, 0>, picks = array<i64: -1, -1, 0, 0>, {{.*}}row_leaves = 1 : i64, sharded}
// GENERAL: dloss.sub %[[F]]#1
// GENERAL-NOT: dloss.sharded_softmax
func.func @cosface_sharded(%x: tensor<?x?xf32> {dloss.grad}, %y: tensor<?xi64>,
                           %w: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %x_all = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %y_all = dloss.all_gather %y axis 0 grad none : tensor<?xi64>
  %cos_mine = dloss.matmul %x_all, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %cos = dloss.all_gather %cos_mine axis 1 : tensor<?x?xf32>
  %target = dloss.take_along %cos, %y_all axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %m = arith.constant dense<0.35> : tensor<f32>
  %target_m = dloss.sub %target, %m : tensor<?xf32>, tensor<f32>
  %cos_m = dloss.put_along %cos, %y_all, %target_m axis 1
      : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %s = arith.constant dense<30.0> : tensor<f32>
  %logits = dloss.mul %cos_m, %s : tensor<?x?xf32>, tensor<f32>
  %ce = dloss.cross_entropy %logits, %y_all axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %total = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  return %total : tensor<f32>
}

// -----

// The class-sharded pattern needs the same rows on every shard: with this
// rank's own rows (varying) the per-shard statistics could not be combined,
// and a similarity gathered along axis 1 is no ring either.
// CHECK-LABEL: func.func @sharded_local_rows(
// CHECK: dloss.cross_entropy
// CHECK-NOT: dloss.sharded_softmax
// CHECK-NOT: dloss.fused_similarity
func.func @sharded_local_rows(%x: tensor<?x?xf32> {dloss.grad}, %y: tensor<?xi64>,
                              %w: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %cos_mine = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %cos = dloss.all_gather %cos_mine axis 1 : tensor<?x?xf32>
  %ce = dloss.cross_entropy %cos, %y axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// ArcFace with a replicated W: tiled over the classes (no ring, no gather):
// the log-sum-exp over every class but the target (result 0, the target
// masked with -inf) and the target's cosine (result 1); the margin stays
// ordinary IR and the cross-entropy is rebuilt from both.
// CHECK-LABEL: func.func @arcface_replicated(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[Y:[^:]*]]: tensor<?xi64>, %[[W:[^:]*]]: tensor<?x?xf32>
// CHECK: %[[S:.*]] = arith.constant dense<6.400000e+01>
// CHECK: %[[F:.*]]:2 = dloss.fused_similarity %[[X]], %[[W]] leaves(%[[Y]], %[[S]]) {class_targets = array<i64: 0>, col_leaves = 0 : i64, outputs = array<i64: 7, 1, 9, 0>, picks = array<i64: -1, -1, 0, 0>
// CHECK-NOT: gathered
// CHECK: dloss.clamp %[[F]]#1
// CHECK: dloss.softplus
// CHECK-NOT: dloss.cross_entropy
// CHECK-NOT: dloss.matmul
// GRAD-LABEL: func.func @arcface_replicated_grad(
// GRAD: %[[DX:.*]], %[[DW:.*]], %{{.*}}, %{{.*}} = dloss.fused_similarity_grad
// GRAD-NOT: dloss.reduce_scatter
// GRAD: return
func.func @arcface_replicated(%x: tensor<?x?xf32> {dloss.grad}, %y: tensor<?xi64>,
                             %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %cos = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %target = dloss.take_along %cos, %y axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %c = dloss.clamp %target min -0.9999999 max 0.9999999 : tensor<?xf32>
  %theta = dloss.acos %c : tensor<?xf32>
  %m = arith.constant dense<0.5> : tensor<f32>
  %shifted = dloss.add %theta, %m : tensor<?xf32>, tensor<f32>
  %target_m = dloss.cos %shifted : tensor<?xf32>
  %cos_m = dloss.put_along %cos, %y, %target_m axis 1
      : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %s = arith.constant dense<64.0> : tensor<f32>
  %logits = dloss.mul %cos_m, %s : tensor<?x?xf32>, tensor<f32>
  %ce = dloss.cross_entropy %logits, %y axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// NT-Xent: the self-similarity masked by comparing per-row global ids with
// the column ids (an arange over every gathered column), the positive the
// other view; the masks are part of the tile program, the expands go.
// CHECK-LABEL: func.func @ntxent_mask(
// CHECK: %[[F:.*]]:2 = dloss.fused_similarity %{{.*}}, %{{.*}} leaves(%[[ROWS:.*]], %[[POS:.*]]) {class_targets = array<i64: 0, 1>, col_leaves = 0 : i64, gathered,
// CHECK-SAME: picks = array<i64: -1, -1, 7, 1>,
// CHECK-SAME: program = array<i64: 0, 0, 0, 0, 5, 4602678819172646912, 0, 0, 9, 0, 1, 0, 2, 0, 0, 0, 1, 0, 0, 0, 21, 3, 4, 0, 5, -4503599627370496, 0, 0, 22, 5, 6, 2,
// CHECK-NOT: dloss.expand
// CHECK-NOT: dloss.select
// CHECK-NOT: dloss.all_gather
// GRAD-LABEL: func.func @ntxent_mask_grad(
// GRAD: dloss.fused_similarity_grad
// GRAD: return
func.func @ntxent_mask(%z: tensor<?x?xf32> {dloss.grad}, %rows: tensor<?xi64>,
                       %pos: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %all = dloss.all_gather %z axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %z, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %temperature = arith.constant dense<0.5> : tensor<f32>
  %logits = dloss.div %sim, %temperature : tensor<?x?xf32>, tensor<f32>
  %b = dloss.global_size %z axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %b : tensor<?xi64>
  %row_ids = dloss.expand %rows axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_self = dloss.eq %row_ids, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %masked = dloss.select %is_self, %ninf, %logits : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %ce = dloss.cross_entropy %masked, %pos axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// SupCon: positives are every same-label column (a per-column label leaf:
// this rank's labels travel with its columns), counted and summed by masked
// row sums; the self column is masked out of the log-sum-exp.
// CHECK-LABEL: func.func @supcon_labels(
// CHECK-SAME: %[[Z:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[Y:[^:]*]]: tensor<?xi64>, %[[IDS:[^:]*]]: tensor<?xi64>
// CHECK: %[[F:.*]]:3 = dloss.fused_similarity %[[Z]], %[[Z]] leaves(%[[IDS]], %[[Y]], %[[Y]]) {class_targets = array<i64: 0>, col_leaves = 1 : i64, gathered,
// CHECK-SAME: picks = array<i64: -1, -1, -1, -1, -1, -1>,
// CHECK-SAME: row_leaves = 2 : i64}
// CHECK-NOT: dloss.all_gather
// CHECK-NOT: dloss.logsumexp
// GRAD-LABEL: func.func @supcon_labels_grad(
// GRAD: dloss.fused_similarity_grad
// GRAD: return
func.func @supcon_labels(%z: tensor<?x?xf32> {dloss.grad}, %y: tensor<?xi64>,
                         %ids: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %all = dloss.all_gather %z axis 0 : tensor<?x?xf32>
  %y_all = dloss.all_gather %y axis 0 grad none : tensor<?xi64>
  %sim = dloss.matmul %z, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %b = dloss.global_size %z axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %b : tensor<?xi64>
  %row_ids = dloss.expand %ids axes [1] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %is_self = dloss.eq %row_ids, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %row_y = dloss.expand %y axes [1] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %col_y = dloss.expand %y_all axes [0] like %sim : tensor<?xi64>, tensor<?x?xf32>
  %same = dloss.eq %row_y, %col_y : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %zero_f = arith.constant dense<0.0> : tensor<f32>
  %others = dloss.select %is_self, %ninf, %sim : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %others axis 1 : tensor<?x?xf32>
  %not_self = dloss.select %is_self, %zero_f, %sim : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %pos = dloss.select %same, %not_self, %zero_f : tensor<?x?xi64>, tensor<?x?xf32>, tensor<f32>
  %pos_sum = dloss.reduce sum %pos axes [1] : tensor<?x?xf32>
  %ind = dloss.cast %same : tensor<?x?xi64> to tensor<?x?xf32>
  %count = dloss.reduce sum %ind axes [1] : tensor<?x?xf32>
  %mean_pos = dloss.div %pos_sum, %count : tensor<?xf32>, tensor<?xf32>
  %loss = dloss.sub %lse, %mean_pos : tensor<?xf32>, tensor<?xf32>
  %sum = dloss.reduce sum %loss axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// DCL: the positive is left out of the denominator (its column masked with
// -inf by comparing the column ids with each row's positive) and picked by
// take_along: one log-sum-exp and one pick from the same tiles.
// CHECK-LABEL: func.func @dcl_positive_out(
// CHECK-SAME: %[[Q:[^:]*]]: tensor<?x?xf32> {dloss.grad}, %[[K:[^:]*]]: tensor<?x?xf32> {dloss.grad}
// CHECK: %[[F:.*]]:2 = dloss.fused_similarity %[[Q]], %[[K]] leaves(%[[POS:.*]], %{{.*}}) {class_targets = array<i64: 0>, col_leaves = 0 : i64, gathered,
// CHECK-SAME: outputs = array<i64: 7, 1, 9, 0>, picks = array<i64: -1, -1, 2, 0>
// CHECK: dloss.sub %[[F]]#0, %[[F]]#1
// CHECK-NOT: dloss.logsumexp
// CHECK-NOT: dloss.take_along
// GRAD-LABEL: func.func @dcl_positive_out_grad(
// GRAD: dloss.fused_similarity_grad
// GRAD: return
func.func @dcl_positive_out(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                            %s: tensor<f32> {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %all = dloss.all_gather %k axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %q, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %s : tensor<?x?xf32>, tensor<f32>
  %offset = dloss.shard_offset %q axis 0 : tensor<?x?xf32>
  %n = dloss.dim %q axis 0 : tensor<?x?xf32>
  %pos = dloss.arange %offset, %n : tensor<?xi64>
  %b = dloss.global_size %k axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %b : tensor<?xi64>
  %row_pos = dloss.expand %pos axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_pos = dloss.eq %row_pos, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %negatives = dloss.select %is_pos, %ninf, %logits : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %negatives axis 1 : tensor<?x?xf32>
  %positive = dloss.take_along %logits, %pos axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %loss = dloss.sub %lse, %positive : tensor<?xf32>, tensor<?xf32>
  %sum = dloss.reduce sum %loss axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// Hard-negative weighting (Robinson et al.): the importance-weighted
// negative term is a ratio of two row sums of exponentials of the logits,
// both results of one op (the ratio and the log stay per-row IR).
// CHECK-LABEL: func.func @hard_negatives(
// CHECK: %[[F:.*]]:3 = dloss.fused_similarity {{.*}}gathered, outputs = array<i64: {{[0-9]+}}, 0, {{[0-9]+}}, 0, {{[0-9]+}}, 0>
// CHECK: dloss.div %[[F]]#0, %[[F]]#1
// CHECK-NOT: dloss.exp %{{.*}} : tensor<?x?xf32>
func.func @hard_negatives(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                          %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %all = dloss.all_gather %k axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %q, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %tau = arith.constant dense<0.1> : tensor<f32>
  %logits = dloss.div %sim, %tau : tensor<?x?xf32>, tensor<f32>
  %beta = arith.constant dense<0.5> : tensor<f32>
  %one_beta = arith.constant dense<1.5> : tensor<f32>
  %wl = dloss.mul %logits, %one_beta : tensor<?x?xf32>, tensor<f32>
  %weighted = dloss.exp %wl : tensor<?x?xf32>
  %bl = dloss.mul %logits, %beta : tensor<?x?xf32>, tensor<f32>
  %weights = dloss.exp %bl : tensor<?x?xf32>
  %num = dloss.reduce sum %weighted axes [1] : tensor<?x?xf32>
  %den = dloss.reduce sum %weights axes [1] : tensor<?x?xf32>
  %neg = dloss.div %num, %den : tensor<?xf32>, tensor<?xf32>
  %pos = dloss.take_along %logits, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %log_neg = dloss.log %neg : tensor<?xf32>
  %loss = dloss.sub %log_neg, %pos : tensor<?xf32>, tensor<?xf32>
  %sum = dloss.reduce sum %loss axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// sentence-transformers' hardness weighting: a stop-gradient copy of the
// similarity, scaled by alpha, added to every negative logit (not the row's
// own column). stop_gradient is an instruction of the tile program (opcode
// 24); its adjoint passes nothing, so the backward is fused too and no
// similarity matrix is left.
// %3 = stop_gradient %0 (S), %5 = %3 * 9, %10 = select(own, 0, %5),
// %11 = s S + %10: the log-sum-exp; %12 the positive's logit, picked.
// CHECK-LABEL: func.func @hardness_stop_gradient(
// CHECK: dloss.fused_similarity
// CHECK-SAME: outputs = array<i64: 11, 1, 12, 0>, picks = array<i64: -1, -1, 2, 0>,
// CHECK-SAME: program = array<i64: 0, 0, 0, 0, 4, 0, 0, 0, 8, 0, 1, 0, 24, 0, 0, 0, 5, 4621256167635550208, 0, 0, 8, 3, 4, 0, 2, 0, 0, 0, 1, 0, 0, 0, 21, 6, 7, 0, 5, 0, 0, 0, 22, 8, 9, 5, 6, 2, 10, 0, 22, 8, 2, 9>
// CHECK-NOT: dloss.stop_gradient
// CHECK-NOT: dloss.matmul
// CHECK-NOT: dloss.logsumexp
// GRAD-LABEL: func.func @hardness_stop_gradient_grad(
// GRAD-NOT: dloss.matmul
// GRAD: dloss.fused_similarity_grad
// GRAD-NOT: dloss.matmul
// GRAD: return
func.func @hardness_stop_gradient(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                                  %s: tensor<f32> {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %all = dloss.all_gather %k axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %q, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %s : tensor<?x?xf32>, tensor<f32>
  %held = dloss.stop_gradient %sim : tensor<?x?xf32>
  %alpha = arith.constant dense<9.0> : tensor<f32>
  %penalty = dloss.mul %held, %alpha : tensor<?x?xf32>, tensor<f32>
  %offset = dloss.shard_offset %q axis 0 : tensor<?x?xf32>
  %n = dloss.dim %q axis 0 : tensor<?x?xf32>
  %pos = dloss.arange %offset, %n : tensor<?xi64>
  %b = dloss.global_size %k axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %b : tensor<?xi64>
  %row_pos = dloss.expand %pos axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_pos = dloss.eq %row_pos, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %zero_f = arith.constant dense<0.0> : tensor<f32>
  %others = dloss.select %is_pos, %zero_f, %penalty : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %hard = dloss.add %logits, %others : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %hard axis 1 : tensor<?x?xf32>
  %positive = dloss.take_along %logits, %pos axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %loss = dloss.sub %lse, %positive : tensor<?xf32>, tensor<?xf32>
  %sum = dloss.reduce sum %loss axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}
