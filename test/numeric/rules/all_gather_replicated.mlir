// all_gather of a replicated input gives N copies; the mean and the max over
// the copies equal those over one copy, so the meaning does not depend on N.
// The max over the copies is an N-way tie (one per rank) that the gradient
// must split. Gathers along axis 0 and axis 1.
func.func @all_gather_replicated(%x: tensor<?x?xf32> {dloss.grad},
                                 %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %g0 = dloss.all_gather %w axis 0 : tensor<?x?xf32>
  %m0 = dloss.reduce mean %g0 axes [0] : tensor<?x?xf32>
  %mx0 = dloss.reduce max %g0 axes [0] : tensor<?x?xf32>
  %g1 = dloss.all_gather %w axis 1 : tensor<?x?xf32>
  %m1 = dloss.reduce mean %g1 axes [1] : tensor<?x?xf32>
  %m0e = dloss.expand %m0 axes [0] like %x : tensor<?xf32>, tensor<?x?xf32>
  %mx0e = dloss.expand %mx0 axes [0] like %x : tensor<?xf32>, tensor<?x?xf32>
  %a = dloss.mul %x, %m0e : tensor<?x?xf32>, tensor<?x?xf32>
  %b = dloss.mul %a, %mx0e : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.matmul %x, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %m1e = dloss.expand %m1 axes [0] like %logits : tensor<?xf32>, tensor<?x?xf32>
  %c = dloss.mul %logits, %m1e : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %c axis 1 : tensor<?x?xf32>
  %sb = dloss.reduce sum %b axes [0, 1] : tensor<?x?xf32>
  %sl = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %local = dloss.add %sb, %sl : tensor<f32>, tensor<f32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
