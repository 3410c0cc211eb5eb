// The fused kernels' element-wise tile passes as vectorised loops
// (TileLoops.cpp, built under the row loops' flags): log-sum-exp folds in
// either or both directions, CLIP's and SigLIP's gradient tiles, SigLIP's
// softplus sums.
#ifndef DLOSS_RUNTIME_FUSED_TILELOOPS_H
#define DLOSS_RUNTIME_FUSED_TILELOOPS_H

#include "runtime/fused/TileShape.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace dloss::fused {

/// Checks that `tile` is a contiguous [block.rows, block.cols] matrix; `what`
/// names the caller in the error (an internal invariant: the fused ops make
/// their tiles so).
void checkTile(const at::Tensor &tile, const Block &block, const char *what);

// The tile loops below (TileLoops.cpp) take `tile` (f32 or f64, the
// contiguous [block.rows, block.cols] tile at `block`) and whole contiguous
// vectors of its type: a row-indexed one (every row's statistics, log-sum-
// exps, cotangents) is read and written at the tile's rows, from block.row
// on, a column-indexed one at its columns, from block.col on. No views per
// tile: a tile's ATen calls cost as much as its loops at these sizes.

/// Folds `scale * tile` into running statistics along `dim` (1: max and
/// sum are row-indexed, one per tile row; 0: column-indexed), in
/// vectorised loops: one read of the tile for the maxima and one, with one
/// exp per element, for the sums. `tile` is not changed; infinities behave
/// as in mergeLse.
void foldLse(const at::Tensor &tile, double scale, int64_t dim,
             const Block &block, const at::Tensor &max, const at::Tensor &sum);

/// foldLse along both dims at once (CLIP's forward tile), with one exp per
/// element instead of two. The same statistics as two foldLse calls, to
/// rounding.
void foldLseBoth(const at::Tensor &tile, double scale, const Block &block,
                 const at::Tensor &rowMax, const at::Tensor &rowSum,
                 const at::Tensor &colMax, const at::Tensor &colSum);

/// CLIP's gradient tile in one vectorised pass: grad[i, j] = ctRow[i]
/// exp(scale s - rowLse[i]) + ctCol[j] exp(scale s - colLse[j]). One exp per
/// element where the tile's row and column log-sum-exps lie within 40 of
/// each other (the second term is then the first's exp times a per-row and
/// a per-column factor), two otherwise. Returns (sum(grad * s), the sum of
/// the column direction's part times s).
std::pair<double, double>
softmaxTileGradient(const at::Tensor &s, double scale, const Block &block,
                    const at::Tensor &rowLse, const at::Tensor &ctRow,
                    const at::Tensor &colLse, const at::Tensor &ctCol,
                    at::Tensor grad);

/// The one-exp softmax gradients' factors (TileLoops.cpp): for a tile whose
/// row and column log-sum-exps are finite and lie within 40 of each other,
/// exp(rowLse[i] - colLse[j]) = u[i] v[j] (each within e^+-40); sets u and
/// cv[j] = ctCol[j] v[j] and returns true. False (two exps needed)
/// otherwise. Where exp(x - rowLse[i]) then underflows, the column term
/// exp(x - colLse[j]) is below e^-47.
template <typename T>
bool sharedLseFactors(const T *rowLse, int64_t rows, const T *colLse,
                      const T *ctCol, int64_t cols, std::vector<T> &u,
                      std::vector<T> &cv);

/// SigLIP's forward tile: rowSum[i] += sum_j softplus(scale s[i, j] +
/// bias), one vectorised pass.
void softplusRowSums(const at::Tensor &s, double scale, double bias,
                     const Block &block, const at::Tensor &rowSum);

/// SigLIP's gradient tile in one vectorised pass: grad[i, j] = ct[i]
/// sigmoid(scale s + bias). Returns (sum(grad), sum(grad * s)).
std::pair<double, double> sigmoidTileGradient(const at::Tensor &s, double scale,
                                              double bias, const Block &block,
                                              const at::Tensor &ct,
                                              at::Tensor grad);

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_TILELOOPS_H
