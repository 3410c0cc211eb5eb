// Collectives applied to invariant values, whose results equal their inputs
// (or a function of one copy): all_reduce max / min / mean (an N-way tie for
// max and min), broadcast, ring_shift, and reduce_scatter mean of an
// all_gather (each rank gets its own rows back). Their adjoints must still sum
// to the single-device gradient.
func.func @invariant_collectives(%y: tensor<?x?xf32> {dloss.grad},
                                 %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %a = dloss.all_reduce max %w : tensor<?x?xf32>
  %sw = dloss.sin %w : tensor<?x?xf32>
  %b = dloss.all_reduce min %sw : tensor<?x?xf32>
  %ew = dloss.exp %w : tensor<?x?xf32>
  %c = dloss.all_reduce mean %ew : tensor<?x?xf32>
  %cw = dloss.cos %w : tensor<?x?xf32>
  %d = dloss.broadcast %cw root 0 : tensor<?x?xf32>
  %e = dloss.ring_shift %a by 1 : tensor<?x?xf32>
  %ab = dloss.mul %a, %b : tensor<?x?xf32>, tensor<?x?xf32>
  %cd = dloss.mul %c, %d : tensor<?x?xf32>, tensor<?x?xf32>
  %abcd = dloss.add %ab, %cd : tensor<?x?xf32>, tensor<?x?xf32>
  %all = dloss.add %abcd, %e : tensor<?x?xf32>, tensor<?x?xf32>
  %inv = dloss.reduce sum %all axes [0, 1] : tensor<?x?xf32>
  %yall = dloss.all_gather %y axis 0 : tensor<?x?xf32>
  %ty = dloss.sin %yall : tensor<?x?xf32>
  %n = dloss.dim %y axis 0 : tensor<?x?xf32>
  %mine = dloss.reduce_scatter mean %ty axis 0 size %n : tensor<?x?xf32>
  %logits = dloss.matmul %mine, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %loss = dloss.add %total, %inv : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
