# Finds MLIR/LLVM 22 and makes LLVM's CMake functions available, without LLVM's compile flags.
#
# LLVM's flags (-fno-exceptions among them) are applied per directory by
# cmake/DlossLLVMOptions.cmake, which only compiler directories include: the runtime,
# the JIT and the tools that catch LibTorch exceptions must keep exceptions on.

if(NOT MLIR_DIR AND EXISTS "/usr/lib/llvm-22/lib/cmake/mlir")
  set(MLIR_DIR "/usr/lib/llvm-22/lib/cmake/mlir")
endif()
find_package(MLIR REQUIRED CONFIG)
if(NOT LLVM_VERSION_MAJOR EQUAL 22)
  message(FATAL_ERROR "dloss needs MLIR 22, found ${LLVM_PACKAGE_VERSION} in ${MLIR_DIR}; "
                      "run scripts/setup.sh or pass -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir")
endif()
message(STATUS "dloss: MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}")

set(LLVM_RUNTIME_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/bin)
set(LLVM_LIBRARY_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/lib)
set(MLIR_BINARY_DIR ${CMAKE_BINARY_DIR})

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
include(TableGen)
include(AddLLVM)
include(AddMLIR)

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
separate_arguments(DLOSS_LLVM_DEFINITIONS NATIVE_COMMAND ${LLVM_DEFINITIONS})
add_definitions(${DLOSS_LLVM_DEFINITIONS})

# Debian's package names a lit that does not exist; the README passes this one.
if(NOT LLVM_EXTERNAL_LIT OR NOT EXISTS "${LLVM_EXTERNAL_LIT}")
  find_program(LLVM_EXTERNAL_LIT NAMES lit llvm-lit PATHS "${LLVM_TOOLS_BINARY_DIR}" NO_DEFAULT_PATH)
endif()
