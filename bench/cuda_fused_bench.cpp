// Throughput of the CUDA fused CLIP tiles against the bare cuBLAS GEMMs they
// contain: the ratio is what the epilogues cost. Prints a line and exits 0
// where no GPU is visible.
//
//   dloss-bench-cuda-fused [B_local] [B_global] [width] [bf16|f16|f32]
//
// Runs clipForwardTile / clipBackwardTile over every tile of a B_local x
// B_global similarity (one rank's work, all chunks) and, on the same tile
// shapes, the plain cublasGemmEx calls alone (1 forward, 3 backward). The
// ratio GEMM time / fused time is the share of tensor-core throughput the
// fused kernels keep (target >= 0.70).
#include "runtime/fused/cuda/FusedTiles.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
  const cudaDataType_t cublasType = type == ElementType::F32   ? CUDA_R_32F
                                    : type == ElementType::F16 ? CUDA_R_16F
                                                               : CUDA_R_16BF;
  // The runtime's default GPU tile (FusedKernels.cpp, deviceTileShape).
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
