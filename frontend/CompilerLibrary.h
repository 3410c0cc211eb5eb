// libdloss_compiler (compiler/dloss_compiler.h), loaded with dlopen the first
// time something compiles or builds a Graph, so that the JIT, dloss-run and
// the Python package load and run cached plans on a machine without it.
#ifndef DLOSS_FRONTEND_COMPILERLIBRARY_H
#define DLOSS_FRONTEND_COMPILERLIBRARY_H

#include "compiler/dloss_compiler.h"

#include <string>

namespace dloss {

/// The C API's functions, from the loaded library.
struct CompilerLibrary {
  std::string path;
  decltype(&dloss_compile) compile;
  decltype(&dloss_compile_result_free) resultFree;
  decltype(&dloss_compile_ok) ok;
  decltype(&dloss_compile_plan) plan;
  decltype(&dloss_compile_messages) messages;
  decltype(&dloss_graph_create) graphCreate;
  decltype(&dloss_graph_destroy) graphDestroy;
  decltype(&dloss_graph_add) graphAdd;
  decltype(&dloss_graph_shape) graphShape;
  decltype(&dloss_graph_mlir) graphMlir;
};

/// The library, loaded once: DLOSS_COMPILER_LIBRARY (a path) when set, else
/// libdloss_compiler.so beside the library holding this code (libdloss_jit:
/// the build tree or a prefix), else the dloss-compiler wheel's, beside the
/// dloss wheel in site-packages (dloss_compiler/lib). Throws dloss::Error
/// saying where it looked and why it could not load it, or that it was built
/// from other compiler sources than this runtime (its plans would not match
/// the plan cache's keys). The failure is remembered, not retried.
const CompilerLibrary &compilerLibrary();

/// The path compilerLibrary() loads (or would load): the one place that
/// decides it, also for `import dloss`'s check of the dloss-compiler wheel.
std::string compilerLibraryPath();

} // namespace dloss

#endif // DLOSS_FRONTEND_COMPILERLIBRARY_H
