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

# LLVM linked statically. Debian's MLIR targets name LLVM's shared library
# (LLVM_LINK_LLVM_DYLIB), which would make every library and tool of dloss
# need libLLVM.so.22 at run time. Its static component libraries ship in the
# same packages, so every MLIR target is pointed at those instead; the
# libraries that contain MLIR then hide its symbols (--exclude-libs), and an
# installed dloss (the wheel) runs where no LLVM is installed.
option(DLOSS_STATIC_LLVM "Link LLVM's static libraries instead of libLLVM.so" ON)
if(DLOSS_STATIC_LLVM)
  llvm_map_components_to_libnames(_dloss_llvm_static Support Demangle Remarks BitstreamReader)
  get_directory_property(_dloss_imported IMPORTED_TARGETS)
  foreach(_target IN LISTS _dloss_imported)
    if(NOT _target MATCHES "^MLIR")
      continue()
    endif()
    get_target_property(_links ${_target} INTERFACE_LINK_LIBRARIES)
    if(_links)
      list(FIND _links LLVM _at)
      if(_at GREATER -1)
        list(REMOVE_ITEM _links LLVM)
        list(APPEND _links ${_dloss_llvm_static})
        set_target_properties(${_target} PROPERTIES INTERFACE_LINK_LIBRARIES "${_links}")
      endif()
    endif()
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endforeach()
  foreach(_target IN LISTS _dloss_llvm_static)
    set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
  endforeach()
  # add_llvm_executable/add_mlir_library link LLVM components through
  # LLVM_LINK_COMPONENTS: the same static libraries.
  set(LLVM_LINK_LLVM_DYLIB OFF)
  # LLVMSupport names z3, zlib and zstd for parts dloss never calls: only
  # what a binary uses stays in its NEEDED list.
  add_link_options("LINKER:--as-needed")
  message(STATUS "dloss: LLVM linked statically (${_dloss_llvm_static})")
endif()

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

# Debian's package names a lit that does not exist; docs/Building.md passes this one.
# Only the tests run lit: the compiler alone (the dloss-compiler wheel) needs none.
if(DLOSS_BUILD_TESTS AND (NOT LLVM_EXTERNAL_LIT OR NOT EXISTS "${LLVM_EXTERNAL_LIT}"))
  find_program(LLVM_EXTERNAL_LIT NAMES lit llvm-lit PATHS "${LLVM_TOOLS_BINARY_DIR}" NO_DEFAULT_PATH)
endif()
