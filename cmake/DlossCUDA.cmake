# Optional CUDA parts (the fused ops' GPU tiles), built when torch has CUDA and
# nvcc is found: found -> DLOSS_HAVE_CUDA; missing -> skipped with a message.
# NCCL is not dloss's: CUDA tensors move through torch's c10d ProcessGroupNCCL
# (USE_C10D_NCCL, from torch_cuda's compile definitions).

find_program(DLOSS_NVCC nvcc PATHS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
# A CPU-only torch has no CUDA stream, cuBLAS or NCCL to share: the CUDA parts
# would run beside torch rather than with it, so they build only for a CUDA torch.
if(DLOSS_NVCC AND DLOSS_TORCH_CUDA_VERSION)
  set(_dloss_cuda_default ON)
else()
  set(_dloss_cuda_default OFF)
endif()
option(DLOSS_ENABLE_CUDA "Build the CUDA parts (the fused ops' GPU tiles)." ${_dloss_cuda_default})

set(DLOSS_HAVE_CUDA OFF)
if(DLOSS_ENABLE_CUDA)
  if(NOT DLOSS_NVCC)
    message(STATUS "dloss: DLOSS_ENABLE_CUDA=ON but no nvcc was found: skipping the CUDA parts")
  else()
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER "${DLOSS_NVCC}")
    endif()
    # Hopper is the tuning target; CUDA 13 no longer builds for the old default architectures.
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      find_package(CUDAToolkit)
    endif()
    if(CUDAToolkit_FOUND)
      set(DLOSS_HAVE_CUDA ON)
      message(STATUS "dloss: CUDA ${CUDAToolkit_VERSION} (architectures ${CMAKE_CUDA_ARCHITECTURES})")
    else()
      message(STATUS "dloss: the CUDA toolkit could not be used: skipping the CUDA parts")
    endif()
  endif()
else()
  message(STATUS "dloss: DLOSS_ENABLE_CUDA=OFF: skipping the CUDA parts")
endif()
