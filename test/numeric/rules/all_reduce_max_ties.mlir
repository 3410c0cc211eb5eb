// all_reduce max/min after a local reduce max/min, with the global extremum
// tied across ranks: row 0 of every rank is the same large row and row 1 the
// same small row (--tie-rows), once per rank. The single-device gradient
// (torch.amax/amin) splits the cotangent evenly between the tied rows, so the
// ranks holding a tie must share it equally.
// NUMERIC-ARGS: --tie-rows
func.func @max_ties(%x: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %colmax = dloss.reduce max %x axes [0] : tensor<?x?xf32>
  %gmax = dloss.all_reduce max %colmax : tensor<?xf32>
  %colmin = dloss.reduce min %x axes [0] : tensor<?x?xf32>
  %gmin = dloss.all_reduce min %colmin : tensor<?xf32>
  %a = dloss.sin %gmax : tensor<?xf32>
  %b = dloss.mul %gmin, %gmin : tensor<?xf32>, tensor<?xf32>
  %ab = dloss.add %a, %b : tensor<?xf32>, tensor<?xf32>
  %loss = dloss.reduce sum %ab axes [0] : tensor<?xf32>
  return %loss : tensor<f32>
}
