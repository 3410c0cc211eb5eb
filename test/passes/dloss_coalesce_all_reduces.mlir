// RUN: dloss-opt %s --split-input-file --dloss-coalesce-all-reduces | FileCheck %s
// RUN: dloss-opt %s --split-input-file --dloss-coalesce-all-reduces=max-bytes=100 | FileCheck %s --check-prefix=LIMIT
// What dloss-coalesce-all-reduces joins (independent small all-reduces of
// one kind and element type: what they read moves above the first, they
// follow it, the first says how many) and what it leaves.

// Batch norm's statistics of two views: the means' all-reduces are
// independent, so are the variances'; each variance depends on its mean.
// The second view's sum moves above the first all-reduce, its all-reduce
// right after it.
// CHECK-LABEL: func.func @two_views(
// CHECK-SAME: %[[A:[^:]*]]: tensor<?x8xf32>, %[[B:[^:]*]]: tensor<?x8xf32>
// CHECK: %[[SA:.*]] = dloss.reduce sum %[[A]] axes [0]
// CHECK-NEXT: %[[SB:.*]] = dloss.reduce sum %[[B]] axes [0]
// CHECK-NEXT: %[[MA:.*]] = dloss.all_reduce sum %[[SA]] {coalesce = 2 : i64}
// CHECK-NEXT: %[[MB:.*]] = dloss.all_reduce sum %[[SB]] :
// CHECK: %[[QA:.*]] = dloss.mul %[[MA]], %[[MA]]
// CHECK: %[[QB:.*]] = dloss.mul %[[MB]], %[[MB]]
// CHECK-NEXT: dloss.all_reduce sum %[[QA]] {coalesce = 2 : i64}
// CHECK-NEXT: dloss.all_reduce sum %[[QB]] :
// LIMIT-LABEL: func.func @two_views(
// LIMIT: coalesce = 2
// LIMIT: coalesce = 2
func.func @two_views(%a: tensor<?x8xf32>, %b: tensor<?x8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %sa = dloss.reduce sum %a axes [0] : tensor<?x8xf32>
  %ma = dloss.all_reduce sum %sa : tensor<8xf32>
  %qa = dloss.mul %ma, %ma : tensor<8xf32>, tensor<8xf32>
  %va = dloss.all_reduce sum %qa : tensor<8xf32>
  %sb = dloss.reduce sum %b axes [0] : tensor<?x8xf32>
  %mb = dloss.all_reduce sum %sb : tensor<8xf32>
  %qb = dloss.mul %mb, %mb : tensor<8xf32>, tensor<8xf32>
  %vb = dloss.all_reduce sum %qb : tensor<8xf32>
  return %va, %vb : tensor<8xf32>, tensor<8xf32>
}

// -----

// Other kinds and element types, a dynamic shape (its size unknown), a
// 0-d value (the runtime defers those to ride on a later gather) and a
// dependent all-reduce stay apart; an all-reduce whose operand needs
// another collective (the gather) is not joined either, as the gather
// would have to move.
// CHECK-LABEL: func.func @left_apart(
// CHECK-NOT: coalesce
// CHECK: return
func.func @left_apart(%x: tensor<8xf32>, %y: tensor<8xf64>, %z: tensor<?xf32>, %w: tensor<?x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf64>, tensor<?xf32>, tensor<8xf32>, tensor<8xf32>, tensor<f32>) {
  %a = dloss.all_reduce sum %x : tensor<8xf32>
  %b = dloss.all_reduce max %x : tensor<8xf32>
  %c = dloss.all_reduce sum %y : tensor<8xf64>
  %d = dloss.all_reduce sum %z : tensor<?xf32>
  %e = dloss.all_reduce sum %a : tensor<8xf32>
  %g = dloss.all_gather %w axis 0 : tensor<?x8xf32>
  %s = dloss.reduce sum %g axes [0] : tensor<?x8xf32>
  %f = dloss.all_reduce sum %s : tensor<8xf32>
  %t = dloss.reduce sum %x axes [0] : tensor<8xf32>
  %u = dloss.all_reduce sum %t : tensor<f32>
  return %a, %b, %c, %d, %e, %f, %u : tensor<8xf32>, tensor<8xf32>, tensor<8xf64>, tensor<?xf32>, tensor<8xf32>, tensor<8xf32>, tensor<f32>
}

// -----

// An operand computed by an op with a large result (an 8 x 8 GEMM, over a
// 100-byte limit) is not moved above the first all-reduce, where that
// result would be held longer; under the default limit it moves.
// LIMIT-LABEL: func.func @large_slice(
// LIMIT-NOT: coalesce
// CHECK-LABEL: func.func @large_slice(
// CHECK: dloss.matmul
// CHECK: dloss.all_reduce sum %{{.*}} {coalesce = 2 : i64} : tensor<2xf32>
// CHECK-NEXT: dloss.all_reduce sum %{{.*}} : tensor<8xf32>
func.func @large_slice(%x: tensor<2xf32>, %a: tensor<8x8xf32>) -> (tensor<2xf32>, tensor<8xf32>) {
  %r = dloss.all_reduce sum %x : tensor<2xf32>
  %m = dloss.matmul %a, %a : tensor<8x8xf32>, tensor<8x8xf32>
  %s = dloss.reduce sum %m axes [0] : tensor<8x8xf32>
  %t = dloss.all_reduce sum %s : tensor<8xf32>
  return %r, %t : tensor<2xf32>, tensor<8xf32>
}
