// stop_gradient inside a fused similarity's tile program (derived fused:
// test/passes/dloss_fuse_gather_similarity.mlir checks that this form
// fuses). The reference is the loss as written, on one device; a tile rule
// that let the gradient through the stop_gradient would add the penalty's
// and the weight's terms to d/dq, d/dk and d/dw.

// sentence-transformers' hardness weighting: alpha * stop_gradient(S) added
// to every logit but the row's own column (its positive), with a learnable
// scale s:
//   loss = sum_i lse_j (s S_ij + [j != i] 9 sg(S_ij)) - s S_ii
func.func @hardness(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                    %s: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %zero = arith.constant 0 : index
  %all = dloss.all_gather %k axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %q, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %s : tensor<?x?xf32>, tensor<f32>
  %held = dloss.stop_gradient %sim : tensor<?x?xf32>
  %alpha = arith.constant dense<9.0> : tensor<f32>
  %penalty = dloss.mul %held, %alpha : tensor<?x?xf32>, tensor<f32>
  %offset = dloss.shard_offset %q axis 0 : tensor<?x?xf32>
  %n = dloss.dim %q axis 0 : tensor<?x?xf32>
  %pos = dloss.arange %offset, %n : tensor<?xi64>
  %b = dloss.global_size %k axis 0 : tensor<?x?xf32>
  %cols = dloss.arange %zero, %b : tensor<?xi64>
  %row_pos = dloss.expand %pos axes [1] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %col_ids = dloss.expand %cols axes [0] like %logits : tensor<?xi64>, tensor<?x?xf32>
  %is_pos = dloss.eq %row_pos, %col_ids : tensor<?x?xi64>, tensor<?x?xi64>
  %zero_f = arith.constant dense<0.0> : tensor<f32>
  %others = dloss.select %is_pos, %zero_f, %penalty : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %hard = dloss.add %logits, %others : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %hard axis 1 : tensor<?x?xf32>
  %positive = dloss.take_along %logits, %pos axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %loss = dloss.sub %lse, %positive : tensor<?xf32>, tensor<?xf32>
  %sum = dloss.reduce sum %loss axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// A float per-row weight w both under stop_gradient and used directly:
//   loss = sum_ij softplus(S_ij) sg(w_i S_ij) + w_i S_ij
// d/dw_i is sum_j S_ij alone.
func.func @weighted_rows(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                         %w: tensor<?xf32> {dloss.grad}) -> tensor<f32>
    attributes {dloss.loss} {
  %all = dloss.all_gather %k axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %q, %all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %wr = dloss.expand %w axes [1] like %sim : tensor<?xf32>, tensor<?x?xf32>
  %ws = dloss.mul %wr, %sim : tensor<?x?xf32>, tensor<?x?xf32>
  %held = dloss.stop_gradient %ws : tensor<?x?xf32>
  %soft = dloss.softplus %sim : tensor<?x?xf32>
  %weighted = dloss.mul %soft, %held : tensor<?x?xf32>, tensor<?x?xf32>
  %e = dloss.add %weighted, %ws : tensor<?x?xf32>, tensor<?x?xf32>
  %rows = dloss.reduce sum %e axes [1] : tensor<?x?xf32>
  %sum = dloss.reduce sum %rows axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}
