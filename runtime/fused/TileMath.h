// The fused ops' arithmetic on one similarity tile: scratch, targets, online
// log-sum-exp, backpropagation (TileMath.cpp). Its users also get the tiles'
// shapes and blocks (TileShape.h), GEMMs (TileGemm.h) and vectorised loops
// (TileLoops.h).
//
// A chunk is processed in blocks of Br rows x Bc columns: one GEMM (tileGemm)
// into a preallocated tile sized to half the L2 cache, then the element-wise
// math in place on it. Extra memory is O((n_r + 2 m_max) d + Br Bc): the two
// chunk buffers, the carries and a few tiles, never n_r x M.
#ifndef DLOSS_RUNTIME_FUSED_TILEMATH_H
#define DLOSS_RUNTIME_FUSED_TILEMATH_H

#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/FusedKernels.h"
#include "runtime/fused/TileGemm.h"
#include "runtime/fused/TileLoops.h"
#include "runtime/fused/TileShape.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace dloss::fused {

/// Tile buffers, allocated once per call and reused by every tile.
class TileScratch {
public:
  TileScratch(TileShape shape, int count, at::TensorOptions options) {
    for (int i = 0; i < count; ++i)
      buffers.push_back(at::empty({shape.rows * shape.cols}, options));
  }
  /// Buffer `which` as a contiguous [block.rows, block.cols] matrix: one
  /// view per buffer and shape, made once (a chunk's blocks have at most
  /// four shapes). Not for concurrent callers.
  at::Tensor operator()(int which, const Block &block) const {
    for (const View &view : views)
      if (view.which == which && view.rows == block.rows &&
          view.cols == block.cols)
        return view.tensor;
    views.push_back({which, block.rows, block.cols,
                     buffers[which]
                         .narrow(0, 0, block.rows * block.cols)
                         .view({block.rows, block.cols})});
    return views.back().tensor;
  }

private:
  struct View {
    int which;
    int64_t rows, cols;
    at::Tensor tensor;
  };
  Tensors buffers;
  mutable std::vector<View> views;
};

/// fn(block, scratch) for every block of a rows x cols problem (a side of
/// the gather of both sides), with `buffers` tile buffers of the tile the
/// sizes clip to.
template <typename Fn>
void forSideBlocks(int64_t rows, int64_t cols, const FusedArgs &args,
                   int buffers, Fn &&fn) {
  TileShape tile = clippedTile(rows, cols, args.compute);
  TileScratch scratch(tile, buffers, args.options());
  forEachBlock(rows, cols, tile,
               [&](const Block &block) { fn(block, scratch); });
}

/// S = rows[block] x cols[block]^T, written into `out`.
at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out);
/// The same, read from `kept` where it is defined: the call's S of these
/// rows over every column (keptSimilarity), `cols` starting at column
/// `colBase` of it. keepTile stores a computed tile there (where defined).
at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out,
                          const at::Tensor &kept, int64_t colBase);
void keepTile(const at::Tensor &kept, const at::Tensor &s, const Block &block,
              int64_t colBase);

/// Single elements of a contiguous f32 or f64 tensor.
class Elements {
public:
  explicit Elements(const at::Tensor &tensor)
      : isDouble(tensor.scalar_type() == at::kDouble), data(tensor.data_ptr()) {
  }
  double get(int64_t k) const {
    return isDouble ? static_cast<const double *>(data)[k]
                    : static_cast<const float *>(data)[k];
  }
  void set(int64_t k, double value) const {
    if (isDouble)
      static_cast<double *>(data)[k] = value;
    else
      static_cast<float *>(data)[k] = static_cast<float>(value);
  }
  void add(int64_t k, double value) const { set(k, get(k) + value); }

private:
  bool isDouble;
  void *data;
};

/// Calls fn(k, c) for every k in [begin, begin + count) whose target lies in
/// [low, low + width), with c = targets[k] - low.
template <typename Fn>
void forTargetsIn(const at::Tensor &targets, int64_t begin, int64_t count,
                  int64_t low, int64_t width, Fn &&fn) {
  const int64_t *data = targets.data_ptr<int64_t>();
  for (int64_t k = begin; k < begin + count; ++k) {
    int64_t c = data[k] - low;
    if (c >= 0 && c < width)
      fn(k, c);
  }
}

/// The tile elements of this rank's rows' targets: fn(k, element index) for
/// each row k of the block whose target column (global; the tile's columns
/// start at global column `colBase`) is in the block.
template <typename Fn>
void forRowTargets(const at::Tensor &targets, const Block &block,
                   int64_t colBase, Fn &&fn) {
  forTargetsIn(
      targets, block.row, block.rows, colBase + block.col, block.cols,
      [&](int64_t i, int64_t c) { fn(i, (i - block.row) * block.cols + c); });
}

/// The same for columns whose target row (global; the tile's rows start at
/// global row `rowBase`) is in the block.
template <typename Fn>
void forColTargets(const at::Tensor &targets, const Block &block,
                   int64_t rowBase, Fn &&fn) {
  forTargetsIn(
      targets, block.col, block.cols, rowBase + block.row, block.rows,
      [&](int64_t j, int64_t c) { fn(j, c * block.cols + (j - block.col)); });
}

/// `x` with infinities replaced by 0: a shift that keeps exp(-inf - shift) =
/// 0 instead of exp(-inf + inf) = NaN.
at::Tensor finiteShift(const at::Tensor &x);

/// Online log-sum-exp: folds the statistics (max2, sum2) into (max1, sum1),
/// in place; sum is the sum of exp(x - max), an empty set has (-inf, 0).
void mergeLse(at::Tensor max1, at::Tensor sum1, const at::Tensor &max2,
              const at::Tensor &sum2);

/// The log-sum-exp of running statistics.
at::Tensor lseOf(const at::Tensor &max, const at::Tensor &sum);

/// Backpropagates a tile's gradient G = dLoss/dL through L = scale S:
/// dRows[block] += scale G cols[block], dCols[block] += scale G^T
/// rows[block].
void backpropGemms(const at::Tensor &grad, const Block &block,
                   const Similarity &operands, const at::Tensor &cols,
                   at::Tensor &dRows, at::Tensor &dCols);
/// The same for L = scale rows cols^T (f32 or f64, rows contiguous; grad
/// a contiguous [block.rows, block.cols] tile). An undefined dRows or dCols
/// is skipped: the gather's two sides each want one of them.
void backpropGemms(const at::Tensor &grad, const Block &block,
                   const at::Tensor &rows, const at::Tensor &cols, double scale,
                   at::Tensor &dRows, at::Tensor &dCols);

/// backpropGemms, and returns sum(G * S), the tile's part of dLoss/dscale.
double backpropTile(const at::Tensor &grad, const at::Tensor &sim,
                    const Block &block, const Similarity &operands,
                    const at::Tensor &cols, at::Tensor &dRows,
                    at::Tensor &dCols);

/// Running log-sum-exp statistics per row (max, sum of exp(x - max); empty:
/// (-inf, 0)) and the value each row picks at its target.
struct RowStatistics {
  at::Tensor max, sum, picked;
};

/// Empty statistics for `n` rows.
RowStatistics rowStatistics(int64_t n, const FusedArgs &args);

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_TILEMATH_H
