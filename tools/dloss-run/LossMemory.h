// A loss's memory (Linux), two ways:
//  - first call on: peak RSS minus the RSS right before the first call. It
//    also counts what the process sets up once (code pages first touched,
//    thread pools, the communicator's buffers), tens of MB that any training
//    step pays once, whatever its loss.
//  - steady state: peak RSS of the later calls minus the RSS once the first
//    call is over and the heap's free memory is given back (malloc_trim):
//    what each training step needs.
//
// Header-only, shared by dloss-run and bench/eager_clip.cpp so that both
// measure the same quantity the same way.
#ifndef DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H
#define DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H

#include <malloc.h>
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

/// "5" to /proc/self/clear_refs resets VmHWM to the current RSS (proc(5));
/// false when the kernel refuses.
inline bool resetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out)
    return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

/// Blocks of this size and up are their own mappings while a loss is measured.
constexpr int kMeasuredMmapThreshold = 1 << 20;

/// Fixes glibc's mmap threshold at kMeasuredMmapThreshold, unless the user
/// set MALLOC_MMAP_THRESHOLD_; true when fixed here. By default glibc raises
/// the threshold to the largest block freed so far (up to 32 MiB), and from
/// then on blocks of 1-32 MiB come from the heap, whose freed middle stays
/// resident: the peak RSS then counts tensors already freed, not what the
/// loss holds at once. Measured on ArcFace's fused plan (16384 classes,
/// B_local 4096): 79 MiB per step with the dynamic threshold, 42 MiB with a
/// fixed one, which is dlossc --report's estimate of its live tensors.
/// Blocks over 32 MiB (the unfused plans' matrices) are mappings either way.
inline bool fixMmapThreshold() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_"))
    return false;
  return mallopt(M_MMAP_THRESHOLD, kMeasuredMmapThreshold) == 1;
}

/// Start with `LossMemory::start()` right before the first call (inputs
/// loaded, peers met), call `steady()` after the first (warm-up) call and
/// `stop()` after the last one.
struct LossMemory {
  long baselineKb = -1; // VmRSS right before the first call
  long hwmKb = -1;      // the calls' peak RSS (VmHWM)
  long lastHwmKb = -1;  // VmHWM after the calls (the later ones', if steady())
  long firstHwmKb = -1; // VmHWM after the first call (steady() was called)
  long steadyBaselineKb = -1; // VmRSS after the first call, heap trimmed
  long peakBeforeKb = 0; // VmHWM before the reset: the process's peak so far
  long maxRssKb = 0;     // getrusage's ru_maxrss after the calls
  // Whether VmHWM was reset; if not, hwmKb may be a peak from before start().
  bool hwmReset = false;
  // Whether it was reset again by steady(): the steady state is measured.
  bool steadyReset = false;
  // Whether start() fixed glibc's mmap threshold (fixMmapThreshold).
  bool mmapThresholdFixed = false;

  /// Also fixes the mmap threshold, so that every program measured this way
  /// (dloss-run's plans, the eager baseline) frees large blocks alike.
  static LossMemory start() {
    LossMemory m;
    m.mmapThresholdFixed = fixMmapThreshold();
    m.peakBeforeKb = std::max(0L, procStatusKb("VmHWM"));
    // If the reset is refused, the peak also covers what ran before.
    m.hwmReset = resetPeakRss();
    m.baselineKb = procStatusKb("VmRSS");
    return m;
  }

  /// After the first call: keeps its peak, gives the heap's free memory back
  /// to the kernel and measures the later calls from the RSS that remains.
  void steady() {
    firstHwmKb = procStatusKb("VmHWM");
    malloc_trim(0);
    steadyReset = hwmReset && resetPeakRss();
    steadyBaselineKb = procStatusKb("VmRSS");
  }

  void stop() {
    lastHwmKb = procStatusKb("VmHWM");
    hwmKb = std::max(lastHwmKb, firstHwmKb);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    maxRssKb = usage.ru_maxrss;
  }

  double baselineMb() const { return baselineKb / 1024.0; }
  double hwmMb() const { return hwmKb / 1024.0; }
  /// What the calls added at their peak: VmHWM - baseline VmRSS.
  double lossMb() const { return (hwmKb - baselineKb) / 1024.0; }
  /// What one of the later calls added at its peak (steady()), or -1 when
  /// it could not be measured (no steady(), VmHWM not resettable).
  double steadyMb() const {
    if (!steadyReset)
      return -1;
    return (lastHwmKb - steadyBaselineKb) / 1024.0;
  }
  /// The process's total peak RSS since it started; the reset lowers VmHWM
  /// (and with it ru_maxrss), so the peak before the reset is kept apart.
  double peakRssMb() const {
    return std::max({peakBeforeKb, hwmKb, maxRssKb}) / 1024.0;
  }
};

} // namespace tools
} // namespace dloss

#endif // DLOSS_TOOLS_DLOSS_RUN_LOSSMEMORY_H
