// The dedicated kernels' element-wise tile passes as loops the compiler
// vectorises (TileMath.h: foldLse, softmaxTileGradient, softplusRowSums,
// sigmoidTileGradient), instead of one ATen pass per operation: a
// log-sum-exp fold in either direction reads the tile once (plus once for
// its maxima) with one exp per element, CLIP's gradient tile is one pass with
// its two exps, SigLIP's forward and gradient tiles one pass each. The
// scalar functions are the tile programs' (Epilogue.h). Built like
// RowEvaluator.cpp (runtime/CMakeLists.txt): no FP traps, no errno,
// `omp simd` honoured, and each loop cloned for AVX-512, AVX2 and baseline
// x86-64.
#include "runtime/fused/TileLoops.h"

#include "runtime/fused/Epilogue.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace dloss::fused {

namespace {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DLOSS_TILE_LOOP                                                        \
  __attribute__((noinline, target_clones("avx512f", "avx2", "default")))
#else
#define DLOSS_TILE_LOOP
#endif

/// Forced inline: left to the inliner, GCC 12 kept it out of line in
/// gradientRow's clones, so CLIP's gradient tile called it per element
/// instead of vectorising (21% of a fused CLIP step in perf).
template <typename T> inline __attribute__((always_inline)) T expOf(T x) {
  return epilogue::detail::exp_(x);
}

/// expOf of x <= 88 (a difference from a maximum or a finite log-sum-exp):
/// cheaper, the same value (fastmath::expNonPositive).
template <typename T> inline __attribute__((always_inline)) T expBelowMax(T x) {
  return epilogue::detail::expNonPositive_(x);
}

/// A finite shift for exp(x - shift): an infinite maximum shifts by 0, so
/// exp(-inf - shift) stays 0 instead of NaN (TileMath's finiteShift).
template <typename T> T finite(T top) { return std::isinf(top) ? T(0) : top; }

/// max_j scale x[j] (-inf for none).
template <typename T>
DLOSS_TILE_LOOP T scaledMax(const T *__restrict x, T scale, int64_t w) {
  T top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < w; ++j) {
    T v = scale * x[j];
    top = v > top ? v : top;
  }
  return top;
}

/// sum_j exp(scale x[j] - shift).
template <typename T>
DLOSS_TILE_LOOP T scaledSumExp(const T *__restrict x, T scale, T shift,
                               int64_t w) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < w; ++j)
    acc += expOf(scale * x[j] - shift);
  return acc;
}

/// top[j] = max(top[j], scale x[j]).
template <typename T>
DLOSS_TILE_LOOP void maxInto(T *__restrict top, const T *__restrict x, T scale,
                             int64_t w) {
  for (int64_t j = 0; j < w; ++j) {
    T v = scale * x[j];
    top[j] = v > top[j] ? v : top[j];
  }
}

/// sum[j] += exp(scale x[j] - shift[j]).
template <typename T>
DLOSS_TILE_LOOP void sumExpInto(T *__restrict sum, const T *__restrict x,
                                T scale, const T *__restrict shift, int64_t w) {
  for (int64_t j = 0; j < w; ++j)
    sum[j] += expOf(scale * x[j] - shift[j]);
}

/// Returns max_j scale x[j] and raises colTop[j] to scale x[j]: both
/// directions' maxima in one read of a tile row.
template <typename T>
DLOSS_TILE_LOOP T maxBoth(const T *__restrict x, T scale, T *__restrict colTop,
                          int64_t w) {
  T top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < w; ++j) {
    const T v = scale * x[j];
    top = v > top ? v : top;
    colTop[j] = v > colTop[j] ? v : colTop[j];
  }
  return top;
}

/// Returns sum_j exp(scale x[j] - shift) and adds each term to colSum[j]:
/// both directions' sums from one exp per element.
template <typename T>
DLOSS_TILE_LOOP T sumExpBoth(const T *__restrict x, T scale, T shift,
                             T *__restrict colSum, int64_t w) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < w; ++j) {
    const T e = expBelowMax(scale * x[j] - shift); // shift: the maximum
    acc += e;
    colSum[j] += e;
  }
  return acc;
}

/// gradientRow with one exp per element: the column term ct[j] exp(scale
/// s[j] - lse[j]) is p u cv[j], p = exp(scale s[j] - rowLse), u =
/// exp(rowLse - K), cv[j] = ct[j] exp(K - lse[j]) (gradientTile).
template <typename T>
DLOSS_TILE_LOOP T gradientRowOneExp(T *__restrict g, const T *__restrict s,
                                    T scale, T rowLse, T a, T u,
                                    const T *__restrict cv, int64_t w,
                                    T &byCol) {
  T all = 0, col = 0;
#pragma omp simd reduction(+ : all, col)
  for (int64_t j = 0; j < w; ++j) {
    const T p = expBelowMax(scale * s[j] - rowLse); // a finite lse
    const T c = p * u * cv[j];
    const T v = a * p + c;
    g[j] = v;
    all += v * s[j];
    col += c * s[j];
  }
  byCol = col;
  return all;
}

/// g[j] = a exp(scale s[j] - rowLse) + ct[j] exp(scale s[j] - lse[j]), for
/// one tile row (a = the row's cotangent); returns sum_j g[j] s[j] and, in
/// byCol, sum_j (the second term) s[j].
template <typename T>
DLOSS_TILE_LOOP T gradientRow(T *__restrict g, const T *__restrict s, T scale,
                              T rowLse, T a, const T *__restrict lse,
                              const T *__restrict ct, int64_t w, T &byCol) {
  T all = 0, col = 0;
#pragma omp simd reduction(+ : all, col)
  for (int64_t j = 0; j < w; ++j) {
    const T logit = scale * s[j];
    const T c = ct[j] * expOf(logit - lse[j]);
    const T v = a * expOf(logit - rowLse) + c;
    g[j] = v;
    all += v * s[j];
    col += c * s[j];
  }
  byCol = col;
  return all;
}

/// sum_j softplus(scale s[j] + bias).
template <typename T>
DLOSS_TILE_LOOP T softplusSum(const T *__restrict s, T scale, T bias,
                              int64_t w) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < w; ++j)
    acc += epilogue::softplus(scale * s[j] + bias);
  return acc;
}

/// g[j] = a sigmoid(scale s[j] + bias); returns sum_j g[j], and sum_j g[j]
/// s[j] in `dot`.
template <typename T>
DLOSS_TILE_LOOP T sigmoidRow(T *__restrict g, const T *__restrict s, T scale,
                             T bias, T a, int64_t w, T &dot) {
  T sum = 0, gs = 0;
#pragma omp simd reduction(+ : sum, gs)
  for (int64_t j = 0; j < w; ++j) {
    const T v = a * epilogue::sigmoid(scale * s[j] + bias);
    g[j] = v;
    sum += v;
    gs += v * s[j];
  }
  dot = gs;
  return sum;
}

/// Rows per parallel task: enough elements to pay for the fork.
int64_t rowGrain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

template <typename T>
void foldRows(const at::Tensor &tile, T scale, T *max, T *sum) {
  const int64_t rows = tile.size(0), cols = tile.size(1);
  const T *x = tile.data_ptr<T>();
  at::parallel_for(0, rows, rowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T *row = x + i * cols;
      T top = scaledMax(row, scale, cols);
      top = top > max[i] ? top : max[i];
      const T shift = finite(top);
      // exp(max - shift) is 0 for an empty row (-inf) and inf for an
      // infinite one, as mergeLse has it.
      sum[i] = sum[i] * expOf(max[i] - shift) +
               scaledSumExp(row, scale, shift, cols);
      max[i] = top;
    }
  });
}

template <typename T>
void foldColumns(const at::Tensor &tile, T scale, T *max, T *sum) {
  const int64_t rows = tile.size(0), cols = tile.size(1);
  const T *x = tile.data_ptr<T>();
  // Columns split over threads; each walks every row of its slice, the
  // inner loops running along the row.
  const int64_t grain =
      std::max<int64_t>(64, 16384 / std::max<int64_t>(1, rows));
  at::parallel_for(0, cols, grain, [&](int64_t begin, int64_t end) {
    const int64_t w = end - begin;
    std::vector<T> top(max + begin, max + end), shift(w);
    for (int64_t i = 0; i < rows; ++i)
      maxInto(top.data(), x + i * cols + begin, scale, w);
    for (int64_t j = 0; j < w; ++j) {
      shift[j] = finite(top[j]);
      sum[begin + j] *= expOf(max[begin + j] - shift[j]);
    }
    for (int64_t i = 0; i < rows; ++i)
      sumExpInto(sum + begin, x + i * cols + begin, scale, shift.data(), w);
    std::copy(top.begin(), top.end(), max + begin);
  });
}

/// How far below the tile's maximum a row's or column's own maximum may lie
/// for the one-exp folds: exp(x - max) stays a normal float down to -87, so
/// an element that underflows there weighs below e^-23 in its row's (and
/// column's) sum. A row or column further down is summed with its own shift.
constexpr double kSharedShiftRange = 64;

/// Folds (top, s) (s the sum of exp(x - top)) into running statistics, as
/// foldRows does.
template <typename T> void mergeInto(T &max, T &sum, T top, T s) {
  const T next = top > max ? top : max;
  const T shift = finite(next);
  sum = sum * expOf(max - shift) + s * expOf(top - shift);
  max = next;
}

/// foldRows and foldColumns in two reads of the tile and one exp per
/// element: the row and column maxima, the tile's maximum m, then exp(x -
/// m) summed both ways. Rows and columns whose maximum lies more than
/// kSharedShiftRange below m (rare: a logit range over 64) are summed again
/// with their own shift; a tile with infinities or NaN takes foldRows and
/// foldColumns.
template <typename T>
void foldBoth(const at::Tensor &tile, T scale, T *rowMax, T *rowSum, T *colMax,
              T *colSum) {
  const int64_t rows = tile.size(0), cols = tile.size(1);
  const T *x = tile.data_ptr<T>();
  constexpr T inf = std::numeric_limits<T>::infinity();
  const int threads = std::max(1, at::get_num_threads());
  // Per thread: its rows' column maxima, then sums.
  std::vector<T> colTop(threads * cols, -inf), colAcc(threads * cols, T(0));
  std::vector<T> rowTop(rows), rowAcc(rows);
  const int64_t grain = rowGrain(cols);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    T *top = colTop.data() + at::get_thread_num() * cols;
    for (int64_t i = begin; i < end; ++i)
      rowTop[i] = maxBoth(x + i * cols, scale, top, cols);
  });
  for (int k = 1; k < threads; ++k)
    for (int64_t j = 0; j < cols; ++j)
      colTop[j] = std::max(colTop[j], colTop[k * cols + j]);
  T m = -inf;
  for (int64_t j = 0; j < cols; ++j)
    m = std::max(m, colTop[j]);
  if (!std::isfinite(m)) {
    foldRows(tile, scale, rowMax, rowSum);
    foldColumns(tile, scale, colMax, colSum);
    return;
  }
  const T low = m - T(kSharedShiftRange);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    T *acc = colAcc.data() + at::get_thread_num() * cols;
    for (int64_t i = begin; i < end; ++i) {
      const T *row = x + i * cols;
      const T s = sumExpBoth(row, scale, m, acc, cols);
      if (rowTop[i] == -inf)
        continue; // nothing but exp(-inf) = 0
      rowAcc[i] = rowTop[i] >= low ? s * expOf(m - rowTop[i])
                                   : scaledSumExp(row, scale, rowTop[i], cols);
      mergeInto(rowMax[i], rowSum[i], rowTop[i], rowAcc[i]);
    }
  });
  for (int k = 1; k < threads; ++k)
    for (int64_t j = 0; j < cols; ++j)
      colAcc[j] += colAcc[k * cols + j];
  for (int64_t j = 0; j < cols; ++j) {
    const T top = colTop[j];
    if (top == -inf)
      continue;
    T s = 0;
    if (top >= low)
      s = colAcc[j] * expOf(m - top);
    else // far below m: its own shift, a strided pass
      for (int64_t i = 0; i < rows; ++i)
        s += expOf(scale * x[i * cols + j] - top);
    mergeInto(colMax[j], colSum[j], top, s);
  }
}

/// Runs first = fn(i, second) for every tile row i, rows split over ATen's
/// threads; returns the sums of both over the rows.
template <typename Fn>
std::pair<double, double> rowPairSums(int64_t rows, int64_t cols, Fn &&fn) {
  std::vector<double> first(rows), second(rows);
  at::parallel_for(0, rows, rowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      first[i] = fn(i, second[i]);
  });
  std::pair<double, double> total{0.0, 0.0};
  for (int64_t i = 0; i < rows; ++i) {
    total.first += first[i];
    total.second += second[i];
  }
  return total;
}

template <typename T>
std::pair<double, double>
gradientTile(const at::Tensor &s, T scale, const T *rowLse, const T *ctRow,
             const T *colLse, const T *ctCol, at::Tensor &grad) {
  const int64_t rows = s.size(0), cols = s.size(1);
  const T *x = s.data_ptr<T>();
  T *g = grad.data_ptr<T>();
  std::vector<T> u, cv;
  if (sharedLseFactors(rowLse, rows, colLse, ctCol, cols, u, cv))
    return rowPairSums(rows, cols, [&](int64_t i, double &byCol) {
      T col = 0;
      T all = gradientRowOneExp(g + i * cols, x + i * cols, scale, rowLse[i],
                                ctRow[i], u[i], cv.data(), cols, col);
      byCol = col;
      return static_cast<double>(all);
    });
  return rowPairSums(rows, cols, [&](int64_t i, double &byCol) {
    T col = 0;
    T all = gradientRow(g + i * cols, x + i * cols, scale, rowLse[i], ctRow[i],
                        colLse, ctCol, cols, col);
    byCol = col;
    return static_cast<double>(all);
  });
}

template <typename T>
void softplusRows(const at::Tensor &s, T scale, T bias, T *rowSum) {
  const int64_t rows = s.size(0), cols = s.size(1);
  const T *x = s.data_ptr<T>();
  at::parallel_for(0, rows, rowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      rowSum[i] += softplusSum(x + i * cols, scale, bias, cols);
  });
}

template <typename T>
std::pair<double, double> sigmoidTile(const at::Tensor &s, T scale, T bias,
                                      const T *ct, at::Tensor &grad) {
  const int64_t cols = s.size(1);
  const T *x = s.data_ptr<T>();
  T *g = grad.data_ptr<T>();
  return rowPairSums(s.size(0), cols, [&](int64_t i, double &dot) {
    T gs = 0;
    T sum =
        sigmoidRow(g + i * cols, x + i * cols, scale, bias, ct[i], cols, gs);
    dot = gs;
    return static_cast<double>(sum);
  });
}

/// The data of a contiguous vector of the tile's type, from element
/// `offset` on; it holds `count` elements from there.
template <typename T>
T *dataOf(const at::Tensor &v, int64_t offset, int64_t count) {
  TORCH_CHECK(v.is_contiguous() && v.dim() == 1 &&
                  v.scalar_type() == c10::CppTypeToScalarType<T>::value &&
                  offset >= 0 && offset + count <= v.numel(),
              "a tile loop's vector is not a contiguous vector of the tile's "
              "type covering the tile");
  return v.data_ptr<T>() + offset;
}

/// A row-indexed vector's data at the tile's rows, a column-indexed one's
/// at its columns.
template <typename T> T *rowsAt(const at::Tensor &v, const Block &block) {
  return dataOf<T>(v, block.row, block.rows);
}
template <typename T> T *colsAt(const at::Tensor &v, const Block &block) {
  return dataOf<T>(v, block.col, block.cols);
}

} // namespace

void checkTile(const at::Tensor &tile, const Block &block, const char *what) {
  TORCH_CHECK(tile.is_contiguous() && tile.dim() == 2 &&
                  tile.size(0) == block.rows && tile.size(1) == block.cols,
              what, " takes a contiguous tile of its block's shape");
}

/// How far apart a tile's row and column log-sum-exps may lie for the
/// one-exp gradients: where p = exp(x - rowLse) underflows (x - rowLse <
/// -87), the column term p exp(rowLse - colLse) is below e^-47.
constexpr double kLseSpread = 40;

template <typename T>
bool sharedLseFactors(const T *rowLse, int64_t rows, const T *colLse,
                      const T *ctCol, int64_t cols, std::vector<T> &u,
                      std::vector<T> &cv) {
  if (rows == 0 || cols == 0)
    return false;
  const auto [rowLow, rowHigh] = std::minmax_element(rowLse, rowLse + rows);
  const auto [colLow, colHigh] = std::minmax_element(colLse, colLse + cols);
  if (!std::isfinite(*rowLow) || !std::isfinite(*rowHigh) ||
      !std::isfinite(*colLow) || !std::isfinite(*colHigh) ||
      *rowHigh - *colLow > T(kLseSpread) || *colHigh - *rowLow > T(kLseSpread))
    return false;
  // u[i] and v[j] each within e^+-40: K is midway between the row lses.
  const T K = (*rowLow + *rowHigh) / 2;
  u.resize(rows);
  cv.resize(cols);
  for (int64_t i = 0; i < rows; ++i)
    u[i] = expOf(rowLse[i] - K);
  for (int64_t j = 0; j < cols; ++j)
    cv[j] = ctCol[j] * expOf(K - colLse[j]);
  return true;
}

template bool sharedLseFactors<float>(const float *, int64_t, const float *,
                                      const float *, int64_t,
                                      std::vector<float> &,
                                      std::vector<float> &);
template bool sharedLseFactors<double>(const double *, int64_t, const double *,
                                       const double *, int64_t,
                                       std::vector<double> &,
                                       std::vector<double> &);

void foldLse(const at::Tensor &tile, double scale, int64_t dim,
             const Block &block, const at::Tensor &max, const at::Tensor &sum) {
  checkTile(tile, block, "foldLse");
  TORCH_CHECK(dim == 0 || dim == 1, "foldLse folds along dim 0 or 1");
  AT_DISPATCH_FLOATING_TYPES(tile.scalar_type(), "foldLse", [&] {
    const auto s = static_cast<scalar_t>(scale);
    if (dim == 1)
      foldRows<scalar_t>(tile, s, rowsAt<scalar_t>(max, block),
                         rowsAt<scalar_t>(sum, block));
    else
      foldColumns<scalar_t>(tile, s, colsAt<scalar_t>(max, block),
                            colsAt<scalar_t>(sum, block));
  });
}

void foldLseBoth(const at::Tensor &tile, double scale, const Block &block,
                 const at::Tensor &rowMax, const at::Tensor &rowSum,
                 const at::Tensor &colMax, const at::Tensor &colSum) {
  checkTile(tile, block, "foldLseBoth");
  AT_DISPATCH_FLOATING_TYPES(tile.scalar_type(), "foldLseBoth", [&] {
    foldBoth<scalar_t>(
        tile, static_cast<scalar_t>(scale), rowsAt<scalar_t>(rowMax, block),
        rowsAt<scalar_t>(rowSum, block), colsAt<scalar_t>(colMax, block),
        colsAt<scalar_t>(colSum, block));
  });
}

std::pair<double, double>
softmaxTileGradient(const at::Tensor &s, double scale, const Block &block,
                    const at::Tensor &rowLse, const at::Tensor &ctRow,
                    const at::Tensor &colLse, const at::Tensor &ctCol,
                    at::Tensor grad) {
  checkTile(s, block, "softmaxTileGradient");
  checkTile(grad, block, "softmaxTileGradient");
  std::pair<double, double> sums;
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "softmaxTileGradient", [&] {
    sums = gradientTile<scalar_t>(
        s, static_cast<scalar_t>(scale), rowsAt<scalar_t>(rowLse, block),
        rowsAt<scalar_t>(ctRow, block), colsAt<scalar_t>(colLse, block),
        colsAt<scalar_t>(ctCol, block), grad);
  });
  return sums;
}

void softplusRowSums(const at::Tensor &s, double scale, double bias,
                     const Block &block, const at::Tensor &rowSum) {
  checkTile(s, block, "softplusRowSums");
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "softplusRowSums", [&] {
    softplusRows<scalar_t>(s, static_cast<scalar_t>(scale),
                           static_cast<scalar_t>(bias),
                           rowsAt<scalar_t>(rowSum, block));
  });
}

std::pair<double, double> sigmoidTileGradient(const at::Tensor &s, double scale,
                                              double bias, const Block &block,
                                              const at::Tensor &ct,
                                              at::Tensor grad) {
  checkTile(s, block, "sigmoidTileGradient");
  checkTile(grad, block, "sigmoidTileGradient");
  std::pair<double, double> sums;
  AT_DISPATCH_FLOATING_TYPES(s.scalar_type(), "sigmoidTileGradient", [&] {
    sums = sigmoidTile<scalar_t>(s, static_cast<scalar_t>(scale),
                                 static_cast<scalar_t>(bias),
                                 rowsAt<scalar_t>(ct, block), grad);
  });
  return sums;
}

} // namespace dloss::fused
