// take_along / put_along with integer labels (class indices into the rows of
// the replicated weights): the target logit is replaced by a function of
// itself (put_along replaces, so the old target gets no gradient through that
// path), plus an eq mask (no gradient) built from the labels.
func.func @put_take_along(%x: tensor<?x?xf32> {dloss.grad},
                          %labels: tensor<?xi64>,
                          %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %logits = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %t = dloss.take_along %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %st = dloss.sin %t : tensor<?xf32>
  %t2 = dloss.mul %st, %t : tensor<?xf32>, tensor<?xf32>
  %m = dloss.put_along %logits, %labels, %t2 axis 1
      : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %lse = dloss.logsumexp %m axis 1 : tensor<?x?xf32>
  %zero = arith.constant dense<0> : tensor<i64>
  %lab0 = dloss.eq %labels, %zero : tensor<?xi64>, tensor<i64>
  %lab0f = dloss.cast %lab0 : tensor<?xi64> to tensor<?xf32>
  %bonus = dloss.mul %lab0f, %t : tensor<?xf32>, tensor<?xf32>
  %ce = dloss.cross_entropy %m, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %a = dloss.add %lse, %bonus : tensor<?xf32>, tensor<?xf32>
  %b = dloss.add %a, %ce : tensor<?xf32>, tensor<?xf32>
  %local = dloss.reduce sum %b axes [0] : tensor<?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
