# Where `cmake --install` (a prefix) and `pip install .` (a wheel, through
# scikit-build-core, which defines SKBUILD) put dloss's files. One set of
# variables for both, so that every install() names a layout, not a path.
#
#   prefix (cmake --install)               wheel (site-packages/)
#   lib/libdloss_*.so                      dloss/lib/libdloss_*.so
#   bin/dlossc, dloss-run, dloss-opt       dloss/bin/... (console scripts exec them)
#   include/dloss/...                      dloss/include/dloss/...
#   lib/cmake/dloss/                       dloss/lib/cmake/dloss/ (dloss.cmake_prefix_path)
#   lib/python3/dist-packages/dloss/       dloss/
#
# The compiler alone (DLOSS_BUILD_RUNTIME=OFF: the dloss-compiler wheel,
# packaging/compiler) puts the same layout under dloss_compiler/ instead.
if(SKBUILD)
  set(DLOSS_WHEEL ON)
  if(DLOSS_BUILD_RUNTIME)
    set(_root dloss/)
  else()
    set(_root dloss_compiler/)
  endif()
  set(DLOSS_PYTHON_INSTALL_DIR "." CACHE STRING "Where the dloss package goes, relative to the prefix")
else()
  set(DLOSS_WHEEL OFF)
  set(_root "")
  set(DLOSS_PYTHON_INSTALL_DIR "lib/python3/dist-packages" CACHE STRING
    "Where `cmake --install` puts the dloss package, relative to the prefix")
endif()
set(DLOSS_INSTALL_LIBDIR ${_root}lib)
set(DLOSS_INSTALL_BINDIR ${_root}bin)
set(DLOSS_INSTALL_INCLUDEDIR ${_root}include/dloss)
set(DLOSS_INSTALL_CMAKEDIR ${_root}lib/cmake/dloss)

# dloss_install_rpath(TARGET DIR): the run path of TARGET installed in DIR (one
# of the directories above): dloss's libraries through $ORIGIN, and torch's.
# A wheel finds torch beside it in site-packages (torch/lib), so the path is
# relative and the wheel relocatable; a prefix keeps the torch it was built
# against (the link path). Never a path into the build or source tree.
function(dloss_install_rpath target dir)
  file(RELATIVE_PATH _to_lib "/root/${dir}" "/root/${DLOSS_INSTALL_LIBDIR}")
  set(_rpath "$ORIGIN")
  if(_to_lib)
    set(_rpath "$ORIGIN/${_to_lib}")
  endif()
  if(DLOSS_WHEEL)
    file(RELATIVE_PATH _to_torch "/root/${dir}" "/root/torch/lib")
    set_target_properties(${target} PROPERTIES
      INSTALL_RPATH "${_rpath};$ORIGIN/${_to_torch}"
      INSTALL_RPATH_USE_LINK_PATH FALSE)
  else()
    set_target_properties(${target} PROPERTIES
      INSTALL_RPATH "${_rpath}"
      INSTALL_RPATH_USE_LINK_PATH TRUE)
  endif()
endfunction()
