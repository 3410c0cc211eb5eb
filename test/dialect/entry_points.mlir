// RUN: dloss-opt %s | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @ddp_default
// CHECK-SAME: %{{.*}}: tensor<?x?xf32> {dloss.grad}
// CHECK-SAME: %{{.*}}: tensor<f32> {dloss.grad, dloss.replicated}
// CHECK-SAME: %{{.*}}: tensor<?xi64>
// CHECK-SAME: attributes {dloss.loss}
func.func @ddp_default(%x: tensor<?x?xf32> {dloss.grad}, %scale: tensor<f32> {dloss.grad, dloss.replicated},
                       %labels: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0, 1] : tensor<?x?xf32>
  %t = dloss.mul %s, %scale : tensor<f32>, tensor<f32>
  %l = dloss.all_reduce sum %t : tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @global_mode
// CHECK-SAME: attributes {dloss.grad_mode = "global", dloss.loss}
func.func @global_mode(%w: tensor<100x8xf32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss, dloss.grad_mode = "global"} {
  %s = dloss.reduce sum %w axes [0, 1] : tensor<100x8xf32>
  return %s : tensor<f32>
}

// A replicated argument need not be differentiated, and a plain helper
// function may sit beside the losses.
// CHECK-LABEL: func.func @helper
// CHECK-SAME: {dloss.replicated}
func.func @helper(%w: tensor<4xf32> {dloss.replicated}) -> tensor<4xf32> {
  return %w : tensor<4xf32>
}
