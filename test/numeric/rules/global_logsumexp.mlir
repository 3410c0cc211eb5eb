// A global logsumexp over all rows of the batch, stabilised by the global max
// (all_reduce max, no ties), as in a softmax over the whole batch.
func.func @global_logsumexp(%x: tensor<?x?xf32> {dloss.grad},
                            %v: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %scores = dloss.matmul %x, %v transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %rowmax = dloss.reduce max %scores axes [0, 1] : tensor<?x?xf32>
  %m = dloss.all_reduce max %rowmax : tensor<f32>
  %shifted = dloss.sub %scores, %m : tensor<?x?xf32>, tensor<f32>
  %e = dloss.exp %shifted : tensor<?x?xf32>
  %local = dloss.reduce sum %e axes [0, 1] : tensor<?x?xf32>
  %sum = dloss.all_reduce sum %local : tensor<f32>
  %log = dloss.log %sum : tensor<f32>
  %loss = dloss.add %log, %m : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
