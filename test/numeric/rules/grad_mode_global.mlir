// grad_mode = "global": rank r gets its rows of dF/dx (no factor N) and the
// replicated parameters get the full dF/dtheta on every rank. A CLIP-style
// loss with a replicated projection W and logit scale.
func.func @grad_mode_global(%image: tensor<?x?xf32> {dloss.grad},
                            %text: tensor<?x?xf32> {dloss.grad},
                            %w: tensor<?x?xf32> {dloss.grad, dloss.replicated},
                            %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss, dloss.grad_mode = "global"} {
  %proj = dloss.matmul %image, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %tproj = dloss.matmul %text, %w transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %u = dloss.l2_normalize %proj axis 1 : tensor<?x?xf32>
  %v = dloss.l2_normalize %tproj axis 1 : tensor<?x?xf32>
  %vall = dloss.all_gather %v axis 0 : tensor<?x?xf32>
  %off = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %n = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %off, %n : tensor<?xi64>
  %sim = dloss.matmul %u, %vall transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %scale : tensor<?x?xf32>, tensor<f32>
  %ce = dloss.cross_entropy %logits, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %local = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %b = dloss.global_size %image axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f32>
  %loss = dloss.div %total, %bf : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
