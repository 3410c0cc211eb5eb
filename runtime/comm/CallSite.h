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

/// Makes `site` the current call site until the scope ends (scopes nest).
class CallSiteScope {
public:
  explicit CallSiteScope(const CallSite &site);
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope &) = delete;
  CallSiteScope &operator=(const CallSiteScope &) = delete;

private:
  const CallSite *previous;
};

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_CALLSITE_H
