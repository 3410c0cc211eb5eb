// reduce_scatter without size splits the axis evenly, so this one runs with
// even batches (3 rows on every rank).
// NUMERIC-ARGS: --batch-sizes 3
func.func @reduce_scatter_even(%x: tensor<?x?xf32> {dloss.grad},
                               %y: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %yall = dloss.all_gather %y axis 0 : tensor<?x?xf32>
  %gram = dloss.matmul %x, %x transpose_lhs : tensor<?x?xf32>, tensor<?x?xf32>
  %c = dloss.matmul %yall, %gram : tensor<?x?xf32>, tensor<?x?xf32>
  %rs = dloss.reduce_scatter sum %c axis 0 : tensor<?x?xf32>
  %s = dloss.cos %rs : tensor<?x?xf32>
  %p = dloss.mul %s, %y : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %p axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
