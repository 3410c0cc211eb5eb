// ArcFace (additive angular margin) with replicated class weights, as the
// program one rank runs.
//
// Each rank holds its rows (embeddings and integer class labels); the class
// weights W (classes x dim) are replicated. logits = s * cos(theta + m) for
// the target class and s * cos(theta) for the others; the loss is the mean
// cross-entropy over the global batch. W's gradient follows the gradient
// contract (`dloss.grad_mode`, default "ddp": W is a DDP parameter).
func.func @arcface(%embeddings: tensor<?x?xf32> {dloss.grad},
                   %labels: tensor<?xi64>,
                   %weights: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %x = dloss.l2_normalize %embeddings axis 1 : tensor<?x?xf32>
  %w = dloss.l2_normalize %weights axis 1 : tensor<?x?xf32>
  %cos = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>

  // Margin on the target logit; clamp keeps acos's gradient finite.
  %target = dloss.take_along %cos, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %clamped = dloss.clamp %target min -0.9999999 max 0.9999999 : tensor<?xf32>
  %theta = dloss.acos %clamped : tensor<?xf32>
  %margin = arith.constant dense<0.5> : tensor<f32>
  %shifted = dloss.add %theta, %margin : tensor<?xf32>, tensor<f32>
  %target_m = dloss.cos %shifted : tensor<?xf32>
  %cos_m = dloss.put_along %cos, %labels, %target_m axis 1
      : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %s = arith.constant dense<64.0> : tensor<f32>
  %logits = dloss.mul %cos_m, %s : tensor<?x?xf32>, tensor<f32>

  %ce = dloss.cross_entropy %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %local = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %batch = dloss.global_size %embeddings axis 0 : tensor<?x?xf32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
