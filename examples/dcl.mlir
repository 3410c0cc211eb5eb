// Decoupled Contrastive Learning (Yeh et al., ECCV 2022), one direction, as
// the program one rank runs.
//
// Each rank holds its rows of the queries q and of their keys k (row i of k
// is the positive of row i of q; uneven row counts are fine) and the
// replicated scale s = 1 / temperature. DCL is InfoNCE with the positive
// left out of the denominator: on one device, with S = q k^T over the
// global batch,
//
//   loss_i = -s S_{i,i} + logsumexp_{j != i} s S_{i,j},
//
// so a query with an easy positive no longer lowers the weight of its
// negatives' gradient (the "negative-positive coupling"). The paper's full
// form also counts the same view's other rows as negatives (NT-Xent's
// structure, examples/ntxent.mlir); this is the cross-view form. Here each
// rank takes its own queries against the gathered keys: the positive of
// local row i is global key offset + i (offset = the shard offset of q, not
// `n * rank`). The positive is masked out of the log-sum-exp with -inf by
// dloss.select (exact in the gradient) and picked with dloss.take_along.
// A global batch of one row has no negative (the log-sum-exp of nothing is
// -inf). The loss is the mean over the B queries, the same on every rank.
func.func @dcl(%q: tensor<?x?xf32> {dloss.grad},
               %k: tensor<?x?xf32> {dloss.grad},
               %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %k_all = dloss.all_gather %k axis 0 : tensor<?x?xf32>

  %offset = dloss.shard_offset %q axis 0 : tensor<?x?xf32>
  %n = dloss.dim %q axis 0 : tensor<?x?xf32>
  %positives = dloss.arange %offset, %n : tensor<?xi64>

  %sim = dloss.matmul %q, %k_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %scale : tensor<?x?xf32>, tensor<f32>

  // The negatives: every column but the positive's.
  %batch = dloss.global_size %q axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %batch : tensor<?xi64>
  %pos_ids = dloss.expand %positives axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_pos = dloss.eq %pos_ids, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %negatives = dloss.select %is_pos, %ninf, %logits
      : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse_neg = dloss.logsumexp %negatives axis 1 : tensor<?x?xf32>
  %pos = dloss.take_along %logits, %positives axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %per_row = dloss.sub %lse_neg, %pos : tensor<?xf32>, tensor<?xf32>

  %local = dloss.reduce sum %per_row axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %batch_f = dloss.cast %batch : index to tensor<f32>
  %loss = dloss.div %total, %batch_f : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
