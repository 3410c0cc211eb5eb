# Third-party build inputs from one folder, for machines that have no network
# to install them from PyPI and no Debian packages (the GPU machines):
# -DDLOSS_THIRD_PARTY_DIR=<dir>, filled by scripts/gpu-prepare.sh.
#
#   <dir>/include/flatbuffers/  FlatBuffers' headers -> DLOSS_FLATBUFFERS_INCLUDE_DIR
#   <dir>/bin/flatc             the schema compiler  -> DLOSS_FLATC
#                               (both checked by cmake/DlossFlatBuffers.cmake)
#   <dir>/googletest/           GoogleTest's sources, built in the build tree,
#                               found by find_package(GTest) (GTest::gtest_main)
#
# Each piece is used when present and replaces the system's (the cache
# variables are forced, so a build directory configured before without the
# folder follows it). Unset (the default), nothing here runs and the system's
# packages are found as before. Included by the top CMakeLists.txt before
# cmake/DlossTorch.cmake.

set(DLOSS_THIRD_PARTY_DIR "" CACHE PATH
  "A folder of third-party headers, flatc and GoogleTest's sources used instead of the system's (scripts/gpu-prepare.sh)")
if(NOT DLOSS_THIRD_PARTY_DIR)
  return()
endif()
get_filename_component(_dloss_tp "${DLOSS_THIRD_PARTY_DIR}" ABSOLUTE)
if(NOT IS_DIRECTORY "${_dloss_tp}")
  message(FATAL_ERROR "dloss: DLOSS_THIRD_PARTY_DIR=${DLOSS_THIRD_PARTY_DIR} is not a folder: "
    "make it with scripts/gpu-prepare.sh, or leave the option out to use the system's packages")
endif()

set(_dloss_tp_used "")
if(EXISTS "${_dloss_tp}/include/flatbuffers/flatbuffers.h")
  set(DLOSS_FLATBUFFERS_INCLUDE_DIR "${_dloss_tp}/include" CACHE PATH
    "FlatBuffers' headers (a folder holding flatbuffers/)" FORCE)
  list(APPEND _dloss_tp_used "FlatBuffers headers")
endif()
if(EXISTS "${_dloss_tp}/bin/flatc")
  set(DLOSS_FLATC "${_dloss_tp}/bin/flatc" CACHE FILEPATH "flatc, the FlatBuffers schema compiler" FORCE)
  list(APPEND _dloss_tp_used "flatc")
endif()

# GoogleTest from source, as its own README suggests for projects that embed
# it: no install, no gmock (no test uses it). find_package(GTest) in the test
# folders then finds this config (FindGTest tries config mode first), which
# names the targets built here.
if(DLOSS_BUILD_TESTS AND EXISTS "${_dloss_tp}/googletest/CMakeLists.txt")
  set(BUILD_GMOCK OFF CACHE BOOL "GoogleTest: no gmock (dloss's tests do not use it)")
  set(INSTALL_GTEST OFF CACHE BOOL "GoogleTest: embedded, not installed")
  add_subdirectory("${_dloss_tp}/googletest" "${CMAKE_BINARY_DIR}/third-party/googletest"
    EXCLUDE_FROM_ALL)
  # GoogleTest 1.11 and later name them so itself.
  foreach(_dloss_gtest gtest gtest_main)
    if(NOT TARGET GTest::${_dloss_gtest})
      add_library(GTest::${_dloss_gtest} ALIAS ${_dloss_gtest})
    endif()
  endforeach()
  set(_dloss_gtest_config "${CMAKE_BINARY_DIR}/third-party/gtest-config")
  file(WRITE "${_dloss_gtest_config}/GTestConfig.cmake"
    "# Written by cmake/DlossThirdParty.cmake: GoogleTest is built in this tree\n"
    "# from ${_dloss_tp}/googletest (targets GTest::gtest, GTest::gtest_main).\n"
    "set(GTest_FOUND TRUE)\n")
  set(GTest_DIR "${_dloss_gtest_config}" CACHE PATH "GoogleTest's CMake package (built in this tree)" FORCE)
  list(APPEND _dloss_tp_used "GoogleTest (built here)")
endif()
list(JOIN _dloss_tp_used ", " _dloss_tp_used)
message(STATUS "dloss: third-party inputs from ${_dloss_tp}: ${_dloss_tp_used}")
