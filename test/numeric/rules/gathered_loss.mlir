// The whole loss computed redundantly on every rank from gathered data (no
// all_reduce): embeddings and integer labels are all_gather'ed (the labels
// carry no gradient), so every value after the gathers is invariant and the
// cotangents reaching the gathers are already complete on every rank.
func.func @gathered_loss(%x: tensor<?x?xf32> {dloss.grad},
                         %labels: tensor<?xi64>,
                         %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %xall = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %lall = dloss.all_gather %labels axis 0 : tensor<?xi64>
  %logits = dloss.matmul %xall, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce = dloss.cross_entropy %logits, %lall axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce mean %ce axes [0] : tensor<?xf32>
  return %sum : tensor<f32>
}
