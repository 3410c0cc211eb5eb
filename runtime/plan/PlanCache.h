// The on-disk plan cache: compiled plans keyed by a hash of the loss's source
// and the compile options, so that a process (or a machine without the
// compiler) that finds its plan compiles nothing.
#ifndef DLOSS_RUNTIME_PLANCACHE_H
#define DLOSS_RUNTIME_PLANCACHE_H

#include "runtime/plan/PlanFile.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dloss {

/// What a plan is compiled from. Everything that can change the plan's bytes
/// is here, so equal requests share an entry and different ones never do.
struct PlanRequest {
  std::string source;   ///< MLIR text, or a Graph's recording.
  std::string name;     ///< The source's name in locations ("<jit>", a path).
  std::string gradMode; ///< "", "ddp" or "global".
  bool fuse = true;
  /// CLIP, SigLIP and PartialFC fused as the general op too (dlossc
  /// --general-fusion-only).
  bool generalOnly = false;
};

/// The directory of cached plans: $DLOSS_CACHE_DIR, else
/// $XDG_CACHE_HOME/dloss, else ~/.cache/dloss; nullopt when caching is off
/// (DLOSS_CACHE_DIR=off, or no home directory to default to).
std::optional<std::string> planCacheDirectory();

/// The entry's key: 32 hex digits of a hash of the request, the plan format
/// version and the compiler's identity (kCompilerIdentity). Stable across
/// processes and machines of the same dloss build.
std::string planCacheKey(const PlanRequest &request);

/// How lookups went in this process (tests and logs read them).
struct PlanCacheStats {
  int64_t hits = 0;    ///< Plans read from disk.
  int64_t misses = 0;  ///< Requests with no entry.
  int64_t corrupt = 0; ///< Entries that failed their checks (then replaced).
  int64_t stored = 0;  ///< Plans written.
};
PlanCacheStats planCacheStats();

/// The cached plan of `request` in `directory`, or null when there is none.
/// An entry whose checks fail (truncated, corrupt, another request's under
/// a colliding key, a plan that does not verify) is never returned: it is
/// reported on stderr, counted, removed, and treated as missing.
std::shared_ptr<const PlanFile> loadCachedPlan(const std::string &directory,
                                               const PlanRequest &request);

/// Stores `plan` for `request` (written to a temporary file and renamed into
/// place, so concurrent ranks never read a partial entry). A directory that
/// cannot be written is reported once on stderr and otherwise ignored: the
/// cache is an optimisation.
void storeCachedPlan(const std::string &directory, const PlanRequest &request,
                     const PlanFile &plan);

} // namespace dloss

#endif // DLOSS_RUNTIME_PLANCACHE_H
