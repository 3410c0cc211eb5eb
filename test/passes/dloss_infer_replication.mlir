// RUN: dloss-opt %s --split-input-file --dloss-infer-replication=annotate --verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @rules
func.func @rules(%x: tensor<?x4xf32>, %w: tensor<4x4xf32> {dloss.replicated}, %s: tensor<f32> {dloss.replicated})
    -> tensor<f32> attributes {dloss.loss} {
  // Collectives (the table in DESIGN.md).
  // CHECK: dloss.all_gather {{.*}}dloss.replication = "invariant"
  %g = dloss.all_gather %x axis 0 : tensor<?x4xf32>
  // CHECK: dloss.reduce_scatter {{.*}}dloss.replication = "varying"
  %rs = dloss.reduce_scatter sum %g axis 0 : tensor<?x4xf32>
  // CHECK: dloss.broadcast {{.*}}dloss.replication = "invariant"
  %b = dloss.broadcast %x root 0 : tensor<?x4xf32>
  // CHECK: dloss.ring_shift {{.*}}dloss.replication = "varying"
  %shifted = dloss.ring_shift %x by 1 : tensor<?x4xf32>
  // A copy of an equal value is still equal.
  // CHECK: dloss.ring_shift {{.*}}dloss.replication = "invariant"
  %shifted_w = dloss.ring_shift %w by 1 : tensor<4x4xf32>
  // Rank facts.
  // CHECK: dloss.rank {{.*}}dloss.replication = "varying"
  %r = dloss.rank
  // CHECK: dloss.world_size {{.*}}dloss.replication = "invariant"
  %n = dloss.world_size
  // CHECK: dloss.dim %arg0 {{.*}}dloss.replication = "varying"
  %d = dloss.dim %x axis 0 : tensor<?x4xf32>
  // CHECK: dloss.dim %arg1 {{.*}}dloss.replication = "invariant"
  %dw = dloss.dim %w axis 0 : tensor<4x4xf32>
  // CHECK: dloss.shard_offset {{.*}}dloss.replication = "varying"
  %o = dloss.shard_offset %x axis 0 : tensor<?x4xf32>
  // CHECK: dloss.global_size {{.*}}dloss.replication = "invariant"
  %gs = dloss.global_size %x axis 0 : tensor<?x4xf32>
  // Local computation: invariant only when every operand is.
  // CHECK: dloss.matmul %arg0, %arg1 {{.*}}dloss.replication = "varying"
  %xw = dloss.matmul %x, %w : tensor<?x4xf32>, tensor<4x4xf32>
  // CHECK: dloss.matmul %{{.*}}, %arg1 {{.*}}dloss.replication = "invariant"
  %gw = dloss.matmul %g, %w : tensor<?x4xf32>, tensor<4x4xf32>
  // CHECK: arith.constant {{.*}}dloss.replication = "invariant"
  %two = arith.constant dense<2.0> : tensor<f32>
  // CHECK: dloss.mul {{.*}}dloss.replication = "invariant"
  %s2 = dloss.mul %s, %two : tensor<f32>, tensor<f32>
  // CHECK: dloss.reduce sum %{{.*}}dloss.replication = "varying"
  %local = dloss.reduce sum %xw axes [0, 1] : tensor<?x4xf32>
  // CHECK: dloss.all_reduce {{.*}}dloss.replication = "invariant"
  %total = dloss.all_reduce sum %local : tensor<f32>
  %loss = dloss.mul %total, %s2 : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Control flow: a varying condition makes the results vary; an invariant one
// keeps invariant results invariant.
// CHECK-LABEL: func.func @control_flow
func.func @control_flow(%s: tensor<f32> {dloss.replicated}, %t: tensor<f32> {dloss.replicated}, %flag: i1 {dloss.replicated}) {
  %r = dloss.rank
  %c0 = arith.constant 0 : index
  %first = arith.cmpi eq, %r, %c0 : index
  // CHECK: scf.if
  // CHECK: dloss.replication = "varying"
  %a = scf.if %first -> tensor<f32> {
    scf.yield %s : tensor<f32>
  } else {
    scf.yield %t : tensor<f32>
  }
  // CHECK: scf.if
  // CHECK: dloss.replication = "invariant"
  %b = scf.if %flag -> tensor<f32> {
    scf.yield %s : tensor<f32>
  } else {
    scf.yield %t : tensor<f32>
  }
  // A loop-carried value that picks up a varying value becomes varying.
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  // CHECK: scf.for
  // CHECK: dloss.replication = "varying"
  %c = scf.for %i = %c0 to %c3 step %c1 iter_args(%acc = %s) -> tensor<f32> {
    %rt = dloss.cast %r : index to tensor<f32>
    %next = dloss.add %acc, %rt : tensor<f32>, tensor<f32>
    scf.yield %next : tensor<f32>
  }
  return
}

// -----

// Region ops that the analysis knows only through RegionBranchOpInterface:
// what a case or region yields reaches the result (an invariant selector
// does not make a varying case value invariant), and a varying selector makes
// ranks take different cases.
// CHECK-LABEL: func.func @region_branch_ops
func.func @region_branch_ops(%s: tensor<f32> {dloss.replicated}, %x: tensor<f32>, %i: index {dloss.replicated}) {
  %r = dloss.rank
  %one = arith.constant dense<1.0> : tensor<f32>
  // CHECK: scf.index_switch %arg2 {dloss.replication = "varying"}
  %a = scf.index_switch %i -> tensor<f32>
  case 0 {
    scf.yield %x : tensor<f32>
  }
  default {
    scf.yield %s : tensor<f32>
  }
  // CHECK: scf.index_switch %{{.*}} {dloss.replication = "varying"}
  %b = scf.index_switch %r -> tensor<f32>
  case 0 {
    scf.yield %one : tensor<f32>
  }
  default {
    scf.yield %s : tensor<f32>
  }
  // CHECK: scf.index_switch %arg2 {dloss.replication = "invariant"}
  %c = scf.index_switch %i -> tensor<f32>
  case 0 {
    scf.yield %one : tensor<f32>
  }
  default {
    scf.yield %s : tensor<f32>
  }
  // CHECK: scf.execute_region
  // CHECK-NEXT: scf.yield %arg1
  // CHECK-NEXT: } {dloss.replication = "varying"}
  %d = scf.execute_region -> tensor<f32> {
    scf.yield %x : tensor<f32>
  }
  // CHECK: scf.execute_region
  // CHECK: } {dloss.replication = "invariant"}
  %e = scf.execute_region -> tensor<f32> {
    %t = dloss.add %s, %one : tensor<f32>, tensor<f32>
    scf.yield %t : tensor<f32>
  }
  return
}

// -----

func.func @varying_loss(%x: tensor<?xf32>) -> tensor<f32> attributes {dloss.loss} {
  // expected-note@+1 {{the returned value is computed here by 'dloss.reduce' on each rank's own data; combine it across ranks with `dloss.all_reduce sum` (or mean) before returning it}}
  %s = dloss.reduce sum %x axes [0] : tensor<?xf32>
  // expected-error@+1 {{the loss returned by @varying_loss varies across ranks, but a loss must be the same on every rank}}
  return %s : tensor<f32>
}
// The note on the argument comes from the explanation of the variation.
// expected-note@-7 {{it varies across ranks because argument #0 of @varying_loss is not marked dloss.replicated}}

// -----

func.func @loss_varying_through_rank(%s: tensor<f32> {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  // expected-note@+1 {{it varies across ranks because of this 'dloss.rank'}}
  %r = dloss.rank
  %rt = dloss.cast %r : index to tensor<f32>
  // expected-note@+1 {{the returned value is computed here by 'dloss.mul'}}
  %y = dloss.mul %s, %rt : tensor<f32>, tensor<f32>
  // expected-error@+1 {{the loss returned by @loss_varying_through_rank varies across ranks}}
  return %y : tensor<f32>
}

// -----

func.func private @scaled(%x: tensor<?xf32>, %scale: tensor<f32> {dloss.replicated}) -> tensor<?xf32>

// expected-note@+1 {{it varies across ranks because argument #1 of @call_with_varying_replicated is not marked dloss.replicated}}
func.func @call_with_varying_replicated(%x: tensor<?xf32>, %mine: tensor<f32>) -> tensor<?xf32> {
  // expected-error@+1 {{'func.call' op passes a value that varies across ranks as argument #1 of @scaled, which is marked dloss.replicated (the same on every rank); pass an invariant value, for example the result of a dloss.all_reduce or dloss.broadcast}}
  %y = func.call @scaled(%x, %mine) : (tensor<?xf32>, tensor<f32>) -> tensor<?xf32>
  return %y : tensor<?xf32>
}
