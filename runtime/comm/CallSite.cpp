// The thread's current call site: what the executor is running while it
// calls a collective.
#include "runtime/comm/CallSite.h"

namespace dloss {

namespace {
thread_local const CallSite *currentSite = nullptr;
} // namespace

const CallSite *currentCallSite() { return currentSite; }

CallSiteScope::CallSiteScope(const CallSite &site) : previous(currentSite) {
  currentSite = &site;
}

CallSiteScope::~CallSiteScope() { currentSite = previous; }

} // namespace dloss
