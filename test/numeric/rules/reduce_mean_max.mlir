// Local reductions: mean and max along the feature axis (per row, so the
// meaning does not depend on N), mean over all axes and min over axis 0 of a
// replicated parameter, and a centring expand (x - row mean).
func.func @reduce_mean_max(%x: tensor<?x?xf32> {dloss.grad},
                           %w: tensor<?x?xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %mean = dloss.reduce mean %x axes [1] : tensor<?x?xf32>
  %meane = dloss.expand %mean axes [1] like %x : tensor<?xf32>, tensor<?x?xf32>
  %centred = dloss.sub %x, %meane : tensor<?x?xf32>, tensor<?x?xf32>
  %max = dloss.reduce max %centred axes [1] : tensor<?x?xf32>
  %e = dloss.exp %mean : tensor<?xf32>
  %p = dloss.mul %e, %max : tensor<?xf32>, tensor<?xf32>
  %local = dloss.reduce sum %p axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %b = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f32>
  %data = dloss.div %total, %bf : tensor<f32>, tensor<f32>
  %wmean = dloss.reduce mean %w axes [0, 1] : tensor<?x?xf32>
  %wmin = dloss.reduce min %w axes [0] : tensor<?x?xf32>
  %wmins = dloss.reduce sum %wmin axes [0] : tensor<?xf32>
  %wterm = dloss.mul %wmean, %wmins : tensor<f32>, tensor<f32>
  %loss = dloss.add %data, %wterm : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
