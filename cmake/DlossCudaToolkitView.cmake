# For a CUDA torch from pip: a CUDA toolkit made of the machine's nvcc and the
# cuBLAS, cuda runtime and NCCL of torch's own nvidia wheels, so that dloss's
# CUDA parts compile and link against the libraries torch runs with, not a
# second copy (and build where the toolkit has no cuBLAS or NCCL, as here).
#
# Included by cmake/DlossTorch.cmake before find_package(Torch), when torch
# has CUDA. Uses the toolkit as it is when it already has cuBLAS, unless
# DLOSS_CUDA_WHEEL_LIBRARIES is ON (scripts/gpu-check.sh sets it): then the
# view is made anyway, the toolkit's headers with the wheels' libraries, so
# that a machine whose /usr/local/cuda has its own cuBLAS still links the one
# torch runs with. Sets CUDA_TOOLKIT_ROOT_DIR, CUDAToolkit_ROOT and
# CMAKE_CUDA_COMPILER to the view.
option(DLOSS_CUDA_WHEEL_LIBRARIES
  "Link the cuBLAS and CUDA runtime of torch's nvidia wheels even where the CUDA toolkit has its own" OFF)

# The toolkit's own nvcc (CUDA_HOME, /usr/local/cuda) before any wrapper on PATH.
find_program(_dloss_nvcc nvcc HINTS ENV CUDA_HOME /usr/local/cuda PATH_SUFFIXES bin NO_CACHE)
if(NOT _dloss_nvcc)
  message(STATUS "dloss: torch has CUDA but no nvcc was found: the CUDA parts will be skipped")
  return()
endif()
file(REAL_PATH "${_dloss_nvcc}" _dloss_nvcc_real)
get_filename_component(_dloss_toolkit "${_dloss_nvcc_real}" DIRECTORY)
get_filename_component(_dloss_toolkit "${_dloss_toolkit}" DIRECTORY)
if(EXISTS "${_dloss_toolkit}/include/cublas_v2.h" AND NOT DLOSS_CUDA_WHEEL_LIBRARIES)
  return()
endif()

# torch/../nvidia: cu13/{include,lib}, nccl/{include,lib} in the cu130 wheels.
get_filename_component(_dloss_nvidia "${_dloss_torch_prefix}/../../../nvidia" ABSOLUTE)
if(NOT EXISTS "${_dloss_nvidia}")
  message(STATUS "dloss: ${_dloss_toolkit} has no cuBLAS and torch has no nvidia wheels beside it "
    "(${_dloss_nvidia}): the CUDA parts will be skipped")
  return()
endif()
set(_view ${CMAKE_BINARY_DIR}/cuda-toolkit)
file(REMOVE_RECURSE ${_view})
file(MAKE_DIRECTORY ${_view}/include ${_view}/lib64 ${_view}/targets/x86_64-linux)
foreach(_dir bin nvvm)
  if(EXISTS "${_dloss_toolkit}/${_dir}")
    file(CREATE_LINK "${_dloss_toolkit}/${_dir}" "${_view}/${_dir}" SYMBOLIC)
  endif()
endforeach()
file(CREATE_LINK "${_view}/lib64" "${_view}/targets/x86_64-linux/lib" SYMBOLIC)
file(CREATE_LINK "${_view}/include" "${_view}/targets/x86_64-linux/include" SYMBOLIC)
# Headers: the toolkit's first (nvcc's own crt/ and cccl/ must match nvcc),
# then what only the wheels have (cuBLAS, NCCL). Libraries: the wheels' first
# (the ones torch loads), then the toolkit's (the static cudart that nvcc
# links test programs with).
file(GLOB _dloss_headers "${_dloss_toolkit}/include/*"
  "${_dloss_toolkit}/targets/x86_64-linux/include/*")
file(GLOB _dloss_wheel_headers "${_dloss_nvidia}/*/include/*")
file(GLOB _dloss_libraries "${_dloss_nvidia}/*/lib/*")
file(GLOB _dloss_toolkit_libraries "${_dloss_toolkit}/lib64/*"
  "${_dloss_toolkit}/targets/x86_64-linux/lib/*")
foreach(_kind headers libraries)
  if(_kind STREQUAL "headers")
    set(_into ${_view}/include)
    set(_entries ${_dloss_headers} ${_dloss_wheel_headers})
  else()
    set(_into ${_view}/lib64)
    set(_entries ${_dloss_libraries} ${_dloss_toolkit_libraries})
  endif()
  foreach(_entry IN LISTS _entries)
    get_filename_component(_name "${_entry}" NAME)
    if(NOT EXISTS "${_into}/${_name}" AND NOT IS_SYMLINK "${_into}/${_name}")
      file(CREATE_LINK "${_entry}" "${_into}/${_name}" SYMBOLIC)
    endif()
    # The wheels ship libfoo.so.N only; linkers look for libfoo.so.
    if(_name MATCHES "^(lib[A-Za-z0-9_]+)\\.so\\.[0-9]+$")
      set(_plain "${_into}/${CMAKE_MATCH_1}.so")
      if(NOT EXISTS "${_plain}" AND NOT IS_SYMLINK "${_plain}")
        file(CREATE_LINK "${_entry}" "${_plain}" SYMBOLIC)
      endif()
    endif()
  endforeach()
endforeach()

set(CUDA_TOOLKIT_ROOT_DIR ${_view} CACHE PATH "The CUDA toolkit (dloss's view: nvcc + torch's nvidia wheels)" FORCE)
set(CUDAToolkit_ROOT ${_view} CACHE PATH "The CUDA toolkit (dloss's view)" FORCE)
set(CMAKE_CUDA_COMPILER ${_view}/bin/nvcc CACHE FILEPATH "nvcc" FORCE)
# torch's CMake would otherwise try to run a program on a GPU to pick the
# architectures; Hopper is dloss's target (cmake/DlossCUDA.cmake).
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
endif()
message(STATUS "dloss: CUDA toolkit ${_view}: nvcc from ${_dloss_toolkit}, cuBLAS, "
  "the CUDA runtime and NCCL from torch's nvidia wheels (${_dloss_nvidia})")
