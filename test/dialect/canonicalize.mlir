// RUN: dloss-opt %s --canonicalize --cse --split-input-file | FileCheck %s

// Static sizes fold; dynamic ones stay.
// CHECK-LABEL: func.func @dim_folds_when_static
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : index
// CHECK-DAG: %[[D:.*]] = dloss.dim %{{.*}} axis 0 : tensor<?x8xf32>
// CHECK: return %[[D]], %[[C8]]
func.func @dim_folds_when_static(%x: tensor<?x8xf32>) -> (index, index) {
  %0 = dloss.dim %x axis 0 : tensor<?x8xf32>
  %1 = dloss.dim %x axis 1 : tensor<?x8xf32>
  return %0, %1 : index, index
}

// -----

// CHECK-LABEL: func.func @cast_to_same_type_folds
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xf32>)
// CHECK-NOT: dloss.cast
// CHECK: return %[[X]]
func.func @cast_to_same_type_folds(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %0 = dloss.cast %x : tensor<?x8xf32> to tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// -----

// CHECK-LABEL: func.func @ring_shift_by_zero_folds
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xf32>)
// CHECK-NEXT: %[[S:.*]] = dloss.ring_shift %[[X]] by 1
// CHECK-NEXT: return %[[X]], %[[S]]
func.func @ring_shift_by_zero_folds(%x: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  %0 = dloss.ring_shift %x by 0 : tensor<?x8xf32>
  %1 = dloss.ring_shift %x by 1 : tensor<?x8xf32>
  return %0, %1 : tensor<?x8xf32>, tensor<?x8xf32>
}

// -----

// Collectives are never CSE'd or dropped: every rank must run the same
// sequence of collectives, whatever the optimizer thinks of their results.
// CHECK-LABEL: func.func @collectives_are_kept
// CHECK: dloss.all_reduce sum
// CHECK: dloss.all_reduce sum
// CHECK: dloss.all_gather
// CHECK: dloss.broadcast
// CHECK: dloss.reduce_scatter
// CHECK: dloss.ring_shift
// CHECK: return
func.func @collectives_are_kept(%x: tensor<?x8xf32>, %s: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %0 = dloss.all_reduce sum %s : tensor<f32>
  %1 = dloss.all_reduce sum %s : tensor<f32>
  %unused_gather = dloss.all_gather %x axis 0 : tensor<?x8xf32>
  %unused_broadcast = dloss.broadcast %s root 0 : tensor<f32>
  %unused_scatter = dloss.reduce_scatter sum %x axis 0 : tensor<?x8xf32>
  %unused_shift = dloss.ring_shift %x by 1 : tensor<?x8xf32>
  return %0, %1 : tensor<f32>, tensor<f32>
}

// -----

// Rank facts and compute are pure: duplicates merge, unused ones go.
// CHECK-LABEL: func.func @pure_ops_merge
// CHECK-COUNT-1: dloss.exp
// CHECK-NOT: dloss.rank
// CHECK-NOT: dloss.exp
func.func @pure_ops_merge(%x: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  %r = dloss.rank
  %0 = dloss.exp %x : tensor<?x8xf32>
  %1 = dloss.exp %x : tensor<?x8xf32>
  return %0, %1 : tensor<?x8xf32>, tensor<?x8xf32>
}

// -----

// A sum or mean of a negation negates the reduced value (one pass over
// the batch less); a max keeps its negation, and so does a negation with
// another use.
// CHECK-LABEL: func.func @negation_after_reducing
// CHECK-SAME: (%[[X:.*]]: tensor<?x8xf32>)
// CHECK-DAG: %[[S:.*]] = dloss.reduce sum %[[X]] axes [0] : tensor<?x8xf32>
// CHECK-DAG: %[[NS:.*]] = dloss.neg %[[S]] : tensor<8xf32>
// CHECK-DAG: %[[M:.*]] = dloss.reduce mean %[[X]] axes [0, 1] : tensor<?x8xf32>
// CHECK-DAG: %[[NM:.*]] = dloss.neg %[[M]] : tensor<f32>
// CHECK-DAG: %[[N:.*]] = dloss.neg %[[X]] : tensor<?x8xf32>
// CHECK-DAG: %[[MAX:.*]] = dloss.reduce max %[[N]] axes [0] : tensor<?x8xf32>
// CHECK-DAG: %[[S2:.*]] = dloss.reduce sum %[[N]] axes [0] : tensor<?x8xf32>
// CHECK: return %[[NS]], %[[NM]], %[[MAX]], %[[S2]]
func.func @negation_after_reducing(%x: tensor<?x8xf32>) -> (tensor<8xf32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>) {
  %n1 = dloss.neg %x : tensor<?x8xf32>
  %s = dloss.reduce sum %n1 axes [0] : tensor<?x8xf32>
  %n2 = dloss.neg %x : tensor<?x8xf32>
  %m = dloss.reduce mean %n2 axes [0, 1] : tensor<?x8xf32>
  %n3 = dloss.neg %x : tensor<?x8xf32>
  %max = dloss.reduce max %n3 axes [0] : tensor<?x8xf32>
  %s2 = dloss.reduce sum %n3 axes [0] : tensor<?x8xf32>
  return %s, %m, %max, %s2 : tensor<8xf32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
}
