// The LibTorch JIT: dloss MLIR (or a Graph) -> cached plan -> CompiledLoss.
#include "frontend/Jit.h"

#include "driver/Compile.h"
#include "runtime/plan/PlanCache.h"
#include "runtime/support/Error.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

namespace dloss::jit {
namespace {

std::mutex cacheMutex;
/// Plans this process compiled (not found in memory or on disk).
std::atomic<int64_t> compiled{0};
/// Plans by (IR text, gradient mode, fused).
using CacheKey = std::tuple<std::string, std::string, bool>;
std::map<CacheKey, std::shared_ptr<const PlanFile>> &cache() {
  static std::map<CacheKey, std::shared_ptr<const PlanFile>> plans;
  return plans;
}

} // namespace

std::shared_ptr<const PlanFile> compilePlan(const std::string &mlirText,
                                            const std::string &gradMode,
                                            const std::string &name,
                                            bool fuse) {
  CacheKey key{mlirText, gradMode, fuse};
  {
    std::lock_guard<std::mutex> lock(cacheMutex);
    auto it = cache().find(key);
    if (it != cache().end())
      return it->second;
  }
  // Then the plan cache on disk (runtime/plan/PlanCache.h): a process that
  // finds its plan there compiles nothing.
  PlanRequest request{mlirText, name, gradMode, fuse};
  std::optional<std::string> directory = planCacheDirectory();
  if (directory)
    if (auto plan = loadCachedPlan(*directory, request)) {
      std::lock_guard<std::mutex> lock(cacheMutex);
      return cache().emplace(key, plan).first->second;
    }

  mlir::DialectRegistry registry;
  mlir::dloss::registerLossDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(mlirText, name), llvm::SMLoc());
  std::string messages;
  llvm::raw_string_ostream os(messages);
  mlir::SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context, os);

  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::dloss::parseLoss(sourceMgr, &context);
  bool ok = static_cast<bool>(module);
  if (ok && !gradMode.empty())
    ok = mlir::succeeded(mlir::dloss::overrideGradMode(*module, gradMode));
  mlir::FailureOr<std::string> bytes = mlir::failure();
  if (ok)
    bytes = mlir::dloss::compileToPlan(*module, name, fuse);
  if (mlir::failed(bytes))
    throw Error("the loss '" + name + "' did not compile:\n" + messages,
                "fix the loss at the location the compiler names");

  auto plan = PlanFile::fromBytes(
      std::vector<uint8_t>(bytes->begin(), bytes->end()), name);
  ++compiled;
  if (directory)
    storeCachedPlan(*directory, request, *plan);
  std::lock_guard<std::mutex> lock(cacheMutex);
  cache().emplace(key, plan);
  return plan;
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
  auto plan = compilePlan(mlirText, options.gradMode, "<jit>", options.fuse);
  return CompiledLoss(
      plan, options.communicator ? options.communicator : defaultCommunicator(),
      options.entry);
}

CompiledLoss compile(const Graph &graph, Options options) {
  auto plan =
      compilePlan(graph.toMlir(), options.gradMode, graph.name(), options.fuse);
  return CompiledLoss(
      plan, options.communicator ? options.communicator : defaultCommunicator(),
      options.entry.empty() ? graph.name() : options.entry);
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
