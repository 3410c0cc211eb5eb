# The user's torch: the one the active Python imports (torch.utils.cmake_prefix_path),
# its bundled pybind11 and libtorch_python.
#
# Sets Python3_EXECUTABLE (the Python with torch), DLOSS_TORCH_VERSION,
# DLOSS_TORCH_CUDA_VERSION (empty for a CPU-only torch),
# DLOSS_TORCH_PYTHON_LIBRARY and DLOSS_TORCH_PYBIND11_INCLUDE_DIR, and
# promotes torch's imported targets to global.

# The Python that has torch: an explicit -DPython3_EXECUTABLE, else the
# active environment's python3 (a venv's, when one is active).
if(NOT Python3_EXECUTABLE)
  find_program(_dloss_python NAMES python3 python NO_CACHE)
  set(Python3_EXECUTABLE "${_dloss_python}" CACHE FILEPATH "The Python whose torch dloss builds against")
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module REQUIRED)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
          "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _dloss_torch_info ERROR_VARIABLE _dloss_torch_error
  RESULT_VARIABLE _dloss_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _dloss_torch_rc EQUAL 0)
  message(FATAL_ERROR "dloss: ${Python3_EXECUTABLE} cannot import torch:\n${_dloss_torch_error}\n"
    "Activate the environment that has torch 2.x (pip install torch), or pass "
    "-DPython3_EXECUTABLE=/path/to/python; scripts/setup.sh makes one in .venv")
endif()
string(REPLACE "\n" ";" _dloss_torch_info "${_dloss_torch_info}")
list(GET _dloss_torch_info 0 _dloss_torch_prefix)
list(GET _dloss_torch_info 1 DLOSS_TORCH_VERSION)
list(LENGTH _dloss_torch_info _dloss_torch_fields)
set(DLOSS_TORCH_CUDA_VERSION "")
if(_dloss_torch_fields GREATER 2)
  list(GET _dloss_torch_info 2 DLOSS_TORCH_CUDA_VERSION)
endif()
if(DLOSS_TORCH_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "dloss: torch ${DLOSS_TORCH_VERSION} from ${Python3_EXECUTABLE} is too old: dloss needs torch 2.x")
endif()
list(PREPEND CMAKE_PREFIX_PATH "${_dloss_torch_prefix}")
if(DLOSS_TORCH_CUDA_VERSION)
  include(DlossCudaToolkitView)
endif()

# TorchConfig finds torch's own libraries with find_library(... PATHS
# <torch>/lib), which searches the system's directories first: where Debian's
# libtorch-dev is installed too, libtorch.so and libc10.so would resolve to
# /usr/lib beside the wheel's headers and libtorch_cpu, two torches in one
# process (measured: a double free in the first Gloo call). Point those
# variables at the wheel's own files before TorchConfig runs, and check after.
get_filename_component(_dloss_torch_lib "${_dloss_torch_prefix}/../../lib" ABSOLUTE)
foreach(_dloss_pair "TORCH_LIBRARY;torch" "c10_LIBRARY;c10"
                    "C10_CUDA_LIBRARY;c10_cuda" "CAFFE2_NVRTC_LIBRARY;caffe2_nvrtc")
  list(GET _dloss_pair 0 _dloss_var)
  list(GET _dloss_pair 1 _dloss_name)
  set(_dloss_file "${_dloss_torch_lib}/${CMAKE_SHARED_LIBRARY_PREFIX}${_dloss_name}${CMAKE_SHARED_LIBRARY_SUFFIX}")
  if(EXISTS "${_dloss_file}")
    set(${_dloss_var} "${_dloss_file}" CACHE FILEPATH "torch's own ${_dloss_name} (cmake/DlossTorch.cmake)" FORCE)
  endif()
endforeach()

# TorchConfig looks for CUDA itself when torch has it (cu wheels); its
# find_package(CUDA) noise is torch's, not ours.
find_package(Torch REQUIRED)
foreach(_dloss_var TORCH_LIBRARY c10_LIBRARY)
  string(FIND "${${_dloss_var}}" "${_dloss_torch_lib}/" _dloss_at)
  if(${_dloss_var} AND NOT _dloss_at EQUAL 0)
    message(FATAL_ERROR "dloss: ${_dloss_var} is ${${_dloss_var}}, outside the torch of "
      "${Python3_EXECUTABLE} (${_dloss_torch_lib}): two torches would meet in one process. "
      "Remove the other one (Debian: apt remove libtorch-dev) or the build directory's "
      "CMakeCache.txt, and configure again")
  endif()
endforeach()
message(STATUS "dloss: torch ${DLOSS_TORCH_VERSION} from ${Python3_EXECUTABLE} (${Torch_DIR})")

# Imported targets are visible only in the directory that found them and below,
# yet every directory linking dloss_runtime (tests, tools, the JIT) must resolve
# torch's targets through its link interface. Promote the ones found here.
get_directory_property(_dloss_torch_targets IMPORTED_TARGETS)
foreach(_target IN LISTS _dloss_torch_targets)
  get_target_property(_global ${_target} IMPORTED_GLOBAL)
  if(NOT _global)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endif()
endforeach()

# torch's own pybind11 (include/pybind11 in the wheel): its internals are the
# ones libtorch_python registered Tensor, ProcessGroup and Store with.
find_path(DLOSS_TORCH_PYBIND11_INCLUDE_DIR pybind11/pybind11.h
  HINTS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_library(DLOSS_TORCH_PYTHON_LIBRARY torch_python
  HINTS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
if(NOT DLOSS_TORCH_PYBIND11_INCLUDE_DIR OR NOT DLOSS_TORCH_PYTHON_LIBRARY)
  message(FATAL_ERROR "dloss: torch in ${TORCH_INSTALL_PREFIX} ships no pybind11 headers "
    "or no libtorch_python; dloss needs a torch installed from a wheel (pip install torch)")
endif()

# dloss_precompile_torch_headers(TARGET [REUSE_FROM OTHER] [SKIP source...]):
# TARGET's C++ files compile with <ATen/ATen.h> precompiled (one header
# compile per target and build; a runtime file's compile takes less than half
# as long), or with OTHER's precompiled header, where both compile with the
# same flags. SKIP names the files built with flags of their own (a
# precompiled header is used only with the flags it was made with).
# DLOSS_PRECOMPILE_HEADERS=OFF turns it off.
option(DLOSS_PRECOMPILE_HEADERS "Compile the torch-heavy targets with <ATen/ATen.h> precompiled." ON)
function(dloss_precompile_torch_headers target)
  cmake_parse_arguments(ARG "" "REUSE_FROM" "SKIP" ${ARGN})
  if(NOT DLOSS_PRECOMPILE_HEADERS)
    return()
  endif()
  if(ARG_REUSE_FROM)
    target_precompile_headers(${target} REUSE_FROM ${ARG_REUSE_FROM})
  else()
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<ATen/ATen.h$<ANGLE-R>>")
  endif()
  if(ARG_SKIP)
    set_source_files_properties(${ARG_SKIP} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
