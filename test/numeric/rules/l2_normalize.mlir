// l2_normalize with eps 2.0: random rows of 5 features have norms around 2.2,
// so both branches (norm >= eps: x / |x|; norm < eps: x / eps) are taken.
// The replicated weights use the default eps.
func.func @l2_normalize(%x: tensor<?x?xf32> {dloss.grad},
                        %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %u = dloss.l2_normalize %x axis 1 eps 2.0 : tensor<?x?xf32>
  %v = dloss.l2_normalize %w axis 1 : tensor<?x?xf32>
  %cos = dloss.matmul %u, %v transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %three = arith.constant dense<3.0> : tensor<f32>
  %logits = dloss.mul %cos, %three : tensor<?x?xf32>, tensor<f32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
