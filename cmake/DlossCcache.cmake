# Compiles through ccache where it is installed (scripts/setup.sh installs it),
# so that a second build of the same sources, such as the wheel test's
# `pip wheel` (test/install/wheel_test.sh), takes its objects from the first.
#
# The cache lies in the build tree (DLOSS_CCACHE_DIR, default <build>/ccache),
# never in the home directory: every fresh build starts it empty, and the
# wheel test is handed the main build's. Paths under the source tree are
# hashed relative to the build folder (ccache's base_dir), so two build folders
# at the same depth under the source tree share objects when their flags agree.
# Depend mode takes the headers from the compiler's own -MD output instead of
# running the preprocessor a second time on a miss; the sloppiness lets it
# cache the precompiled header and the files compiled with it
# (dloss_precompile_torch_headers, cmake/DlossTorch.cmake).
#
#   -DDLOSS_CCACHE=OFF                       compile without ccache
#   -DDLOSS_CCACHE_DIR=/path                 another cache (one per machine, say)
option(DLOSS_CCACHE "Compile through ccache where it is installed." ON)
set(DLOSS_CCACHE_IN_USE OFF)
set(DLOSS_CCACHE_DIR "${PROJECT_BINARY_DIR}/ccache" CACHE PATH
  "ccache's directory (default: in the build tree, so that each build starts empty)")
if(NOT DLOSS_CCACHE OR CMAKE_CXX_COMPILER_LAUNCHER)
  return()
endif()
find_program(DLOSS_CCACHE_PROGRAM ccache)
if(NOT DLOSS_CCACHE_PROGRAM)
  message(STATUS "dloss: no ccache: compiling without it (scripts/setup.sh installs it)")
  return()
endif()
set(_dloss_ccache ${CMAKE_COMMAND} -E env
  "CCACHE_DIR=${DLOSS_CCACHE_DIR}" "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}"
  CCACHE_DEPEND=1 CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=4G
  CCACHE_SLOPPINESS=pch_defines,time_macros ${DLOSS_CCACHE_PROGRAM})
set(CMAKE_C_COMPILER_LAUNCHER ${_dloss_ccache})
set(CMAKE_CXX_COMPILER_LAUNCHER ${_dloss_ccache})
set(DLOSS_CCACHE_IN_USE ON)
message(STATUS "dloss: compiling through ${DLOSS_CCACHE_PROGRAM}, cache ${DLOSS_CCACHE_DIR}")
