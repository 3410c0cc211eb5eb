// reduce_scatter sum with uneven slices (size = this rank's rows): rank r
// contributes yall * (x_r^T x_r), whose sum over ranks is Y (X^T X) for the
// global X, Y; rank r keeps its own rows. The adjoint is an all_gather of the
// cotangent.
func.func @reduce_scatter_sum(%x: tensor<?x?xf32> {dloss.grad},
                              %y: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %yall = dloss.all_gather %y axis 0 : tensor<?x?xf32>
  %gram = dloss.matmul %x, %x transpose_lhs : tensor<?x?xf32>, tensor<?x?xf32>
  %c = dloss.matmul %yall, %gram : tensor<?x?xf32>, tensor<?x?xf32>
  %n = dloss.dim %y axis 0 : tensor<?x?xf32>
  %rs = dloss.reduce_scatter sum %c axis 0 size %n : tensor<?x?xf32>
  %mine = dloss.neg %rs : tensor<?x?xf32>
  %s = dloss.sin %mine : tensor<?x?xf32>
  %p = dloss.mul %s, %y : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %p axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
