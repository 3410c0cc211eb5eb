// l2_normalize_grad differentiated (a second derivative through
// l2_normalize): both operands carry gradients. eps 2.0 puts rows of 5
// features (norms around 2.2) on both sides of the branch, as in
// l2_normalize.mlir; the replicated pair (h, w) takes the rule under
// replicated operands.
func.func @l2_normalize_grad(%x: tensor<?x?xf32> {dloss.grad},
                             %g: tensor<?x?xf32> {dloss.grad},
                             %h: tensor<?x?xf32> {dloss.grad, dloss.replicated},
                             %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %dx = dloss.l2_normalize_grad %g, %x axis 1 eps 2.0 : tensor<?x?xf32>
  %dw = dloss.l2_normalize_grad %h, %w axis 1 : tensor<?x?xf32>
  %cos = dloss.matmul %dx, %dw transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %cos axis 1 : tensor<?x?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
