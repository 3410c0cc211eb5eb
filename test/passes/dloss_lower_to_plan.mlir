// RUN: dloss-opt %s --split-input-file --dloss-lower-to-plan=text=- --verify-diagnostics -o /dev/null | FileCheck %s

// One step per op, registers numbered arguments first, attributes by name
// (enums as text), locations, and each register freed after its last use.
// CHECK: plan version 5 fingerprint 0x{{[0-9a-f]+}}
// CHECK-LABEL: func @steps(%0: tensor<?x8xf32> "x", %1: tensor<f32> replicated) grad_mode "global" registers 8
// CHECK-NEXT: %2 = arith.constant() {value = constant<f32, splat, 4 bytes>} loc({{.*}}dloss_lower_to_plan.mlir:[[@LINE+10]]:{{[0-9]+}}) free(%2)
// CHECK-NEXT: %3 = dloss.all_gather(%0) {axis = 0, grad = "none"} loc({{.*}}:[[@LINE+10]]:{{[0-9]+}})
// CHECK-NEXT: %4 = dloss.matmul(%0, %3) {transpose_rhs = 1} loc({{.*}}) free(%0, %3)
// CHECK-NEXT: %5 = dloss.reduce(%4) {axes = [0, 1], kind = "max"} loc({{.*}}) free(%4)
// CHECK-NEXT: %6 = dloss.mul(%5, %1) loc({{.*}}) free(%1, %5)
// CHECK-NEXT: dloss.all_reduce(%6) {kind = "mean"}
// CHECK-SAME: free(%6)
// CHECK-NEXT: return(%7)
func.func @steps(%x: tensor<?x8xf32> {dloss.name = "x"}, %s: tensor<f32> {dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss, dloss.grad_mode = "global"} {
  %unused = arith.constant dense<1.0> : tensor<f32>
  %all = dloss.all_gather %x axis 0 grad none : tensor<?x8xf32>
  %sim = dloss.matmul %x, %all transpose_rhs : tensor<?x8xf32>, tensor<?x8xf32>
  %m = dloss.reduce max %sim axes [0, 1] : tensor<?x?xf32>
  %l = dloss.mul %m, %s : tensor<f32>, tensor<f32>
  %t = dloss.all_reduce mean %l : tensor<f32>
  return %t : tensor<f32>
}

// -----

// A dead result is freed right after the step that makes it; index values
// live in index registers; the gradient function records its contract.
// CHECK-LABEL: func @sizes(%0: tensor<?x4xf32>) registers 5
// CHECK-NEXT: %1 = dloss.dim(%0) {axis = 0}
// CHECK-SAME: free(%1)
// CHECK-NEXT: %2 = dloss.global_size(%0) {axis = 0}
// CHECK-NEXT: %3 = dloss.cast(%2)
// CHECK-NEXT: %4 = dloss.reduce(%0)
// CHECK: func @loss_grad(%0: tensor<?x4xf32>) grad_mode "ddp" gradient_of @loss wrt (%0)
func.func @sizes(%x: tensor<?x4xf32>) -> (tensor<f32>, tensor<f32>) {
  %n = dloss.dim %x axis 0 : tensor<?x4xf32>
  %g = dloss.global_size %x axis 0 : tensor<?x4xf32>
  %gf = dloss.cast %g : index to tensor<f32>
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  return %gf, %s : tensor<f32>, tensor<f32>
}
func.func @loss(%x: tensor<?x4xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}
func.func @loss_grad(%x: tensor<?x4xf32>) -> (tensor<f32>, tensor<?x4xf32>) attributes {dloss.gradient_of = @loss} {
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  return %s, %x : tensor<f32>, tensor<?x4xf32>
}

// -----

func.func @control_flow(%x: tensor<f32>, %flag: i1) -> tensor<f32> {
  // expected-error@+1 {{'scf.if' op has regions, and the runtime runs straight-line plans; compute this without control flow}}
  %y = scf.if %flag -> tensor<f32> {
    scf.yield %x : tensor<f32>
  } else {
    scf.yield %x : tensor<f32>
  }
  return %y : tensor<f32>
}

// -----

func.func private @helper(%x: tensor<f32>) -> tensor<f32>
func.func @calls(%x: tensor<f32>) -> tensor<f32> {
  // expected-error@+1 {{'func.call' op calls a function; inline it first (dlossc and dloss-derive-backward do)}}
  %y = func.call @helper(%x) : (tensor<f32>) -> tensor<f32>
  return %y : tensor<f32>
}

// -----

// expected-error@+1 {{the runtime cannot hold argument of type 'tensor<4xcomplex<f32>>'; use ranked tensors of float or signless integer elements, or index}}
func.func @unsupported_type(%x: tensor<4xcomplex<f32>>) {
  return
}

// -----

// Index arithmetic (from a user or from a rule such as reduce mean's count)
// lowers with its overflow flags.
// CHECK-LABEL: func @index_arithmetic
// CHECK: arith.addi(%1, %2) {overflowFlags = 0}
// CHECK: arith.muli(%3, %2) {overflowFlags = 0}
func.func @index_arithmetic(%x: tensor<?x4xf32>) -> index {
  %n = dloss.dim %x axis 0 : tensor<?x4xf32>
  %c4 = arith.constant 4 : index
  %s = arith.addi %n, %c4 : index
  %p = arith.muli %s, %c4 : index
  return %p : index
}
