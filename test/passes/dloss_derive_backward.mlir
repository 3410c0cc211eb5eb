// The named pipeline on the examples: each derives @<name>_grad, cleaned up by
// canonicalize and CSE. fuse=false shows the unfused collective adjoints; by
// default CLIP and SigLIP become ring ops (test/passes/dloss_fuse_gather_similarity.mlir).
// RUN: dloss-opt %dloss_src/examples/clip.mlir --dloss-derive-backward="fuse=false" | FileCheck %s --check-prefix=CLIP
// RUN: dloss-opt %dloss_src/examples/siglip.mlir --dloss-derive-backward="fuse=false" | FileCheck %s --check-prefix=SIGLIP
// RUN: dloss-opt %dloss_src/examples/clip.mlir --dloss-derive-backward | FileCheck %s --check-prefix=FUSED
// RUN: dloss-opt %dloss_src/examples/arcface.mlir --dloss-derive-backward | FileCheck %s --check-prefix=ARCFACE
// RUN: dloss-opt %s --dloss-derive-backward --split-input-file --verify-diagnostics

// For CLIP, one reduce_scatter per gathered input, the scale scaled by N (ddp).
// CLIP-LABEL: func.func @clip_grad
// CLIP-SAME: -> (tensor<f32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<f32>)
// CLIP-COUNT-2: dloss.reduce_scatter sum
// CLIP-NOT: dloss.reduce_scatter
// CLIP: %[[N:.*]] = dloss.world_size
// CLIP-NOT: dloss.world_size
// CLIP: return

// Fused, CLIP communicates only inside its ring ops: no gather, no
// reduce_scatter.
// FUSED-LABEL: func.func @clip_grad
// FUSED-NOT: dloss.all_gather
// FUSED-NOT: dloss.reduce_scatter
// FUSED: dloss.ring_softmax_ce %arg0, %arg1, %arg2
// FUSED-NOT: dloss.all_gather
// FUSED-NOT: dloss.reduce_scatter
// FUSED: dloss.ring_softmax_ce_grad
// FUSED-NOT: dloss.all_gather
// FUSED-NOT: dloss.reduce_scatter
// FUSED: return

// For SigLIP, the text features come back through a reduce_scatter; the image
// features and both scalars stay local until the ddp scaling.
// SIGLIP-LABEL: func.func @siglip_grad
// SIGLIP-SAME: -> (tensor<f32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<f32>, tensor<f32>)
// SIGLIP: dloss.sigmoid
// SIGLIP: dloss.reduce_scatter sum
// SIGLIP-NOT: dloss.reduce_scatter
// SIGLIP: return

// ArcFace with replicated W: no gather; W's gradient is this rank's share
// times N (ddp); the labels get no gradient.
// ARCFACE-LABEL: func.func @arcface_grad
// ARCFACE-SAME: -> (tensor<f32>, tensor<?x?xf32>, tensor<?x?xf32>)
// ARCFACE-NOT: dloss.all_gather
// ARCFACE-NOT: dloss.reduce_scatter
// ARCFACE: dloss.sin
// ARCFACE: dloss.sqrt
// ARCFACE: dloss.world_size
// ARCFACE: return

// The logging pattern that hangs hand-written jobs: a collective only on rank 0.
func.func @log_on_rank_zero(%x: tensor<?xf32> {dloss.grad}) -> tensor<f32> attributes {dloss.loss} {
  %local = dloss.reduce sum %x axes [0] : tensor<?xf32>
  %loss = dloss.all_reduce sum %local : tensor<f32>
  // expected-note@+1 {{it varies across ranks because of this 'dloss.rank'}}
  %r = dloss.rank
  %c0 = arith.constant 0 : index
  // expected-note@+1 {{the condition is computed here}}
  %is_zero = arith.cmpi eq, %r, %c0 : index
  scf.if %is_zero {
    // expected-error@+1 {{'dloss.all_reduce' op is reached only on some ranks: it is inside an 'scf.if' whose condition varies across ranks}}
    %m = dloss.all_reduce max %local : tensor<f32>
  }
  return %loss : tensor<f32>
}
