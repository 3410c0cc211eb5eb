// sigmoid, softplus and log_sigmoid, on inputs up to about +-40 (--scale 8
// times a replicated scale) so that their stable forms are exercised.
// NUMERIC-ARGS: --scale 8
func.func @sigmoid_softplus(%x: tensor<?x?xf32> {dloss.grad},
                            %t: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %xt = dloss.mul %x, %t : tensor<?x?xf32>, tensor<f32>
  %sg = dloss.sigmoid %xt : tensor<?x?xf32>
  %sp = dloss.softplus %xt : tensor<?x?xf32>
  %ls = dloss.log_sigmoid %x : tensor<?x?xf32>
  %a = dloss.mul %sg, %sp : tensor<?x?xf32>, tensor<?x?xf32>
  %b = dloss.sub %a, %ls : tensor<?x?xf32>, tensor<?x?xf32>
  %local = dloss.reduce sum %b axes [0, 1] : tensor<?x?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  return %loss : tensor<f32>
}
