// slice / pad with run-time offsets: this rank's block of the gathered x is x
// itself, padded back to the global layout and summed over ranks it is the
// gathered x again. A constant-offset slice along the feature axis too. Index
// arithmetic with arith.addi / subi / muli.
func.func @slice_pad(%x: tensor<?x?xf32> {dloss.grad},
                     %y: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %xall = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %off = dloss.shard_offset %x axis 0 : tensor<?x?xf32>
  %n = dloss.dim %x axis 0 : tensor<?x?xf32>
  %mine = dloss.slice %xall axis 0 offset %off size %n : tensor<?x?xf32>
  %total = dloss.global_size %x axis 0 : tensor<?x?xf32>
  %end = arith.addi %off, %n : index
  %after = arith.subi %total, %end : index
  %padded = dloss.pad %mine axis 0 low %off high %after : tensor<?x?xf32>
  %sq = dloss.mul %padded, %padded : tensor<?x?xf32>, tensor<?x?xf32>
  %again = dloss.all_reduce sum %padded : tensor<?x?xf32>
  %yall = dloss.all_gather %y axis 0 : tensor<?x?xf32>
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.muli %c1, %c2 : index
  %cols = dloss.slice %yall axis 1 offset %c1 size %c3 : tensor<?x?xf32>
  %gcols = dloss.slice %again axis 1 offset %c2 size %c2 : tensor<?x?xf32>
  %prod = dloss.mul %cols, %gcols : tensor<?x?xf32>, tensor<?x?xf32>
  %sp = dloss.sin %prod : tensor<?x?xf32>
  %inv = dloss.reduce sum %sp axes [0, 1] : tensor<?x?xf32>
  %wide = dloss.pad %mine axis 1 low %c1 high %c2 : tensor<?x?xf32>
  %e = dloss.exp %wide : tensor<?x?xf32>
  %s1 = dloss.reduce sum %e axes [0, 1] : tensor<?x?xf32>
  %s2 = dloss.reduce sum %sq axes [0, 1] : tensor<?x?xf32>
  %s12 = dloss.add %s1, %s2 : tensor<f32>, tensor<f32>
  %local = dloss.all_reduce sum %s12 : tensor<f32>
  %loss = dloss.add %local, %inv : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
