// all_reduce mean: its adjoint divides by N. The program multiplies the mean
// back by world_size so that its meaning (the global sum) does not depend on N.
func.func @all_reduce_mean(%x: tensor<?x?xf32> {dloss.grad},
                           %s: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %xs = dloss.mul %x, %s : tensor<?x?xf32>, tensor<f32>
  %sp = dloss.softplus %xs : tensor<?x?xf32>
  %local = dloss.reduce sum %sp axes [0, 1] : tensor<?x?xf32>
  %mean = dloss.all_reduce mean %local : tensor<f32>
  %n = dloss.world_size
  %nf = dloss.cast %n : index to tensor<f32>
  %total = dloss.mul %mean, %nf : tensor<f32>, tensor<f32>
  %b = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %bf = dloss.cast %b : index to tensor<f32>
  %loss = dloss.div %total, %bf : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
