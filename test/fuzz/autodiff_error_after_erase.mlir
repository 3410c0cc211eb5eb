// RUN: not dloss-opt %s --split-input-file --dloss-autodiff 2>&1 | FileCheck %s
// RUN: not dloss-opt %s --split-input-file --dloss-derive-backward 2>&1 | FileCheck %s
// Found by dloss-fuzz: dloss-autodiff erased @<loss>_grad, and with it the op
// it was about to report, before emitting the error on that op (a use after
// free that crashed dloss-opt and dlossc instead of printing the diagnostic).
// Not -verify-diagnostics: the crash was in printing the op into the error,
// which that mode turns off.

// An op without an adjoint rule (minimized crash input).
func.func @u(%x: tensor<4xf32> {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  // CHECK: [[# @LINE + 1]]:8: error: 'tensor.cast' op has no adjoint rule, so the gradient cannot flow through it; express this step with dloss ops
  %c = tensor.cast %x : tensor<4xf32> to tensor<?xf32>
  %s = dloss.reduce sum %c axes [0] : tensor<?xf32>
  return %s : tensor<f32>
}

// -----

// A recursive loss: the inliner leaves the call, which has no adjoint rule.
func.func @loss(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  // CHECK: [[# @LINE + 1]]:8: error: 'func.call' op has no adjoint rule, so the gradient cannot flow through it; express this step with dloss ops
  %0 = call @loss(%x) : (tensor<?xf32>) -> tensor<f32>
  %t = dloss.all_reduce sum %0 : tensor<f32>
  return %t : tensor<f32>
}

// -----

// A region op on the gradient path (the other early return).
func.func @through_if(%x: tensor<f32> {dloss.grad, dloss.replicated}, %flag: i1 {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  // CHECK: [[# @LINE + 1]]:8: error: 'scf.if' op is on the path from the inputs to the loss, and dloss-autodiff does not differentiate through region ops yet; compute this part without control flow
  %y = scf.if %flag -> tensor<f32> {
    %e = dloss.exp %x : tensor<f32>
    scf.yield %e : tensor<f32>
  } else {
    scf.yield %x : tensor<f32>
  }
  return %y : tensor<f32>
}
