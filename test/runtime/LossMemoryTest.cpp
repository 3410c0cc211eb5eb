// LossMemory (tools/dloss-run/LossMemory.h): the two figures dloss-run and
// the benches report, on allocations of known size.
#include "tools/dloss-run/LossMemory.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kMiB = 1024 * 1024;

/// A touched block of `mib` MiB.
char *touched(size_t mib) {
  char *block = static_cast<char *>(std::malloc(mib * kMiB));
  std::memset(block, 1, mib * kMiB);
  // The block escapes: its stores cannot be trimmed as dead before free().
  asm volatile("" : : "r"(block) : "memory");
  return block;
}

/// A "call" that allocates `mib` MiB, touches every page and frees it.
void call(size_t mib) { std::free(touched(mib)); }

TEST(LossMemoryTest, FirstCallAndSteadyStateAreMeasuredApart) {
  using dloss::tools::LossMemory;
  auto memory = LossMemory::start();
  if (!memory.hwmReset)
    GTEST_SKIP() << "the kernel refuses to reset VmHWM (clear_refs)";
  call(96); // the first call, larger than the later ones
  memory.steady();
  call(32);
  call(32);
  memory.stop();
  // Page rounding and the allocator's own pages allow a few MiB either way.
  EXPECT_GE(memory.lossMb(), 90.0);
  EXPECT_LE(memory.lossMb(), 110.0);
  EXPECT_GE(memory.steadyMb(), 28.0);
  EXPECT_LE(memory.steadyMb(), 40.0);
}

/// A "call" that takes `mib` MiB in 16 KiB heap blocks, touches and frees
/// them: the heap keeps freed blocks in RSS for the next call to reuse.
void heapCall(size_t mib) {
  constexpr size_t kBlock = 16 * 1024;
  std::vector<char *> blocks(mib * kMiB / kBlock);
  for (char *&block : blocks) {
    block = static_cast<char *>(std::malloc(kBlock));
    std::memset(block, 1, kBlock);
  }
  // A block kept above them (as a long-lived tensor would be) stops free()
  // from shrinking the heap when they go.
  static std::vector<void *> kept;
  kept.push_back(std::malloc(kBlock));
  for (char *block : blocks)
    std::free(block);
}

// A step's heap memory is counted although the first call left that much
// free heap behind: steady() gives it back first, or the step would reuse it
// without growing the RSS and seem to need nothing.
TEST(LossMemoryTest, AStepsHeapIsCountedAfterTheFirstCallsHeapIsFreed) {
  using dloss::tools::LossMemory;
  auto memory = LossMemory::start();
  if (!memory.hwmReset)
    GTEST_SKIP() << "the kernel refuses to reset VmHWM (clear_refs)";
  heapCall(64);
  memory.steady();
  heapCall(16);
  memory.stop();
  EXPECT_GE(memory.lossMb(), 60.0);
  EXPECT_GE(memory.steadyMb(), 14.0);
  EXPECT_LE(memory.steadyMb(), 24.0);
}

// Tensors freed in the middle of a step are not counted as held: at most
// 16 + 20 MiB are live at once below, but with glibc's dynamic mmap threshold
// (raised to 16 MiB by the first free) a and b come from the heap, a's freed
// block stays resident under the kept one and c grows the heap: 52 MiB.
// Exits 0 when the steady figure is a fixed threshold's, and says it.
void freedBlocksOfAStep() {
  using dloss::tools::LossMemory;
  auto memory = LossMemory::start();
  memory.steady();
  std::free(touched(16));
  char *a = touched(16);
  static std::vector<void *> kept;
  kept.push_back(std::malloc(64));
  char *b = touched(16);
  std::free(a);
  char *c = touched(20);
  std::free(b);
  std::free(c);
  memory.stop();
  const double steady = memory.steadyMb();
  std::fprintf(stderr, "threshold fixed: %d, steady %.1f MiB\n",
               memory.mmapThresholdFixed ? 1 : 0, steady);
  std::_Exit(memory.mmapThresholdFixed && steady >= 34.0 && steady <= 42.0 ? 0
                                                                           : 1);
}

// Run in a process of its own (gtest's threadsafe death-test style starts
// the test program again for it): free heap blocks that earlier tests of
// this process left (AStepsHeapIsCounted... keeps a block above 64 MiB of
// them) would serve a and b before any mapping, whatever the threshold,
// and the figure would be 52 MiB.
TEST(LossMemoryTest, FreedBlocksOfTheStepAreNotCountedAsHeld) {
  using dloss::tools::LossMemory;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_"))
    GTEST_SKIP() << "MALLOC_MMAP_THRESHOLD_ is set: the user's threshold wins";
  if (!dloss::tools::resetPeakRss())
    GTEST_SKIP() << "the kernel refuses to reset VmHWM (clear_refs)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(freedBlocksOfAStep(), ::testing::ExitedWithCode(0),
              "threshold fixed: 1, steady [0-9.]+ MiB");
}

TEST(LossMemoryTest, WithoutSteadyThereIsNoSteadyFigure) {
  auto memory = dloss::tools::LossMemory::start();
  call(4);
  memory.stop();
  EXPECT_EQ(memory.steadyMb(), -1.0);
}

} // namespace
