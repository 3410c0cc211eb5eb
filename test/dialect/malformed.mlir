// Malformed input: a diagnostic with file:line:col and a non-zero exit, no crash.
// RUN: not dloss-opt %s --split-input-file 2>&1 | FileCheck %s

func.func @misspelled_keyword(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  // CHECK: malformed.mlir:[[@LINE+1]]:28: error: custom op 'dloss.all_gather' expected 'axis'
  %0 = dloss.all_gather %x along 0 : tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// -----

func.func @unknown_op(%x: tensor<?x8xf32>) {
  // CHECK: malformed.mlir:[[@LINE+1]]:8: error: custom op 'dloss.all_gathr' is unknown
  %0 = dloss.all_gathr %x axis 0 : tensor<?x8xf32>
  return
}

// -----

func.func @operand_type_mismatch(%x: tensor<?x8xf32>) {
  // CHECK: malformed.mlir:[[@LINE+1]]:25: error: use of value '%x' expects different type than prior uses: 'tensor<?x4xf32>' vs 'tensor<?x8xf32>'
  %0 = dloss.all_gather %x axis 0 : tensor<?x4xf32>
  return
}

// -----

// The input ends in the middle of an op.
// CHECK: malformed.mlir:{{[0-9]+}}:{{[0-9]+}}: error: expected non-function type
func.func @truncated(%x: tensor<?x8xf32>) {
  %0 = dloss.all_reduce sum %x :
