// fused_similarity and its adjoint (fused_similarity_grad), written by hand:
// the reference is the simulator's meaning of the forward op under
// torch.autograd on one device; the derived side is dloss-autodiff's
// fused_similarity_grad (stacked per-row leaf gradients sliced out, 0-d
// partials, sharded partials) run on N ranks. Every opcode of the tile
// program appears once.

// Gathered: rows q against every rank's k; per-row leaves a float weight w
// and the integer labels y, per-column leaf the labels (this rank's shard),
// one 0-d leaf s. Two row results (logsumexp, sum) and one column result.
//   r0 = lse_j select(y_i == y_j, s S w_i, clamp(S, -0.5, 0.5))
//   r1 = sum_j 0.25 (j - i) sin S + softplus(s S w_i) + sigmoid(S) log_sigmoid(s S)
//        + stop_gradient(S) w_i
//   c0 = lse_i s (log exp S - cos(acos(clamp(S))) / sqrt(exp S))
func.func @gathered(%q: tensor<?x?xf32> {dloss.grad}, %k: tensor<?x?xf32> {dloss.grad},
                    %w: tensor<?xf32> {dloss.grad}, %y: tensor<?xi64>,
                    %s: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %r:3 = dloss.fused_similarity %q, %k leaves(%w, %y, %y, %s) {
      row_leaves = 2, col_leaves = 1, gathered,
      program = array<i64: 0, 0, 0, 0,   4, 0, 0, 0,   8, 0, 1, 0,   2, 0, 0, 0,
                           8, 2, 3, 0,   2, 1, 0, 0,   3, 0, 0, 0,   21, 5, 6, 0,
                           5, 4598175219545276416, 0, 0,
                           20, 0, -4620693217682128896, 4602678819172646912,
                           22, 7, 4, 9,  1, 0, 0, 0,   23, 0, 0, 0,  7, 11, 12, 0,
                           8, 13, 8, 0,  18, 0, 0, 0,  8, 14, 15, 0, 13, 4, 0, 0,
                           6, 16, 17, 0, 15, 0, 0, 0,  14, 2, 0, 0,  8, 19, 20, 0,
                           6, 18, 21, 0, 11, 0, 0, 0,  19, 23, 0, 0, 17, 9, 0, 0,
                           16, 25, 0, 0, 9, 26, 24, 0, 10, 27, 0, 0, 12, 23, 0, 0,
                           6, 28, 29, 0, 8, 30, 1, 0,  24, 0, 0, 0,  8, 32, 3, 0,
                           6, 22, 33, 0>,
      outputs = array<i64: 10, 1, 34, 0>, col_outputs = array<i64: 31, 1>,
      picks = array<i64: -1, -1, -1, -1>, col_picks = array<i64: -1, -1>,
      lse_pairs = array<i64: -1>, class_targets = array<i64>}
      : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xi64>,
         tensor<f32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>)
  %s0 = dloss.reduce sum %r#0 axes [0] : tensor<?xf32>
  %s1 = dloss.reduce sum %r#1 axes [0] : tensor<?xf32>
  %s2 = dloss.reduce sum %r#2 axes [0] : tensor<?xf32>
  %a = dloss.add %s0, %s1 : tensor<f32>, tensor<f32>
  %b = dloss.add %a, %s2 : tensor<f32>, tensor<f32>
  %loss = dloss.all_reduce sum %b : tensor<f32>
  return %loss : tensor<f32>
}

// Sharded: every rank holds the gathered rows x_all and its own shard W of
// the classes (the class count follows the batch sizes); per-row leaves the
// gathered targets t and weights w, one 0-d leaf s. The results are
// invariant (all classes of every shard):
//   r0 = lse over classes c != t_i of s S      (PartialFC's lse_rest)
//   r1 = S[i, t_i] w_i                           (the target's similarity)
//   r2 = sum_c softplus(s S)
func.func @sharded(%x: tensor<?x?xf32> {dloss.grad}, %W: tensor<?x?xf32> {dloss.grad},
                   %t: tensor<?xi64>, %w: tensor<?xf32> {dloss.grad},
                   %s: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %x_all = dloss.all_gather %x axis 0 : tensor<?x?xf32>
  %t_all = dloss.all_gather %t axis 0 : tensor<?xi64>
  %w_all = dloss.all_gather %w axis 0 : tensor<?xf32>
  %r:3 = dloss.fused_similarity %x_all, %W leaves(%t_all, %w_all, %s) {
      row_leaves = 2, col_leaves = 0, sharded,
      program = array<i64: 0, 0, 0, 0,   4, 0, 0, 0,   8, 0, 1, 0,   2, 0, 0, 0,
                           1, 0, 0, 0,   21, 3, 4, 0,  5, -4503599627370496, 0, 0,
                           22, 5, 6, 2,  5, 0, 0, 0,   22, 5, 0, 8,  13, 2, 0, 0,
                           2, 1, 0, 0,   8, 9, 11, 0>,
      outputs = array<i64: 7, 1, 12, 0, 10, 0>,
      picks = array<i64: -1, -1, -1, -1, -1, -1>, class_targets = array<i64: 0>}
      : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>, tensor<f32>)
        -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>)
  %s0 = dloss.reduce sum %r#0 axes [0] : tensor<?xf32>
  %s1 = dloss.reduce sum %r#1 axes [0] : tensor<?xf32>
  %s2 = dloss.reduce sum %r#2 axes [0] : tensor<?xf32>
  %a = dloss.add %s0, %s1 : tensor<f32>, tensor<f32>
  %loss = dloss.add %a, %s2 : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
