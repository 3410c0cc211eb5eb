// SimCLR's NT-Xent loss as the program one rank runs.
//
// Each rank holds its rows of the two augmented views, z1 and z2 (uneven row
// counts are fine). On one device SimCLR stacks the 2B embeddings, all first
// views then all second views, and takes for each row the cross-entropy of
// its cosine similarities over a temperature, with the row itself masked out
// and its other view as the positive. Here each rank takes its own 2n rows
// (its first views at global rows offset + i, its second views at
// B + offset + i) against all 2B gathered rows. The loss is the mean over the
// 2B rows, the same on every rank. The self-similarity is masked with -inf by
// dloss.select, whose gradient is exact (a product with the mask would be
// NaN). examples/python/ntxent_loss.py is the same loss in PyTorch.
func.func @ntxent(%z1: tensor<?x?xf32> {dloss.grad},
                  %z2: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %u1 = dloss.l2_normalize %z1 axis 1 : tensor<?x?xf32>
  %u2 = dloss.l2_normalize %z2 axis 1 : tensor<?x?xf32>

  // This rank's 2n rows [u1; u2], and every rank's 2B rows
  // [all u1; all u2] (a concatenation is a sum of zero-padded blocks).
  %n = dloss.dim %z1 axis 0 : tensor<?x?xf32>
  %u1_low = dloss.pad %u1 axis 0 low %zero high %n : tensor<?x?xf32>
  %u2_high = dloss.pad %u2 axis 0 low %n high %zero : tensor<?x?xf32>
  %mine = dloss.add %u1_low, %u2_high : tensor<?x?xf32>, tensor<?x?xf32>
  %all1 = dloss.all_gather %u1 axis 0 : tensor<?x?xf32>
  %all2 = dloss.all_gather %u2 axis 0 : tensor<?x?xf32>
  %b = dloss.global_size %z1 axis 0 : tensor<?x?xf32>
  %all1_low = dloss.pad %all1 axis 0 low %zero high %b : tensor<?x?xf32>
  %all2_high = dloss.pad %all2 axis 0 low %b high %zero : tensor<?x?xf32>
  %everyone = dloss.add %all1_low, %all2_high : tensor<?x?xf32>, tensor<?x?xf32>

  %sim = dloss.matmul %mine, %everyone transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %temperature = arith.constant dense<0.5> : tensor<f32>
  %logits = dloss.div %sim, %temperature : tensor<?x?xf32>, tensor<f32>

  // Global indices: of my rows (first views, then second views) and of
  // each row's other view.
  %offset = dloss.shard_offset %z1 axis 0 : tensor<?x?xf32>
  %own = dloss.arange %offset, %n : tensor<?xi64>
  %offset_b = arith.addi %offset, %b : index
  %own_b = dloss.arange %offset_b, %n : tensor<?xi64>
  %own_low = dloss.pad %own axis 0 low %zero high %n : tensor<?xi64>
  %own_b_high = dloss.pad %own_b axis 0 low %n high %zero : tensor<?xi64>
  %rows = dloss.add %own_low, %own_b_high : tensor<?xi64>, tensor<?xi64>
  %own_b_low = dloss.pad %own_b axis 0 low %zero high %n : tensor<?xi64>
  %own_high = dloss.pad %own axis 0 low %n high %zero : tensor<?xi64>
  %positives = dloss.add %own_b_low, %own_high : tensor<?xi64>, tensor<?xi64>

  // A row is not its own negative: -inf where global row == column.
  %two_b = arith.addi %b, %b : index
  %cols = dloss.arange %zero, %two_b : tensor<?xi64>
  %row_ids = dloss.expand %rows axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_self = dloss.eq %row_ids, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %masked = dloss.select %is_self, %ninf, %logits
      : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>

  %ce = dloss.cross_entropy %masked, %positives axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %local = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %two_b_f = dloss.cast %two_b : index to tensor<f32>
  %loss = dloss.div %total, %two_b_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
