// Loading libdloss_compiler: see CompilerLibrary.h.
#include "frontend/CompilerLibrary.h"

#include "runtime/plan/CompilerIdentity.h"
#include "runtime/support/Error.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace dloss {
namespace {

const char *const kLibraryName = "libdloss_compiler.so";

/// The directory of the shared library that holds this function.
std::string ownDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void *>(&ownDirectory), &info) == 0 ||
      !info.dli_fname)
    return "";
  std::string path = info.dli_fname;
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

Error loadError(const std::string &problem) {
  return Error("the dloss compiler library could not be loaded (" + problem +
                   ")",
               "Install the dloss-compiler wheel built from the same sources "
               "as dloss (pip wheel packaging/compiler; docs/Install.md), "
               "build dloss from source with DLOSS_BUILD_COMPILER=ON, "
               "or point DLOSS_COMPILER_LIBRARY at the libdloss_compiler.so "
               "of the same dloss sources");
}

bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

/// Where the library is looked for, first found first: DLOSS_COMPILER_LIBRARY;
/// beside libdloss_jit (a build tree, an install prefix); the dloss-compiler
/// wheel's package beside dloss's in site-packages (dloss/lib ->
/// dloss_compiler/lib). None found: the first candidate, whose dlopen error
/// says what is missing.
std::string libraryPath() {
  if (const char *explicitPath = std::getenv("DLOSS_COMPILER_LIBRARY");
      explicitPath && *explicitPath)
    return explicitPath;
  std::string own = ownDirectory();
  std::string beside = own + "/" + kLibraryName;
  std::string wheel = own + "/../../dloss_compiler/lib/" + kLibraryName;
  if (!exists(beside) && exists(wheel))
    return wheel;
  return beside;
}

template <typename Fn>
void bind(void *handle, const char *name, Fn &fn, const std::string &path) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn)
    throw loadError(path + " has no " + name +
                    " (it is not a dloss compiler library of this version)");
}

CompilerLibrary load() {
  std::string path = libraryPath();
  void *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror(); // It names the path.
    throw loadError(why ? why : path + ": dlopen failed");
  }
  CompilerLibrary library;
  library.path = path;
  decltype(&dloss_compiler_api_version) apiVersion;
  decltype(&dloss_compiler_identity) identity;
  bind(handle, "dloss_compiler_api_version", apiVersion, path);
  bind(handle, "dloss_compiler_identity", identity, path);
  if (apiVersion() != DLOSS_COMPILER_API_VERSION)
    throw loadError(path + " has C API version " +
                    std::to_string(apiVersion()) + ", this dloss needs " +
                    std::to_string(DLOSS_COMPILER_API_VERSION));
  if (std::strcmp(identity(), kCompilerIdentity) != 0)
    throw loadError(path + " was built from other compiler sources (" +
                    identity() + ") than this dloss (" + kCompilerIdentity +
                    "), so its plans would not match the plan cache's keys");
  bind(handle, "dloss_compile", library.compile, path);
  bind(handle, "dloss_compile_result_free", library.resultFree, path);
  bind(handle, "dloss_compile_ok", library.ok, path);
  bind(handle, "dloss_compile_plan", library.plan, path);
  bind(handle, "dloss_compile_messages", library.messages, path);
  bind(handle, "dloss_graph_create", library.graphCreate, path);
  bind(handle, "dloss_graph_destroy", library.graphDestroy, path);
  bind(handle, "dloss_graph_add", library.graphAdd, path);
  bind(handle, "dloss_graph_shape", library.graphShape, path);
  bind(handle, "dloss_graph_mlir", library.graphMlir, path);
  // Never closed: graphs and results of it may live until the process ends.
  return library;
}

} // namespace

const CompilerLibrary &compilerLibrary() {
  static std::once_flag once;
  static std::unique_ptr<CompilerLibrary> library;
  static std::unique_ptr<Error> failure;
  std::call_once(once, [] {
    try {
      library = std::make_unique<CompilerLibrary>(load());
    } catch (const Error &e) {
      failure = std::make_unique<Error>(e);
    }
  });
  if (failure)
    throw *failure;
  return *library;
}

std::string compilerLibraryPath() { return libraryPath(); }

} // namespace dloss
