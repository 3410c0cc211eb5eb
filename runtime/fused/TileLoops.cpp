// The dedicated kernels' element-wise tile passes as loops the compiler
// vectorises (TileMath.h: foldLse, softmaxTileGradient, softplusRowSums,
// sigmoidTileGradient), instead of one ATen pass per operation: a
// log-sum-exp fold in either direction reads the tile once (plus once for
// its maxima) with one exp per element, CLIP's gradient tile is one pass with
// its two exps, SigLIP's forward and gradient tiles one pass each. The
// scalar functions are the tile programs' (Epilogue.h). Built like
// FusedSimilarity.cpp (runtime/CMakeLists.txt): no FP traps, no errno,
// `omp simd` honoured, and each loop cloned for AVX-512, AVX2 and baseline
// x86-64.
#include "runtime/fused/TileMath.h"

#include "runtime/fused/Epilogue.h"

#include <ATen/Parallel.h>

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
                                T scale, const T *__restrict shift,
                                int64_t w) {
  for (int64_t j = 0; j < w; ++j)
    sum[j] += expOf(scale * x[j] - shift[j]);
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
  const int64_t grain = std::max<int64_t>(64, 16384 / std::max<int64_t>(1, rows));
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
  const int64_t cols = s.size(1);
  const T *x = s.data_ptr<T>();
  T *g = grad.data_ptr<T>();
  return rowPairSums(s.size(0), cols, [&](int64_t i, double &byCol) {
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
    T sum = sigmoidRow(g + i * cols, x + i * cols, scale, bias, ct[i], cols,
                       gs);
    dot = gs;
    return static_cast<double>(sum);
  });
}

/// The data of a contiguous vector of the tile's type.
template <typename T> T *dataOf(const at::Tensor &v) {
  TORCH_CHECK(v.is_contiguous() && v.scalar_type() == c10::CppTypeToScalarType<T>::value,
              "a tile loop's vector is not a contiguous vector of the tile's type");
  return v.data_ptr<T>();
}

} // namespace

void foldLse(const at::Tensor &tile, double scale, int64_t dim, at::Tensor max,
             at::Tensor sum) {
  TORCH_CHECK(tile.is_contiguous() && tile.dim() == 2 && (dim == 0 || dim == 1),
              "foldLse takes a contiguous tile and dim 0 or 1");
  if (tile.scalar_type() == at::kDouble) {
    if (dim == 1)
      foldRows<double>(tile, scale, dataOf<double>(max), dataOf<double>(sum));
    else
      foldColumns<double>(tile, scale, dataOf<double>(max),
                          dataOf<double>(sum));
    return;
  }
  const float s = static_cast<float>(scale);
  if (dim == 1)
    foldRows<float>(tile, s, dataOf<float>(max), dataOf<float>(sum));
  else
    foldColumns<float>(tile, s, dataOf<float>(max), dataOf<float>(sum));
}

std::pair<double, double>
softmaxTileGradient(const at::Tensor &s, double scale, const at::Tensor &rowLse,
                    const at::Tensor &ctRow, const at::Tensor &colLse,
                    const at::Tensor &ctCol, at::Tensor grad) {
  TORCH_CHECK(s.is_contiguous() && grad.is_contiguous() &&
                  grad.sizes() == s.sizes(),
              "softmaxTileGradient takes contiguous tiles of one shape");
  if (s.scalar_type() == at::kDouble)
    return gradientTile<double>(s, scale, dataOf<double>(rowLse),
                                dataOf<double>(ctRow), dataOf<double>(colLse),
                                dataOf<double>(ctCol), grad);
  return gradientTile<float>(s, static_cast<float>(scale), dataOf<float>(rowLse),
                             dataOf<float>(ctRow), dataOf<float>(colLse),
                             dataOf<float>(ctCol), grad);
}

void softplusRowSums(const at::Tensor &s, double scale, double bias,
                     at::Tensor rowSum) {
  TORCH_CHECK(s.is_contiguous() && s.dim() == 2,
              "softplusRowSums takes a contiguous tile");
  if (s.scalar_type() == at::kDouble)
    softplusRows<double>(s, scale, bias, dataOf<double>(rowSum));
  else
    softplusRows<float>(s, static_cast<float>(scale), static_cast<float>(bias),
                        dataOf<float>(rowSum));
}

std::pair<double, double> sigmoidTileGradient(const at::Tensor &s,
                                              double scale, double bias,
                                              const at::Tensor &ct,
                                              at::Tensor grad) {
  TORCH_CHECK(s.is_contiguous() && grad.is_contiguous() &&
                  grad.sizes() == s.sizes(),
              "sigmoidTileGradient takes contiguous tiles of one shape");
  if (s.scalar_type() == at::kDouble)
    return sigmoidTile<double>(s, scale, bias, dataOf<double>(ct), grad);
  return sigmoidTile<float>(s, static_cast<float>(scale),
                            static_cast<float>(bias), dataOf<float>(ct), grad);
}

} // namespace dloss::fused
