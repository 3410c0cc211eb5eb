// SimCLR's NT-Xent loss as the program one rank runs.
//
// Each rank holds its rows of the two augmented views, z1 and z2 (uneven row
// counts are fine). On one device SimCLR stacks the 2B embeddings and takes
// for each row the cross-entropy of its cosine similarities over a
// temperature, with the row itself masked out and its other view as the
// positive. Here each rank stacks its own two views, mine = [u1; u2] (2n
// rows), and gathers everyone's stacks in one all_gather: rank r's block
// sits at 2 * offset_r, so my first view i is global row 2 * offset + i and
// my second view 2 * offset + n + i (2 * offset is the shard offset of
// `mine`). The gathered rows are ordered by rank, not all first views then
// all second views as on one device; a softmax does not depend on the order
// of its columns, so the loss is SimCLR's exactly. The loss is the mean over
// the 2B rows, the same on every rank. The self-similarity is masked with
// -inf by dloss.select, whose gradient is exact (a product with the mask
// would be NaN). examples/python/ntxent_loss.py is the same loss in PyTorch.
func.func @ntxent(%z1: tensor<?x?xf32> {dloss.grad},
                  %z2: tensor<?x?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %u1 = dloss.l2_normalize %z1 axis 1 : tensor<?x?xf32>
  %u2 = dloss.l2_normalize %z2 axis 1 : tensor<?x?xf32>

  // This rank's 2n rows [u1; u2] (a concatenation is a sum of zero-padded
  // blocks), and every rank's, in rank order.
  %n = dloss.dim %z1 axis 0 : tensor<?x?xf32>
  %u1_low = dloss.pad %u1 axis 0 low %zero high %n : tensor<?x?xf32>
  %u2_high = dloss.pad %u2 axis 0 low %n high %zero : tensor<?x?xf32>
  %mine = dloss.add %u1_low, %u2_high : tensor<?x?xf32>, tensor<?x?xf32>
  %everyone = dloss.all_gather %mine axis 0 : tensor<?x?xf32>

  %sim = dloss.matmul %mine, %everyone transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %temperature = arith.constant dense<0.5> : tensor<f32>
  %logits = dloss.div %sim, %temperature : tensor<?x?xf32>, tensor<f32>

  // Global indices: of my 2n rows (contiguous from the shard offset of
  // `mine`), and of each row's other view: [offset2 + n + i; offset2 + i].
  %offset2 = dloss.shard_offset %mine axis 0 : tensor<?x?xf32>
  %two_n = arith.addi %n, %n : index
  %rows = dloss.arange %offset2, %two_n : tensor<?xi64>
  %firsts = dloss.arange %offset2, %n : tensor<?xi64>
  %offset2_n = arith.addi %offset2, %n : index
  %seconds = dloss.arange %offset2_n, %n : tensor<?xi64>
  %seconds_low = dloss.pad %seconds axis 0 low %zero high %n : tensor<?xi64>
  %firsts_high = dloss.pad %firsts axis 0 low %n high %zero : tensor<?xi64>
  %positives = dloss.add %seconds_low, %firsts_high : tensor<?xi64>, tensor<?xi64>

  // A row is not its own negative: -inf where global row == column.
  %two_b = dloss.global_size %mine axis 0 : tensor<?x?xf32>
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
