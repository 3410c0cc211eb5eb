// broadcast of a replicated parameter from root 0: its whole cotangent
// belongs to the root (zero elsewhere), and the DDP average must still be the
// single-device gradient. A broadcast of an invariant intermediate (a global
// column sum) is checked too.
func.func @broadcast_root0(%x: tensor<?x?xf32> {dloss.grad},
                            %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %wb = dloss.broadcast %w root 0 : tensor<?x?xf32>
  %logits = dloss.matmul %x, %wb transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %colsum = dloss.reduce sum %x axes [0] : tensor<?x?xf32>
  %gcol = dloss.all_reduce sum %colsum : tensor<?xf32>
  %gb = dloss.broadcast %gcol root 0 : tensor<?xf32>
  %sq = dloss.mul %gb, %gb : tensor<?xf32>, tensor<?xf32>
  %reg = dloss.reduce sum %sq axes [0] : tensor<?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %b = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f32>
  %mean = dloss.div %total, %bf : tensor<f32>, tensor<f32>
  %loss = dloss.add %mean, %reg : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
