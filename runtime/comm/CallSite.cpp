// The thread's current call site: what the executor is running while it
// calls a collective, located at the user's call where dloss's own source
// line would mean nothing to them.
#include "runtime/comm/CallSite.h"

#include <mutex>
#include <vector>

namespace dloss {

namespace {
thread_local const CallSite *currentSite = nullptr;
thread_local const std::string *currentCaller = nullptr;

std::mutex ownDirsMutex;
std::vector<std::string> &ownDirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
} // namespace

const CallSite *currentCallSite() { return currentSite; }

bool isOwnLocation(const std::string &location) {
  std::string path = location.substr(0, location.find(':'));
  if (path.rfind("frontend/", 0) == 0 || path.rfind("dloss/", 0) == 0)
    return true;
  std::lock_guard<std::mutex> lock(ownDirsMutex);
  for (const std::string &dir : ownDirs())
    if (path.rfind(dir, 0) == 0)
      return true;
  return false;
}

void addOwnSourceDir(const std::string &dir) {
  std::lock_guard<std::mutex> lock(ownDirsMutex);
  ownDirs().push_back(dir);
}

CallSiteScope::CallSiteScope(const CallSite &site) : previous(currentSite) {
  currentSite = &site;
  if (currentCaller &&
      (site.location.empty() || isOwnLocation(site.location))) {
    located = site;
    located.location = *currentCaller;
    currentSite = &located;
  }
}

CallSiteScope::~CallSiteScope() { currentSite = previous; }

CallerScope::CallerScope(std::string where)
    : location(std::move(where)), previous(currentCaller) {
  if (!location.empty())
    currentCaller = &location;
}

CallerScope::~CallerScope() { currentCaller = previous; }

} // namespace dloss
