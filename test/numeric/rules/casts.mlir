// Casts between floating-point types on the gradient path (the simulator
// computes in float64 throughout, so only the cast-back of the cotangent is
// checked), and an index cast.
func.func @casts(%x: tensor<?x?xf32> {dloss.grad},
                 %s: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %h = dloss.cast %x : tensor<?x?xf32> to tensor<?x?xbf16>
  %e = dloss.exp %h : tensor<?x?xbf16>
  %back = dloss.cast %e : tensor<?x?xbf16> to tensor<?x?xf64>
  %s64 = dloss.cast %s : tensor<f32> to tensor<f64>
  %p = dloss.mul %back, %s64 : tensor<?x?xf64>, tensor<f64>
  %local = dloss.reduce sum %p axes [0, 1] : tensor<?x?xf64>
  %total = dloss.all_reduce sum %local : tensor<f64>
  %b = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f64>
  %mean = dloss.div %total, %bf : tensor<f64>, tensor<f64>
  %loss = dloss.cast %mean : tensor<f64> to tensor<f32>
  return %loss : tensor<f32>
}
