// The LibTorch JIT: dloss MLIR (or a Graph) -> cached plan -> CompiledLoss.
#include "frontend/Jit.h"

#include "frontend/CompilerLibrary.h"
#include "runtime/comm/Engines.h"
#include "runtime/comm/RendezvousOptions.h"
#include "runtime/plan/PlanCache.h"
#include "runtime/support/Error.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace dloss::jit {
namespace {

std::mutex cacheMutex;
/// Plans this process compiled (not found in memory or on disk).
std::atomic<int64_t> compiled{0};
/// Plans by (source, name, gradient mode, fused, general fusion only).
using CacheKey = std::tuple<std::string, std::string, std::string, bool, bool>;
std::map<CacheKey, std::shared_ptr<const PlanFile>> &cache() {
  static std::map<CacheKey, std::shared_ptr<const PlanFile>> plans;
  return plans;
}

/// The plan of `request` (its source: MLIR text or a graph's recording),
/// from memory, the disk cache, or compiled from `mlirText()`.
std::shared_ptr<const PlanFile>
planFor(const PlanRequest &request,
        const std::function<std::string()> &mlirText) {
  const std::string &name = request.name;
  CacheKey key{request.source, request.name, request.gradMode, request.fuse,
               request.generalOnly};
  {
    std::lock_guard<std::mutex> lock(cacheMutex);
    auto it = cache().find(key);
    if (it != cache().end())
      return it->second;
  }
  // Then the plan cache on disk (runtime/plan/PlanCache.h): a process that
  // finds its plan there compiles nothing.
  std::optional<std::string> directory = planCacheDirectory();
  if (directory)
    if (auto plan = loadCachedPlan(*directory, request)) {
      std::lock_guard<std::mutex> lock(cacheMutex);
      return cache().emplace(key, plan).first->second;
    }

  // Not cached: compile with the compiler library (loaded on first use). A
  // machine without it can only run plans compiled elsewhere.
  const CompilerLibrary *library = nullptr;
  try {
    library = &compilerLibrary();
  } catch (const Error &e) {
    throw Error("the plan of '" + name + "' is not in the plan cache (key " +
                    planCacheKey(request) +
                    (directory ? " in " + *directory
                               : std::string(", the cache is off")) +
                    ") and this machine cannot compile it: " + e.problem(),
                "Compile it once (same source and options) where dloss has "
                "its compiler library and share the cache directory "
                "(DLOSS_CACHE_DIR), or point DLOSS_COMPILER_LIBRARY at the "
                "libdloss_compiler.so of this dloss build");
  }
  std::string text = mlirText();
  dloss_compile_request compileRequest{
      text.data(),          text.size(),
      name.c_str(),         request.gradMode.c_str(),
      request.fuse ? 1 : 0, request.generalOnly ? 1 : 0};
  std::unique_ptr<dloss_compile_result, decltype(library->resultFree)> result(
      library->compile(&compileRequest), library->resultFree);
  if (!library->ok(result.get()))
    throw Error("the loss '" + name + "' did not compile:\n" +
                    library->messages(result.get()),
                "Fix the loss at the location the compiler names");
  size_t size = 0;
  const uint8_t *bytes = library->plan(result.get(), &size);

  auto plan =
      PlanFile::fromBytes(std::vector<uint8_t>(bytes, bytes + size), name);
  ++compiled;
  if (directory)
    storeCachedPlan(*directory, request, *plan);
  std::lock_guard<std::mutex> lock(cacheMutex);
  cache().emplace(key, plan);
  return plan;
}

} // namespace

std::shared_ptr<const PlanFile> compilePlan(const std::string &mlirText,
                                            const std::string &gradMode,
                                            const std::string &name, bool fuse,
                                            bool generalOnly) {
  return planFor(PlanRequest{mlirText, name, gradMode, fuse, generalOnly},
                 [&] { return mlirText; });
}

std::shared_ptr<const PlanFile>
compilePlan(const Graph &graph, const std::string &gradMode, bool fuse) {
  return planFor(PlanRequest{graph.recording(), graph.name(), gradMode, fuse},
                 [&] { return graph.toMlir(); });
}

std::shared_ptr<Communicator> defaultCommunicator() {
  static std::mutex mutex;
  static std::shared_ptr<Communicator> communicator;
  std::lock_guard<std::mutex> lock(mutex);
  if (!communicator) {
    if (std::getenv("WORLD_SIZE"))
      communicator = connectProcessGroup(RendezvousOptions::fromEnvironment());
    else
      communicator = makeSingleProcessCommunicator();
  }
  return communicator;
}

CompiledLoss compile(const std::string &mlirText, Options options) {
  auto schedule =
      fused::parseOptionalSchedule(options.schedule, "jit::Options::schedule");
  auto plan = compilePlan(mlirText, options.gradMode, "<jit>", options.fuse);
  return CompiledLoss(
      plan, options.communicator ? options.communicator : defaultCommunicator(),
      options.entry, schedule);
}

CompiledLoss compile(const Graph &graph, Options options) {
  auto schedule =
      fused::parseOptionalSchedule(options.schedule, "jit::Options::schedule");
  auto plan = compilePlan(graph, options.gradMode, options.fuse);
  return CompiledLoss(
      plan, options.communicator ? options.communicator : defaultCommunicator(),
      options.entry.empty() ? graph.name() : options.entry, schedule);
}

int64_t plansCompiled() { return compiled.load(); }

size_t cachedPlans() {
  std::lock_guard<std::mutex> lock(cacheMutex);
  return cache().size();
}

void clearPlanCache() {
  std::lock_guard<std::mutex> lock(cacheMutex);
  cache().clear();
}

} // namespace dloss::jit
