// The CUDA stream ATen enqueues its kernels on, for the runtime's own CUDA work
// (fused tiles, NCCL ordering).
#ifndef DLOSS_RUNTIME_SUPPORT_CUDASTREAM_H
#define DLOSS_RUNTIME_SUPPORT_CUDASTREAM_H

namespace dloss {

/// LibTorch's current stream on `device` (a cudaStream_t) when LibTorch has
/// CUDA; otherwise null, the legacy default stream (then no CUDA tensor can
/// reach the runtime except through its tests). No CUDA type crosses this
/// header, so plain C++ includes it.
void *currentCudaStream(int device);

} // namespace dloss

#endif // DLOSS_RUNTIME_SUPPORT_CUDASTREAM_H
