// dloss.fused_similarity and its _grad round the ring (FusedSimilarity.cpp):
// the steps the CPU path and the GPU glue (FusedSimilarityDevice.cpp) share:
// what travels with a column chunk, the visit of every rank's columns with
// their statistics, and the forward's results.
#ifndef DLOSS_RUNTIME_FUSED_FUSEDSIMILARITY_H
#define DLOSS_RUNTIME_FUSED_FUSEDSIMILARITY_H

#include "runtime/fused/RingDriver.h"
#include "runtime/fused/SimilarityOperands.h"

#include <functional>

namespace dloss::fused::similarity {

/// What travels with a column chunk: cols, then the per-column leaves.
Tensors chunkFeatures(const SimilarityOperands &ops);

/// The keys of chunkFeatures (RingPass::keys): the plan registers of the
/// columns and the per-column leaves.
std::vector<int64_t> chunkKeys(const KernelContext &ctx,
                               const SimilarityProgram &spec);

/// What travels with a column chunk in the backward: chunkFeatures, then
/// the column results and their cotangents.
Tensors gradientChunkFeatures(const SimilarityOperands &ops);

/// Column statistics of no rows yet: maxima -inf, sums 0.
void clearColumnStats(Tensors &stats);

/// Runs `visit` on every rank's columns round the ring (gathered: the
/// chunks' column statistics merge on the way and come home) or on the
/// local class matrix; returns this rank's own columns' statistics.
Tensors
visitColumns(KernelContext &ctx, const SimilarityProgram &spec,
             const SimilarityOperands &ops, at::TensorOptions options,
             const std::function<void(const Chunk &, Tensors &)> &visit);

/// Sets the forward's results from the rows' statistics (f64 [results, n],
/// combined across class shards here) and this rank's columns' (from
/// visitColumns).
void setForwardResults(KernelContext &ctx, const FusedArgs &args,
                       const SimilarityProgram &spec,
                       const SimilarityOperands &ops, at::Tensor max,
                       at::Tensor sum, const Tensors &colStats);

} // namespace dloss::fused::similarity

#endif // DLOSS_RUNTIME_FUSED_FUSEDSIMILARITY_H
