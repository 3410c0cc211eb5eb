// matmul with every transpose combination: the global Gram matrix X^T X
// (transpose_lhs, then all_reduce), a projection with both flags, and one
// without flags.
func.func @matmul_transposes(%x: tensor<?x?xf32> {dloss.grad},
                             %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %gram = dloss.matmul %x, %x transpose_lhs : tensor<?x?xf32>, tensor<?x?xf32>
  %g = dloss.all_reduce sum %gram : tensor<?x?xf32>
  %gw = dloss.matmul %g, %w transpose_lhs transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %wg = dloss.matmul %w, %gw : tensor<?x?xf32>, tensor<?x?xf32>
  %s = dloss.sin %wg : tensor<?x?xf32>
  %inv = dloss.reduce sum %s axes [0, 1] : tensor<?x?xf32>
  %p = dloss.matmul %x, %gw : tensor<?x?xf32>, tensor<?x?xf32>
  %c = dloss.cos %p : tensor<?x?xf32>
  %local = dloss.reduce sum %c axes [0, 1] : tensor<?x?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %loss = dloss.add %total, %inv : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
