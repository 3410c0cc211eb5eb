// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @take_and_put
func.func @take_and_put(%x: tensor<?x10xf32>, %idx: tensor<?xi64>, %v: tensor<?xf32>)
    -> (tensor<?xf32>, tensor<?x10xf32>, tensor<10xf32>) {
  // CHECK: dloss.take_along %{{.*}}, %{{.*}} axis 1 : tensor<?x10xf32>, tensor<?xi64>
  %0 = dloss.take_along %x, %idx axis 1 : tensor<?x10xf32>, tensor<?xi64>
  // CHECK: dloss.put_along %{{.*}}, %{{.*}}, %{{.*}} axis 1 : tensor<?x10xf32>, tensor<?xi64>, tensor<?xf32>
  %1 = dloss.put_along %x, %idx, %v axis 1 : tensor<?x10xf32>, tensor<?xi64>, tensor<?xf32>
  // Along axis 0: one row index per column.
  // CHECK: dloss.take_along %{{.*}}, %{{.*}} axis 0 : tensor<?x10xf32>, tensor<10xi32>
  %cols = arith.constant dense<0> : tensor<10xi32>
  %2 = dloss.take_along %x, %cols axis 0 : tensor<?x10xf32>, tensor<10xi32>
  return %0, %1, %2 : tensor<?xf32>, tensor<?x10xf32>, tensor<10xf32>
}

// CHECK-LABEL: func.func @arange
// CHECK-SAME: (%[[S:.*]]: index, %[[N:.*]]: index)
func.func @arange(%start: index, %n: index) -> (tensor<?xi64>, tensor<?xf32>) {
  // CHECK: dloss.arange %[[S]], %[[N]] : tensor<?xi64>
  %0 = dloss.arange %start, %n : tensor<?xi64>
  // CHECK: dloss.arange %[[S]], %[[N]] : tensor<?xf32>
  %1 = dloss.arange %start, %n : tensor<?xf32>
  return %0, %1 : tensor<?xi64>, tensor<?xf32>
}
