// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// Round trip of the general fused ops (dloss-fuse-gather-similarity makes
// them; the program's encoding and facts are runtime/plan/TileEncoding.h's).

// CHECK-LABEL: func.func @infonce_tiles(
// CHECK: %[[F:.*]]:2 = dloss.fused_similarity %arg0, %arg1 leaves(%arg2, %arg3) {class_targets = array<i64: 0>, col_leaves = 0 : i64, gathered, outputs = array<i64: 2, 1, 7, 0>, picks = array<i64: -1, -1, 2, 0>, program = array<i64: 0, 0, 0, 0, 4, 0, 0, 0, 8, 0, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 21, 3, 4, 0, 5, 0, 0, 0, 22, 5, 2, 6>, row_leaves = 1 : i64} : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>, tensor<f32>) -> (tensor<?xf32>, tensor<?xf32>)
// CHECK: dloss.fused_similarity_grad %arg0, %arg1 extra(%arg2, %arg3, %[[F]]#0, %[[F]]#1, %arg4, %arg4) {class_targets = array<i64: 0>, col_leaves = 0 : i64, gathered, outputs = array<i64: 2, 1, 7, 0>, picks = array<i64: -1, -1, 2, 0>, {{.*}}} : {{.*}} -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x?xf32>, tensor<?xf32>)
func.func @infonce_tiles(%q: tensor<?x8xf32>, %k: tensor<?x8xf32>, %t: tensor<?xi64>,
                         %s: tensor<f32>, %ct: tensor<?xf32>) {
  %f:2 = dloss.fused_similarity %q, %k leaves(%t, %s) {
      row_leaves = 1, col_leaves = 0, gathered,
      program = array<i64: 0, 0, 0, 0,  4, 0, 0, 0,  8, 0, 1, 0,  1, 0, 0, 0,
                           2, 0, 0, 0,  21, 3, 4, 0,  5, 0, 0, 0,  22, 5, 2, 6>,
      outputs = array<i64: 2, 1, 7, 0>,
      picks = array<i64: -1, -1, 2, 0>, class_targets = array<i64: 0>}
      : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>, tensor<f32>) -> (tensor<?xf32>, tensor<?xf32>)
  %g:4 = dloss.fused_similarity_grad %q, %k extra(%t, %s, %f#0, %f#1, %ct, %ct) {
      row_leaves = 1, col_leaves = 0, gathered,
      program = array<i64: 0, 0, 0, 0,  4, 0, 0, 0,  8, 0, 1, 0,  1, 0, 0, 0,
                           2, 0, 0, 0,  21, 3, 4, 0,  5, 0, 0, 0,  22, 5, 2, 6>,
      outputs = array<i64: 2, 1, 7, 0>,
      picks = array<i64: -1, -1, 2, 0>, class_targets = array<i64: 0>}
      : (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?xi64>, tensor<f32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>, tensor<?xf32>)
      -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x?xf32>, tensor<?xf32>)
  return
}
