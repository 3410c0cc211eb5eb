// Throughput of the CUDA fused CLIP tiles against the bare cuBLAS GEMMs they
// contain: the ratio is what the epilogues cost. Prints a line and exits 0
// where no GPU is visible.
//
//   dloss-bench-cuda-fused [B_local] [B_global] [width] [bf16|f16|f32]
//                          [clip|similarity]
//
// Runs clipForwardTile / clipBackwardTile over every tile of a B_local x
// B_global similarity (one rank's work, all chunks) and, on the same tile
// shapes, the plain cublasGemmEx calls alone (1 forward, 3 backward). The
// ratio GEMM time / fused time is the share of tensor-core throughput the
// fused kernels keep (target >= 0.70).
//
// `similarity` runs CLIP written as a general tile program (dloss.
// fused_similarity: both directions, column results, a float 0-d scale)
// through cuda/SimilarityTiles.h instead, and first checks its first 64 rows'
// and columns' results and rows' gradients against float64 host loops over
// the same epilogue::evaluate / reverse (prints CHECK OK or CHECK FAILED).
#include "runtime/fused/cuda/FusedTiles.h"
#include "runtime/fused/cuda/SimilarityTiles.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace dloss::cuda;

namespace {

#define CHECK(call)                                                            \
  do {                                                                         \
    if (!(call)) {                                                             \
      std::fprintf(stderr, "failed: %s\n", #call);                             \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

void *deviceAlloc(size_t bytes, bool zero = true) {
  void *ptr = nullptr;
  CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 256)) == cudaSuccess);
  if (zero)
    CHECK(cudaMemset(ptr, 0, bytes) == cudaSuccess);
  return ptr;
}

/// Median milliseconds of `fn` over `runs` timed runs after one warm-up.
double medianMs(const std::function<void()> &fn, int runs = 7) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  fn();
  std::vector<double> times;
  for (int k = 0; k < runs; ++k) {
    cudaEventRecord(start);
    fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return times[times.size() / 2];
}

//===----------------------------------------------------------------------===//
// The general op (cuda/SimilarityTiles.h)
//===----------------------------------------------------------------------===//

/// The bits of `x` in `type`; x must be exactly representable there (the
/// check's features are multiples of 1/8 below 1).
uint16_t bits16(float x, ElementType type) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (type == ElementType::BF16 || x == 0)
    return x == 0 ? static_cast<uint16_t>(bits >> 16 & 0x8000u)
                  : static_cast<uint16_t>(bits >> 16);
  int exponent = 0;
  const float mantissa = std::frexp(std::fabs(x), &exponent); // [0.5, 1)
  const uint16_t sign = x < 0 ? 0x8000 : 0;
  return static_cast<uint16_t>(
      sign | (exponent - 1 + 15) << 10 |
      static_cast<uint16_t>((mantissa * 2 - 1) * 1024));
}

using dloss::epilogue::Instr;
using dloss::epilogue::Op;
using dloss::epilogue::Reduce;

/// CLIP as a tile program: results (logit, lse), (row target's logit, sum);
/// column results (logit, lse), (column target's logit, sum).
TileProgram clipProgram(float scale) {
  const Instr code[] = {
      {Op::Sim, 0, 0, 0},     {Op::Scalar, 0, 0, 0},  {Op::Mul, 0, 1, 0},
      {Op::ColId, 0, 0, 0},   {Op::RowLeaf, 0, 0, 0}, {Op::Eq, 3, 4, 0},
      {Op::Const, 0, 0, 0},   {Op::Select, 5, 2, 6},  {Op::RowId, 0, 0, 0},
      {Op::ColLeaf, 0, 0, 0}, {Op::Eq, 8, 9, 0},      {Op::Select, 10, 2, 6}};
  TileProgram p;
  p.count = sizeof code / sizeof code[0];
  std::copy(std::begin(code), std::end(code), p.code); // Const 0: bits 0
  p.rowResults = p.colResults = 2;
  p.rowResult[0] = p.colResult[0] = {2, Reduce::LogSumExp};
  p.rowResult[1] = {7, Reduce::Sum};
  p.colResult[1] = {11, Reduce::Sum};
  p.rowLeaves = p.colLeaves = p.scalars = 1;
  p.scalar[0] = scale;
  p.scalarIsFloat = 1;
  return p;
}

template <typename T> std::vector<T> download(const T *device, int64_t count) {
  std::vector<T> host(count);
  CHECK(cudaMemcpy(host.data(), device, count * sizeof(T),
                   cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

template <typename T> T *upload(const std::vector<T> &host) {
  auto *device = static_cast<T *>(deviceAlloc(host.size() * sizeof(T), false));
  CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(T),
                   cudaMemcpyHostToDevice) == cudaSuccess);
  return device;
}

int runSimilarity(int64_t n, int64_t m, int64_t d, ElementType type,
                  const std::string &typeName) {
  const int64_t tileRows = std::min<int64_t>(2048, n),
                tileCols = std::min<int64_t>(4096, m);
  const size_t element = elementSize(type);
  const float scale = 0.5f;
  const TileProgram program = clipProgram(scale);

  // Features in {0, +-1/8, +-1/4}: exact in every type, so S is exact too.
  std::vector<float> rowsHost(n * d), colsHost(m * d);
  unsigned seed = 12345;
  auto next = [&] {
    seed = seed * 1103515245u + 12345u;
    return (static_cast<int>(seed >> 16 & 0x7fff) % 5 - 2) / 8.0f;
  };
  for (float &x : rowsHost)
    x = next();
  for (float &x : colsHost)
    x = next();
  auto inType = [&](const std::vector<float> &values) {
    std::vector<char> bytes(values.size() * element);
    for (size_t k = 0; k < values.size(); ++k) {
      if (type == ElementType::F32) {
        std::memcpy(&bytes[k * 4], &values[k], 4);
      } else {
        uint16_t b = bits16(values[k], type);
        std::memcpy(&bytes[k * 2], &b, 2);
      }
    }
    return upload(bytes);
  };
  char *rows = inType(rowsHost), *cols = inType(colsHost);
  std::vector<float> rowTargetHost(n), colTargetHost(m);
  for (int64_t i = 0; i < n; ++i)
    rowTargetHost[i] = static_cast<float>(i % m);
  for (int64_t j = 0; j < m; ++j)
    colTargetHost[j] = static_cast<float>(j % n);
  float *rowTarget = upload(rowTargetHost), *colTarget = upload(colTargetHost);

  // Statistics [2, count] (max, sum) per direction; -inf / 0 to start.
  std::vector<float> emptyRows(2 * n, -INFINITY), emptyCols(2 * m, -INFINITY);
  float *rowMax = upload(emptyRows), *colMax = upload(emptyCols);
  auto *rowSum = static_cast<float *>(deviceAlloc(2 * n * 4));
  auto *colSum = static_cast<float *>(deviceAlloc(2 * m * 4));
  TileLaunch launch;
  launch.maxRows = tileRows;
  launch.maxCols = tileCols;
  launch.type = type;
  launch.workspace = deviceAlloc(
      similarityWorkspaceBytes(tileRows, tileCols, type, program.colResults),
      false);

  auto forEachTile = [&](const std::function<void(const Tile &, int64_t,
                                                  int64_t, TileLeaves &)> &fn) {
    for (int64_t col = 0; col < m; col += tileCols)
      for (int64_t row = 0; row < n; row += tileRows) {
        Tile tile;
        tile.rowCount = std::min(tileRows, n - row);
        tile.colCount = std::min(tileCols, m - col);
        tile.depth = d;
        tile.rows = rows + row * d * element;
        tile.cols = cols + col * d * element;
        TileLeaves leaves;
        leaves.rowBase = row;
        leaves.colBase = col;
        leaves.row[0] = rowTarget + row;
        leaves.col[0] = colTarget + col;
        fn(tile, row, col, leaves);
      }
  };
  auto forward = [&] {
    forEachTile(
        [&](const Tile &tile, int64_t row, int64_t col, TileLeaves &leaves) {
          SimilarityForward args;
          args.leaves = leaves;
          for (int k = 0; k < 2; ++k) {
            args.rowMax[k] = rowMax + k * n + row;
            args.rowSum[k] = rowSum + k * n + row;
            args.colMax[k] = colMax + k * m + col;
            args.colSum[k] = colSum + k * m + col;
          }
          similarityForwardTile(launch, tile, program, args);
        });
  };
  forward();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);

  // Results: lse = max + log(sum), the target logits are sums.
  auto results = [](const std::vector<float> &max,
                    const std::vector<float> &sum, int64_t count) {
    std::vector<float> out(2 * count);
    for (int64_t k = 0; k < count; ++k) {
      out[k] = max[k] + std::log(sum[k]);
      out[count + k] = sum[count + k];
    }
    return out;
  };
  std::vector<float> rowResults =
      results(download(rowMax, 2 * n), download(rowSum, 2 * n), n);
  std::vector<float> colResults =
      results(download(colMax, 2 * m), download(colSum, 2 * m), m);

  // Backward: ct 1/n for the rows' results, 1/m for the columns'.
  std::vector<float> ctRowHost(n, 1.f / n), ctColHost(m, 1.f / m);
  float *rowValue = upload(rowResults), *colValue = upload(colResults);
  float *ctRow = upload(ctRowHost), *ctCol = upload(ctColHost);
  auto *dRows = static_cast<float *>(deviceAlloc(n * d * 4));
  auto *dCols = static_cast<float *>(deviceAlloc(m * d * 4));
  auto *dScalarRow = static_cast<double *>(deviceAlloc(n * 8));
  auto *colShareRow = static_cast<double *>(deviceAlloc(n * 8));
  auto *dRowLeaf = static_cast<double *>(deviceAlloc(n * 8));
  auto backward = [&] {
    forEachTile(
        [&](const Tile &tile, int64_t row, int64_t col, TileLeaves &leaves) {
          SimilarityBackward args;
          args.leaves = leaves;
          for (int k = 0; k < 2; ++k) {
            args.rowValue[k] = rowValue + k * n + row;
            args.rowCt[k] = ctRow + row;
            args.colValue[k] = colValue + k * m + col;
            args.colCt[k] = ctCol + col;
          }
          args.splitScalars = true;
          args.dRowLeaf[0] = dRowLeaf + row;
          args.dScalarRow[0] = dScalarRow + row;
          args.colShareRow[0] = colShareRow + row;
          args.dRows = dRows + row * d;
          args.dCols = dCols + col * d;
          similarityBackwardTile(launch, tile, program, args);
        });
  };
  backward();
  CHECK(cudaDeviceSynchronize() == cudaSuccess);

  // The check: float64 host loops over the same rules.
  const int64_t checkRows = std::min<int64_t>(n, 64),
                checkCols = std::min<int64_t>(m, 64);
  auto sim = [&](int64_t i, int64_t j) {
    double s = 0;
    for (int64_t k = 0; k < d; ++k)
      s += double(rowsHost[i * d + k]) * colsHost[j * d + k];
    return s;
  };
  auto evaluate = [&](int64_t i, int64_t j, double s, double *regs) {
    dloss::epilogue::evaluate<double>(program.code, program.count, regs,
                                      [&](const Instr &ins) -> double {
                                        switch (ins.op) {
                                        case Op::Sim:
                                          return s;
                                        case Op::ColId:
                                          return double(j);
                                        case Op::RowId:
                                          return double(i);
                                        case Op::RowLeaf:
                                          return rowTargetHost[i];
                                        case Op::ColLeaf:
                                          return colTargetHost[j];
                                        case Op::Scalar:
                                          return scale;
                                        default:
                                          return 0;
                                        }
                                      });
  };
  double worst = 0;
  auto compare = [&](double got, double want) {
    double error = std::fabs(got - want) / std::max(1.0, std::fabs(want));
    // A NaN fails the check: std::max would keep the old worst.
    worst = std::isfinite(error) ? std::max(worst, error) : INFINITY;
  };
  double regs[kMaxInstructions], cts[kMaxInstructions];
  std::vector<float> dRowsHost = download(dRows, checkRows * d);
  for (int64_t i = 0; i < checkRows; ++i) {
    double top = -INFINITY, total = 0, picked = 0;
    std::vector<double> es(m);
    for (int64_t j = 0; j < m; ++j) {
      evaluate(i, j, sim(i, j), regs);
      es[j] = regs[2];
      top = std::max(top, regs[2]);
      picked += regs[7];
    }
    for (int64_t j = 0; j < m; ++j)
      total += std::exp(es[j] - top);
    compare(rowResults[i], top + std::log(total));
    compare(rowResults[n + i], picked);
    // dRows[i] = sum_j G_ij cols_j, G from the device's forward results.
    std::vector<double> grad(d, 0.0);
    for (int64_t j = 0; j < m; ++j) {
      evaluate(i, j, sim(i, j), regs);
      std::fill(std::begin(cts), std::end(cts), 0.0);
      cts[2] += ctRowHost[i] * std::exp(regs[2] - rowResults[i]);
      cts[7] += ctRowHost[i];
      cts[2] += ctColHost[j] * std::exp(regs[2] - colResults[j]);
      cts[11] += ctColHost[j];
      dloss::epilogue::reverse<double>(program.code, program.count, regs, cts);
      for (int64_t k = 0; k < d; ++k)
        grad[k] += cts[0] * colsHost[j * d + k];
    }
    for (int64_t k = 0; k < d; ++k)
      compare(dRowsHost[i * d + k] * double(n), grad[k] * n); // ct is 1/n
  }
  for (int64_t j = 0; j < checkCols; ++j) {
    double top = -INFINITY, total = 0, picked = 0;
    std::vector<double> es(n);
    for (int64_t i = 0; i < n; ++i) {
      evaluate(i, j, sim(i, j), regs);
      es[i] = regs[2];
      top = std::max(top, regs[2]);
      picked += regs[11];
    }
    for (int64_t i = 0; i < n; ++i)
      total += std::exp(es[i] - top);
    compare(colResults[j], top + std::log(total));
    compare(colResults[m + j], picked);
  }
  const double tolerance = type == ElementType::F32 ? 1e-4 : 1e-2;
  std::printf("dloss-bench-cuda-fused similarity: first %lld rows and %lld "
              "columns against float64 loops: max relative error %.3g: %s\n",
              (long long)checkRows, (long long)checkCols, worst,
              worst <= tolerance ? "CHECK OK" : "CHECK FAILED");

  // Timings: the general tiles against the bare GEMMs of the same shapes.
  cublasHandle_t handle;
  CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const cudaDataType_t cublasType = type == ElementType::F32   ? CUDA_R_32F
                                    : type == ElementType::F16 ? CUDA_R_16F
                                                               : CUDA_R_16BF;
  auto *gemmOut = static_cast<float *>(
      deviceAlloc(tileRows * ((tileCols + 7) / 8 * 8) * 4, false));
  const float one = 1, zero = 0;
  auto gemms = [&](bool backwardToo) {
    forEachTile([&](const Tile &tile, int64_t row, int64_t col, TileLeaves &) {
      const int ld = int((tile.colCount + 7) / 8 * 8);
      const int r = int(tile.rowCount), c = int(tile.colCount), k = int(d);
      CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, c, r, k, &one,
                         tile.cols, cublasType, k, tile.rows, cublasType, k,
                         &zero, gemmOut, CUDA_R_32F, ld, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      if (!backwardToo)
        return;
      // G stands in as the fp32 tile (the fused path's f32 case).
      CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, k, r, c, &one,
                         tile.cols, cublasType, k, launch.workspace, cublasType,
                         ld, &one, dRows + row * d, CUDA_R_32F, k,
                         CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, k, c, r, &one,
                         tile.rows, cublasType, k, launch.workspace, cublasType,
                         ld, &one, dCols + col * d, CUDA_R_32F, k,
                         CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    });
  };
  const double flops = 2.0 * n * m * d;
  const double fwdFused = medianMs(forward),
               fwdGemm = medianMs([&] { gemms(false); });
  const double bwdFused = medianMs(backward),
               bwdGemm = medianMs([&] { gemms(true); });
  std::printf("B_local %lld, B_global %lld, width %lld, %s, tile %lldx%lld, "
              "%d instructions\n",
              (long long)n, (long long)m, (long long)d, typeName.c_str(),
              (long long)tileRows, (long long)tileCols, program.count);
  std::printf("| pass | general ms | GEMMs ms | GEMMs / general |\n"
              "|---|---:|---:|---:|\n");
  std::printf("| forward | %.3f | %.3f | %.2f |\n", fwdFused, fwdGemm,
              fwdGemm / fwdFused);
  std::printf("| backward | %.3f | %.3f | %.2f |\n", bwdFused, bwdGemm,
              bwdGemm / bwdFused);
  std::printf("(%.1f TFLOP/s forward GEMM work in the general tiles)\n",
              flops / fwdFused / 1e9);
  cublasDestroy(handle);
  return worst <= tolerance ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  if (deviceCount() == 0) {
    std::printf("dloss-bench-cuda-fused: no CUDA device is visible; skipped\n");
    return 0;
  }
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t m = argc > 2 ? std::atoll(argv[2]) : 65536;
  const int64_t d = argc > 3 ? std::atoll(argv[3]) : 512;
  const std::string typeName = argc > 4 ? argv[4] : "bf16";
  const ElementType type = typeName == "f32"   ? ElementType::F32
                           : typeName == "f16" ? ElementType::F16
                                               : ElementType::BF16;
  if (argc > 5 && std::string(argv[5]) == "similarity")
    return runSimilarity(n, m, d, type, typeName);
  const cudaDataType_t cublasType = type == ElementType::F32   ? CUDA_R_32F
                                    : type == ElementType::F16 ? CUDA_R_16F
                                                               : CUDA_R_16BF;
  // The runtime's default GPU tile (fused/TileShape.cpp, deviceTileShape).
  const int64_t tileRows = std::min<int64_t>(2048, n),
                tileCols = std::min<int64_t>(4096, m);
  const size_t element = elementSize(type);

  // Zero features: every value stays finite (S = 0, P = 1) and the kernels
  // do the same work whatever the values.
  void *rows = deviceAlloc(n * d * element);
  void *cols = deviceAlloc(m * d * element);
  std::vector<int64_t> targets(std::max(n, m));
  for (size_t k = 0; k < targets.size(); ++k)
    targets[k] = static_cast<int64_t>(k % std::min(n, m));
  auto *rowTargets = static_cast<int64_t *>(deviceAlloc(n * 8));
  auto *colTargets = static_cast<int64_t *>(deviceAlloc(m * 8));
  cudaMemcpy(rowTargets, targets.data(), n * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(colTargets, targets.data(), m * 8, cudaMemcpyHostToDevice);
  auto *rowStats = static_cast<float *>(deviceAlloc(3 * n * 4));
  auto *colStats = static_cast<float *>(deviceAlloc(3 * m * 4));
  auto *lse = static_cast<float *>(deviceAlloc(std::max(n, m) * 4));
  auto *ct = static_cast<float *>(deviceAlloc(std::max(n, m) * 4));
  std::vector<float> ones(std::max(n, m), 1.f / n);
  cudaMemcpy(ct, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
  auto *dRows = static_cast<float *>(deviceAlloc(n * d * 4));
  auto *dCols = static_cast<float *>(deviceAlloc(m * d * 4));
  auto *dScale = static_cast<double *>(deviceAlloc(n * 8));
  auto *colShare = static_cast<double *>(deviceAlloc(n * 8));
  void *workspace =
      deviceAlloc(tileWorkspaceBytes(tileRows, tileCols, type), false);
  auto *gemmOut = static_cast<float *>(
      deviceAlloc(tileRows * ((tileCols + 7) / 8 * 8) * 4, false));
  void *gemmG = deviceAlloc(tileRows * tileCols * element);

  TileLaunch launch;
  launch.workspace = workspace;
  launch.maxRows = tileRows;
  launch.maxCols = tileCols;
  launch.type = type;

  auto forEachTile =
      [&](const std::function<void(const Tile &, int64_t, int64_t)> &fn) {
        for (int64_t col = 0; col < m; col += tileCols)
          for (int64_t row = 0; row < n; row += tileRows) {
            Tile tile;
            tile.rowCount = std::min(tileRows, n - row);
            tile.colCount = std::min(tileCols, m - col);
            tile.depth = d;
            tile.rows = static_cast<char *>(rows) + row * d * element;
            tile.cols = static_cast<char *>(cols) + col * d * element;
            fn(tile, row, col);
          }
      };

  auto fusedForward = [&] {
    forEachTile([&](const Tile &tile, int64_t row, int64_t col) {
      ClipForward args;
      args.scale = 10;
      args.rowTargets = rowTargets + row;
      args.colBase = col;
      args.colTargets = colTargets + col;
      args.rowBase = row;
      args.rowMax = rowStats + row;
      args.rowSum = rowStats + n + row;
      args.rowTarget = rowStats + 2 * n + row;
      args.colMax = colStats + col;
      args.colSum = colStats + m + col;
      args.colTarget = colStats + 2 * m + col;
      clipForwardTile(launch, tile, args);
    });
  };
  auto fusedBackward = [&] {
    prepareGradientScale(launch, 10, ct, n, ct, m);
    forEachTile([&](const Tile &tile, int64_t row, int64_t col) {
      ClipBackward args;
      args.scale = 10;
      args.rowLse = lse + row;
      args.ctRow = ct + row;
      args.rowTargets = rowTargets + row;
      args.colBase = col;
      args.colLse = lse + col;
      args.ctCol = ct + col;
      args.colTargets = colTargets + col;
      args.rowBase = row;
      args.dRows = dRows + row * d;
      args.dCols = dCols + col * d;
      args.dScaleRow = dScale + row;
      args.colShareRow = colShare + row;
      clipBackwardTile(launch, tile, args);
    });
  };

  cublasHandle_t handle;
  CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const float one = 1, zero = 0;
  auto gemm = [&](cublasOperation_t opA, cublasOperation_t opB, int64_t mm,
                  int64_t nn, int64_t kk, const void *a, int64_t lda,
                  const void *b, int64_t ldb, const float *beta, float *c,
                  int64_t ldc) {
    CHECK(cublasGemmEx(handle, opA, opB, int(mm), int(nn), int(kk), &one, a,
                       cublasType, int(lda), b, cublasType, int(ldb), beta, c,
                       CUDA_R_32F, int(ldc), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  };
  auto gemmForward = [&] {
    forEachTile([&](const Tile &tile, int64_t, int64_t) {
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, tile.colCount, tile.rowCount, d, tile.cols,
           d, tile.rows, d, &zero, gemmOut, (tile.colCount + 7) / 8 * 8);
    });
  };
  auto gemmBackward = [&] {
    forEachTile([&](const Tile &tile, int64_t row, int64_t col) {
      const int64_t ld = (tile.colCount + 7) / 8 * 8;
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, tile.colCount, tile.rowCount, d, tile.cols,
           d, tile.rows, d, &zero, gemmOut, ld);
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, d, tile.rowCount, tile.colCount, tile.cols,
           d, gemmG, ld, &one, dRows + row * d, d);
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, d, tile.colCount, tile.rowCount, tile.rows,
           d, gemmG, ld, &one, dCols + col * d, d);
    });
  };

  const double flops = 2.0 * n * m * d;
  const double fwdFused = medianMs(fusedForward),
               fwdGemm = medianMs(gemmForward);
  const double bwdFused = medianMs(fusedBackward),
               bwdGemm = medianMs(gemmBackward);
  std::printf(
      "dloss-bench-cuda-fused: B_local %lld, B_global %lld, width %lld, "
      "%s, tile %lldx%lld\n",
      (long long)n, (long long)m, (long long)d, typeName.c_str(),
      (long long)tileRows, (long long)tileCols);
  std::printf("| pass | fused ms | GEMMs ms | fused TFLOP/s | GEMMs TFLOP/s | "
              "GEMMs / fused |\n|---|---:|---:|---:|---:|---:|\n");
  std::printf("| forward | %.3f | %.3f | %.1f | %.1f | %.2f |\n", fwdFused,
              fwdGemm, flops / fwdFused / 1e9, flops / fwdGemm / 1e9,
              fwdGemm / fwdFused);
  std::printf("| backward | %.3f | %.3f | %.1f | %.1f | %.2f |\n", bwdFused,
              bwdGemm, 3 * flops / bwdFused / 1e9, 3 * flops / bwdGemm / 1e9,
              bwdGemm / bwdFused);
  std::printf("verdict: forward %s, backward %s (target GEMMs / fused >= "
              "0.70)\n",
              fwdGemm / fwdFused >= 0.7 ? "MET" : "NOT MET",
              bwdGemm / bwdFused >= 0.7 ? "MET" : "NOT MET");
  cublasDestroy(handle);
  return 0;
}
