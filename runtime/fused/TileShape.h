// How large the fused ops' similarity tiles are and where each lies
// (TileShape.cpp): from the L2 cache on the CPU, fixed on the GPU,
// DLOSS_TILE for both.
#ifndef DLOSS_RUNTIME_FUSED_TILESHAPE_H
#define DLOSS_RUNTIME_FUSED_TILESHAPE_H

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dloss {

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

namespace fused {

/// The tile for a `rows` x `cols` problem of `type`: fusedTileShape, never
/// larger than the problem.
TileShape clippedTile(int64_t rows, int64_t cols, at::ScalarType type);
/// The GPU tile, clipped the same way: DLOSS_TILE when set (tests cross
/// block edges with it), otherwise 2048 x 4096.
TileShape deviceTileShape(int64_t rows, int64_t cols);

/// A tile's place: rows [row, row + rows) x columns [col, col + cols).
struct Block {
  int64_t row, rows, col, cols;
};

/// Calls fn(block) for every tile of a `rows` x `cols` matrix.
template <typename Fn>
void forEachBlock(int64_t rows, int64_t cols, TileShape tile, Fn &&fn) {
  for (int64_t col = 0; col < cols; col += tile.cols)
    for (int64_t row = 0; row < rows; row += tile.rows)
      fn(Block{row, std::min(tile.rows, rows - row), col,
               std::min(tile.cols, cols - col)});
}

} // namespace fused
} // namespace dloss

#endif // DLOSS_RUNTIME_FUSED_TILESHAPE_H
