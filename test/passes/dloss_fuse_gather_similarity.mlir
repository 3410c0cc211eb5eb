// RUN: dloss-opt %s --split-input-file --dloss-fuse-gather-similarity | FileCheck %s
// RUN: dloss-opt %s --split-input-file --dloss-fuse-gather-similarity --dloss-autodiff | FileCheck %s --check-prefix=GRAD
// What dloss-fuse-gather-similarity fuses (CLIP, SigLIP, the class-sharded
// softmax) and what it leaves alone.

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

// One direction only (InfoNCE): not the CLIP pattern, stays unfused.
// CHECK-LABEL: func.func @one_direction(
// CHECK: dloss.all_gather
// CHECK: dloss.matmul
// CHECK: dloss.cross_entropy
// CHECK-NOT: dloss.ring_softmax_ce
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
// max): fusing would not save the matrix, so nothing changes.
// CHECK-LABEL: func.func @logits_reused(
// CHECK-COUNT-2: dloss.cross_entropy
// CHECK-NOT: dloss.ring_softmax_ce
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

// SigLIP without its positives: the pattern needs the take_along, so the
// softplus stays.
// CHECK-LABEL: func.func @pairs_only(
// CHECK: dloss.softplus
// CHECK-NOT: dloss.ring_sigmoid_pairs
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
// rank's own rows (varying) the per-shard statistics could not be combined.
// CHECK-LABEL: func.func @sharded_local_rows(
// CHECK: dloss.cross_entropy
// CHECK-NOT: dloss.sharded_softmax
func.func @sharded_local_rows(%x: tensor<?x?xf32> {dloss.grad}, %y: tensor<?xi64>,
                              %w: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %cos_mine = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %cos = dloss.all_gather %cos_mine axis 1 : tensor<?x?xf32>
  %ce = dloss.cross_entropy %cos, %y axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}
