// The call site: what this thread is running while it calls a collective, for
// the communicators' errors and flight record.
#ifndef DLOSS_RUNTIME_COMM_CALLSITE_H
#define DLOSS_RUNTIME_COMM_CALLSITE_H

#include <string>

namespace dloss {

/// What the caller is doing while it calls a collective: the plan function,
/// the step's IR op and location, or a phase outside the steps ("preflight").
/// Communicators read it (currentCallSite()) to say where a collective
/// failed and to label their flight record; the executor sets it with a
/// CallSiteScope. Thread-local, so it passes through wrapping communicators.
struct CallSite {
  std::string function; ///< "clip_grad"; empty outside a plan function.
  std::string op;       ///< "dloss.all_gather"; empty outside a step.
  std::string location; ///< "clip.mlir:12:16"; empty when unknown.
  std::string phase;    ///< "preflight", "check"; empty inside a step.
};

/// The call site of this thread's innermost CallSiteScope, or nullptr.
const CallSite *currentCallSite();

/// Whether an IR location is in dloss's own sources (the graph of a
/// drop-in: "frontend/Losses.cpp:36", "dloss/losses.py:250", or a path under
/// a directory given to addOwnSourceDir, the installed Python package)
/// rather than in the user's program. Not for "".
bool isOwnLocation(const std::string &location);
/// Adds `dir` (ending in '/') to the places isOwnLocation knows.
void addOwnSourceDir(const std::string &dir);

/// Makes `site` the current call site until the scope ends (scopes nest).
/// Inside a CallerScope, a site with no location or one in dloss's own
/// sources takes the caller's instead: what peers, errors and flight
/// records name is the user's call of a drop-in, not dloss's source line.
class CallSiteScope {
public:
  explicit CallSiteScope(const CallSite &site);
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope &) = delete;
  CallSiteScope &operator=(const CallSiteScope &) = delete;

private:
  const CallSite *previous;
  CallSite located;
};

/// The user's `file:line` of the dloss call this thread runs (from Python's
/// frames), for the CallSiteScopes inside it; "" sets none.
class CallerScope {
public:
  explicit CallerScope(std::string location);
  ~CallerScope();
  CallerScope(const CallerScope &) = delete;
  CallerScope &operator=(const CallerScope &) = delete;

private:
  std::string location;
  const std::string *previous;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_CALLSITE_H
