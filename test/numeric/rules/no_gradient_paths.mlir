// dloss.grad arguments that the loss does not depend on differentiably: one
// unused, one reaching the loss only through eq (an indicator) and dim, one
// only through a zeros_like. Their gradients are zero.
func.func @no_gradient_paths(%x: tensor<?x?xf32> {dloss.grad},
                             %unused: tensor<?x?xf32> {dloss.grad},
                             %mask_src: tensor<?x?xf32> {dloss.grad},
                             %z: tensor<?x?xf32> {dloss.grad},
                             %p: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant dense<0.0> : tensor<f32>
  %pos = dloss.eq %mask_src, %mask_src : tensor<?x?xf32>, tensor<?x?xf32>
  %zz = dloss.zeros_like %z : tensor<?x?xf32>
  %xm = dloss.mul %x, %pos : tensor<?x?xf32>, tensor<?x?xf32>
  %xz = dloss.add %xm, %zz : tensor<?x?xf32>, tensor<?x?xf32>
  %e = dloss.exp %xz : tensor<?x?xf32>
  %local = dloss.reduce sum %e axes [0, 1] : tensor<?x?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %loss = dloss.add %total, %zero : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
