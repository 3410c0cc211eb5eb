// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @rank_facts
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xf32>)
func.func @rank_facts(%x: tensor<?x8xf32>) -> (index, index, index, index, index) {
  // CHECK: dloss.rank
  %r = dloss.rank
  // CHECK: dloss.world_size
  %n = dloss.world_size
  // CHECK: dloss.dim %[[X]] axis 0 : tensor<?x8xf32>
  %d = dloss.dim %x axis 0 : tensor<?x8xf32>
  // CHECK: dloss.shard_offset %[[X]] axis 0 : tensor<?x8xf32>
  %o = dloss.shard_offset %x axis 0 : tensor<?x8xf32>
  // CHECK: dloss.global_size %[[X]] axis 0 : tensor<?x8xf32>
  %g = dloss.global_size %x axis 0 : tensor<?x8xf32>
  return %r, %n, %d, %o, %g : index, index, index, index, index
}

// CHECK-LABEL: func.func @sizes_of_any_element_type
func.func @sizes_of_any_element_type(%labels: tensor<?xi64>) -> index {
  // CHECK: dloss.global_size %{{.*}} axis 0 : tensor<?xi64>
  %g = dloss.global_size %labels axis 0 : tensor<?xi64>
  return %g : index
}
