// The CUDA tiles of the fused ops (runtime/fused/cuda/FusedTiles.h) against
// plain float64 loops at world size 1, on raw device memory (no ATen CUDA);
// with a CUDA LibTorch, also the executor's CUDA dispatch against its CPU
// kernels.
// Every test skips where no GPU is visible (ctest label gpu).
#include "runtime/fused/cuda/FusedTiles.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#ifdef DLOSS_TORCH_HAS_CUDA
#include "PlanTestUtil.h"
#include "TilePrograms.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/Engines.h"
#include "runtime/exec/Executor.h"
#endif

namespace {

using namespace dloss::cuda;

#define SKIP_WITHOUT_GPU()                                                     \
  if (deviceCount() == 0)                                                      \
  GTEST_SKIP() << "no CUDA device is visible"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

/// Device memory of `bytes`, freed at the end of its scope.
class DeviceMemory {
public:
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&ptr, std::max<size_t>(bytes, 256)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
  }
  template <typename T>
  explicit DeviceMemory(const std::vector<T> &values)
      : DeviceMemory(values.size() * sizeof(T)) {
    cudaMemcpy(ptr, values.data(), values.size() * sizeof(T),
               cudaMemcpyHostToDevice);
  }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory &) = delete;
  DeviceMemory &operator=(const DeviceMemory &) = delete;

  void *raw() const { return ptr; }
  template <typename T> T *as(int64_t offset = 0) const {
    return static_cast<T *>(ptr) + offset;
  }
  template <typename T> std::vector<T> read(size_t count) const {
    std::vector<T> out(count);
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }

private:
  void *ptr = nullptr;
};

float roundTo(float x, ElementType type) {
  switch (type) {
  case ElementType::BF16:
    return __bfloat162float(__float2bfloat16_rn(x));
  case ElementType::F16:
    return __half2float(__float2half_rn(x));
  default:
    return x;
  }
}

/// `values` (already representable) in `type`, on the device.
std::unique_ptr<DeviceMemory> upload(const std::vector<float> &values,
                                     ElementType type) {
  if (type == ElementType::F32)
    return std::make_unique<DeviceMemory>(values);
  std::vector<uint16_t> bits(values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    if (type == ElementType::BF16) {
      __nv_bfloat16 value = __float2bfloat16_rn(values[k]);
      std::memcpy(&bits[k], &value, 2);
    } else {
      __half value = __float2half_rn(values[k]);
      std::memcpy(&bits[k], &value, 2);
    }
  }
  return std::make_unique<DeviceMemory>(bits);
}

struct Config {
  std::string name;
  ElementType type;
  int64_t n, m, d;
  int64_t tileRows, tileCols;
  /// Relative to the largest reference magnitude.
  double forwardTol, gradientTol;
  /// Multiplies the cotangents: tiny ones check G's fp16 prescale.
  float ctScale = 1;
};

void PrintTo(const Config &config, std::ostream *out) { *out << config.name; }

/// A world-size-1 problem: rows, cols (L2-normalised, then rounded to the
/// type), targets, cotangents, and the float64 similarity.
struct Problem {
  explicit Problem(const Config &config) : c(config) {
    std::mt19937 gen(1234 + static_cast<unsigned>(c.n * 7 + c.d));
    std::normal_distribution<float> normal;
    auto matrix = [&](int64_t count) {
      std::vector<float> out(count * c.d);
      for (int64_t i = 0; i < count; ++i) {
        double norm = 0;
        for (int64_t k = 0; k < c.d; ++k) {
          out[i * c.d + k] = normal(gen);
          norm += out[i * c.d + k] * out[i * c.d + k];
        }
        for (int64_t k = 0; k < c.d; ++k)
          out[i * c.d + k] =
              roundTo(out[i * c.d + k] / std::sqrt(norm), c.type);
      }
      return out;
    };
    rows = matrix(c.n);
    cols = matrix(c.m);
    std::uniform_int_distribution<int64_t> col(0, c.m - 1), row(0, c.n - 1),
        wide(0, c.m + 9);
    for (int64_t i = 0; i < c.n; ++i) {
      rowTargets.push_back(col(gen));
      classTargets.push_back(wide(gen)); // global; the shard is [5, 5 + m)
    }
    for (int64_t j = 0; j < c.m; ++j)
      colTargets.push_back(row(gen));
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (int64_t i = 0; i < c.n; ++i) {
      ctRow.push_back(uniform(gen) * c.ctScale);
      ctExtra.push_back(uniform(gen) * c.ctScale);
    }
    for (int64_t j = 0; j < c.m; ++j)
      ctCol.push_back(uniform(gen) * c.ctScale);
    sim.assign(c.n * c.m, 0);
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.m; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < c.d; ++k)
          dot += double(rows[i * c.d + k]) * cols[j * c.d + k];
        sim[i * c.m + j] = dot;
      }
    dRows = upload(rows, c.type);
    dCols = upload(cols, c.type);
    launch.maxRows = c.tileRows;
    launch.maxCols = c.tileCols;
    launch.type = c.type;
    workspace = std::make_unique<DeviceMemory>(
        tileWorkspaceBytes(c.tileRows, c.tileCols, c.type));
    launch.workspace = workspace->raw();
  }

  double s(int64_t i, int64_t j) const { return sim[i * c.m + j]; }

  /// Calls fn(row, rows, col, cols, tile) for every tile, columns outer (the
  /// runtime's order).
  template <typename Fn> void forEachTile(int64_t n, int64_t m, Fn &&fn) {
    const size_t element = elementSize(c.type);
    for (int64_t col = 0; col < m; col += c.tileCols)
      for (int64_t row = 0; row < n; row += c.tileRows) {
        Tile tile;
        tile.rowCount = std::min(c.tileRows, n - row);
        tile.colCount = std::min(c.tileCols, m - col);
        tile.depth = c.d;
        tile.rows = dRows->as<char>(row * c.d * element);
        tile.cols = dCols->as<char>(col * c.d * element);
        fn(row, col, tile);
      }
  }

  Config c;
  std::vector<float> rows, cols, ctRow, ctCol, ctExtra;
  std::vector<int64_t> rowTargets, colTargets, classTargets;
  std::vector<double> sim;
  std::unique_ptr<DeviceMemory> dRows, dCols, workspace;
  TileLaunch launch;
};

/// Every element of `got` within tol * max|want| of `want` (tol when `want`
/// is all zeros): relative, so that tiny gradients are checked too.
template <typename T>
void expectClose(const std::vector<T> &got, const std::vector<double> &want,
                 double tol, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double largest = 0;
  for (double value : want)
    if (std::isfinite(value))
      largest = std::max(largest, std::abs(value));
  if (largest == 0)
    largest = 1;
  double bound = tol * largest, worst = 0;
  size_t at = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    if (std::isinf(want[k]) && double(got[k]) == want[k])
      continue;
    double error = std::abs(double(got[k]) - want[k]);
    if (!(error <= worst)) {
      worst = error;
      at = k;
    }
  }
  EXPECT_LE(worst, bound) << what << ": element " << at << " is "
                          << double(got[at]) << ", expected " << want[at];
}

std::vector<float> lseOf(const std::vector<float> &max,
                         const std::vector<float> &sum) {
  std::vector<float> out(max.size());
  for (size_t k = 0; k < max.size(); ++k)
    out[k] = max[k] + std::log(sum[k]);
  return out;
}

double softplus(double x) {
  return std::log1p(std::exp(-std::abs(x))) + std::max(x, 0.0);
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

/// The float64 gradients of the rows and columns for a tile gradient G.
void backprop(const Problem &p, const std::vector<double> &grad, double scale,
              std::vector<double> &dRows, std::vector<double> &dCols) {
  const int64_t n = p.c.n, m = p.c.m, d = p.c.d;
  dRows.assign(n * d, 0);
  dCols.assign(m * d, 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double g = scale * grad[i * m + j];
      for (int64_t k = 0; k < d; ++k) {
        dRows[i * d + k] += g * p.cols[j * d + k];
        dCols[j * d + k] += g * p.rows[i * d + k];
      }
    }
}

const float kScale = 10, kBias = -5;
/// d scale (and d bias) come from the fp32 G, whatever the input type.
constexpr double kScaleTol = 1e-4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The sum of `count` float64 values on the device.
double deviceSum(const DeviceMemory &values, int64_t count) {
  double sum = 0;
  for (double value : values.read<double>(count))
    sum += value;
  return sum;
}

/// A backward tile's outputs (BackwardTile), zeroed, and their checks.
struct Gradients {
  explicit Gradients(const Problem &p)
      : p(p), dRows(std::vector<float>(p.c.n * p.c.d, 0)),
        dCols(std::vector<float>(p.c.m * p.c.d, 0)),
        dScaleRow(std::vector<double>(p.c.n, 0)) {}

  /// Points `args` (with scale kScale) at the tile at (row, col), whose
  /// column 0 is global column colBase.
  void point(BackwardTile &args, int64_t row, int64_t col,
             const DeviceMemory &rowTargets, int64_t colBase) const {
    args.scale = kScale;
    args.rowTargets = rowTargets.as<int64_t>(row);
    args.colBase = colBase;
    args.dRows = dRows.as<float>(row * p.c.d);
    args.dCols = dCols.as<float>(col * p.c.d);
    args.dScaleRow = dScaleRow.as<double>(row);
  }

  /// d rows and d cols (`colsName`) against the float64 gradients for G.
  void expectRowsAndCols(const std::vector<double> &grad,
                         const std::string &colsName) const {
    std::vector<double> wantRows, wantCols;
    backprop(p, grad, kScale, wantRows, wantCols);
    expectClose(dRows.read<float>(p.c.n * p.c.d), wantRows, p.c.gradientTol,
                "d rows");
    expectClose(dCols.read<float>(p.c.m * p.c.d), wantCols, p.c.gradientTol,
                colsName);
  }

  /// The sum of every row's share of d scale.
  double dScale() const { return deviceSum(dScaleRow, p.c.n); }

  const Problem &p;
  DeviceMemory dRows, dCols, dScaleRow;
};

class FusedCudaTest : public ::testing::TestWithParam<Config> {};

TEST_P(FusedCudaTest, ClipForwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  DeviceMemory rowTargets(p.rowTargets), colTargets(p.colTargets);
  DeviceMemory rowMax(std::vector<float>(n, kNegInf)),
      rowSum(std::vector<float>(n, 0)), rowTarget(std::vector<float>(n, 0));
  DeviceMemory colMax(std::vector<float>(m, kNegInf)),
      colSum(std::vector<float>(m, 0)), colTarget(std::vector<float>(m, 0));
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    ClipForward args;
    args.scale = kScale;
    args.rowTargets = rowTargets.as<int64_t>(row);
    args.colBase = col;
    args.colTargets = colTargets.as<int64_t>(col);
    args.rowBase = row;
    args.rowMax = rowMax.as<float>(row);
    args.rowSum = rowSum.as<float>(row);
    args.rowTarget = rowTarget.as<float>(row);
    args.colMax = colMax.as<float>(col);
    args.colSum = colSum.as<float>(col);
    args.colTarget = colTarget.as<float>(col);
    clipForwardTile(p.launch, tile, args);
  });
  std::vector<double> wantRowLse(n), wantColLse(m), wantRowT(n), wantColT(m);
  for (int64_t i = 0; i < n; ++i) {
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < m; ++j)
      top = std::max(top, kScale * p.s(i, j));
    for (int64_t j = 0; j < m; ++j)
      sum += std::exp(kScale * p.s(i, j) - top);
    wantRowLse[i] = top + std::log(sum);
    wantRowT[i] = kScale * p.s(i, p.rowTargets[i]);
  }
  for (int64_t j = 0; j < m; ++j) {
    double top = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; ++i)
      top = std::max(top, kScale * p.s(i, j));
    for (int64_t i = 0; i < n; ++i)
      sum += std::exp(kScale * p.s(i, j) - top);
    wantColLse[j] = top + std::log(sum);
    wantColT[j] = kScale * p.s(p.colTargets[j], j);
  }
  double tol = p.c.forwardTol;
  expectClose(lseOf(rowMax.read<float>(n), rowSum.read<float>(n)), wantRowLse,
              tol, "row lse");
  expectClose(lseOf(colMax.read<float>(m), colSum.read<float>(m)), wantColLse,
              tol, "col lse");
  expectClose(rowTarget.read<float>(n), wantRowT, tol, "row target logit");
  expectClose(colTarget.read<float>(m), wantColT, tol, "col target logit");
}

TEST_P(FusedCudaTest, ClipBackwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  // The saved statistics, from the float64 reference.
  std::vector<float> rowLse(n), colLse(m);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < m; ++j)
      sum += std::exp(kScale * p.s(i, j));
    rowLse[i] = static_cast<float>(std::log(sum));
  }
  for (int64_t j = 0; j < m; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      sum += std::exp(kScale * p.s(i, j));
    colLse[j] = static_cast<float>(std::log(sum));
  }
  DeviceMemory rowTargets(p.rowTargets), colTargets(p.colTargets);
  DeviceMemory dRowLse(rowLse), dColLse(colLse), ctRow(p.ctRow), ctCol(p.ctCol);
  Gradients out(p);
  DeviceMemory colShareRow(std::vector<double>(n, 0));
  prepareGradientScale(p.launch, kScale, ctRow.as<float>(), n,
                       ctCol.as<float>(), m);
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    ClipBackward args;
    out.point(args, row, col, rowTargets, col);
    args.rowLse = dRowLse.as<float>(row);
    args.ctRow = ctRow.as<float>(row);
    args.colLse = dColLse.as<float>(col);
    args.ctCol = ctCol.as<float>(col);
    args.colTargets = colTargets.as<int64_t>(col);
    args.rowBase = row;
    args.colShareRow = colShareRow.as<double>(row);
    clipBackwardTile(p.launch, tile, args);
  });
  std::vector<double> grad(n * m);
  double wantRowPart = 0, wantColPart = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double l = kScale * p.s(i, j);
      double byRow = p.ctRow[i] *
                     (std::exp(l - rowLse[i]) - (j == p.rowTargets[i] ? 1 : 0));
      double byCol = p.ctCol[j] *
                     (std::exp(l - colLse[j]) - (i == p.colTargets[j] ? 1 : 0));
      grad[i * m + j] = byRow + byCol;
      wantRowPart += byRow * p.s(i, j);
      wantColPart += byCol * p.s(i, j);
    }
  out.expectRowsAndCols(grad, "d cols");
  expectClose(std::vector<double>{out.dScale(), deviceSum(colShareRow, n)},
              {wantRowPart, wantColPart}, kScaleTol, "d scale shares");
}

TEST_P(FusedCudaTest, SigmoidForwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  DeviceMemory targets(p.rowTargets), pairSum(std::vector<float>(n, 0)),
      positive(std::vector<float>(n, 0));
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    SigmoidForward args;
    args.scale = kScale;
    args.bias = kBias;
    args.targets = targets.as<int64_t>(row);
    args.colBase = col;
    args.pairSum = pairSum.as<float>(row);
    args.positive = positive.as<float>(row);
    sigmoidForwardTile(p.launch, tile, args);
  });
  std::vector<double> wantSum(n, 0), wantPositive(n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j)
      wantSum[i] += softplus(kScale * p.s(i, j) + kBias);
    wantPositive[i] = kScale * p.s(i, p.rowTargets[i]) + kBias;
  }
  expectClose(pairSum.read<float>(n), wantSum, p.c.forwardTol, "pair sum");
  expectClose(positive.read<float>(n), wantPositive, p.c.forwardTol,
              "positive logit");
}

TEST_P(FusedCudaTest, SigmoidBackwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  DeviceMemory targets(p.rowTargets), ctPair(p.ctRow), ctPositive(p.ctExtra);
  Gradients out(p);
  DeviceMemory dBiasRow(std::vector<double>(n, 0));
  prepareGradientScale(p.launch, kScale, ctPair.as<float>(), n,
                       ctPositive.as<float>(), n);
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    SigmoidBackward args;
    out.point(args, row, col, targets, col);
    args.bias = kBias;
    args.ctPair = ctPair.as<float>(row);
    args.ctPositive = ctPositive.as<float>(row);
    args.dBiasRow = dBiasRow.as<double>(row);
    sigmoidBackwardTile(p.launch, tile, args);
  });
  std::vector<double> grad(n * m);
  double wantScale = 0, wantBias = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double g = p.ctRow[i] * sigmoid(kScale * p.s(i, j) + kBias) +
                 (j == p.rowTargets[i] ? p.ctExtra[i] : 0);
      grad[i * m + j] = g;
      wantScale += g * p.s(i, j);
      wantBias += g;
    }
  out.expectRowsAndCols(grad, "d cols");
  expectClose(std::vector<double>{out.dScale(), deviceSum(dBiasRow, n)},
              {wantScale, wantBias}, kScaleTol, "d scale, d bias");
}

// The shard holds global classes [5, 5 + m); targets range over [0, m + 10).
constexpr int64_t kClassOffset = 5;

TEST_P(FusedCudaTest, ShardedForwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  DeviceMemory targets(p.classTargets);
  DeviceMemory rowMax(std::vector<float>(n, kNegInf)),
      rowSum(std::vector<float>(n, 0)), targetDot(std::vector<float>(n, 0));
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    ShardedForward args;
    args.scale = kScale;
    args.targets = targets.as<int64_t>(row);
    args.colBase = kClassOffset + col;
    args.rowMax = rowMax.as<float>(row);
    args.rowSum = rowSum.as<float>(row);
    args.targetDot = targetDot.as<float>(row);
    shardedForwardTile(p.launch, tile, args);
  });
  std::vector<double> wantLse(n), wantDot(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = p.classTargets[i] - kClassOffset;
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < m; ++j)
      if (j != t)
        top = std::max(top, kScale * p.s(i, j));
    for (int64_t j = 0; j < m; ++j)
      if (j != t)
        sum += std::exp(kScale * p.s(i, j) - top);
    wantLse[i] = top + std::log(sum);
    if (t >= 0 && t < m)
      wantDot[i] = p.s(i, t);
  }
  expectClose(lseOf(rowMax.read<float>(n), rowSum.read<float>(n)), wantLse,
              p.c.forwardTol, "lse of the rest");
  expectClose(targetDot.read<float>(n), wantDot, p.c.forwardTol, "target dot");
}

TEST_P(FusedCudaTest, ShardedBackwardMatchesLoops) {
  SKIP_WITHOUT_GPU();
  Problem p(GetParam());
  const int64_t n = p.c.n, m = p.c.m;
  std::vector<float> lseRest(n);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < m; ++j)
      if (j != p.classTargets[i] - kClassOffset)
        sum += std::exp(kScale * p.s(i, j));
    lseRest[i] = static_cast<float>(std::log(sum));
  }
  DeviceMemory targets(p.classTargets), dLse(lseRest), ctLse(p.ctRow);
  Gradients out(p);
  prepareGradientScale(p.launch, kScale, ctLse.as<float>(), n, nullptr, 0);
  p.forEachTile(n, m, [&](int64_t row, int64_t col, const Tile &tile) {
    ShardedBackward args;
    out.point(args, row, col, targets, kClassOffset + col);
    args.lseRest = dLse.as<float>(row);
    args.ctLse = ctLse.as<float>(row);
    shardedBackwardTile(p.launch, tile, args);
  });
  std::vector<double> grad(n * m, 0);
  double wantScale = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      if (j != p.classTargets[i] - kClassOffset) {
        double g = p.ctRow[i] * std::exp(kScale * p.s(i, j) - lseRest[i]);
        grad[i * m + j] = g;
        wantScale += g * p.s(i, j);
      }
  out.expectRowsAndCols(grad, "d weights");
  expectClose(std::vector<double>{out.dScale()}, {wantScale}, kScaleTol,
              "d scale");
}

// Small tiles cross every block edge (and leave columns that are not a
// multiple of 8); the larger problems span several 32 x 256 statistics
// sub-tiles per tile; fp16 with tiny cotangents needs G's prescale.
INSTANTIATE_TEST_SUITE_P(
    Tiles, FusedCudaTest,
    ::testing::Values(Config{"f32_small_tiles", ElementType::F32, 37, 53, 24,
                             16, 20, 1e-5, 1e-5},
                      Config{"bf16_small_tiles", ElementType::BF16, 37, 53, 24,
                             16, 20, 1e-5, 2e-2},
                      Config{"f32_large", ElementType::F32, 300, 700, 64, 100,
                             300, 1e-5, 1e-5},
                      Config{"bf16_one_tile", ElementType::BF16, 300, 700, 64,
                             300, 700, 1e-5, 2e-2},
                      Config{"f16_tiny_cotangents", ElementType::F16, 300, 700,
                             64, 100, 300, 1e-5, 2e-2, 1e-6f}),
    [](const ::testing::TestParamInfo<Config> &info) {
      return info.param.name;
    });

TEST(FusedCudaLaunchTest, OversizedTileRaises) {
  SKIP_WITHOUT_GPU();
  Config config{"", ElementType::F32, 8, 8, 4, 4, 4, 0, 0};
  Problem p(config);
  Tile tile;
  tile.rows = p.dRows->raw();
  tile.cols = p.dCols->raw();
  tile.rowCount = 8;
  tile.colCount = 8;
  tile.depth = 4;
  SigmoidForward args;
  EXPECT_THROW(sigmoidForwardTile(p.launch, tile, args), std::runtime_error);
}

#ifdef DLOSS_TORCH_HAS_CUDA
//===----------------------------------------------------------------------===//
// The executor's dispatch: CUDA tensors through the fused ops' kernel table
//===----------------------------------------------------------------------===//

using namespace dloss::test;

/// `op` on CUDA copies of `operands` against the CPU kernel, result by
/// result, each within tol * max(1, max |CPU result|) (the CPU computes 16-bit
/// inputs in f32 too; both round the results to the inputs' type). Returns
/// the CPU kernel's results.
std::vector<at::Tensor>
expectDeviceMatchesCpu(const std::string &op,
                       const std::vector<at::Tensor> &operands, int numResults,
                       double tol, const std::string &where = "",
                       const std::vector<size_t> &replicated = {},
                       const std::vector<AttrSpec> &attrs = {}) {
  const std::string what = op + (where.empty() ? "" : " (" + where + ")");
  std::vector<at::Tensor> onDevice;
  for (const at::Tensor &operand : operands)
    onDevice.push_back(operand.to(at::kCUDA));
  std::vector<at::Tensor> want =
      runFused(*dloss::makeSingleProcessCommunicator(), op, operands,
               numResults, replicated, attrs);
  std::vector<at::Tensor> got =
      runFused(*dloss::makeSingleProcessCommunicator(), op, onDevice,
               numResults, replicated, attrs);
  EXPECT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < std::min(got.size(), want.size()); ++k) {
    EXPECT_TRUE(got[k].is_cuda()) << what << " result " << k;
    EXPECT_EQ(got[k].scalar_type(), want[k].scalar_type())
        << what << " result " << k;
    EXPECT_EQ(got[k].sizes(), want[k].sizes()) << what << " result " << k;
    if (got[k].sizes() != want[k].sizes())
      continue;
    at::Tensor g = got[k].cpu().to(at::kDouble), w = want[k].to(at::kDouble);
    EXPECT_FALSE(w.isnan().any().item<bool>())
        << what << " result " << k << ": the CPU kernel gave NaN";
    // The scale of the finite values: an infinity (a masked row's -inf)
    // would make the bound infinite and pass any finite error.
    at::Tensor finite = w.masked_fill(~w.isfinite(), 0);
    double bound =
        tol *
        std::max(1.0, w.numel() ? finite.abs().max().item<double>() : 0.0);
    // Equal infinities (a masked row's -inf) are no error.
    at::Tensor error = (g - w).abs().masked_fill_(g == w, 0);
    double worst = w.numel() ? error.max().item<double>() : 0.0;
    EXPECT_LE(worst, bound) << what << " result " << k << ": max error "
                            << worst << " (NaN: a NaN on the GPU)";
  }
  return want;
}

/// Relative tolerance of the GPU against the CPU kernel: f32 1e-4; bf16 and
/// f16 results are rounded to 16 bits on both paths (one bf16 ulp is 2^-8)
/// and the GPU's backward stores G in 16 bits before its gradient GEMMs.
double tolFor(at::ScalarType type) { return type == at::kFloat ? 1e-4 : 2e-2; }

/// Tiles that divide none of the sizes below (several tiles on both paths),
/// and the default tile (one).
const std::vector<std::string> kDispatchTiles = {"16x24", ""};

class FusedCudaDispatchTest : public ::testing::TestWithParam<at::ScalarType> {
};

// CLIP (ring_softmax_ce), SigLIP (ring_sigmoid_pairs) and PartialFC
// (sharded_softmax), forward and backward.
TEST_P(FusedCudaDispatchTest, EveryOpMatchesTheCpuKernel) {
  SKIP_WITHOUT_GPU();
  const at::ScalarType type = GetParam();
  const double tol = tolFor(type);
  const int64_t n = 37, m = 53, d = 24;
  at::manual_seed(7);
  auto features = [&](int64_t count) {
    at::Tensor x = at::randn({count, d});
    return (x / x.norm(2, 1, true)).to(type);
  };
  at::Tensor rows = features(n), cols = features(m);
  at::Tensor scale = at::scalar_tensor(10.0), bias = at::scalar_tensor(-5.0);
  at::Tensor rowTargets = at::randint(m, {n}, at::kLong);
  at::Tensor colTargets = at::randint(n, {m}, at::kLong);
  at::Tensor ctRow = at::rand({n}), ctCol = at::rand({m});
  at::Tensor classTargets = at::randint(m, {n}, at::kLong);
  for (const std::string &tile : kDispatchTiles) {
    TileEnv env(tile);
    const std::string where = "tile '" + tile + "'";
    std::vector<at::Tensor> clip = expectDeviceMatchesCpu(
        "dloss.ring_softmax_ce", {rows, cols, scale, rowTargets, colTargets}, 4,
        tol, where);
    expectDeviceMatchesCpu("dloss.ring_softmax_ce_grad",
                           {rows, cols, scale, rowTargets, colTargets,
                            clip[2].to(at::kFloat), clip[3].to(at::kFloat),
                            ctRow, ctCol},
                           3, tol, where);
    expectDeviceMatchesCpu("dloss.ring_sigmoid_pairs",
                           {rows, cols, scale, bias, rowTargets}, 2, tol,
                           where);
    expectDeviceMatchesCpu(
        "dloss.ring_sigmoid_pairs_grad",
        {rows, cols, scale, bias, rowTargets, ctRow, at::rand({n})}, 4, tol,
        where);
    std::vector<at::Tensor> sharded = expectDeviceMatchesCpu(
        "dloss.sharded_softmax", {rows, cols, scale, classTargets}, 2, tol,
        where);
    expectDeviceMatchesCpu("dloss.sharded_softmax_grad",
                           {rows, cols, scale, classTargets,
                            sharded[0].to(at::kFloat), ctRow, at::rand({n})},
                           3, tol, where);
  }
}

// dloss.fused_similarity and its _grad (docs/Cuda.md, step 2): every tile
// program of the CPU tests (InfoNCE's target, NT-Xent's self mask with
// row_id, SupCon's label eq, DCL, ArcFace, every opcode, CLIP's column
// results) in every mode it has (gathered; local and sharded where it has
// no column results), the backward fed the CPU forward's results.
TEST_P(FusedCudaDispatchTest, EveryTileProgramMatchesTheCpuKernel) {
  SKIP_WITHOUT_GPU();
  const at::ScalarType type = GetParam();
  const double tol = tolFor(type);
  const int64_t n = 37, m = 53, d = 24;
  for (const std::string &tile : kDispatchTiles) {
    TileEnv env(tile);
    for (const ProgramCase &pc : tilePrograms())
      for (Mode mode : {Mode::Gathered, Mode::Local, Mode::Sharded}) {
        const Program &p = pc.program;
        if (!p.colOutputs.empty() && mode != Mode::Gathered)
          continue;
        const std::string where =
            pc.name + ", " + modeName(mode) + ", tile '" + tile + "'";
        SCOPED_TRACE(where);
        at::manual_seed(11);
        auto features = [&](int64_t count) {
          at::Tensor x = at::randn({count, d}, at::kDouble);
          return (x / x.norm(2, 1, true)).to(type);
        };
        // At world size 1 each operand is the whole; still, as in a plan,
        // the operands that are the same on every rank are marked so: the
        // rows in sharded steps (and their per-row leaves, results and
        // cotangents), the columns in local ones (and per-column leaves).
        const bool rowsReplicated = mode == Mode::Sharded;
        const bool colsReplicated = mode == Mode::Local;
        std::vector<at::Tensor> operands = {features(n), features(m)};
        std::vector<size_t> replicated;
        if (rowsReplicated)
          replicated.push_back(0);
        if (colsReplicated)
          replicated.push_back(1);
        std::vector<at::Tensor> leaves = pc.leaves(n, m);
        for (size_t k = 0; k < leaves.size(); ++k) {
          const int64_t index = static_cast<int64_t>(k);
          const bool isRow = index < p.rowLeaves;
          const bool isCol = !isRow && index < p.rowLeaves + p.colLeaves;
          if ((isRow && rowsReplicated) || (isCol && colsReplicated))
            replicated.push_back(operands.size());
          operands.push_back(at::isFloatingType(leaves[k].scalar_type())
                                 ? leaves[k].to(type)
                                 : leaves[k]);
        }
        const std::vector<AttrSpec> attrs = p.attrs(mode);
        const int64_t numResults = p.numOutputs() + p.numColOutputs();
        std::vector<at::Tensor> forward = expectDeviceMatchesCpu(
            "dloss.fused_similarity", operands, static_cast<int>(numResults),
            tol, where, replicated, attrs);
        if (static_cast<int64_t>(forward.size()) != numResults)
          continue;
        std::vector<at::Tensor> gradOperands = operands;
        for (int64_t k = 0; k < 2 * numResults; ++k) {
          // Column results exist only in gathered steps.
          if (rowsReplicated)
            replicated.push_back(gradOperands.size());
          const int64_t result = k % numResults;
          gradOperands.push_back(
              k < numResults
                  ? forward[result]
                  : (at::rand({result < p.numOutputs() ? n : m}, at::kDouble) -
                     0.5)
                        .to(type));
        }
        expectDeviceMatchesCpu("dloss.fused_similarity_grad", gradOperands, 4,
                               tol, where, replicated, attrs);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, FusedCudaDispatchTest,
                         ::testing::Values(at::kFloat, at::kBFloat16,
                                           at::kHalf),
                         [](const ::testing::TestParamInfo<at::ScalarType> &i) {
                           return std::string(c10::toString(i.param));
                         });
#endif // DLOSS_TORCH_HAS_CUDA

} // namespace
