// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @all_gather
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[L:.*]]: tensor<?xi64>)
func.func @all_gather(%x: tensor<4x8xf32>, %labels: tensor<?xi64>)
    -> (tensor<?x8xf32>, tensor<4x?xf32>, tensor<?xi64>, tensor<?x8xf32>) {
  // The gathered axis becomes dynamic: ranks may hold different sizes.
  // CHECK: dloss.all_gather %[[X]] axis 0 : tensor<4x8xf32>
  %0 = dloss.all_gather %x axis 0 : tensor<4x8xf32>
  // CHECK: dloss.all_gather %[[X]] axis 1 : tensor<4x8xf32>
  %1 = dloss.all_gather %x axis 1 : tensor<4x8xf32>
  // CHECK: dloss.all_gather %[[L]] axis 0 grad none : tensor<?xi64>
  %2 = dloss.all_gather %labels axis 0 grad none : tensor<?xi64>
  // The default `grad exact` is not printed.
  // CHECK: dloss.all_gather %[[X]] axis 0 : tensor<4x8xf32>
  %3 = dloss.all_gather %x axis 0 grad exact : tensor<4x8xf32>
  return %0, %1, %2, %3 : tensor<?x8xf32>, tensor<4x?xf32>, tensor<?xi64>, tensor<?x8xf32>
}

// CHECK-LABEL: func.func @all_gather_local
func.func @all_gather_local(%x: tensor<?x256xbf16>) -> tensor<?x256xbf16> {
  // CHECK: dloss.all_gather %{{.*}} axis 0 grad local : tensor<?x256xbf16>
  %0 = dloss.all_gather %x axis 0 grad local : tensor<?x256xbf16>
  return %0 : tensor<?x256xbf16>
}

// CHECK-LABEL: func.func @all_reduce
func.func @all_reduce(%s: tensor<f32>, %v: tensor<3xi32>) -> (tensor<f32>, tensor<f32>, tensor<3xi32>, tensor<3xi32>) {
  // CHECK: dloss.all_reduce sum %{{.*}} : tensor<f32>
  %0 = dloss.all_reduce sum %s : tensor<f32>
  // CHECK: dloss.all_reduce mean %{{.*}} : tensor<f32>
  %1 = dloss.all_reduce mean %s : tensor<f32>
  // CHECK: dloss.all_reduce max %{{.*}} : tensor<3xi32>
  %2 = dloss.all_reduce max %v : tensor<3xi32>
  // CHECK: dloss.all_reduce min %{{.*}} : tensor<3xi32>
  %3 = dloss.all_reduce min %v : tensor<3xi32>
  return %0, %1, %2, %3 : tensor<f32>, tensor<f32>, tensor<3xi32>, tensor<3xi32>
}

// CHECK-LABEL: func.func @reduce_scatter
// CHECK-SAME: (%[[CT:.*]]: tensor<?x16xf32>, %[[N:.*]]: index)
func.func @reduce_scatter(%ct: tensor<?x16xf32>, %n: index) -> (tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>) {
  // CHECK: dloss.reduce_scatter sum %[[CT]] axis 0 size %[[N]] : tensor<?x16xf32>
  %0 = dloss.reduce_scatter sum %ct axis 0 size %n : tensor<?x16xf32>
  // CHECK: dloss.reduce_scatter sum %[[CT]] axis 0 : tensor<?x16xf32>
  %1 = dloss.reduce_scatter sum %ct axis 0 : tensor<?x16xf32>
  // CHECK: dloss.reduce_scatter mean %[[CT]] axis 0 size %[[N]] : tensor<?x16xf32>
  %2 = dloss.reduce_scatter mean %ct axis 0 size %n : tensor<?x16xf32>
  return %0, %1, %2 : tensor<?x16xf32>, tensor<?x16xf32>, tensor<?x16xf32>
}

// CHECK-LABEL: func.func @reduce_scatter_static
func.func @reduce_scatter_static(%ct: tensor<12x5xf64>) -> tensor<?x5xf64> {
  // CHECK: dloss.reduce_scatter sum %{{.*}} axis 0 : tensor<12x5xf64>
  %0 = dloss.reduce_scatter sum %ct axis 0 : tensor<12x5xf64>
  return %0 : tensor<?x5xf64>
}

// CHECK-LABEL: func.func @broadcast
func.func @broadcast(%w: tensor<100x8xf32>) -> (tensor<100x8xf32>, tensor<100x8xf32>) {
  // CHECK: dloss.broadcast %{{.*}} root 0 : tensor<100x8xf32>
  %0 = dloss.broadcast %w root 0 : tensor<100x8xf32>
  // CHECK: dloss.broadcast %{{.*}} root 3 : tensor<100x8xf32>
  %1 = dloss.broadcast %w root 3 : tensor<100x8xf32>
  return %0, %1 : tensor<100x8xf32>, tensor<100x8xf32>
}

// CHECK-LABEL: func.func @ring_shift
func.func @ring_shift(%c: tensor<?x8xf16>) -> (tensor<?x8xf16>, tensor<?x8xf16>) {
  // CHECK: dloss.ring_shift %{{.*}} by 1 : tensor<?x8xf16>
  %0 = dloss.ring_shift %c by 1 : tensor<?x8xf16>
  // CHECK: dloss.ring_shift %{{.*}} by -2 : tensor<?x8xf16>
  %1 = dloss.ring_shift %c by -2 : tensor<?x8xf16>
  return %0, %1 : tensor<?x8xf16>, tensor<?x8xf16>
}
