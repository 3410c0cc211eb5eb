// The CPU kernels of the fused similarity ops (dloss.ring_softmax_ce, ...).
#ifndef DLOSS_RUNTIME_FUSEDKERNELS_H
#define DLOSS_RUNTIME_FUSEDKERNELS_H

#include "runtime/Kernels.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace dloss {

/// Adds the rules of the six fused ops to the kernel table.
void addFusedKernels(std::unordered_map<std::string, KernelRule> &table);

/// The rows x columns of one similarity tile.
struct TileShape {
  int64_t rows;
  int64_t cols;
};

/// The tile the fused kernels use for elements of `elementSize` bytes: about
/// half the L2 cache, columns a multiple of 64. The environment variable
/// DLOSS_TILE=RxC (e.g. 3x5) overrides it, for experiments and for tests of
/// the block edges; a malformed value raises dloss::Error.
TileShape fusedTileShape(size_t elementSize);

} // namespace dloss

#endif // DLOSS_RUNTIME_FUSEDKERNELS_H
