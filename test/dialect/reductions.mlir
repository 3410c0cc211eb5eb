// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @reduce
func.func @reduce(%x: tensor<?x8x3xf32>, %i: tensor<?xi64>)
    -> (tensor<f32>, tensor<?x3xf32>, tensor<8xf32>, tensor<?x8xf32>, tensor<i64>) {
  // CHECK: dloss.reduce sum %{{.*}} axes [0, 1, 2] : tensor<?x8x3xf32>
  %0 = dloss.reduce sum %x axes [0, 1, 2] : tensor<?x8x3xf32>
  // CHECK: dloss.reduce mean %{{.*}} axes [1] : tensor<?x8x3xf32>
  %1 = dloss.reduce mean %x axes [1] : tensor<?x8x3xf32>
  // Axes may come in any order.
  // CHECK: dloss.reduce max %{{.*}} axes [2, 0] : tensor<?x8x3xf32>
  %2 = dloss.reduce max %x axes [2, 0] : tensor<?x8x3xf32>
  // CHECK: dloss.reduce min %{{.*}} axes [2] : tensor<?x8x3xf32>
  %3 = dloss.reduce min %x axes [2] : tensor<?x8x3xf32>
  // CHECK: dloss.reduce sum %{{.*}} axes [0] : tensor<?xi64>
  %4 = dloss.reduce sum %i axes [0] : tensor<?xi64>
  return %0, %1, %2, %3, %4 : tensor<f32>, tensor<?x3xf32>, tensor<8xf32>, tensor<?x8xf32>, tensor<i64>
}

// CHECK-LABEL: func.func @logsumexp
func.func @logsumexp(%x: tensor<?x100xf32>) -> (tensor<?xf32>, tensor<100xf32>) {
  // CHECK: dloss.logsumexp %{{.*}} axis 1 : tensor<?x100xf32>
  %0 = dloss.logsumexp %x axis 1 : tensor<?x100xf32>
  // CHECK: dloss.logsumexp %{{.*}} axis 0 : tensor<?x100xf32>
  %1 = dloss.logsumexp %x axis 0 : tensor<?x100xf32>
  return %0, %1 : tensor<?xf32>, tensor<100xf32>
}

// CHECK-LABEL: func.func @cross_entropy
func.func @cross_entropy(%logits: tensor<?x?xf32>, %t: tensor<?xi64>, %t32: tensor<16xi32>) -> (tensor<?xf32>, tensor<16xf32>) {
  // CHECK: dloss.cross_entropy %{{.*}}, %{{.*}} axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %0 = dloss.cross_entropy %logits, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  // The static row count of the targets is kept.
  // CHECK: dloss.cross_entropy %{{.*}}, %{{.*}} axis 1 : tensor<?x?xf32>, tensor<16xi32>
  %1 = dloss.cross_entropy %logits, %t32 axis 1 : tensor<?x?xf32>, tensor<16xi32>
  return %0, %1 : tensor<?xf32>, tensor<16xf32>
}
