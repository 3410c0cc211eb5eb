// CUDA tiles of the fused similarity ops: cuBLAS GEMMs (fp32 accumulation)
// plus epilogue kernels that reproduce runtime/fused/TileMath.h's tile math.
//
// A tile S = rows cols^T (fp32, row-major, leading dimension ld = colCount
// rounded up to 8) is written by one cublasGemmEx into the workspace; the
// loss never sees a bigger matrix than that. Then, per op:
//   * forward: one pass over S (tileStats) reduces every 32 x 256 sub-tile to
//     per-row and per-column partial (max, sum) pairs, from registers, with
//     warp shuffles for rows and shared memory for columns; two small kernels
//     fold the partials, in a fixed order, into the running statistics and
//     pick up the target logits. No atomics: the results are deterministic.
//   * backward: one warp per row rebuilds G from S and the saved statistics
//     (exactly the CPU kernel's formula), stores it in the input type and
//     reduces the row's share of dscale; two more GEMMs accumulate
//     dRows += scale G cols and dCols += scale G^T rows into fp32 with
//     beta = 1. G is stored pre-multiplied by a power of two (alpha divides
//     it back out) so that fp16 cannot underflow small cotangents.
// Errors raise std::runtime_error built from a C string: no std::string
// crosses into the runtime's translation units, whatever their C++ ABI.
#include "runtime/fused/cuda/FusedTiles.h"

#include "runtime/support/CudaDeviceGuard.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace dloss::cuda {

namespace {

//===----------------------------------------------------------------------===//
// Errors, devices, handles
//===----------------------------------------------------------------------===//

[[noreturn]] void raise(const std::string &what) {
  throw std::runtime_error(what.c_str());
}

void check(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    raise(std::string("CUDA error in ") + call + ": " +
          cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char *call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    raise(std::string("cuBLAS error in ") + call + ": " +
          cublasGetStatusString(status));
}

#define DLOSS_CUDA_CHECK(call) check((call), #call)

/// One cuBLAS handle per thread and device, created on first use and kept
/// (creating one costs far more than a tile). Never destroyed: at exit the
/// CUDA context may already be gone.
cublasHandle_t handleFor(const TileLaunch &launch) {
  thread_local std::vector<cublasHandle_t> handles;
  if (launch.device < 0)
    raise("invalid CUDA device " + std::to_string(launch.device));
  if (handles.size() <= static_cast<size_t>(launch.device))
    handles.resize(launch.device + 1, nullptr);
  cublasHandle_t &handle = handles[launch.device];
  if (!handle)
    DLOSS_CUDA_CHECK(cublasCreate(&handle));
  DLOSS_CUDA_CHECK(
      cublasSetStream(handle, static_cast<cudaStream_t>(launch.stream)));
  return handle;
}

//===----------------------------------------------------------------------===//
// Workspace
//===----------------------------------------------------------------------===//

// tileStats' sub-tile: 8 warps, each owning 4 rows x 8 columns per lane.
constexpr int kStatWarps = 8;
constexpr int kStatRowsPerWarp = 4;
constexpr int kStatRows = kStatWarps * kStatRowsPerWarp; // 32
constexpr int kStatColsPerLane = 8;
constexpr int kStatCols = 32 * kStatColsPerLane; // 256
constexpr int kThreads = 256;
// tileGradient: one warp per row.
constexpr int kGradRowsPerBlock = kThreads / 32;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t alignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }
/// S's and G's leading dimension: 16-byte rows for 16-bit G (tensor cores).
int64_t leadingDim(int64_t cols) { return (cols + 7) / 8 * 8; }

/// The workspace, carved into its parts.
struct Workspace {
  float *sim;       ///< [maxRows, ld] fp32
  void *grad;       ///< [maxRows, ld] of the element type
  float2 *rowPart;  ///< [ceil(maxCols / 256), maxRows]
  float2 *colPart;  ///< [ceil(maxRows / 32), maxCols]
  float *gradScale; ///< {prescale of G, scale / prescale, 1}
};

Workspace carve(const TileLaunch &launch) {
  const int64_t ld = leadingDim(launch.maxCols);
  char *at = static_cast<char *>(launch.workspace);
  Workspace ws;
  ws.sim = reinterpret_cast<float *>(at);
  at += alignUp(sizeof(float) * launch.maxRows * ld);
  ws.grad = at;
  at += alignUp(elementSize(launch.type) * launch.maxRows * ld);
  ws.rowPart = reinterpret_cast<float2 *>(at);
  at += alignUp(sizeof(float2) * ceilDiv(launch.maxCols, kStatCols) *
                launch.maxRows);
  ws.colPart = reinterpret_cast<float2 *>(at);
  at += alignUp(sizeof(float2) * ceilDiv(launch.maxRows, kStatRows) *
                launch.maxCols);
  ws.gradScale = reinterpret_cast<float *>(at);
  return ws;
}

void checkTile(const TileLaunch &launch, const Tile &tile, const char *op) {
  if (!launch.workspace)
    raise(std::string(op) + ": no workspace");
  if (tile.rowCount > launch.maxRows || tile.colCount > launch.maxCols)
    raise(std::string(op) + ": a " + std::to_string(tile.rowCount) + " x " +
          std::to_string(tile.colCount) + " tile exceeds the workspace's " +
          std::to_string(launch.maxRows) + " x " +
          std::to_string(launch.maxCols));
  if (tile.rowCount > INT32_MAX || tile.colCount > INT32_MAX ||
      tile.depth > INT32_MAX)
    raise(std::string(op) + ": tile dimensions exceed 2^31");
}

//===----------------------------------------------------------------------===//
// GEMMs
//===----------------------------------------------------------------------===//

cudaDataType_t dataType(ElementType type) {
  switch (type) {
  case ElementType::F32:
    return CUDA_R_32F;
  case ElementType::F16:
    return CUDA_R_16F;
  case ElementType::BF16:
    return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasComputeType_t computeType(const TileLaunch &launch) {
  return launch.type == ElementType::F32 && launch.allowTF32
             ? CUBLAS_COMPUTE_32F_FAST_TF32
             : CUBLAS_COMPUTE_32F;
}

/// S = rows cols^T into ws.sim. cuBLAS is column-major: the row-major
/// [rowCount, ld] S is the column-major [colCount, rowCount] S^T = cols rows^T.
void similarity(cublasHandle_t handle, const TileLaunch &launch,
                const Tile &tile, float *sim, int64_t ld) {
  const float one = 1, zero = 0;
  const cudaDataType_t type = dataType(launch.type);
  DLOSS_CUDA_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  DLOSS_CUDA_CHECK(cublasGemmEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(tile.colCount),
      static_cast<int>(tile.rowCount), static_cast<int>(tile.depth), &one,
      tile.cols, type, static_cast<int>(tile.depth), tile.rows, type,
      static_cast<int>(tile.depth), &zero, sim, CUDA_R_32F,
      static_cast<int>(ld), computeType(launch), CUBLAS_GEMM_DEFAULT));
}

/// dRows += alpha G cols and dCols += alpha G^T rows, G [rowCount, ld] in
/// the element type; alpha and beta (= 1) are read from device memory
/// (alphaBeta[0], alphaBeta[1]).
void backpropagate(cublasHandle_t handle, const TileLaunch &launch,
                   const Tile &tile, const void *grad, int64_t ld,
                   const float *alphaBeta, float *dRows, float *dCols) {
  const cudaDataType_t type = dataType(launch.type);
  const int rows = static_cast<int>(tile.rowCount),
            cols = static_cast<int>(tile.colCount),
            depth = static_cast<int>(tile.depth);
  const float *alpha = alphaBeta, *beta = alphaBeta + 1;
  DLOSS_CUDA_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE));
  // dRows^T [depth, rows] += cols^T [depth, cols] G^T [cols, rows].
  DLOSS_CUDA_CHECK(cublasGemmEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, depth, rows, cols, alpha, tile.cols,
      type, depth, grad, type, static_cast<int>(ld), beta, dRows, CUDA_R_32F,
      depth, computeType(launch), CUBLAS_GEMM_DEFAULT));
  // dCols^T [depth, cols] += rows^T [depth, rows] G [rows, cols].
  DLOSS_CUDA_CHECK(cublasGemmEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_T, depth, cols, rows, alpha, tile.rows,
      type, depth, grad, type, static_cast<int>(ld), beta, dCols, CUDA_R_32F,
      depth, computeType(launch), CUBLAS_GEMM_DEFAULT));
  DLOSS_CUDA_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
}

//===----------------------------------------------------------------------===//
// Device math
//===----------------------------------------------------------------------===//

enum class Mode { Clip, Sigmoid, Sharded };

constexpr float kNegInf = -INFINITY;

/// The CPU kernels' finiteShift: an infinite maximum shifts by 0, so that an
/// empty set (max -inf) keeps exp(-inf) = 0 instead of NaN.
__device__ __forceinline__ float finiteShift(float x) {
  return isinf(x) ? 0.f : x;
}

/// Folds (m2, s2) into (m1, s1): online log-sum-exp, s the sum of exp(x - m).
__device__ __forceinline__ void mergeLse(float &m1, float &s1, float m2,
                                         float s2) {
  float top = fmaxf(m1, m2);
  float shift = finiteShift(top);
  s1 = s1 * __expf(m1 - shift) + s2 * __expf(m2 - shift);
  m1 = top;
}

/// softplus(x) = log1p(exp(-|x|)) + max(x, 0): exact at both ends, 0 at -inf.
__device__ __forceinline__ float softplus(float x) {
  return log1pf(__expf(-fabsf(x))) + fmaxf(x, 0.f);
}

__device__ __forceinline__ float sigmoid(float x) {
  if (x >= 0)
    return 1.f / (1.f + __expf(-x));
  float e = __expf(x);
  return e / (1.f + e);
}

__device__ __forceinline__ float warpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <typename T> __device__ __forceinline__ T fromFloat(float x);
template <> __device__ __forceinline__ float fromFloat<float>(float x) {
  return x;
}
template <> __device__ __forceinline__ __half fromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

//===----------------------------------------------------------------------===//
// Forward: statistics
//===----------------------------------------------------------------------===//

struct StatArgs {
  const float *sim;
  int64_t ld;
  int rows, cols;
  float scale, bias;
  const int64_t *rowTargets; // Sharded: the excluded column of each row
  int64_t colBase;
  float2 *rowPart; // [gridDim.x, rows]
  float2 *colPart; // [gridDim.y, cols]; Clip only
};

__device__ __forceinline__ void
columnPartials(const StatArgs &a,
               const float (&v)[kStatRowsPerWarp][kStatColsPerLane], int warp,
               int lane, int col0);

/// Partial statistics of one 32 x 256 sub-tile of L (= scale S [+ bias]).
/// Clip and Sharded: per row and (Clip) per column (max, sum exp(L - max));
/// Sigmoid: per row (0, sum softplus(L)). Elements outside the tile, and
/// Sharded's targets, are -inf: they add nothing to either.
template <Mode M>
__global__ void __launch_bounds__(kThreads) tileStats(StatArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.y * kStatRows, col0 = blockIdx.x * kStatCols;
  float v[kStatRowsPerWarp][kStatColsPerLane];
#pragma unroll
  for (int r = 0; r < kStatRowsPerWarp; ++r) {
    const int i = row0 + warp + r * kStatWarps;
    int64_t excluded = -1;
    if (M == Mode::Sharded && i < a.rows)
      excluded = a.rowTargets[i] - a.colBase;
#pragma unroll
    for (int q = 0; q < kStatColsPerLane; ++q) {
      const int j = col0 + lane + 32 * q;
      float x = kNegInf;
      if (i < a.rows && j < a.cols) {
        x = a.scale * a.sim[i * a.ld + j];
        if (M == Mode::Sigmoid)
          x += a.bias;
        if (M == Mode::Sharded && j == excluded)
          x = kNegInf;
      }
      v[r][q] = x;
    }
  }

  // Rows: every row of the sub-tile lies in one warp.
#pragma unroll
  for (int r = 0; r < kStatRowsPerWarp; ++r) {
    const int i = row0 + warp + r * kStatWarps;
    float top = 0, sum = 0;
    if (M == Mode::Sigmoid) {
#pragma unroll
      for (int q = 0; q < kStatColsPerLane; ++q)
        sum += softplus(v[r][q]);
    } else {
      top = kNegInf;
#pragma unroll
      for (int q = 0; q < kStatColsPerLane; ++q)
        top = fmaxf(top, v[r][q]);
      top = warpMax(top);
      const float shift = finiteShift(top);
#pragma unroll
      for (int q = 0; q < kStatColsPerLane; ++q)
        sum += __expf(v[r][q] - shift);
    }
    sum = warpSum(sum);
    if (lane == 0 && i < a.rows)
      a.rowPart[static_cast<int64_t>(blockIdx.x) * a.rows + i] =
          make_float2(top, sum);
  }

  if constexpr (M == Mode::Clip)
    columnPartials(a, v, warp, lane, col0);
}

/// CLIP's column partials of tileStats' sub-tile: each thread's 4 rows, then
/// the 8 warps through shared memory.
__device__ __forceinline__ void
columnPartials(const StatArgs &a,
               const float (&v)[kStatRowsPerWarp][kStatColsPerLane], int warp,
               int lane, int col0) {
  __shared__ float colMax[kStatWarps][kStatCols];
  __shared__ float colSum[kStatWarps][kStatCols];
#pragma unroll
  for (int q = 0; q < kStatColsPerLane; ++q) {
    float top = kNegInf;
#pragma unroll
    for (int r = 0; r < kStatRowsPerWarp; ++r)
      top = fmaxf(top, v[r][q]);
    colMax[warp][lane + 32 * q] = top;
  }
  __syncthreads();
#pragma unroll
  for (int q = 0; q < kStatColsPerLane; ++q) {
    const int c = lane + 32 * q;
    float top = kNegInf;
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w)
      top = fmaxf(top, colMax[w][c]);
    const float shift = finiteShift(top);
    float sum = 0;
#pragma unroll
    for (int r = 0; r < kStatRowsPerWarp; ++r)
      sum += __expf(v[r][q] - shift);
    colSum[warp][c] = sum;
  }
  __syncthreads();
  const int c = threadIdx.x; // kThreads == kStatCols
  if (col0 + c < a.cols) {
    float top = kNegInf, sum = 0;
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w)
      top = fmaxf(top, colMax[w][c]);
#pragma unroll
    for (int w = 0; w < kStatWarps; ++w)
      sum += colSum[w][c];
    a.colPart[static_cast<int64_t>(blockIdx.y) * a.cols + col0 + c] =
        make_float2(top, sum);
  }
}

struct RowMergeArgs {
  const float *sim;
  int64_t ld;
  int rows, cols, parts;
  float scale, bias;
  const float2 *rowPart;
  const int64_t *targets;
  int64_t colBase;
  float *rowMax; // Sigmoid: unused
  float *rowSum; // Sigmoid: the sum of softplus
  float *picked; // the target's L (Clip, Sigmoid) or S (Sharded)
};

/// Folds a tile's row partials, in column order, into the running row
/// statistics, and picks up each row's target in the tile.
template <Mode M>
__global__ void __launch_bounds__(kThreads) mergeRows(RowMergeArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.rows)
    return;
  if (M == Mode::Sigmoid) {
    float sum = a.rowSum[i];
    for (int p = 0; p < a.parts; ++p)
      sum += a.rowPart[static_cast<int64_t>(p) * a.rows + i].y;
    a.rowSum[i] = sum;
  } else {
    float top = a.rowMax[i], sum = a.rowSum[i];
    for (int p = 0; p < a.parts; ++p) {
      float2 part = a.rowPart[static_cast<int64_t>(p) * a.rows + i];
      mergeLse(top, sum, part.x, part.y);
    }
    a.rowMax[i] = top;
    a.rowSum[i] = sum;
  }
  const int64_t t = a.targets[i] - a.colBase;
  if (t >= 0 && t < a.cols) {
    const float s = a.sim[i * a.ld + t];
    a.picked[i] = M == Mode::Sharded   ? s
                  : M == Mode::Sigmoid ? a.scale * s + a.bias
                                       : a.scale * s;
  }
}

struct ColMergeArgs {
  const float *sim;
  int64_t ld;
  int rows, cols, parts;
  float scale;
  const float2 *colPart;
  const int64_t *targets; // the columns' global target rows
  int64_t rowBase;
  float *colMax, *colSum, *picked;
};

/// CLIP's columns: folds the row-block partials, in row order, into the
/// chunk's column statistics and picks up each column's target.
__global__ void __launch_bounds__(kThreads) mergeCols(ColMergeArgs a) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= a.cols)
    return;
  float top = a.colMax[j], sum = a.colSum[j];
  for (int p = 0; p < a.parts; ++p) {
    float2 part = a.colPart[static_cast<int64_t>(p) * a.cols + j];
    mergeLse(top, sum, part.x, part.y);
  }
  a.colMax[j] = top;
  a.colSum[j] = sum;
  const int64_t t = a.targets[j] - a.rowBase;
  if (t >= 0 && t < a.rows)
    a.picked[j] = a.scale * a.sim[t * a.ld + j];
}

//===----------------------------------------------------------------------===//
// Backward: G
//===----------------------------------------------------------------------===//

struct GradArgs {
  const float *sim;
  int64_t ld;
  int rows, cols;
  float scale, bias;
  const float *gradScale; // {prescale, ...}
  // Per row (the tile's first row).
  const float *rowLse, *ctRow, *ctExtra; // ctExtra: Sigmoid's ct_positive
  const int64_t *rowTargets;
  int64_t colBase;
  // Per column (Clip).
  const float *colLse, *ctCol;
  const int64_t *colTargets;
  int64_t rowBase;
  double *dScaleRow,
      *extraRow; // extraRow: Clip's column share, Sigmoid's dbias
};

/// One warp per row: G into the workspace (times the prescale, in T), and
/// the row's float64 shares of dscale (and dbias / the column share).
template <typename T, Mode M>
__global__ void __launch_bounds__(kThreads) tileGradient(GradArgs a, T *grad) {
  const int i = blockIdx.x * kGradRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= a.rows)
    return; // the whole warp: its shuffles stay among full warps
  const float prescale = a.gradScale[0];
  const float *sim = a.sim + i * a.ld;
  T *g = grad + i * a.ld;
  const int64_t target = a.rowTargets[i] - a.colBase;
  const int64_t globalRow = a.rowBase + i;
  const float rowLse = M == Mode::Sigmoid ? 0.f : a.rowLse[i];
  const float ctRow = a.ctRow[i];
  const float ctExtra = M == Mode::Sigmoid ? a.ctExtra[i] : 0.f;
  float all = 0, extra = 0;
  for (int j = lane; j < a.cols; j += 32) {
    const float s = sim[j], logit = a.scale * s;
    float value;
    if (M == Mode::Clip) {
      // G = ct_row P_row + ct_col P_col - the one-hot targets.
      value = ctRow * __expf(logit - rowLse);
      const float ctCol = a.ctCol[j];
      const float byCol = ctCol * __expf(logit - a.colLse[j]);
      extra += byCol * s;
      value += byCol;
      if (j == target)
        value -= ctRow;
      if (a.colTargets[j] == globalRow) {
        value -= ctCol;
        extra -= ctCol * s;
      }
    } else if (M == Mode::Sigmoid) {
      value = ctRow * sigmoid(logit + a.bias);
      if (j == target)
        value += ctExtra;
      extra += value;
    } else {
      value = j == target ? 0.f : ctRow * __expf(logit - rowLse);
    }
    all += value * s;
    g[j] = fromFloat<T>(value * prescale);
  }
  all = warpSum(all);
  if (M != Mode::Sharded)
    extra = warpSum(extra);
  if (lane == 0) {
    // dscale's row part: all of sum(G S) but the column direction's.
    a.dScaleRow[i] += static_cast<double>(M == Mode::Clip ? all - extra : all);
    if (M != Mode::Sharded)
      a.extraRow[i] += static_cast<double>(extra);
  }
}

/// {prescale, scale / prescale, 1}: prescale the power of two that brings
/// max|a| + max|b| into [0.5, 1), or 1 when that is 0 or not finite.
__global__ void __launch_bounds__(1024)
    gradientScale(const float *a, int64_t na, const float *b, int64_t nb,
                  float scale, float *out) {
  __shared__ float partial[2][32];
  float ma = 0, mb = 0;
  for (int64_t k = threadIdx.x; k < na; k += blockDim.x)
    ma = fmaxf(ma, fabsf(a[k]));
  for (int64_t k = threadIdx.x; k < nb; k += blockDim.x)
    mb = fmaxf(mb, fabsf(b[k]));
  ma = warpMax(ma);
  mb = warpMax(mb);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    partial[0][warp] = ma;
    partial[1][warp] = mb;
  }
  __syncthreads();
  if (warp != 0)
    return;
  const int warps = blockDim.x / 32;
  ma = lane < warps ? partial[0][lane] : 0.f;
  mb = lane < warps ? partial[1][lane] : 0.f;
  ma = warpMax(ma);
  mb = warpMax(mb);
  if (lane == 0) {
    const float amplitude = ma + mb;
    float prescale = 1;
    if (amplitude > 0 && isfinite(amplitude)) {
      int exponent = 0;
      frexpf(amplitude, &exponent);
      prescale = ldexpf(1.f, -exponent);
    }
    out[0] = prescale;
    out[1] = scale / prescale;
    out[2] = 1;
  }
}

//===----------------------------------------------------------------------===//
// Launch helpers
//===----------------------------------------------------------------------===//

cudaStream_t streamOf(const TileLaunch &launch) {
  return static_cast<cudaStream_t>(launch.stream);
}

void checkLaunch(const char *kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    raise(std::string("CUDA error launching ") + kernel + ": " +
          cudaGetErrorString(status));
}

/// tileStats + mergeRows for one tile whose S is in ws.sim, with
/// L = scale S + bias, each row's target at targets[i] - colBase, and the
/// running statistics (RowMergeArgs) rowMax, rowSum and picked.
template <Mode M>
void rowStatistics(const TileLaunch &launch, const Tile &tile,
                   const Workspace &ws, int64_t ld, float scale, float bias,
                   const int64_t *targets, int64_t colBase, float *rowMax,
                   float *rowSum, float *picked) {
  const int rows = static_cast<int>(tile.rowCount),
            cols = static_cast<int>(tile.colCount);
  StatArgs stats{};
  RowMergeArgs merge{};
  stats.scale = merge.scale = scale;
  stats.bias = merge.bias = bias;
  if (M == Mode::Sharded) {
    stats.rowTargets = targets;
    stats.colBase = colBase;
  }
  merge.targets = targets;
  merge.colBase = colBase;
  merge.rowMax = rowMax;
  merge.rowSum = rowSum;
  merge.picked = picked;
  stats.sim = merge.sim = ws.sim;
  stats.ld = merge.ld = ld;
  stats.rows = merge.rows = rows;
  stats.cols = merge.cols = cols;
  stats.rowPart = ws.rowPart;
  stats.colPart = ws.colPart;
  merge.rowPart = ws.rowPart;
  merge.parts = static_cast<int>(ceilDiv(cols, kStatCols));
  dim3 grid(static_cast<unsigned>(ceilDiv(cols, kStatCols)),
            static_cast<unsigned>(ceilDiv(rows, kStatRows)));
  tileStats<M><<<grid, kThreads, 0, streamOf(launch)>>>(stats);
  checkLaunch("tileStats");
  mergeRows<M><<<static_cast<unsigned>(ceilDiv(rows, kThreads)), kThreads, 0,
                 streamOf(launch)>>>(merge);
  checkLaunch("mergeRows");
}

template <Mode M>
void launchGradient(const TileLaunch &launch, const Tile &tile,
                    const Workspace &ws, const GradArgs &args) {
  const unsigned blocks =
      static_cast<unsigned>(ceilDiv(tile.rowCount, kGradRowsPerBlock));
  switch (launch.type) {
  case ElementType::F32:
    tileGradient<float, M><<<blocks, kThreads, 0, streamOf(launch)>>>(
        args, static_cast<float *>(ws.grad));
    break;
  case ElementType::F16:
    tileGradient<__half, M><<<blocks, kThreads, 0, streamOf(launch)>>>(
        args, static_cast<__half *>(ws.grad));
    break;
  case ElementType::BF16:
    tileGradient<__nv_bfloat16, M><<<blocks, kThreads, 0, streamOf(launch)>>>(
        args, static_cast<__nv_bfloat16 *>(ws.grad));
    break;
  }
  checkLaunch("tileGradient");
}

bool empty(const Tile &tile) {
  return tile.rowCount <= 0 || tile.colCount <= 0;
}

/// What every launcher starts with: nothing for an empty tile; otherwise
/// checks it (errors name `op`), makes its device current, computes S into
/// the workspace and calls body(handle, ws, ld) in that scope.
template <typename Body>
void withSimilarity(const TileLaunch &launch, const Tile &tile, const char *op,
                    Body &&body) {
  if (empty(tile))
    return;
  checkTile(launch, tile, op);
  CudaDeviceGuard scope(launch.device);
  DLOSS_CUDA_CHECK(scope.status());
  const Workspace ws = carve(launch);
  const int64_t ld = leadingDim(tile.colCount);
  cublasHandle_t handle = handleFor(launch);
  similarity(handle, launch, tile, ws.sim, ld);
  body(handle, ws, ld);
}

/// A forward tile whose statistics are rows only (Sigmoid, Sharded): S, then
/// rowStatistics.
template <Mode M>
void rowsForwardTile(const TileLaunch &launch, const Tile &tile, const char *op,
                     float scale, float bias, const int64_t *targets,
                     int64_t colBase, float *rowMax, float *rowSum,
                     float *picked) {
  withSimilarity(launch, tile, op,
                 [&](cublasHandle_t, const Workspace &ws, int64_t ld) {
                   rowStatistics<M>(launch, tile, ws, ld, scale, bias, targets,
                                    colBase, rowMax, rowSum, picked);
                 });
}

/// A backward tile: S, then G from `grad` (the op's own fields; the tile's
/// and BackwardTile's are filled in here) and the two GEMMs into `out`.
template <Mode M>
void backwardTile(const TileLaunch &launch, const Tile &tile, const char *op,
                  const BackwardTile &out, GradArgs grad) {
  withSimilarity(launch, tile, op,
                 [&](cublasHandle_t handle, const Workspace &ws, int64_t ld) {
                   grad.sim = ws.sim;
                   grad.ld = ld;
                   grad.rows = static_cast<int>(tile.rowCount);
                   grad.cols = static_cast<int>(tile.colCount);
                   grad.scale = out.scale;
                   grad.gradScale = ws.gradScale;
                   grad.rowTargets = out.rowTargets;
                   grad.colBase = out.colBase;
                   grad.dScaleRow = out.dScaleRow;
                   launchGradient<M>(launch, tile, ws, grad);
                   backpropagate(handle, launch, tile, ws.grad, ld,
                                 ws.gradScale + 1, out.dRows, out.dCols);
                 });
}

} // namespace

//===----------------------------------------------------------------------===//
// Public functions
//===----------------------------------------------------------------------===//

size_t elementSize(ElementType type) {
  return type == ElementType::F32 ? 4 : 2;
}

size_t tileWorkspaceBytes(int64_t maxRows, int64_t maxCols, ElementType type) {
  const int64_t ld = leadingDim(maxCols);
  return alignUp(sizeof(float) * maxRows * ld) +
         alignUp(elementSize(type) * maxRows * ld) +
         alignUp(sizeof(float2) * ceilDiv(maxCols, kStatCols) * maxRows) +
         alignUp(sizeof(float2) * ceilDiv(maxRows, kStatRows) * maxCols) +
         alignUp(4 * sizeof(float));
}

void clipForwardTile(const TileLaunch &launch, const Tile &tile,
                     const ClipForward &args) {
  withSimilarity(
      launch, tile, "clipForwardTile",
      [&](cublasHandle_t, const Workspace &ws, int64_t ld) {
        rowStatistics<Mode::Clip>(launch, tile, ws, ld, args.scale, 0,
                                  args.rowTargets, args.colBase, args.rowMax,
                                  args.rowSum, args.rowTarget);
        ColMergeArgs cols{};
        cols.sim = ws.sim;
        cols.ld = ld;
        cols.rows = static_cast<int>(tile.rowCount);
        cols.cols = static_cast<int>(tile.colCount);
        cols.parts = static_cast<int>(ceilDiv(tile.rowCount, kStatRows));
        cols.scale = args.scale;
        cols.colPart = ws.colPart;
        cols.targets = args.colTargets;
        cols.rowBase = args.rowBase;
        cols.colMax = args.colMax;
        cols.colSum = args.colSum;
        cols.picked = args.colTarget;
        mergeCols<<<static_cast<unsigned>(ceilDiv(tile.colCount, kThreads)),
                    kThreads, 0, streamOf(launch)>>>(cols);
        checkLaunch("mergeCols");
      });
}

void sigmoidForwardTile(const TileLaunch &launch, const Tile &tile,
                        const SigmoidForward &args) {
  rowsForwardTile<Mode::Sigmoid>(launch, tile, "sigmoidForwardTile", args.scale,
                                 args.bias, args.targets, args.colBase, nullptr,
                                 args.pairSum, args.positive);
}

void shardedForwardTile(const TileLaunch &launch, const Tile &tile,
                        const ShardedForward &args) {
  rowsForwardTile<Mode::Sharded>(launch, tile, "shardedForwardTile", args.scale,
                                 0, args.targets, args.colBase, args.rowMax,
                                 args.rowSum, args.targetDot);
}

void prepareGradientScale(const TileLaunch &launch, float scale, const float *a,
                          int64_t na, const float *b, int64_t nb) {
  if (!launch.workspace)
    raise("prepareGradientScale: no workspace");
  CudaDeviceGuard scope(launch.device);
  DLOSS_CUDA_CHECK(scope.status());
  const Workspace ws = carve(launch);
  gradientScale<<<1, 1024, 0, streamOf(launch)>>>(a, a ? na : 0, b, b ? nb : 0,
                                                  scale, ws.gradScale);
  checkLaunch("gradientScale");
}

void clipBackwardTile(const TileLaunch &launch, const Tile &tile,
                      const ClipBackward &args) {
  GradArgs grad{};
  grad.rowLse = args.rowLse;
  grad.ctRow = args.ctRow;
  grad.colLse = args.colLse;
  grad.ctCol = args.ctCol;
  grad.colTargets = args.colTargets;
  grad.rowBase = args.rowBase;
  grad.extraRow = args.colShareRow;
  backwardTile<Mode::Clip>(launch, tile, "clipBackwardTile", args, grad);
}

void sigmoidBackwardTile(const TileLaunch &launch, const Tile &tile,
                         const SigmoidBackward &args) {
  GradArgs grad{};
  grad.bias = args.bias;
  grad.ctRow = args.ctPair;
  grad.ctExtra = args.ctPositive;
  grad.extraRow = args.dBiasRow;
  backwardTile<Mode::Sigmoid>(launch, tile, "sigmoidBackwardTile", args, grad);
}

void shardedBackwardTile(const TileLaunch &launch, const Tile &tile,
                         const ShardedBackward &args) {
  GradArgs grad{};
  grad.rowLse = args.lseRest;
  grad.ctRow = args.ctLse;
  backwardTile<Mode::Sharded>(launch, tile, "shardedBackwardTile", args, grad);
}

int64_t tileLeadingDim(int64_t cols) { return leadingDim(cols); }

void similarityGemm(const TileLaunch &launch, const Tile &tile, float *sim,
                    int64_t ld) {
  similarity(handleFor(launch), launch, tile, sim, ld);
}

void gradientGemms(const TileLaunch &launch, const Tile &tile, const void *grad,
                   int64_t ld, const float *alphaBeta, float *dRows,
                   float *dCols) {
  backpropagate(handleFor(launch), launch, tile, grad, ld, alphaBeta, dRows,
                dCols);
}

int deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

} // namespace dloss::cuda
