// Makes a CUDA device current for a scope: the one guard of the NCCL engine and
// the fused ops' tile launchers.
//
// Header-only over the CUDA runtime API, so that nvcc (cuda/FusedTiles.cu)
// and the host compiler (the NCCL engine) both include it.
#ifndef DLOSS_RUNTIME_SUPPORT_CUDADEVICEGUARD_H
#define DLOSS_RUNTIME_SUPPORT_CUDADEVICEGUARD_H

#include <cuda_runtime_api.h>

namespace dloss {

/// Makes `device` current until the scope ends, then restores the previous
/// device. It never throws: status() says whether switching worked, for
/// callers that report it.
class CudaDeviceGuard {
public:
  explicit CudaDeviceGuard(int device) {
    result = cudaGetDevice(&previous);
    // Unknown previous device: still switch (nothing to restore later).
    if (result != cudaSuccess)
      previous = -1;
    if (previous != device) {
      cudaError_t set = cudaSetDevice(device);
      if (result == cudaSuccess)
        result = set;
    }
  }
  ~CudaDeviceGuard() {
    int current = previous;
    if (previous >= 0 && cudaGetDevice(&current) == cudaSuccess &&
        current != previous)
      (void)cudaSetDevice(previous);
  }
  CudaDeviceGuard(const CudaDeviceGuard &) = delete;
  CudaDeviceGuard &operator=(const CudaDeviceGuard &) = delete;

  /// cudaSuccess, or the first error of reading or setting the device.
  cudaError_t status() const { return result; }

private:
  int previous = -1;
  cudaError_t result = cudaSuccess;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_SUPPORT_CUDADEVICEGUARD_H
