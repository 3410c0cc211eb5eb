// RUN: dloss-opt %s --split-input-file --dloss-autodiff --verify-diagnostics | FileCheck %s
// One case per adjoint rule: the ops each rule emits.

// CLIP: each gathered input's gradient comes back through one reduce_scatter
// that keeps this rank's own rows; the replicated scale gets N times its
// per-rank share (ddp), so that DDP's average is the global-batch gradient.
// CHECK-LABEL: func.func @clip_grad
// CHECK-SAME: %[[IMG:[^:]*]]: tensor<?x?xf32>, %[[TXT:[^:]*]]: tensor<?x?xf32>, %[[S:[^:]*]]: tensor<f32> {dloss.replicated}
// CHECK-SAME: -> (tensor<f32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<f32>)
// CHECK: %[[NT:.*]] = dloss.dim %[[TXT]] axis 0
// CHECK-NEXT: dloss.reduce_scatter sum %{{.*}} axis 0 size %[[NT]]
// CHECK: %[[NI:.*]] = dloss.dim %[[IMG]] axis 0
// CHECK-NEXT: dloss.reduce_scatter sum %{{.*}} axis 0 size %[[NI]]
// CHECK-NOT: dloss.all_reduce
// CHECK: dloss.world_size
// CHECK: %[[GS:.*]] = dloss.mul %{{.*}}, %{{.*}} : tensor<f32>, tensor<f32>
// CHECK-NEXT: return %{{.*}}, %{{.*}}, %{{.*}}, %[[GS]]
func.func @clip(%image: tensor<?x?xf32> {dloss.grad}, %text: tensor<?x?xf32> {dloss.grad},
                %scale: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %image_all = dloss.all_gather %image axis 0 : tensor<?x?xf32>
  %text_all = dloss.all_gather %text axis 0 : tensor<?x?xf32>
  %offset = dloss.shard_offset %image axis 0 : tensor<?x?xf32>
  %rows = dloss.dim %image axis 0 : tensor<?x?xf32>
  %labels = dloss.arange %offset, %rows : tensor<?xi64>
  %sim_i = dloss.matmul %image, %text_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_i = dloss.mul %sim_i, %scale : tensor<?x?xf32>, tensor<f32>
  %sim_t = dloss.matmul %text, %image_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits_t = dloss.mul %sim_t, %scale : tensor<?x?xf32>, tensor<f32>
  %ce_i = dloss.cross_entropy %logits_i, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %ce_t = dloss.cross_entropy %logits_t, %labels axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sum_i = dloss.reduce sum %ce_i axes [0] : tensor<?xf32>
  %sum_t = dloss.reduce sum %ce_t axes [0] : tensor<?xf32>
  %local = dloss.add %sum_i, %sum_t : tensor<f32>, tensor<f32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  return %total : tensor<f32>
}

// -----

// The same loss in global mode: varying inputs get dF/dx_r (no N), and the
// scale's partial gradients are all-reduced into the full dF/dscale.
// CHECK-LABEL: func.func @clip_global_grad
// CHECK: dloss.reduce_scatter sum
// CHECK: %[[FULL:.*]] = dloss.all_reduce sum %{{.*}} : tensor<f32>
// CHECK-NOT: dloss.world_size
// CHECK: return %{{.*}}, %{{.*}}, %[[FULL]]
func.func @clip_global(%image: tensor<?x?xf32> {dloss.grad}, %scale: tensor<f32> {dloss.grad, dloss.replicated})
    -> tensor<f32> attributes {dloss.loss, dloss.grad_mode = "global"} {
  %image_all = dloss.all_gather %image axis 0 : tensor<?x?xf32>
  %sim = dloss.matmul %image, %image_all transpose_rhs : tensor<?x?xf32>, tensor<?x?xf32>
  %logits = dloss.mul %sim, %scale : tensor<?x?xf32>, tensor<f32>
  %lse = dloss.logsumexp %logits axis 1 : tensor<?x?xf32>
  %local = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  return %total : tensor<f32>
}

// -----

// An all_gather whose result reaches the loss only through computation that
// every rank repeats has the whole cotangent on every rank: each rank takes
// its own block, without communication.
// CHECK-LABEL: func.func @gather_reduced_cotangent_grad
// CHECK-SAME: (%[[X:.*]]: tensor<?x4xf32>)
// CHECK: %[[OFF:.*]] = dloss.shard_offset %[[X]] axis 0
// CHECK: %[[N:.*]] = dloss.dim %[[X]] axis 0
// CHECK: dloss.slice %{{.*}} axis 0 offset %[[OFF]] size %[[N]]
// CHECK-NOT: dloss.reduce_scatter
// CHECK: return
func.func @gather_reduced_cotangent(%x: tensor<?x4xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %all = dloss.all_gather %x axis 0 : tensor<?x4xf32>
  %sq = dloss.mul %all, %all : tensor<?x4xf32>, tensor<?x4xf32>
  %s = dloss.reduce sum %sq axes [0, 1] : tensor<?x4xf32>
  return %s : tensor<f32>
}

// -----

// grad local keeps only this rank's own slot of its cotangent, and warns.
// CHECK-LABEL: func.func @gather_local_grad
// CHECK: dloss.shard_offset
// CHECK: dloss.slice
// CHECK-NOT: dloss.reduce_scatter
// CHECK: return
func.func @gather_local(%x: tensor<?x4xf32> {dloss.grad}, %y: tensor<?x4xf32>) -> tensor<f32> attributes {dloss.loss} {
  // expected-warning@+1 {{grad local: only this rank's own slot of the gathered cotangent flows back (the TorchMetrics/OpenCLIP behaviour), so the gradient differs from single-device training on the global batch; use grad exact (the default) to match it}}
  %all = dloss.all_gather %x axis 0 grad local : tensor<?x4xf32>
  %sim = dloss.matmul %y, %all transpose_rhs : tensor<?x4xf32>, tensor<?x4xf32>
  %s = dloss.reduce sum %sim axes [0, 1] : tensor<?x?xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// grad none stops the gradient, and warns; the unreached argument gets zeros.
// CHECK-LABEL: func.func @gather_none_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x4xf32>
// CHECK-NOT: dloss.reduce_scatter
// CHECK: %[[Z:.*]] = dloss.zeros_like %[[X]]
// CHECK: return %{{.*}}, %[[Z]]
func.func @gather_none(%x: tensor<?x4xf32> {dloss.grad}, %y: tensor<?x4xf32>) -> tensor<f32> attributes {dloss.loss} {
  // expected-warning@+1 {{grad none: no gradient flows back through this all_gather}}
  %all = dloss.all_gather %x axis 0 grad none : tensor<?x4xf32>
  %sim = dloss.matmul %y, %all transpose_rhs : tensor<?x4xf32>, tensor<?x4xf32>
  %s = dloss.reduce sum %sim axes [0, 1] : tensor<?x?xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// stop_gradient passes its value and no cotangent: %w's gradient comes only
// from its direct use (no second term to add), and %x's, used only through
// stop_gradient, is zeros.
// CHECK-LABEL: func.func @stop_gradient_grad
// CHECK-SAME: (%[[W:[^:]*]]: tensor<?x4xf32>, %[[X:[^:]*]]: tensor<?x4xf32>)
// CHECK-NOT: dloss.add
// CHECK: %[[Z:.*]] = dloss.zeros_like %[[X]]
// CHECK-NOT: dloss.add
// CHECK: return %{{.*}}, %{{.*}}, %[[Z]]
func.func @stop_gradient(%w: tensor<?x4xf32> {dloss.grad}, %x: tensor<?x4xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %held = dloss.stop_gradient %w : tensor<?x4xf32>
  %e = dloss.exp %held : tensor<?x4xf32>
  %sx = dloss.stop_gradient %x : tensor<?x4xf32>
  %ex = dloss.mul %e, %sx : tensor<?x4xf32>, tensor<?x4xf32>
  %p = dloss.mul %ex, %w : tensor<?x4xf32>, tensor<?x4xf32>
  %s = dloss.reduce sum %p axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// all_reduce: sum passes the cotangent as is, mean divides by N, max routes
// it to the ranks holding the maximum (ties share).
// CHECK-LABEL: func.func @all_reduce_kinds_grad
// CHECK: %[[HIT:.*]] = dloss.eq %[[X:.*]], %[[MAX:.*]] : tensor<f32>, tensor<f32>
// CHECK: %[[HITS:.*]] = dloss.all_reduce sum %[[HIT]]
// CHECK: dloss.div %{{.*}}, %[[HITS]]
// CHECK: dloss.world_size
// CHECK: dloss.div
// CHECK: return
func.func @all_reduce_kinds(%x: tensor<f32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss, dloss.grad_mode = "global"} {
  %s = dloss.all_reduce sum %x : tensor<f32>
  %m = dloss.all_reduce mean %x : tensor<f32>
  %mx = dloss.all_reduce max %x : tensor<f32>
  %a = dloss.add %s, %m : tensor<f32>, tensor<f32>
  %b = dloss.add %a, %mx : tensor<f32>, tensor<f32>
  return %b : tensor<f32>
}

// -----

// reduce_scatter's adjoint is an all_gather (divided by N for mean).
// CHECK-LABEL: func.func @reduce_scatter_grad
// CHECK: %[[MEAN:.*]] = dloss.all_gather %{{.*}} axis 0 : tensor<?x4xf32>
// CHECK: dloss.world_size
// CHECK: dloss.div %[[MEAN]]
// CHECK: dloss.all_gather %{{.*}} axis 0 : tensor<?x4xf32>
// CHECK: return
func.func @reduce_scatter(%x: tensor<?x4xf32> {dloss.grad}, %n: index) -> tensor<f32> attributes {dloss.loss} {
  %a = dloss.reduce_scatter sum %x axis 0 size %n : tensor<?x4xf32>
  %b = dloss.reduce_scatter mean %x axis 0 size %n : tensor<?x4xf32>
  %c = dloss.add %a, %b : tensor<?x4xf32>, tensor<?x4xf32>
  %s = dloss.reduce sum %c axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// broadcast: the whole cotangent goes to the root, zero elsewhere.
// CHECK-LABEL: func.func @broadcast_grad
// CHECK: %[[R:.*]] = dloss.rank
// CHECK: %[[RF:.*]] = dloss.cast %[[R]] : index to tensor<f32>
// CHECK: %[[ROOT:.*]] = arith.constant dense<2.000000e+00> : tensor<f32>
// CHECK: %[[IS:.*]] = dloss.eq %[[RF]], %[[ROOT]]
// CHECK: dloss.mul %{{.*}}, %[[IS]]
func.func @broadcast(%x: tensor<4xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %b = dloss.broadcast %x root 2 : tensor<4xf32>
  %s = dloss.reduce sum %b axes [0] : tensor<4xf32>
  return %s : tensor<f32>
}

// -----

// ring_shift by k is undone by a ring_shift by -k.
// CHECK-LABEL: func.func @ring_shift_grad
// CHECK: dloss.ring_shift %{{.*}} by -3 : tensor<?x4xf32>
func.func @ring_shift(%x: tensor<?x4xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %y = dloss.ring_shift %x by 3 : tensor<?x4xf32>
  %s = dloss.reduce sum %y axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// matmul, in its four transpose forms.
// CHECK-LABEL: func.func @matmul_grad
// CHECK-SAME: (%[[A:[^:]*]]: tensor<3x4xf32>, %[[B:[^:]*]]: tensor<4x5xf32>, %[[C:[^:]*]]: tensor<5x4xf32>, %[[D:[^:]*]]: tensor<4x3xf32>)
// tt: y = d^T c^T: dd = c^T g^T, dc = g^T d^T
// CHECK-DAG: dloss.matmul %[[C]], %{{.*}} transpose_lhs transpose_rhs : tensor<5x4xf32>, tensor<3x5xf32>
// CHECK-DAG: dloss.matmul %{{.*}}, %[[D]] transpose_lhs transpose_rhs : tensor<3x5xf32>, tensor<4x3xf32>
// tn: y = d^T b: dd = b g^T, db = d g
// CHECK-DAG: dloss.matmul %[[B]], %{{.*}} transpose_rhs : tensor<4x5xf32>, tensor<3x5xf32>
// CHECK-DAG: dloss.matmul %[[D]], %{{.*}} : tensor<4x3xf32>, tensor<3x5xf32>
// nt: y = a c^T: da = g c, dc = g^T a
// CHECK-DAG: dloss.matmul %{{.*}}, %[[C]] : tensor<3x5xf32>, tensor<5x4xf32>
// CHECK-DAG: dloss.matmul %{{.*}}, %[[A]] transpose_lhs : tensor<3x5xf32>, tensor<3x4xf32>
// nn: y = a b: da = g b^T, db = a^T g
// CHECK-DAG: dloss.matmul %{{.*}}, %[[B]] transpose_rhs : tensor<3x5xf32>, tensor<4x5xf32>
// CHECK-DAG: dloss.matmul %[[A]], %{{.*}} transpose_lhs : tensor<3x4xf32>, tensor<3x5xf32>
func.func @matmul(%a: tensor<3x4xf32> {dloss.grad}, %b: tensor<4x5xf32> {dloss.grad},
                  %c: tensor<5x4xf32> {dloss.grad}, %d: tensor<4x3xf32> {dloss.grad})
    -> tensor<f32> attributes {dloss.loss, dloss.grad_mode = "global"} {
  %nn = dloss.matmul %a, %b : tensor<3x4xf32>, tensor<4x5xf32>
  %nt = dloss.matmul %a, %c transpose_rhs : tensor<3x4xf32>, tensor<5x4xf32>
  %tn = dloss.matmul %d, %b transpose_lhs : tensor<4x3xf32>, tensor<4x5xf32>
  %tt = dloss.matmul %d, %c transpose_lhs transpose_rhs : tensor<4x3xf32>, tensor<5x4xf32>
  %s1 = dloss.add %nn, %nt : tensor<3x5xf32>, tensor<3x5xf32>
  %s2 = dloss.add %tn, %tt : tensor<3x5xf32>, tensor<3x5xf32>
  %s3 = dloss.add %s1, %s2 : tensor<3x5xf32>, tensor<3x5xf32>
  %s = dloss.reduce sum %s3 axes [0, 1] : tensor<3x5xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// Element-wise binary ops; a 0-d operand's cotangent is summed back to 0-d.
// CHECK-LABEL: func.func @binary_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x4xf32>, %[[S:[^:]*]]: tensor<f32>)
// div: d/dx = g / s, d/ds = -(g / s) * y
// CHECK: arith.constant dense<1.000000e+00>
// CHECK: %[[GS:.*]] = dloss.div %{{.*}}, %[[S]] : tensor<?x4xf32>, tensor<f32>
// CHECK: %[[T:.*]] = dloss.mul %[[GS]], %{{.*}} : tensor<?x4xf32>, tensor<?x4xf32>
// CHECK: %[[NT:.*]] = dloss.neg %[[T]]
// CHECK: dloss.reduce sum %[[NT]] axes [0, 1]
// mul by the scalar, sub and add
// CHECK: dloss.mul
// CHECK: dloss.neg
// CHECK: return
func.func @binary(%x: tensor<?x4xf32> {dloss.grad}, %s: tensor<f32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %a = dloss.add %x, %x : tensor<?x4xf32>, tensor<?x4xf32>
  %b = dloss.sub %a, %s : tensor<?x4xf32>, tensor<f32>
  %c = dloss.mul %b, %s : tensor<?x4xf32>, tensor<f32>
  %d = dloss.div %c, %s : tensor<?x4xf32>, tensor<f32>
  %r = dloss.reduce sum %d axes [0, 1] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %r : tensor<f32>
  return %t : tensor<f32>
}

// -----

// Element-wise unary ops: each rule's derivative.
// CHECK-LABEL: func.func @unary_grad
// sqrt: g * 0.5 / y
// CHECK: arith.constant dense<5.000000e-01>
// acos: -g / sqrt(1 - x*x)
// CHECK: dloss.sqrt
// CHECK: dloss.neg
// clamp: g * (y == x)
// CHECK: dloss.eq
// sin: g * cos(x)
// CHECK: dloss.cos
// cos: -g * sin(x)
// CHECK: dloss.sin
// CHECK: dloss.neg
// sigmoid: g * y * (1 - y)
// CHECK: dloss.sub
// log_sigmoid: g * sigmoid(-x)
// CHECK: dloss.neg
// CHECK: dloss.sigmoid
// softplus: g * sigmoid(x)
// CHECK: dloss.sigmoid
// log: g / x
// CHECK: dloss.div
// exp: g * y
// CHECK: dloss.mul
// neg: -g
// CHECK: dloss.neg
// CHECK: return
func.func @unary(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %0 = dloss.neg %x : tensor<?xf32>
  %1 = dloss.exp %0 : tensor<?xf32>
  %2 = dloss.log %1 : tensor<?xf32>
  %3 = dloss.softplus %2 : tensor<?xf32>
  %4 = dloss.log_sigmoid %3 : tensor<?xf32>
  %5 = dloss.sigmoid %4 : tensor<?xf32>
  %6 = dloss.cos %5 : tensor<?xf32>
  %7 = dloss.sin %6 : tensor<?xf32>
  %8 = dloss.clamp %7 min -0.5 max 0.5 : tensor<?xf32>
  %9 = dloss.acos %8 : tensor<?xf32>
  %10 = dloss.sqrt %9 : tensor<?xf32>
  %s = dloss.reduce sum %10 axes [0] : tensor<?xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// cast: float to float casts the cotangent back; integer paths carry nothing.
// CHECK-LABEL: func.func @cast_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?xf32>
// CHECK: dloss.cast %{{.*}} : tensor<?xbf16> to tensor<?xf32>
func.func @cast(%x: tensor<?xf32> {dloss.grad}) -> tensor<bf16> attributes {dloss.loss} {
  %h = dloss.cast %x : tensor<?xf32> to tensor<?xbf16>
  %s = dloss.reduce sum %h axes [0] : tensor<?xbf16>
  %t = dloss.all_reduce sum %s : tensor<bf16>
  return %t : tensor<bf16>
}

// -----

// l2_normalize: its own gradient op, so the backward makes no temporary of
// the input's size; the eps branch is the op's (docs/DlossDialect.md).
// CHECK-LABEL: func.func @l2_normalize_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x8xf32>)
// CHECK: %[[Y:.*]] = dloss.l2_normalize %[[X]] axis 1 : tensor<?x8xf32>
// CHECK: dloss.l2_normalize_grad %{{.*}}, %[[X]] axis 1 : tensor<?x8xf32>
// CHECK-NOT: dloss.sqrt
func.func @l2_normalize(%x: tensor<?x8xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %y = dloss.l2_normalize %x axis 1 : tensor<?x8xf32>
  %w = dloss.mul %y, %y : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %w axes [0, 1] : tensor<?x8xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// l2_normalize_grad (a second derivative): the cotangent of its gradient
// operand is the same op on the cotangent; its input's is masked by |x| >= eps.
// CHECK-LABEL: func.func @second_derivative_grad
// CHECK-SAME: (%[[G:[^:]*]]: tensor<?x8xf32>, %[[X:[^:]*]]: tensor<?x8xf32>)
// CHECK: %[[DX:.*]] = dloss.l2_normalize_grad %[[G]], %[[X]] axis 1 eps 5.000000e-01
// CHECK: dloss.l2_normalize_grad %[[CT:.*]], %[[X]] axis 1 eps 5.000000e-01
// CHECK: %[[NORM:.*]] = dloss.sqrt
// CHECK: %[[N:.*]] = dloss.clamp %[[NORM]] min 5.000000e-01
// CHECK: dloss.eq %[[N]], %[[NORM]]
func.func @second_derivative(%g: tensor<?x8xf32> {dloss.grad},
                             %x: tensor<?x8xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %dx = dloss.l2_normalize_grad %g, %x axis 1 eps 0.5 : tensor<?x8xf32>
  %w = dloss.mul %dx, %dx : tensor<?x8xf32>, tensor<?x8xf32>
  %s = dloss.reduce sum %w axes [0, 1] : tensor<?x8xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// reduce: sum expands, mean divides by the reduced count, max routes to the
// maxima (ties share).
// CHECK-LABEL: func.func @reductions_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x8xf32>
// max:
// CHECK: %[[HIT:.*]] = dloss.eq %[[X]], %{{.*}} : tensor<?x8xf32>, tensor<?x8xf32>
// CHECK: dloss.reduce sum %[[HIT]] axes [1]
// mean over axes [0, 1]: count = dim 0 * dim 1
// CHECK: %[[D0:.*]] = dloss.dim %[[X]] axis 0
// CHECK: %[[D1:.*]] = dloss.dim %[[X]] axis 1
// CHECK: %[[COUNT:.*]] = arith.muli %[[D0]], %[[D1]]
// CHECK: dloss.cast %[[COUNT]] : index to tensor<f32>
// sum:
// CHECK: dloss.expand %{{.*}} axes [0] like %[[X]]
func.func @reductions(%x: tensor<?x8xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0] : tensor<?x8xf32>
  %m = dloss.reduce mean %x axes [0, 1] : tensor<?x8xf32>
  %mx = dloss.reduce max %x axes [1] : tensor<?x8xf32>
  %ss = dloss.reduce sum %s axes [0] : tensor<8xf32>
  %sm = dloss.reduce sum %mx axes [0] : tensor<?xf32>
  %a = dloss.add %ss, %m : tensor<f32>, tensor<f32>
  %b = dloss.add %a, %sm : tensor<f32>, tensor<f32>
  %t = dloss.all_reduce sum %b : tensor<f32>
  return %t : tensor<f32>
}

// -----

// logsumexp: g * softmax(x).
// CHECK-LABEL: func.func @logsumexp_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x?xf32>
// CHECK: %[[LSE:.*]] = dloss.logsumexp %[[X]] axis 1
// CHECK: %[[E:.*]] = dloss.expand %[[LSE]] axes [1] like %[[X]]
// CHECK: %[[D:.*]] = dloss.sub %[[X]], %[[E]]
// CHECK: %[[P:.*]] = dloss.exp %[[D]]
// CHECK: dloss.mul %{{.*}}, %[[P]]
func.func @logsumexp(%x: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %l = dloss.logsumexp %x axis 1 : tensor<?x?xf32>
  %s = dloss.reduce sum %l axes [0] : tensor<?xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// cross_entropy: g * (softmax - onehot(targets)); the one-hot is subtracted at
// the targets with take_along / put_along.
// CHECK-LABEL: func.func @cross_entropy_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x?xf32>, %[[T:[^:]*]]: tensor<?xi64>)
// CHECK: %[[LSE:.*]] = dloss.logsumexp %[[X]] axis 1
// CHECK: %[[DX:.*]] = dloss.mul
// CHECK: %[[AT:.*]] = dloss.take_along %[[DX]], %[[T]] axis 1
// CHECK: %[[MINUS:.*]] = dloss.sub %[[AT]], %{{.*}}
// CHECK: dloss.put_along %[[DX]], %[[T]], %[[MINUS]] axis 1
func.func @cross_entropy(%x: tensor<?x?xf32> {dloss.grad}, %t: tensor<?xi64>) -> tensor<f32> attributes {dloss.loss} {
  %l = dloss.cross_entropy %x, %t axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %s = dloss.reduce sum %l axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %s : tensor<f32>
  return %total : tensor<f32>
}

// -----

// take_along scatters into zeros; put_along zeroes the replaced entries for
// the input and gathers them for the values.
// CHECK-LABEL: func.func @indexing_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x?xf32>, %[[V:[^:]*]]: tensor<?xf32>, %[[I:[^:]*]]: tensor<?xi64>)
// CHECK-DAG: %[[ZV:.*]] = dloss.zeros_like %[[V]]
// CHECK-DAG: dloss.put_along %{{.*}}, %[[I]], %[[ZV]] axis 1
// CHECK-DAG: dloss.take_along %{{.*}}, %[[I]] axis 1
// CHECK-DAG: %[[ZX:.*]] = dloss.zeros_like %{{.*}} : tensor<?x?xf32>
// CHECK-DAG: dloss.put_along %[[ZX]], %[[I]], %{{.*}} axis 1
func.func @indexing(%x: tensor<?x?xf32> {dloss.grad}, %v: tensor<?xf32> {dloss.grad}, %i: tensor<?xi64>)
    -> tensor<f32> attributes {dloss.loss} {
  %p = dloss.put_along %x, %i, %v axis 1 : tensor<?x?xf32>, tensor<?xi64>, tensor<?xf32>
  %t = dloss.take_along %p, %i axis 1 : tensor<?x?xf32>, tensor<?xi64>
  %sq = dloss.mul %t, %t : tensor<?xf32>, tensor<?xf32>
  %s = dloss.reduce sum %sq axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %s : tensor<f32>
  return %total : tensor<f32>
}

// -----

// slice pads its cotangent back; pad slices it; expand sums it.
// CHECK-LABEL: func.func @shapes_grad
// CHECK-SAME: (%[[X:[^:]*]]: tensor<?x4xf32>, %[[V:[^:]*]]: tensor<?xf32>, %[[O:[^:]*]]: index, %[[N:[^:]*]]: index)
// expand:
// CHECK: dloss.reduce sum %{{.*}} axes [1]
// pad -> slice of the padded cotangent at %O, as long as the input:
// CHECK: dloss.slice %{{.*}} axis 0 offset %[[O]] size %{{.*}}
// slice -> pad with %O before and (dim - %O - %N) after:
// CHECK: %[[END:.*]] = arith.addi %[[O]], %[[N]]
// CHECK: %[[AFTER:.*]] = arith.subi %{{.*}}, %[[END]]
// CHECK: dloss.pad %{{.*}} axis 0 low %[[O]] high %[[AFTER]]
func.func @shapes(%x: tensor<?x4xf32> {dloss.grad}, %v: tensor<?xf32> {dloss.grad}, %o: index, %n: index)
    -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.slice %x axis 0 offset %o size %n : tensor<?x4xf32>
  %p = dloss.pad %s axis 0 low %o high %n : tensor<?x4xf32>
  %e = dloss.expand %v axes [1] like %x : tensor<?xf32>, tensor<?x4xf32>
  %m = dloss.mul %e, %e : tensor<?x4xf32>, tensor<?x4xf32>
  %sum1 = dloss.reduce sum %p axes [0, 1] : tensor<?x4xf32>
  %sum2 = dloss.reduce sum %m axes [0, 1] : tensor<?x4xf32>
  %a = dloss.add %sum1, %sum2 : tensor<f32>, tensor<f32>
  %t = dloss.all_reduce sum %a : tensor<f32>
  return %t : tensor<f32>
}

// -----

// A replicated parameter used only by computation every rank repeats has the
// full gradient on every rank: ddp leaves it as is (DDP's average keeps it).
// CHECK-LABEL: func.func @replicated_only_grad
// CHECK-NOT: dloss.world_size
// CHECK-NOT: dloss.all_reduce
// CHECK: return
func.func @replicated_only(%w: tensor<4xf32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  %sq = dloss.mul %w, %w : tensor<4xf32>, tensor<4xf32>
  %s = dloss.reduce sum %sq axes [0] : tensor<4xf32>
  return %s : tensor<f32>
}

// -----

// Reduced and partial contributions to one invariant value meet in the
// partial form, without communication: the reduced one is divided by N.
// CHECK-LABEL: func.func @mixed_kinds_grad
// CHECK: %[[N:.*]] = dloss.world_size
// CHECK: %[[NF:.*]] = dloss.cast %[[N]]
// CHECK: %[[SHARE:.*]] = dloss.div %{{.*}}, %[[NF]] : tensor<4xf32>, tensor<f32>
// CHECK: dloss.add %{{.*}}, %[[SHARE]] : tensor<4xf32>, tensor<4xf32>
// CHECK-NOT: dloss.all_reduce sum %{{.*}} : tensor<4xf32>
// CHECK: return
func.func @mixed_kinds(%w: tensor<4xf32> {dloss.grad, dloss.replicated}, %x: tensor<?x4xf32>)
    -> tensor<f32> attributes {dloss.loss} {
  %sq = dloss.mul %w, %w : tensor<4xf32>, tensor<4xf32>
  %reg = dloss.reduce sum %sq axes [0] : tensor<4xf32>
  %rows = dloss.expand %sq axes [0] like %x : tensor<4xf32>, tensor<?x4xf32>
  %wx = dloss.mul %x, %rows : tensor<?x4xf32>, tensor<?x4xf32>
  %local = dloss.reduce sum %wx axes [0, 1] : tensor<?x4xf32>
  %data = dloss.all_reduce sum %local : tensor<f32>
  %loss = dloss.add %reg, %data : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}

// -----

// expected-error@+1 {{cannot derive @taken_grad: a symbol of that name exists}}
func.func @taken(%x: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  return %x : tensor<f32>
}
// expected-note@+1 {{it is defined here; rename it}}
func.func @taken_grad(%x: tensor<f32>) -> tensor<f32> {
  return %x : tensor<f32>
}

// -----

func.func @through_control_flow(%x: tensor<f32> {dloss.grad, dloss.replicated}, %flag: i1 {dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  // expected-error@+1 {{'scf.if' op is on the path from the inputs to the loss, and dloss-autodiff does not differentiate through region ops yet; compute this part without control flow}}
  %y = scf.if %flag -> tensor<f32> {
    %e = dloss.exp %x : tensor<f32>
    scf.yield %e : tensor<f32>
  } else {
    scf.yield %x : tensor<f32>
  }
  return %y : tensor<f32>
}

// -----

func.func @no_rule(%x: tensor<4xf32> {dloss.grad, dloss.replicated}) -> tensor<f32> attributes {dloss.loss} {
  // expected-error@+1 {{'tensor.cast' op has no adjoint rule, so the gradient cannot flow through it; express this step with dloss ops}}
  %c = tensor.cast %x : tensor<4xf32> to tensor<?xf32>
  %s = dloss.reduce sum %c axes [0] : tensor<?xf32>
  return %s : tensor<f32>
}

// -----

// expected-note@+1 {{because argument #0 of @varying_loss is not marked dloss.replicated}}
func.func @varying_loss(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %s = dloss.reduce sum %x axes [0] : tensor<?xf32>
  return %s : tensor<f32>
}
// expected-error@-4 {{cannot differentiate @varying_loss: its loss varies across ranks (run dloss-infer-replication for details)}}

// -----

// select: each value gets the cotangent where it was chosen and an exact
// zero elsewhere (a select again, never a product with the mask, which is
// NaN next to an infinity); the 0-d -inf's share is summed (and dropped as
// dead code later).
// CHECK-LABEL: func.func @select_grad
// CHECK-SAME: (%[[C:[^:]*]]: tensor<?x?xi64>, %[[X:[^:]*]]: tensor<?x?xf32>
// CHECK: %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : tensor<f32>
// CHECK: dloss.select %[[C]], %[[G:[^,]*]], %[[ZERO]] : tensor<?x?xi64>, tensor<?x?xf32>, tensor<f32>
// CHECK: %[[GX:.*]] = dloss.select %[[C]], %[[ZERO]], %[[G]] : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
// CHECK: dloss.mul %[[GX]]
// CHECK: return
func.func @select(%c: tensor<?x?xi64>, %x: tensor<?x?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %ninf = arith.constant dense<0xFF800000> : tensor<f32>
  %m = dloss.select %c, %ninf, %x : tensor<?x?xi64>, tensor<f32>, tensor<?x?xf32>
  %lse = dloss.logsumexp %m axis 1 : tensor<?x?xf32>
  %s = dloss.reduce sum %lse axes [0] : tensor<?xf32>
  %t = dloss.all_reduce sum %s : tensor<f32>
  return %t : tensor<f32>
}

// -----

// Loss state: @<loss>_grad returns the loss, the state's new value (no
// cotangent reaches it), then the gradients; the state argument keeps
// dloss.state.
// CHECK-LABEL: func.func @centre_grad
// CHECK-SAME: %{{[^:]*}}: tensor<4xf32> {dloss.replicated, dloss.state}
// CHECK-SAME: -> (tensor<f32>, tensor<4xf32>, tensor<?x4xf32>)
// CHECK: return %{{.*}}, %[[NEW:[^,]*]], %{{.*}} : tensor<f32>, tensor<4xf32>, tensor<?x4xf32>
func.func @centre(%x: tensor<?x4xf32> {dloss.grad}, %c: tensor<4xf32> {dloss.replicated, dloss.state}) -> (tensor<f32>, tensor<4xf32>) attributes {dloss.loss} {
  %e = dloss.expand %c axes [0] like %x : tensor<4xf32>, tensor<?x4xf32>
  %d = dloss.sub %x, %e : tensor<?x4xf32>, tensor<?x4xf32>
  %q = dloss.mul %d, %d : tensor<?x4xf32>, tensor<?x4xf32>
  %l = dloss.reduce sum %q axes [0, 1] : tensor<?x4xf32>
  %loss = dloss.all_reduce sum %l : tensor<f32>
  %s = dloss.reduce sum %x axes [0] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<4xf32>
  %m = dloss.stop_gradient %t : tensor<4xf32>
  %new = dloss.add %c, %m : tensor<4xf32>, tensor<4xf32>
  return %loss, %new : tensor<f32>, tensor<4xf32>
}

// -----

// A state update that differs between ranks is refused.
// expected-error@+1 {{the new value of a dloss.state argument of @per_rank_centre varies across ranks: state must stay the same on every rank (update it from all-reduced statistics)}}
func.func @per_rank_centre(%x: tensor<?x4xf32> {dloss.grad}, %c: tensor<4xf32> {dloss.replicated, dloss.state}) -> (tensor<f32>, tensor<4xf32>) attributes {dloss.loss} {
  %l = dloss.reduce sum %x axes [0, 1] : tensor<?x4xf32>
  %loss = dloss.all_reduce sum %l : tensor<f32>
  %s = dloss.reduce sum %x axes [0] : tensor<?x4xf32>
  %new = dloss.add %c, %s : tensor<4xf32>, tensor<4xf32>
  return %loss, %new : tensor<f32>, tensor<4xf32>
}
