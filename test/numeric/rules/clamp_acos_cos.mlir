// clamp (both bounds, min only, max only) before acos, then cos: the gradient
// is zero where the input was clamped. sin(x) is in [-1, 1] and about a third
// of it falls outside [-0.5, 0.6].
func.func @clamp_acos_cos(%x: tensor<?x?xf32> {dloss.grad},
                          %m: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %s = dloss.sin %x : tensor<?x?xf32>
  %c = dloss.clamp %s min -0.5 max 0.6 : tensor<?x?xf32>
  %theta = dloss.acos %c : tensor<?x?xf32>
  %shifted = dloss.add %theta, %m : tensor<?x?xf32>, tensor<f32>
  %cs = dloss.cos %shifted : tensor<?x?xf32>
  %lo = dloss.clamp %x min -0.3 : tensor<?x?xf32>
  %hi = dloss.clamp %x max 0.4 : tensor<?x?xf32>
  %lohi = dloss.mul %lo, %hi : tensor<?x?xf32>, tensor<?x?xf32>
  %sum = dloss.add %cs, %lohi : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %sum axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
