// ring_shift: rank r receives rank (r - k) mod N's value; the adjoint must send
// each cotangent back the other way. Uneven batches make a wrong direction a
// shape error, not a silent one. Sums over ranks of per-rank terms do not
// depend on the permutation, and shifting by 1 then by -1 restores x exactly,
// so the meaning is that of one rank. A shifted replicated parameter too.
func.func @ring_shift(%x: tensor<?x?xf32> {dloss.grad},
                      %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %y = dloss.ring_shift %x by 1 : tensor<?x?xf32>
  %z = dloss.ring_shift %y by 2 : tensor<?x?xf32>
  %back = dloss.ring_shift %y by -1 : tensor<?x?xf32>
  %sz = dloss.sin %z : tensor<?x?xf32>
  %ex = dloss.exp %x : tensor<?x?xf32>
  %mix = dloss.mul %back, %ex : tensor<?x?xf32>, tensor<?x?xf32>
  %wr = dloss.ring_shift %w by 1 : tensor<?x?xf32>
  %logits = dloss.matmul %y, %wr transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %s1 = dloss.reduce sum %sz axes [0, 1] : tensor<?x?xf32>
  %s2 = dloss.reduce sum %mix axes [0, 1] : tensor<?x?xf32>
  %s3 = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %s12 = dloss.add %s1, %s2 : tensor<f32>, tensor<f32>
  %local = dloss.add %s12, %s3 : tensor<f32>, tensor<f32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
