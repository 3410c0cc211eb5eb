// The fused ops' arithmetic on one similarity tile: blocking, scratch, targets,
// online log-sum-exp, backpropagation.
//
// A chunk is processed in blocks of Br rows x Bc columns: one GEMM (tileGemm)
// into a preallocated tile sized to half the L2 cache, then the element-wise
// math in place on it. Extra memory is O((n_r + 2 m_max) d + Br Bc): the two
// chunk buffers, the carries and a few tiles, never n_r x M.
#ifndef DLOSS_RUNTIME_FUSED_TILEMATH_H
#define DLOSS_RUNTIME_FUSED_TILEMATH_H

#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/FusedKernels.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace dloss::fused {

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

/// c = alpha op(a) op(b) + beta c for row-major f32 or f64 matrices: op(a)
/// is m x k, op(b) k x n and c m x n, with row strides lda, ldb, ldc (op(x)
/// = x^T where trans). The CPU tiles' GEMMs: sgemm_/dgemm_ of the BLAS that
/// ATen calls, found in the process, so the same kernels as at::mm without
/// its per-call dispatch, views and checks (about 20 ATen calls per CLIP
/// tile cost 2% of a step); addmm_ (tileGemmATen) where LibTorch keeps its
/// BLAS to itself (wheels with MKL linked in) or a size exceeds BLAS's int.
template <typename T>
void tileGemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              T alpha, const T *a, int64_t lda, const T *b, int64_t ldb, T beta,
              T *c, int64_t ldc);
/// tileGemm through ATen: the fallback (tested beside tileGemm).
template <typename T>
void tileGemmATen(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
                  T alpha, const T *a, int64_t lda, const T *b, int64_t ldb,
                  T beta, T *c, int64_t ldc);
/// Whether tileGemm calls the process's BLAS (false: ATen).
bool tileGemmCallsBlas();

/// Checks that `tile` is a contiguous [block.rows, block.cols] matrix; `what`
/// names the caller in the error (an internal invariant: the fused ops make
/// their tiles so).
void checkTile(const at::Tensor &tile, const Block &block, const char *what);

/// S = rows[block] x cols[block]^T, written into `out`.
at::Tensor similarityTile(const Similarity &sim, const at::Tensor &cols,
                          const Block &block, at::Tensor out);

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

/// The log-sum-exp of running statistics.
at::Tensor lseOf(const at::Tensor &max, const at::Tensor &sum);

/// Backpropagates a tile's gradient G = dLoss/dL through L = scale S:
/// dRows[block] += scale G cols[block], dCols[block] += scale G^T
/// rows[block].
void backpropGemms(const at::Tensor &grad, const Block &block,
                   const Similarity &operands, const at::Tensor &cols,
                   at::Tensor &dRows, at::Tensor &dCols);
/// The same for L = scale rows cols^T (f32 or f64, rows contiguous; grad
/// a contiguous [block.rows, block.cols] tile).
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
