// LibTorch's current CUDA stream, or the legacy default stream when LibTorch
// has no CUDA.
#include "runtime/support/CudaStream.h"

#ifdef DLOSS_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace dloss {

void *currentCudaStream(int device) {
#ifdef DLOSS_TORCH_HAS_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))
      .stream();
#else
  (void)device;
  return nullptr;
#endif
}

} // namespace dloss
