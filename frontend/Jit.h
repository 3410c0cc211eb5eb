// dloss::jit: compile a Graph or dloss MLIR text into a LibTorch callable with
// autograd.
#ifndef DLOSS_FRONTEND_JIT_H
#define DLOSS_FRONTEND_JIT_H

#include "frontend/Graph.h"
#include "runtime/autograd/CompiledLoss.h"

#include <memory>
#include <string>

namespace dloss::jit {

struct Options {
  /// The ranks to run on; default: defaultCommunicator().
  std::shared_ptr<Communicator> communicator;
  /// "ddp" or "global" to override the loss's gradient contract; "" keeps it.
  std::string gradMode;
  /// The loss to call when the text defines several.
  std::string entry;
  /// Fuse gather + similarity + loss into ring-tiled kernels
  /// (dloss-fuse-gather-similarity); false runs every op unfused.
  bool fuse = true;
  /// The fused ops' schedule ("ring", "gather" or "auto": the cost model
  /// chooses per call); "" follows the process default (DLOSS_SCHEDULE).
  std::string schedule;
};

/// Compiles dloss MLIR text to a plan: verify collectives, fuse (unless
/// `fuse` is false; with `generalOnly`, CLIP, SigLIP and PartialFC as the
/// general dloss.fused_similarity too), infer replication, derive @<loss>_grad,
/// lower. Plans are cached by (text, name, grad mode, fusion options) in memory
/// and on disk (runtime/plan/PlanCache.h: $DLOSS_CACHE_DIR, default
/// ~/.cache/dloss, `off` to disable): a plan does not depend on batch sizes,
/// dtypes of dynamic inputs or the world size, which the runtime receives at
/// each call (and checks in its preflight). A loss that does not compile raises
/// dloss::Error carrying the compiler's messages with their locations. The
/// compiler is libdloss_compiler, loaded on first use (CompilerLibrary.h).
std::shared_ptr<const PlanFile> compilePlan(const std::string &mlirText,
                                            const std::string &gradMode = "",
                                            const std::string &name = "<jit>",
                                            bool fuse = true,
                                            bool generalOnly = false);
/// The plan of `graph`, cached under the graph's recording (every op with
/// its user's line, Graph::recording()) rather than its MLIR text, so that a
/// machine without the compiler library runs a graph compiled elsewhere.
/// Without the compiler library, a plan not in the cache is a dloss::Error
/// naming its cache key and directory.
std::shared_ptr<const PlanFile> compilePlan(const Graph &graph,
                                            const std::string &gradMode = "",
                                            bool fuse = true);

/// A callable loss: `loss = compiled({image, text, scale}); loss.backward();`
CompiledLoss compile(const Graph &graph, Options options = {});
CompiledLoss compile(const std::string &mlirText, Options options = {});

/// This process's communicator, connected once from the torchrun variables
/// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) over the c10d group of
/// connectProcessGroup (Gloo for CPU tensors; NCCL for CUDA ones where torch
/// has it and a GPU is visible: set the current device first); a
/// single-process communicator when WORLD_SIZE is unset.
std::shared_ptr<Communicator> defaultCommunicator();

/// Plans this process compiled (found neither in memory nor on disk).
int64_t plansCompiled();

/// Number of plans cached in memory, and a way to drop them (the disk cache
/// stays).
size_t cachedPlans();
void clearPlanCache();

} // namespace dloss::jit

#endif // DLOSS_FRONTEND_JIT_H
