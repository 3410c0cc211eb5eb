// The kernels of the fused ops (dloss.ring_softmax_ce, ...,
// dloss.fused_elementwise), as the kernel table runs them.
//
// One file per fused family holds its CPU and GPU visits, forward and _grad:
// RingSoftmaxCE.cpp (CLIP), RingSigmoidPairs.cpp (SigLIP), ShardedSoftmax.cpp
// (PartialFC). They share the ring driver (RingDriver.h), the operand checks
// (FusedArgs.h), the CPU tile arithmetic (TileMath.h) and, on CUDA, the tile
// launches (DeviceTiles.h over cuda/FusedTiles.h).
#ifndef DLOSS_RUNTIME_FUSED_FUSEDKERNELS_H
#define DLOSS_RUNTIME_FUSED_FUSEDKERNELS_H

#include "runtime/fused/TileShape.h"
#include "runtime/kernels/KernelTable.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dloss {

namespace fused {

// The six dedicated fused ops; CUDA tensors go to the GPU visits when the
// runtime has CUDA (DLOSS_HAVE_CUDA). Registered in the kernel table
// (kernels/KernelTable.cpp) with their operand and result counts.
void ringSoftmaxCE(KernelContext &ctx);
void ringSoftmaxCEGrad(KernelContext &ctx);
void ringSigmoidPairs(KernelContext &ctx);
void ringSigmoidPairsGrad(KernelContext &ctx);
void shardedSoftmax(KernelContext &ctx);
void shardedSoftmaxGrad(KernelContext &ctx);

/// The attributes of dloss.fused_similarity and its _grad, as the plan
/// step holds them (the encoding is runtime/plan/TileEncoding.h's); the
/// kernels check them against the operands.
struct SimilarityProgram {
  int64_t rowLeaves = 0;
  int64_t colLeaves = 0;
  std::vector<int64_t> program;
  std::vector<int64_t> outputs;
  /// Column results (the optional `col_outputs`; gathered steps only).
  std::vector<int64_t> colOutputs;
  /// The compiler's facts about the program: `picks`, `col_picks`,
  /// `lse_pairs` (the last two with column results only), `class_targets`.
  std::vector<int64_t> picks, colPicks, lsePairs, classTargets;
  bool gathered = false;
  /// `cols` is this rank's shard of the classes; the row statistics are
  /// all-reduced (forward) and the backward needs no communication.
  bool sharded = false;
};

/// The general fused op (FusedSimilarity.cpp): row reductions of a tile
/// program over S = rows x cols^T, the columns gathered round the ring, a
/// local class matrix or a shard of the classes; and its backward.
void fusedSimilarity(KernelContext &ctx, const SimilarityProgram &program);
void fusedSimilarityGrad(KernelContext &ctx, const SimilarityProgram &program);

/// The attributes of dloss.fused_elementwise (TileEncoding.h's encoding).
struct ElementwiseProgram {
  int64_t elements = 0, rowLeaves = 0, colLeaves = 0;
  std::vector<int64_t> program;
  /// One register per full result.
  std::vector<int64_t> outputs;
  /// One register per further result: its sum over the rows (`col_sums`).
  std::vector<int64_t> colSums;
};

/// A chain of element-wise ops in one pass (FusedElementwise.cpp): on CPU
/// float and double, chunk by chunk in cache; elsewhere (CUDA) one ATen op
/// per instruction, as the unfused ops would run.
void fusedElementwise(KernelContext &ctx, const ElementwiseProgram &program);

} // namespace fused
} // namespace dloss

#endif // DLOSS_RUNTIME_FUSED_FUSEDKERNELS_H
