// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @zeros_like
func.func @zeros_like(%x: tensor<?x4xf32>, %i: tensor<?xi64>) -> (tensor<?x4xf32>, tensor<?xi64>) {
  // CHECK: dloss.zeros_like %{{.*}} : tensor<?x4xf32>
  %0 = dloss.zeros_like %x : tensor<?x4xf32>
  // CHECK: dloss.zeros_like %{{.*}} : tensor<?xi64>
  %1 = dloss.zeros_like %i : tensor<?xi64>
  return %0, %1 : tensor<?x4xf32>, tensor<?xi64>
}

// CHECK-LABEL: func.func @expand
func.func @expand(%row: tensor<?xf32>, %col: tensor<8xf32>, %s: tensor<f32>, %x: tensor<?x8xf32>)
    -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x8xf32>) {
  // The result takes the static sizes of both operands.
  // CHECK: dloss.expand %{{.*}} axes [1] like %{{.*}} : tensor<?xf32>, tensor<?x8xf32>
  %0 = dloss.expand %row axes [1] like %x : tensor<?xf32>, tensor<?x8xf32>
  // CHECK: dloss.expand %{{.*}} axes [0] like %{{.*}} : tensor<8xf32>, tensor<?x8xf32>
  %1 = dloss.expand %col axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  // CHECK: dloss.expand %{{.*}} axes [0, 1] like %{{.*}} : tensor<f32>, tensor<?x8xf32>
  %2 = dloss.expand %s axes [0, 1] like %x : tensor<f32>, tensor<?x8xf32>
  return %0, %1, %2 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<?x8xf32>
}

// CHECK-LABEL: func.func @slice_and_pad
// CHECK-SAME: (%[[X:.*]]: tensor<12x8xf32>, %[[O:.*]]: index, %[[N:.*]]: index)
func.func @slice_and_pad(%x: tensor<12x8xf32>, %o: index, %n: index) -> (tensor<?x8xf32>, tensor<?x8xf32>, tensor<12x?xf32>) {
  // CHECK: dloss.slice %[[X]] axis 0 offset %[[O]] size %[[N]] : tensor<12x8xf32>
  %0 = dloss.slice %x axis 0 offset %o size %n : tensor<12x8xf32>
  // CHECK: dloss.pad %{{.*}} axis 0 low %[[O]] high %[[N]] : tensor<?x8xf32>
  %1 = dloss.pad %0 axis 0 low %o high %n : tensor<?x8xf32>
  // CHECK: dloss.slice %[[X]] axis 1 offset %[[O]] size %[[N]] : tensor<12x8xf32>
  %2 = dloss.slice %x axis 1 offset %o size %n : tensor<12x8xf32>
  return %0, %1, %2 : tensor<?x8xf32>, tensor<?x8xf32>, tensor<12x?xf32>
}
