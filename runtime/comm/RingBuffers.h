// How the Gloo engine's ring reduce_scatter buffers its blocks: the engine
// sizes its pool by it, the compiler's cost report counts it.
//
// Header-only and free of ATen and MLIR, so that dialect/DlossCosts.cpp
// reads the engine's own description instead of a copy of it.
#ifndef DLOSS_RUNTIME_COMM_RINGBUFFERS_H
#define DLOSS_RUNTIME_COMM_RINGBUFFERS_H

#include <algorithm>
#include <cstdint>

namespace dloss {

/// Temporary blocks (each the size of the largest rank's block) that the
/// Gloo engine's ring reduce_scatter holds besides its input and result, over
/// `worldSize` ranks. In each step a rank sends one partial block and
/// receives the next, so it holds at most two: the one going out and the one
/// coming in. The last block received lands in the result, and the first one
/// sent goes out of the input itself when `firstBlockContiguous` (the blocks
/// are slices of the leading non-trivial axis).
constexpr int64_t glooReduceScatterBuffers(int64_t worldSize,
                                           bool firstBlockContiguous) {
  if (worldSize < 2)
    return 0;
  return std::min<int64_t>(2, firstBlockContiguous ? worldSize - 2
                                                   : worldSize - 1);
}

} // namespace dloss

#endif // DLOSS_RUNTIME_COMM_RINGBUFFERS_H
