// RUN: dloss-opt %s --split-input-file --dloss-verify-collectives --verify-diagnostics | FileCheck %s

// Logging on rank 0 only: the all_reduce would hang the other ranks.
func.func @rank_conditional_all_reduce(%x: tensor<f32>) -> tensor<f32> {
  // expected-note@+1 {{it varies across ranks because of this 'dloss.rank'}}
  %r = dloss.rank
  %c0 = arith.constant 0 : index
  // expected-note@+1 {{the condition is computed here}}
  %is_zero = arith.cmpi eq, %r, %c0 : index
  %y = scf.if %is_zero -> tensor<f32> {
    // expected-error@+1 {{'dloss.all_reduce' op is reached only on some ranks: it is inside an 'scf.if' whose condition varies across ranks, and every rank must run every collective in the same order or the job hangs. Hoist the collective out of the 'scf.if' (run it on every rank and use its result only where needed), or make the condition invariant (combine it across ranks with dloss.all_reduce first)}}
    %s = dloss.all_reduce sum %x : tensor<f32>
    scf.yield %s : tensor<f32>
  } else {
    scf.yield %x : tensor<f32>
  }
  return %y : tensor<f32>
}

// -----

// The note names where the variation starts.
func.func @rank_conditional_names_rank(%x: tensor<4xf32>) {
  // expected-note@+1 {{it varies across ranks because of this 'dloss.rank', whose result differs from rank to rank}}
  %r = dloss.rank
  %c0 = arith.constant 0 : index
  // expected-note@+1 {{the condition is computed here}}
  %is_zero = arith.cmpi eq, %r, %c0 : index
  scf.if %is_zero {
    // expected-error@+1 {{'dloss.all_gather' op is reached only on some ranks}}
    %g = dloss.all_gather %x axis 0 grad none : tensor<4xf32>
  }
  return
}

// -----

// A collective in one branch of an if on varying data (each rank's own batch).
// expected-note@+1 {{it varies across ranks because argument #0 of @collective_in_one_branch is not marked dloss.replicated}}
func.func @collective_in_one_branch(%x: tensor<?x4xf32>) {
  %n = dloss.dim %x axis 0 : tensor<?x4xf32>
  %c8 = arith.constant 8 : index
  // expected-note@+1 {{the condition is computed here}}
  %big = arith.cmpi sgt, %n, %c8 : index
  scf.if %big {
    // expected-error@+1 {{'dloss.all_gather' op is reached only on some ranks}}
    %g = dloss.all_gather %x axis 0 : tensor<?x4xf32>
  } else {
  }
  return
}

// -----

// The variation comes from an argument that is not replicated.
// expected-note@+1 {{it varies across ranks because argument #0 of @varying_argument_condition is not marked dloss.replicated (each rank passes its own)}}
func.func @varying_argument_condition(%flag: i1, %x: tensor<f32>) {
  scf.if %flag {
    // expected-error@+1 {{'dloss.all_reduce' op is reached only on some ranks}}
    %s = dloss.all_reduce sum %x : tensor<f32>
  }
  return
}

// -----

// A loop whose trip count is each rank's own batch size.
// expected-note@+1 {{because argument #0 of @rank_dependent_loop is not marked dloss.replicated}}
func.func @rank_dependent_loop(%x: tensor<?x4xf32>, %s: tensor<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  // expected-note@+1 {{the upper bound is computed here}}
  %n = dloss.dim %x axis 0 : tensor<?x4xf32>
  scf.for %i = %c0 to %n step %c1 {
    // expected-error@+1 {{'dloss.ring_shift' op may run a different number of times on different ranks: it is inside an 'scf.for' whose upper bound varies across ranks}}
    %t = dloss.ring_shift %s by 1 : tensor<f32>
  }
  return
}

// -----

// A while loop whose condition is computed from varying data.
func.func @rank_dependent_while(%x: tensor<f32>) {
  %c0 = arith.constant 0 : index
  // expected-note@+1 {{it varies across ranks because of this 'dloss.rank'}}
  %r = dloss.rank
  %w = scf.while (%i = %c0) : (index) -> index {
    // expected-note@+1 {{the condition is computed here}}
    %go = arith.cmpi slt, %i, %r : index
    scf.condition(%go) %i : index
  } do {
  ^bb0(%i: index):
    // expected-error@+1 {{'dloss.all_reduce' op may run a different number of times on different ranks: it is inside an 'scf.while' whose condition varies across ranks}}
    %s = dloss.all_reduce sum %x : tensor<f32>
    %c1 = arith.constant 1 : index
    %next = arith.addi %i, %c1 : index
    scf.yield %next : index
  }
  return
}

// -----

// Control flow every rank follows the same way is fine: a replicated flag,
// a bound from the world size, a condition computed after an all_reduce.
// CHECK-LABEL: func.func @invariant_control_flow
func.func @invariant_control_flow(%flag: i1 {dloss.replicated}, %x: tensor<?x4xf32>, %s: tensor<f32>) -> tensor<f32> {
  // CHECK: scf.if
  scf.if %flag {
    %g = dloss.all_gather %x axis 0 : tensor<?x4xf32>
  }
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = dloss.world_size
  // CHECK: scf.for
  %acc = scf.for %i = %c0 to %n step %c1 iter_args(%a = %s) -> tensor<f32> {
    %t = dloss.ring_shift %a by 1 : tensor<f32>
    scf.yield %t : tensor<f32>
  }
  %total = dloss.all_reduce sum %acc : tensor<f32>
  %zero = arith.constant dense<0.0> : tensor<f32>
  %is_zero = dloss.eq %total, %zero : tensor<f32>, tensor<f32>
  %b = dloss.global_size %x axis 0 : tensor<?x4xf32>
  %c10 = arith.constant 10 : index
  %large = arith.cmpi sgt, %b, %c10 : index
  // CHECK: scf.if
  %y = scf.if %large -> tensor<f32> {
    %m = dloss.all_reduce max %s : tensor<f32>
    scf.yield %m : tensor<f32>
  } else {
    scf.yield %total : tensor<f32>
  }
  return %y : tensor<f32>
}
