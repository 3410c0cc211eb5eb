// A loss's memory: peak RSS minus the RSS right before its first call (Linux).
//
// Header-only, shared by dloss-run and bench/eager_clip.cpp so that both
// measure the same quantity the same way.
#ifndef DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H
#define DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H

#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace dloss {
namespace tools {

/// A field of /proc/self/status in kB (VmRSS, VmHWM), or -1 if absent.
inline long procStatusKb(const char *key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t n = std::string(key).size();
  while (std::getline(in, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::atol(line.c_str() + n + 1);
  return -1;
}

/// Start with `LossMemory::start()` right before the first call (inputs
/// loaded, peers met), stop with `stop()` after the last one.
struct LossMemory {
  long baselineKb = -1;  // VmRSS right before the first call
  long hwmKb = -1;       // VmHWM after the calls
  long peakBeforeKb = 0; // VmHWM before the reset: the process's peak so far
  long maxRssKb = 0;     // getrusage's ru_maxrss after the calls
  // Whether VmHWM was reset; if not, hwmKb may be a peak from before start().
  bool hwmReset = false;

  static LossMemory start() {
    LossMemory m;
    m.peakBeforeKb = std::max(0L, procStatusKb("VmHWM"));
    // "5" resets VmHWM to the current RSS (proc(5), clear_refs); the kernel
    // may refuse it, then the peak also covers what ran before this point.
    {
      std::ofstream out("/proc/self/clear_refs");
      if (out) {
        out << "5";
        out.flush();
        m.hwmReset = static_cast<bool>(out);
      }
    }
    m.baselineKb = procStatusKb("VmRSS");
    return m;
  }

  void stop() {
    hwmKb = procStatusKb("VmHWM");
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    maxRssKb = usage.ru_maxrss;
  }

  double baselineMb() const { return baselineKb / 1024.0; }
  double hwmMb() const { return hwmKb / 1024.0; }
  /// What the calls added at their peak: VmHWM - baseline VmRSS.
  double lossMb() const { return (hwmKb - baselineKb) / 1024.0; }
  /// The process's total peak RSS since it started; the reset lowers VmHWM
  /// (and with it ru_maxrss), so the peak before the reset is kept apart.
  double peakRssMb() const {
    return std::max({peakBeforeKb, hwmKb, maxRssKb}) / 1024.0;
  }
};

} // namespace tools
} // namespace dloss

#endif // DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H
