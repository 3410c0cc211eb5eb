// The GPU glue of dloss.fused_similarity and its _grad: the same operands,
// ring and carries as the CPU path (FusedSimilarity.h), each tile run by
// cuda/SimilarityTiles.h (one element per thread, through the same
// epilogue::evaluate and epilogue::reverse; fp32 statistics on the device,
// combined in f64 as on the CPU). f64 inputs are computed in f32 there, as
// for every fused op on the GPU. Compiled only with DLOSS_HAVE_CUDA.
#ifndef DLOSS_RUNTIME_FUSED_FUSEDSIMILARITYDEVICE_H
#define DLOSS_RUNTIME_FUSED_FUSEDSIMILARITYDEVICE_H

#ifdef DLOSS_HAVE_CUDA
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/FusedKernels.h"

namespace dloss::fused::similarity {

/// The forward on CUDA tensors: row statistics [results, n] and the chunks'
/// column statistics [column results, length] (max, sum) in f32 on the
/// device.
void fusedSimilarityDevice(KernelContext &ctx, const FusedArgs &args,
                           const SimilarityProgram &spec);

/// The backward on CUDA tensors: the per-row shares of the leaves'
/// gradients in f64 [leaf, n] on the device, summed at the end.
void fusedSimilarityGradDevice(KernelContext &ctx, const FusedArgs &args,
                               const SimilarityProgram &spec);

} // namespace dloss::fused::similarity

#endif // DLOSS_HAVE_CUDA
#endif // DLOSS_RUNTIME_FUSED_FUSEDSIMILARITYDEVICE_H
