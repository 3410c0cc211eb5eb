// RUN: dloss-opt %s | dloss-opt | FileCheck %s
// RUN: dloss-opt %s --mlir-print-op-generic | dloss-opt | FileCheck %s

// CHECK-LABEL: func.func @matmul
func.func @matmul(%a: tensor<?x256xf32>, %b: tensor<?x256xf32>, %c: tensor<256x10xf32>, %d: tensor<4x?xf32>)
    -> (tensor<?x?xf32>, tensor<?x10xf32>, tensor<256x256xf32>, tensor<?x?xf32>) {
  // CHECK: dloss.matmul %{{.*}}, %{{.*}} transpose_rhs : tensor<?x256xf32>, tensor<?x256xf32>
  %0 = dloss.matmul %a, %b transpose_rhs : tensor<?x256xf32>, tensor<?x256xf32>
  // CHECK: dloss.matmul %{{.*}}, %{{.*}} : tensor<?x256xf32>, tensor<256x10xf32>
  %1 = dloss.matmul %a, %c : tensor<?x256xf32>, tensor<256x10xf32>
  // CHECK: dloss.matmul %{{.*}}, %{{.*}} transpose_lhs : tensor<?x256xf32>, tensor<?x256xf32>
  %2 = dloss.matmul %a, %b transpose_lhs : tensor<?x256xf32>, tensor<?x256xf32>
  // CHECK: dloss.matmul %{{.*}}, %{{.*}} transpose_lhs transpose_rhs : tensor<4x?xf32>, tensor<?x4xf32>
  %e = dloss.cast %d : tensor<4x?xf32> to tensor<?x4xf32>
  %3 = dloss.matmul %d, %e transpose_lhs transpose_rhs : tensor<4x?xf32>, tensor<?x4xf32>
  return %0, %1, %2, %3 : tensor<?x?xf32>, tensor<?x10xf32>, tensor<256x256xf32>, tensor<?x?xf32>
}

// CHECK-LABEL: func.func @binary
func.func @binary(%x: tensor<?x4xf32>, %y: tensor<8x?xf32>, %s: tensor<f32>, %i: tensor<?xi64>)
    -> (tensor<8x4xf32>, tensor<?x4xf32>, tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xi64>) {
  // Static sizes of either operand are kept.
  // CHECK: dloss.add %{{.*}}, %{{.*}} : tensor<?x4xf32>, tensor<8x?xf32>
  %0 = dloss.add %x, %y : tensor<?x4xf32>, tensor<8x?xf32>
  // A 0-d operand broadcasts, on either side.
  // CHECK: dloss.sub %{{.*}}, %{{.*}} : tensor<f32>, tensor<?x4xf32>
  %1 = dloss.sub %s, %x : tensor<f32>, tensor<?x4xf32>
  // CHECK: dloss.mul %{{.*}}, %{{.*}} : tensor<?x4xf32>, tensor<f32>
  %2 = dloss.mul %x, %s : tensor<?x4xf32>, tensor<f32>
  // CHECK: dloss.div %{{.*}}, %{{.*}} : tensor<?x4xf32>, tensor<f32>
  %3 = dloss.div %x, %s : tensor<?x4xf32>, tensor<f32>
  // Integer tensors add (labels plus an offset).
  // CHECK: dloss.add %{{.*}}, %{{.*}} : tensor<?xi64>, tensor<?xi64>
  %4 = dloss.add %i, %i : tensor<?xi64>, tensor<?xi64>
  return %0, %1, %2, %3, %4 : tensor<8x4xf32>, tensor<?x4xf32>, tensor<?x4xf32>, tensor<?x4xf32>, tensor<?xi64>
}

// CHECK-LABEL: func.func @eq
func.func @eq(%x: tensor<?x4xf32>, %m: tensor<f32>, %i: tensor<?xi64>) -> (tensor<?x4xf32>, tensor<?xi64>) {
  // An indicator in the operands' element type.
  // CHECK: dloss.eq %{{.*}}, %{{.*}} : tensor<?x4xf32>, tensor<f32>
  %0 = dloss.eq %x, %m : tensor<?x4xf32>, tensor<f32>
  // CHECK: dloss.eq %{{.*}}, %{{.*}} : tensor<?xi64>, tensor<?xi64>
  %1 = dloss.eq %i, %i : tensor<?xi64>, tensor<?xi64>
  return %0, %1 : tensor<?x4xf32>, tensor<?xi64>
}

// CHECK-LABEL: func.func @select
func.func @select(%c: tensor<?x4xi64>, %x: tensor<?x4xf32>, %s: tensor<f32>)
    -> (tensor<?x4xf32>, tensor<?x4xf32>) {
  // CHECK: dloss.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x4xi64>, tensor<?x4xf32>, tensor<?x4xf32>
  %0 = dloss.select %c, %x, %x : tensor<?x4xi64>, tensor<?x4xf32>, tensor<?x4xf32>
  // Either value may be 0-d (an infinity that masks).
  // CHECK: dloss.select %{{.*}}, %{{.*}}, %{{.*}} : tensor<?x4xi64>, tensor<f32>, tensor<?x4xf32>
  %1 = dloss.select %c, %s, %x : tensor<?x4xi64>, tensor<f32>, tensor<?x4xf32>
  return %0, %1 : tensor<?x4xf32>, tensor<?x4xf32>
}

// CHECK-LABEL: func.func @unary
func.func @unary(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  // CHECK: dloss.neg
  %0 = dloss.neg %x : tensor<?x4xf32>
  // CHECK: dloss.exp
  %1 = dloss.exp %0 : tensor<?x4xf32>
  // CHECK: dloss.log
  %2 = dloss.log %1 : tensor<?x4xf32>
  // CHECK: dloss.softplus
  %3 = dloss.softplus %2 : tensor<?x4xf32>
  // CHECK: dloss.log_sigmoid
  %4 = dloss.log_sigmoid %3 : tensor<?x4xf32>
  // CHECK: dloss.cos
  %5 = dloss.cos %4 : tensor<?x4xf32>
  // CHECK: dloss.clamp %{{.*}} min -1.000000e+00 max 1.000000e+00 : tensor<?x4xf32>
  %6 = dloss.clamp %5 min -1.0 max 1.0 : tensor<?x4xf32>
  // CHECK: dloss.acos
  %7 = dloss.acos %6 : tensor<?x4xf32>
  // CHECK: dloss.clamp %{{.*}} min 0.000000e+00 : tensor<?x4xf32>
  %8 = dloss.clamp %7 min 0.0 : tensor<?x4xf32>
  // CHECK: dloss.clamp %{{.*}} max 3.000000e+00 : tensor<?x4xf32>
  %9 = dloss.clamp %8 max 3.0 : tensor<?x4xf32>
  // CHECK: dloss.sin
  %10 = dloss.sin %9 : tensor<?x4xf32>
  // CHECK: dloss.sqrt
  %11 = dloss.sqrt %10 : tensor<?x4xf32>
  // CHECK: dloss.sigmoid
  %12 = dloss.sigmoid %11 : tensor<?x4xf32>
  // CHECK: dloss.stop_gradient %{{.*}} : tensor<?x4xf32>
  %13 = dloss.stop_gradient %12 : tensor<?x4xf32>
  return %13 : tensor<?x4xf32>
}

// CHECK-LABEL: func.func @cast
func.func @cast(%x: tensor<?x4xf32>, %i: tensor<?xi64>, %n: index)
    -> (tensor<?x4xbf16>, tensor<?xf32>, tensor<f32>, tensor<i64>, tensor<2x4xf32>) {
  // CHECK: dloss.cast %{{.*}} : tensor<?x4xf32> to tensor<?x4xbf16>
  %0 = dloss.cast %x : tensor<?x4xf32> to tensor<?x4xbf16>
  // CHECK: dloss.cast %{{.*}} : tensor<?xi64> to tensor<?xf32>
  %1 = dloss.cast %i : tensor<?xi64> to tensor<?xf32>
  // CHECK: dloss.cast %{{.*}} : index to tensor<f32>
  %2 = dloss.cast %n : index to tensor<f32>
  // CHECK: dloss.cast %{{.*}} : index to tensor<i64>
  %3 = dloss.cast %n : index to tensor<i64>
  // A cast may refine a dynamic size.
  // CHECK: dloss.cast %{{.*}} : tensor<?x4xf32> to tensor<2x4xf32>
  %4 = dloss.cast %x : tensor<?x4xf32> to tensor<2x4xf32>
  return %0, %1, %2, %3, %4 : tensor<?x4xbf16>, tensor<?xf32>, tensor<f32>, tensor<i64>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @l2_normalize
func.func @l2_normalize(%x: tensor<?x256xf16>) -> (tensor<?x256xf16>, tensor<?x256xf16>) {
  // The default eps is not printed.
  // CHECK: dloss.l2_normalize %{{.*}} axis 1 : tensor<?x256xf16>
  %0 = dloss.l2_normalize %x axis 1 : tensor<?x256xf16>
  // CHECK: dloss.l2_normalize %{{.*}} axis 0 eps 9.9999999999999995E-7 : tensor<?x256xf16>
  %1 = dloss.l2_normalize %x axis 0 eps 1.0e-6 : tensor<?x256xf16>
  return %0, %1 : tensor<?x256xf16>, tensor<?x256xf16>
}

// CHECK-LABEL: func.func @l2_normalize_grad
func.func @l2_normalize_grad(%g: tensor<?x256xf32>, %x: tensor<?x256xf32>) -> (tensor<?x256xf32>, tensor<?x256xf32>) {
  // CHECK: dloss.l2_normalize_grad %{{.*}}, %{{.*}} axis 1 : tensor<?x256xf32>
  %0 = dloss.l2_normalize_grad %g, %x axis 1 : tensor<?x256xf32>
  // CHECK: dloss.l2_normalize_grad %{{.*}}, %{{.*}} axis 0 eps 5.000000e-01 : tensor<?x256xf32>
  %1 = "dloss.l2_normalize_grad"(%g, %x) {axis = 0 : i64, eps = 0.5 : f64} : (tensor<?x256xf32>, tensor<?x256xf32>) -> tensor<?x256xf32>
  return %0, %1 : tensor<?x256xf32>, tensor<?x256xf32>
}
