// Supervised Contrastive loss (Khosla et al., NeurIPS 2020, the L_out form)
// as the program one rank runs.
//
// Each rank holds its rows of the features z and their integer class labels
// y (uneven row counts are fine). On one device, with u = z / |z| and
// temperature tau, every row i is an anchor whose positives P(i) are the
// other rows of its class:
//
//   loss_i = -1/|P(i)| sum_{p in P(i)} log softmax_{a != i}(u_i . u_a / tau)[p]
//          = (|P(i)| lse_i - sum_{p in P(i)} u_i . u_p / tau) / |P(i)|,
//
// lse_i = logsumexp over every a != i. A row with no other row of its class
// contributes 0 (its count is taken as max(|P(i)|, 1), as the reference
// implementation does since its fix for such rows) and still counts in the
// mean. SupCon's multi-view batches are rows too: stack the views and
// repeat the labels. The reference's extra factor tau / base_tau is 1 here.
//
// Here each rank takes its own rows against the gathered rows and labels:
// its row i is global row offset + i (offset = the shard offset of z, not
// `n * rank`), which masks the anchor itself out with -inf (dloss.select,
// exact in the gradient); the positive mask compares the row's label with
// every column's. Everything over the tile is element-wise or a row
// reduction (logsumexp / sum along axis 1), the rest per row. The loss is
// the mean over the B rows of the global batch, the same on every rank.
func.func @supcon(%z: tensor<?x?xf32> {dloss.grad},
                  %y: tensor<?xi64>) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %u = dloss.l2_normalize %z axis 1 : tensor<?x?xf32>
  %u_all = dloss.all_gather %u axis 0 : tensor<?x?xf32>
  %y_all = dloss.all_gather %y axis 0 : tensor<?xi64>

  %sim = dloss.matmul %u, %u_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %temperature = arith.constant dense<0.1> : tensor<f32>
  %logits = dloss.div %sim, %temperature : tensor<?x?xf32>, tensor<f32>

  // The anchor itself: -inf where global row == column.
  %offset = dloss.shard_offset %z axis 0 : tensor<?x?xf32>
  %n = dloss.dim %z axis 0 : tensor<?x?xf32>
  %rows = dloss.arange %offset, %n : tensor<?xi64>
  %batch = dloss.global_size %z axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %batch : tensor<?xi64>
  %row_ids = dloss.expand %rows axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_self = dloss.eq %row_ids, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %others = dloss.select %is_self, %ninf, %logits
      : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %others axis 1 : tensor<?x?xf32>

  // The positives: the same label, not the anchor itself.
  %row_y = dloss.expand %y axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_y = dloss.expand %y_all axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %same = dloss.eq %row_y, %col_y : tensor<?x?xi64>, tensor<?x?xi64>
  %zero_i = arith.constant dense<0> : tensor<i64>
  %is_pos = dloss.select %is_self, %zero_i, %same
      : tensor<?x?xi64>, tensor<i64>, tensor<?x?xi64>
  %zero_f = arith.constant dense<0.0> : tensor<f32>
  %pos_logits = dloss.select %is_pos, %logits, %zero_f
      : tensor<?x?xi64>, tensor<?x?xf32>, tensor<f32>
  %pos_sum = dloss.reduce sum %pos_logits axes [1] : tensor<?x?xf32>
  %is_pos_f = dloss.cast %is_pos : tensor<?x?xi64> to tensor<?x?xf32>
  %count = dloss.reduce sum %is_pos_f axes [1] : tensor<?x?xf32>

  // Per row: (|P| lse - sum_P logits) / max(|P|, 1).
  %scaled_lse = dloss.mul %count, %lse : tensor<?xf32>, tensor<?xf32>
  %numerator = dloss.sub %scaled_lse, %pos_sum : tensor<?xf32>, tensor<?xf32>
  %none = dloss.eq %count, %zero_f : tensor<?xf32>, tensor<f32>
  %one_f = arith.constant dense<1.0> : tensor<f32>
  %divisor = dloss.select %none, %one_f, %count
      : tensor<?xf32>, tensor<f32>, tensor<?xf32>
  %per_row = dloss.div %numerator, %divisor : tensor<?xf32>, tensor<?xf32>

  %local = dloss.reduce sum %per_row axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
