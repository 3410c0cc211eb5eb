// A replicated parameter s reaches the loss on two paths: through varying
// per-rank compute (a partial cotangent, summed over ranks) and directly
// through invariant compute after the all_reduce (a reduced cotangent, the
// same on every rank). The two forms must meet without double counting.
// grad_mode "ddp".
func.func @invariant_mix_ddp(%x: tensor<?x?xf32> {dloss.grad},
                             %s: tensor<f32> {dloss.grad, dloss.replicated},
                             %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss, dloss.grad_mode = "ddp"} {
  %xs = dloss.mul %x, %s : tensor<?x?xf32>, tensor<f32>
  %logits = dloss.matmul %xs, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %b = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f32>
  %mean = dloss.div %total, %bf : tensor<f32>, tensor<f32>
  %ms = dloss.mul %mean, %s : tensor<f32>, tensor<f32>
  %ss = dloss.mul %s, %s : tensor<f32>, tensor<f32>
  %ww = dloss.mul %w, %w : tensor<?x?xf32>, tensor<?x?xf32>
  %wsum = dloss.reduce sum %ww axes [0, 1] : tensor<?x?xf32>
  %wreg = dloss.mul %wsum, %ss : tensor<f32>, tensor<f32>
  %a = dloss.add %ms, %ss : tensor<f32>, tensor<f32>
  %loss = dloss.add %a, %wreg : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
