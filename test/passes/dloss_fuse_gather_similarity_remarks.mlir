// RUN: dloss-opt %s --split-input-file --verify-diagnostics --dloss-fuse-gather-similarity
// Why dloss-fuse-gather-similarity leaves a similarity unfused: one remark at
// the similarity naming the reason, with a note at the op that causes it.
// (dlossc --report lists the same remarks.)

// Another user of the similarity: the matrix is needed anyway.
func.func @other_user(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                      %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  // expected-remark@+1 {{similarity not fused: `dloss.reduce` reads the similarity (or a value computed from it) as a whole matrix; the fused op reduces along rows (axis 1) only}}
  %s = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce = dloss.cross_entropy %s, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  // expected-note@+1 {{here}}
  %m = dloss.reduce max %s axes [0, 1] : tensor<?x?xf32>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %l = dloss.add %sum, %m : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %l : tensor<f32>
  return %total : tensor<f32>
}

// -----

// A `grad local` gather: its gradient is deliberately not the exact one.
func.func @local_gather(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                        %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  // expected-note@+1 {{here}}
  %b_all = dloss.all_gather %b axis 0 grad local : tensor<?x?xf32>
  // expected-remark@+1 {{similarity not fused: the columns' all_gather has `grad local`, whose gradient differs from the exact one the fused op computes}}
  %s = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %ce = dloss.cross_entropy %s, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// An op the tile program cannot hold: a normalisation over the row.
func.func @not_elementwise(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                           %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  // expected-remark@+1 {{similarity not fused: `dloss.l2_normalize` reads the similarity (or a value computed from it) as a whole matrix; the fused tile program holds element-wise ops only}}
  %s = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  // expected-note@+1 {{here}}
  %n = dloss.l2_normalize %s axis 1 : tensor<?x?xf32>
  %ce = dloss.cross_entropy %n, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum = dloss.reduce sum %ce axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// A reduction along the gathered rows (axis 0): the fused op reduces rows.
func.func @column_reduction(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  // expected-remark@+1 {{similarity not fused: `dloss.logsumexp` reads the similarity (or a value computed from it) as a whole matrix; the fused op reduces along rows (axis 1) only}}
  %s = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  // expected-note@+1 {{here}}
  %lse = dloss.logsumexp %s axis 0 : tensor<?x?xf32>
  %sum = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}

// -----

// A per-column float value (e.g. a per-sample weight) feeds the tile: the
// fused op carries integer column values only.
func.func @float_column(%a: tensor<?x?xf32> {dloss.grad}, %b: tensor<?x?xf32> {dloss.grad},
                        %w: tensor<?xf32>) -> tensor<f32> attributes {dloss.loss} {
  %b_all = dloss.all_gather %b axis 0 : tensor<?x?xf32>
  %w_all = dloss.all_gather %w axis 0 : tensor<?xf32>
  // expected-remark@+1 {{similarity not fused: a per-column float value feeds the tile}}
  %s = dloss.matmul %a, %b_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  // expected-note@+1 {{here}}
  %cw = dloss.expand %w_all axes [0] like %s : tensor<?xf32>, tensor<?x?xf32>
  %x = dloss.mul %s, %cw : tensor<?x?xf32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %x axis 1 : tensor<?x?xf32>
  %sum = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %sum : tensor<f32>
  return %total : tensor<f32>
}
