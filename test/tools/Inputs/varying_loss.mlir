// A loss that forgot its all_reduce: dlossc must refuse it.
func.func @varying_loss(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0] : tensor<?xf32>
  // The all_reduce is missing.
  return %s : tensor<f32>
}
