// stop_gradient: the value flows on, its gradient does not. A per-element
// weight (a hardness weighting), a global statistic (DINO's centre) and a
// replicated parameter used both through it and directly: a rule that let
// the gradient through would double a's and add y's and the centre's terms.
func.func @stop_gradient(%x: tensor<?x?xf32> {dloss.grad},
                         %y: tensor<?x?xf32> {dloss.grad},
                         %a: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %sy = dloss.sigmoid %y : tensor<?x?xf32>
  %w = dloss.stop_gradient %sy : tensor<?x?xf32>
  %xx = dloss.mul %x, %x : tensor<?x?xf32>, tensor<?x?xf32>
  %wxx = dloss.mul %w, %xx : tensor<?x?xf32>, tensor<?x?xf32>
  %lx = dloss.reduce sum %x axes [0, 1] : tensor<?x?xf32>
  %gx = dloss.all_reduce sum %lx : tensor<f32>
  %c = dloss.stop_gradient %gx : tensor<f32>
  %xc = dloss.mul %x, %c : tensor<?x?xf32>, tensor<f32>
  %ay = dloss.mul %y, %a : tensor<?x?xf32>, tensor<f32>
  %as = dloss.stop_gradient %a : tensor<f32>
  %aya = dloss.mul %ay, %as : tensor<?x?xf32>, tensor<f32>
  %s1 = dloss.add %wxx, %xc : tensor<?x?xf32>, tensor<?x?xf32>
  %s2 = dloss.add %s1, %aya : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %s2 axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
