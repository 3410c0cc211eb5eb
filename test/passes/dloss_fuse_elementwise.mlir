// RUN: dloss-opt %s --split-input-file --dloss-fuse-elementwise | FileCheck %s
// What dloss-fuse-elementwise fuses (connected add/sub/mul/div/neg/sqrt of
// one float type, with 0-d values and expanded vectors as leaves) and what
// it leaves (lone ops that read no expand, other ops, a chain whose values are read by an op
// outside it before the chain ends).

// Batch norm's forward: the expands become per-column leaves (and go), the
// chain one op with the normalised value as its only result.
// CHECK-LABEL: func.func @batch_norm(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x8xf32>, %[[M:[^:]*]]: tensor<8xf32>, %[[V:[^:]*]]: tensor<8xf32>, %[[E:[^:]*]]: tensor<f32>
// CHECK-NOT: dloss.expand
// CHECK: %[[Y:.*]] = dloss.fused_elementwise %[[X]], %[[M]], %[[V]], %[[E]] {col_leaves = 2 : i64, elements = 1 : i64, outputs = array<i64: 7>,
// CHECK-SAME: program = array<i64: 25, 0, 0, 0, 3, 0, 0, 0, 7, 0, 1, 0, 3, 1, 0, 0, 4, 0, 0, 0, 6, 3, 4, 0, 19, 5, 0, 0, 9, 2, 6, 0>, row_leaves = 0 : i64}
// CHECK-SAME: : (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<f32>) -> tensor<?x8xf32>
// CHECK-NOT: dloss.sub
// CHECK-NOT: dloss.div
// CHECK: return %[[Y]]
func.func @batch_norm(%x: tensor<?x8xf32>, %m: tensor<8xf32>, %v: tensor<8xf32>, %eps: tensor<f32>) -> tensor<?x8xf32> {
  %me = dloss.expand %m axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %d = dloss.sub %x, %me : tensor<?x8xf32>, tensor<?x8xf32>
  %ve = dloss.expand %v axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %a = dloss.add %ve, %eps : tensor<?x8xf32>, tensor<f32>
  %s = dloss.sqrt %a : tensor<?x8xf32>
  %y = dloss.div %d, %s : tensor<?x8xf32>, tensor<?x8xf32>
  return %y : tensor<?x8xf32>
}

// -----

// Values read outside the chain after its last op are results; a sum over
// the batch that ends the chain is a column sum (its operand never reaches
// memory); a per-row expand is a row leaf, and an expand read elsewhere too
// stays.
// CHECK-LABEL: func.func @outputs(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x8xf32>, %[[Y:[^:]*]]: tensor<?x8xf32>, %[[R:[^:]*]]: tensor<?xf32>
// CHECK: %[[RE:.*]] = dloss.expand %[[R]] axes [1]
// CHECK: %[[F:.*]]:3 = dloss.fused_elementwise %[[X]], %[[Y]], %[[R]] {col_leaves = 0 : i64, col_sums = array<i64: 2, 4>, elements = 2 : i64, outputs = array<i64: 5>,
// CHECK-SAME: program = array<i64: 25, 0, 0, 0, 25, 1, 0, 0, 8, 0, 1, 0, 2, 0, 0, 0, 6, 2, 3, 0, 10, 4, 0, 0>, row_leaves = 1 : i64}
// CHECK-SAME: -> (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>)
// CHECK-NOT: dloss.reduce
// CHECK: return %[[F]]#0, %[[F]]#1, %[[F]]#2, %[[RE]]
func.func @outputs(%x: tensor<?x8xf32>, %y: tensor<?x8xf32>, %r: tensor<?xf32>) -> (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<?x8xf32>) {
  %p = dloss.mul %x, %y : tensor<?x8xf32>, tensor<?x8xf32>
  %re = dloss.expand %r axes [1] like %x : tensor<?xf32>, tensor<?x8xf32>
  %q = dloss.add %p, %re : tensor<?x8xf32>, tensor<?x8xf32>
  %n = dloss.neg %q : tensor<?x8xf32>
  %s = dloss.reduce sum %p axes [0] : tensor<?x8xf32>
  %t = dloss.reduce sum %q axes [0] : tensor<?x8xf32>
  return %n, %s, %t, %re : tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<?x8xf32>
}

// -----

// A sum over the batch whose result the chain reads on (batch norm: the
// mean, then x - mean) ends the chain: the rest is a chain of its own. It
// recomputes the first chain's value from x (one read of x, as reading the
// value back would be), so the first chain writes only its sum.
// CHECK-LABEL: func.func @sum_read_by_the_chain(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x8xf32>
// CHECK: %[[S:.*]] = dloss.fused_elementwise %[[X]] {col_leaves = 0 : i64, col_sums = array<i64: 1>, elements = 1 : i64, outputs = array<i64>,
// CHECK-SAME: -> tensor<8xf32>
// CHECK: %[[E:.*]] = dloss.fused_elementwise %[[X]], %[[S]] {col_leaves = 1 : i64, elements = 1 : i64, outputs = array<i64: 3>,
// CHECK-SAME: program = array<i64: 25, 0, 0, 0, 8, 0, 0, 0, 3, 0, 0, 0, 7, 1, 2, 0>
// CHECK-NOT: dloss.reduce
// CHECK: return %[[E]]
func.func @sum_read_by_the_chain(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %sq = dloss.mul %x, %x : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %sq axes [0] : tensor<?x8xf32>
  %se = dloss.expand %s axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %d = dloss.sub %sq, %se : tensor<?x8xf32>, tensor<?x8xf32>
  return %d : tensor<?x8xf32>
}

// -----

// %p is read by the reduction before %q: fused at %q's place, the chain
// would come after a reader of its value, so %q starts a chain of its own
// (of one op: nothing fuses). Exp is no instruction of the fused program.
// CHECK-LABEL: func.func @read_before_the_end(
// CHECK-NOT: dloss.fused_elementwise
// CHECK: dloss.mul
// CHECK: dloss.reduce
// CHECK: dloss.exp
// CHECK: dloss.add
// CHECK: return
func.func @read_before_the_end(%x: tensor<?x8xf32>, %y: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<f32>) {
  %p = dloss.mul %x, %y : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %p axes [0, 1] : tensor<?x8xf32>
  %e = dloss.exp %y : tensor<?x8xf32>
  %q = dloss.add %p, %e : tensor<?x8xf32>, tensor<?x8xf32>
  return %q, %s : tensor<?x8xf32>, tensor<f32>
}

// -----

// Different types make different chains; integer and half types stay.
// CHECK-LABEL: func.func @types(
// CHECK: dloss.fused_elementwise %{{.*}} : (tensor<?x8xf64>, tensor<f64>) -> tensor<?x8xf64>
// CHECK: dloss.add %{{.*}} : tensor<?x4xf32>, tensor<?x4xf32>
// CHECK: dloss.mul %{{.*}} : tensor<?xi64>, tensor<?xi64>
// CHECK: dloss.add %{{.*}} : tensor<?xi64>, tensor<?xi64>
// CHECK-NOT: dloss.fused_elementwise
func.func @types(%x: tensor<?x8xf64>, %s: tensor<f64>, %z: tensor<?x4xf32>, %i: tensor<?xi64>) -> (tensor<?x8xf64>, tensor<?x4xf32>, tensor<?xi64>) {
  %a = dloss.mul %x, %s : tensor<?x8xf64>, tensor<f64>
  %b = dloss.sub %a, %x : tensor<?x8xf64>, tensor<?x8xf64>
  %c = dloss.add %z, %z : tensor<?x4xf32>, tensor<?x4xf32>
  %j = dloss.mul %i, %i : tensor<?xi64>, tensor<?xi64>
  %k = dloss.add %j, %i : tensor<?xi64>, tensor<?xi64>
  return %b, %c, %k : tensor<?x8xf64>, tensor<?x4xf32>, tensor<?xi64>
}

// -----

// One op alone fuses when it reads an expanded vector: the expand (of the
// op's size) goes. An expand of a 0-d value is a 0-d leaf.
// CHECK-LABEL: func.func @lone_op_reading_an_expand(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x8xf32>, %[[V:[^:]*]]: tensor<8xf32>, %[[S:[^:]*]]: tensor<f32>
// CHECK-NOT: dloss.expand
// CHECK: dloss.fused_elementwise %[[X]], %[[V]] {col_leaves = 1 : i64, elements = 1 : i64, outputs = array<i64: 2>, program = array<i64: 25, 0, 0, 0, 3, 0, 0, 0, 9, 0, 1, 0>, row_leaves = 0 : i64}
// CHECK: dloss.fused_elementwise %[[X]], %[[S]] {col_leaves = 0 : i64, elements = 1 : i64, outputs = array<i64: 2>, program = array<i64: 25, 0, 0, 0, 4, 0, 0, 0, 8, 0, 1, 0>, row_leaves = 0 : i64}
// CHECK-NOT: dloss.expand
func.func @lone_op_reading_an_expand(%x: tensor<?x8xf32>, %v: tensor<8xf32>, %s: tensor<f32>) -> (tensor<?x8xf32>, tensor<f32>, tensor<?x8xf32>) {
  %e = dloss.expand %v axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %d = dloss.div %x, %e : tensor<?x8xf32>, tensor<?x8xf32>
  %r = dloss.reduce sum %d axes [0, 1] : tensor<?x8xf32>
  %se = dloss.expand %s axes [0, 1] like %x : tensor<f32>, tensor<?x8xf32>
  %m = dloss.mul %x, %se : tensor<?x8xf32>, tensor<?x8xf32>
  return %d, %r, %m : tensor<?x8xf32>, tensor<f32>, tensor<?x8xf32>
}

// -----

// Batch norm's forward and the sums of its backward, as autodiff writes
// them: x - mean is read after the variance's all-reduce (and as the
// `like` of an expand); g / s is summed after a reader of the other sum.
// That sum moves up to join its chain, x - mean is recomputed where it is
// read, and nothing but the normalised value and the sums reaches memory.
// CHECK-LABEL: func.func @batch_norm_and_backward_sums(
// CHECK-SAME: %[[X:[^:]*]]: tensor<?x8xf32>, %[[M:[^:]*]]: tensor<8xf32>, %[[G:[^:]*]]: tensor<?x8xf32>
// CHECK: %[[V:.*]] = dloss.fused_elementwise %[[X]], %[[M]] {{{.*}}outputs = array<i64>,
// CHECK-SAME: -> tensor<8xf32>
// CHECK: %[[R:.*]] = dloss.all_reduce sum %[[V]]
// CHECK: %[[B:.*]]:3 = dloss.fused_elementwise %[[X]], %[[G]], %[[M]], %[[R]] {{{.*}}col_sums = array<i64: 6, 7>, elements = 2 : i64, outputs = array<i64: 4>,
// CHECK-SAME: -> (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>)
// CHECK: %[[A:.*]] = dloss.all_reduce sum %[[B]]#2
// CHECK: %[[C:.*]] = dloss.all_reduce sum %[[B]]#1
// CHECK-NOT: dloss.reduce
// CHECK-NOT: dloss.expand
// CHECK: return %[[B]]#0, %[[A]], %[[C]]
func.func @batch_norm_and_backward_sums(%x: tensor<?x8xf32>, %m: tensor<8xf32>, %g: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>) {
  %me = dloss.expand %m axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %d = dloss.sub %x, %me : tensor<?x8xf32>, tensor<?x8xf32>
  %sq = dloss.mul %d, %d : tensor<?x8xf32>, tensor<?x8xf32>
  %v = dloss.reduce sum %sq axes [0] : tensor<?x8xf32>
  %r = dloss.all_reduce sum %v : tensor<8xf32>
  %re = dloss.expand %r axes [0] like %d : tensor<8xf32>, tensor<?x8xf32>
  %y = dloss.div %d, %re : tensor<?x8xf32>, tensor<?x8xf32>
  %q = dloss.div %g, %re : tensor<?x8xf32>, tensor<?x8xf32>
  %p = dloss.mul %q, %y : tensor<?x8xf32>, tensor<?x8xf32>
  %sp = dloss.reduce sum %p axes [0] : tensor<?x8xf32>
  %a = dloss.all_reduce sum %sp : tensor<8xf32>
  %sq2 = dloss.reduce sum %q axes [0] : tensor<?x8xf32>
  %b = dloss.all_reduce sum %sq2 : tensor<8xf32>
  return %y, %a, %b : tensor<?x8xf32>, tensor<8xf32>, tensor<8xf32>
}

// -----

// A value read by an op outside every chain (here a matmul) stays a
// result: recomputing it elsewhere would not save its write.
// CHECK-LABEL: func.func @read_by_another_op(
// CHECK: %[[S:.*]]:2 = dloss.fused_elementwise %{{.*}} {{{.*}}col_sums = array<i64: 1>{{.*}}outputs = array<i64: 1>,
// CHECK: dloss.matmul %[[S]]#0
// CHECK: dloss.fused_elementwise %[[S]]#0, %[[S]]#1
func.func @read_by_another_op(%x: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<8x8xf32>) {
  %sq = dloss.mul %x, %x : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %sq axes [0] : tensor<?x8xf32>
  %mm = dloss.matmul %sq, %sq transpose_lhs : tensor<?x8xf32>, tensor<?x8xf32>
  %se = dloss.expand %s axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %d = dloss.sub %sq, %se : tensor<?x8xf32>, tensor<?x8xf32>
  return %d, %mm : tensor<?x8xf32>, tensor<8x8xf32>
}

// -----

// A value of two full-size leaves read by two later chains that read
// neither: recomputing it would read four buffers where writing it and
// reading it twice costs three, so it stays a result.
// CHECK-LABEL: func.func @too_costly_to_recompute(
// CHECK: %[[P:.*]]:2 = dloss.fused_elementwise %{{.*}}, %{{.*}} {{{.*}}col_sums = array<i64: 2>{{.*}}elements = 2 : i64, outputs = array<i64: 2>,
// CHECK: dloss.fused_elementwise %[[P]]#0, %[[P]]#1 {
// CHECK: dloss.fused_elementwise %[[P]]#0, %[[P]]#1 {
func.func @too_costly_to_recompute(%x: tensor<?x8xf32>, %y: tensor<?x8xf32>) -> (tensor<?x8xf32>, tensor<?x8xf32>) {
  %p = dloss.mul %x, %y : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %p axes [0] : tensor<?x8xf32>
  %se = dloss.expand %s axes [0] like %x : tensor<8xf32>, tensor<?x8xf32>
  %a = dloss.sub %p, %se : tensor<?x8xf32>, tensor<?x8xf32>
  %b = dloss.add %p, %se : tensor<?x8xf32>, tensor<?x8xf32>
  return %a, %b : tensor<?x8xf32>, tensor<?x8xf32>
}
