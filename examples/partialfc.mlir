// PartialFC-style ArcFace: the class weights are sharded across the ranks, as
// the program one rank runs.
//
// Each rank holds its rows (embeddings and integer labels, global class ids)
// and its own shard of the class weights: rank r owns classes [o_r, o_r +
// C_r), o_r the sum of the lower ranks' shard sizes (uneven shards are fine).
// Every rank scores the whole global batch against its own classes; the
// softmax over all classes is the all_gather of those blocks along the class
// axis. The margin goes on the target logit: s * cos(theta + m) there and
// s * cos(theta) elsewhere; the loss is the mean cross-entropy over the
// global batch. Unfused, each rank holds the B_global x C matrix; the fusion
// pass (dloss-fuse-gather-similarity) replaces it with dloss.sharded_softmax,
// which tiles the rank's own B_global x C_r block and all-reduces the row
// maxima and sums across the shards.
//
// The weights are not replicated: under the default "ddp" contract rank r
// gets N * dF/dW_r for its shard; compile with --grad-mode global for
// dF/dW_r when W is kept outside DDP (the usual PartialFC setup).
func.func @partialfc(%embeddings: tensor<?x?xf32> {dloss.grad},
                     %labels: tensor<?xi64>,
                     %weights: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %x = dloss.l2_normalize %embeddings axis 1 : tensor<?x?xf32>
  %x_all = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %y_all = dloss.all_gather %labels axis 0 : tensor<?xi64>
  %w = dloss.l2_normalize %weights axis 1 : tensor<?x?xf32>

  // This rank's classes against the global batch, then every class.
  %cos_mine = dloss.matmul %x_all, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %cos = dloss.all_gather %cos_mine axis 1 : tensor<?x?xf32>

  // Margin on the target logit; clamp keeps acos's gradient finite.
  %target = dloss.take_along %cos, %y_all axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %clamped = dloss.clamp %target min -0.9999999 max 0.9999999 : tensor<?xf32>
  %theta = dloss.acos %clamped : tensor<?xf32>
  %margin = arith.constant dense<0.5> : tensor<f32>
  %shifted = dloss.add %theta, %margin : tensor<?xf32>, tensor<f32>
  %target_m = dloss.cos %shifted : tensor<?xf32>
  %cos_m = dloss.put_along %cos, %y_all, %target_m axis 1
      : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %s = arith.constant dense<64.0> : tensor<f32>
  %logits = dloss.mul %cos_m, %s : tensor<?x?xf32>, tensor<f32>

  // Every rank computes the same B_global losses: no all_reduce needed.
  %ce = dloss.cross_entropy %logits, %y_all axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %total = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %batch = dloss.global_size %embeddings axis 0 : tensor<?x?xf32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
