// CUDA tiles of dloss.fused_similarity and its _grad: the tile program of
// runtime/fused/Epilogue.h, one element per thread, on a cuBLAS fp32 tile.
//
// Per tile (all on TileLaunch::stream):
//   * forward: similarityGemm writes S into the workspace. rowForward, one
//     warp per tile row, evaluates the program on the row's elements
//     (epilogue::evaluate<float>, the rules the CPU kernels run), reduces
//     every row result in registers and with warp shuffles (sums; online
//     log-sum-exp pairs) and folds it into the running row statistics. With
//     column results, colForward evaluates the program again, one thread per
//     column over a slab of 32 rows, and writes per-slab partials that
//     colMerge folds, in row order, into the chunk's column statistics. No
//     atomics: the results do not depend on scheduling.
//   * backward: S again; gradient, one warp per row, evaluates, seeds the
//     results' registers, runs epilogue::reverse<float> and writes G = dL/dS
//     over S in place (fp32), with the row's float64 shares of the leaves'
//     gradients; 16-bit inputs then get G in their type, scaled by a power of
//     two so that max|G| < 1 (fp16 keeps small values; alpha divides it
//     back out); gradientGemms adds G cols and G^T rows.
// The column pass re-evaluates the program rather than storing every
// column result's values: simpler, and the cost only where there are column
// results (one 2-D pass for both, as FusedTiles' tileStats, is the next step
// once measured).
//
// Errors raise std::runtime_error built from a C string (FusedTiles.cu's
// rule: no std::string crosses into the runtime's translation units).
#include "runtime/fused/cuda/SimilarityTiles.h"

#include "runtime/support/CudaDeviceGuard.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace dloss::cuda {

namespace {

using epilogue::Instr;
using epilogue::Op;
using epilogue::Reduce;

//===----------------------------------------------------------------------===//
// Errors, workspace
//===----------------------------------------------------------------------===//

[[noreturn]] void raise(const std::string &what) {
  throw std::runtime_error(what.c_str());
}

void check(cudaError_t status, const char *call) {
  if (status != cudaSuccess)
    raise(std::string("CUDA error in ") + call + ": " +
          cudaGetErrorString(status));
}

void checkLaunch(const char *kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    raise(std::string("CUDA error launching ") + kernel + ": " +
          cudaGetErrorString(status));
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32; // rows per block (one warp each)
constexpr int kColRows = 32;          // rows per colForward slab

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t alignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// The workspace, carved into its parts.
struct Workspace {
  float *sim;      ///< [maxRows, ld] fp32: S, then (backward) G over it
  void *grad;      ///< [maxRows, ld] of the element type (16-bit G)
  float2 *colPart; ///< [colResults, ceil(maxRows / kColRows), maxCols]
  float *scale;    ///< {alpha, beta = 1}, then max|G|'s bits (uint32)
};

Workspace carve(const TileLaunch &launch, int colResults) {
  const int64_t ld = tileLeadingDim(launch.maxCols);
  char *at = static_cast<char *>(launch.workspace);
  Workspace ws;
  ws.sim = reinterpret_cast<float *>(at);
  at += alignUp(sizeof(float) * launch.maxRows * ld);
  ws.grad = at;
  at += alignUp(elementSize(launch.type) * launch.maxRows * ld);
  ws.colPart = reinterpret_cast<float2 *>(at);
  at += alignUp(sizeof(float2) * colResults *
                ceilDiv(launch.maxRows, kColRows) * launch.maxCols);
  ws.scale = reinterpret_cast<float *>(at);
  return ws;
}

void checkTile(const TileLaunch &launch, const Tile &tile,
               const TileProgram &program, const char *op) {
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
  // The runtime checks these against the plan first; this guards the
  // kernels' fixed-size arrays.
  if (program.count <= 0 || program.count > kMaxInstructions ||
      program.rowResults < 0 || program.rowResults > kMaxResults ||
      program.colResults < 0 || program.colResults > kMaxResults ||
      program.rowLeaves < 0 || program.rowLeaves > kMaxRowLeaves ||
      program.colLeaves < 0 || program.colLeaves > kMaxColLeaves ||
      program.scalars < 0 || program.scalars > kMaxScalars)
    raise(std::string(op) + ": the tile program exceeds the device limits");
}

//===----------------------------------------------------------------------===//
// Device math
//===----------------------------------------------------------------------===//

constexpr float kNegInf = -INFINITY;

/// The CPU kernels' finiteShift: an infinite maximum shifts by 0, so that an
/// empty set (max -inf) keeps exp(-inf) = 0 instead of NaN.
__device__ __forceinline__ float finiteShift(float x) {
  return isinf(x) ? 0.f : x;
}

/// Folds (m2, s2) into (m1, s1): online log-sum-exp, s the sum of exp(x - m).
/// Symmetric up to the order of one addition (exact in IEEE), so the lanes of
/// a butterfly agree.
__device__ __forceinline__ void mergeLse(float &m1, float &s1, float m2,
                                         float s2) {
  const float top = fmaxf(m1, m2);
  const float shift = finiteShift(top);
  s1 = s1 * expf(m1 - shift) + s2 * expf(m2 - shift);
  m1 = top;
}

/// Adds one value to a result's statistics: the sum, or the online
/// log-sum-exp (one exp per value unless the maximum moves).
__device__ __forceinline__ void accumulate(Reduce kind, float e, float &top,
                                           float &sum) {
  if (kind == Reduce::Sum) {
    sum += e;
  } else if (e <= top) {
    sum += expf(e - finiteShift(top));
  } else { // a new maximum (or NaN, which then stays)
    sum = sum * expf(top - finiteShift(e)) + expf(e - finiteShift(e));
    top = e;
  }
}

__device__ __forceinline__ float warpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

/// A result's statistics over the whole warp, in every lane.
__device__ __forceinline__ void warpFold(Reduce kind, float &top, float &sum) {
  if (kind == Reduce::Sum) {
    sum = warpSum(sum);
    return;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, top, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, sum, offset);
    mergeLse(top, sum, m2, s2);
  }
}

/// Evaluates the program on element (i, j) of the tile, whose similarity is
/// `s`, into regs: epilogue::evaluate, the leaves read here.
__device__ __forceinline__ void evaluateAt(const TileProgram &p,
                                           const TileLeaves &leaves, float s,
                                           int i, int j, float *regs) {
  epilogue::evaluate<float>(p.code, p.count, regs,
                            [&](const Instr &ins) -> float {
                              switch (ins.op) {
                              case Op::Sim:
                                return s;
                              case Op::ColId:
                                return static_cast<float>(leaves.colBase + j);
                              case Op::RowId:
                                return static_cast<float>(leaves.rowBase + i);
                              case Op::RowLeaf:
                                return leaves.row[ins.a][i];
                              case Op::ColLeaf:
                                return leaves.col[ins.a][j];
                              case Op::Scalar:
                                return p.scalar[ins.a];
                              default:
                                return 0.f;
                              }
                            });
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

struct ForwardArgs {
  TileProgram program;
  SimilarityForward out;
  const float *sim;
  int64_t ld;
  int rows, cols;
  float2 *colPart; ///< [colResults, gridDim.y, cols]
};

// Kernel parameters beyond 4 KiB need CUDA 12.1 and Volta; stay below.
static_assert(sizeof(ForwardArgs) < 4000, "forward kernel arguments too big");

/// One warp per tile row: every row result over the row's columns, folded
/// into the running statistics.
__global__ void __launch_bounds__(kThreads)
    rowForward(const __grid_constant__ ForwardArgs a) {
  const int i = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= a.rows)
    return; // the whole warp: its shuffles stay among full warps
  const TileProgram &p = a.program;
  float top[kMaxResults], sum[kMaxResults];
#pragma unroll
  for (int k = 0; k < kMaxResults; ++k) {
    top[k] = kNegInf;
    sum[k] = 0;
  }
  float regs[kMaxInstructions];
  const float *sim = a.sim + static_cast<int64_t>(i) * a.ld;
  for (int j = lane; j < a.cols; j += 32) {
    evaluateAt(p, a.out.leaves, sim[j], i, j, regs);
#pragma unroll
    for (int k = 0; k < kMaxResults; ++k)
      if (k < p.rowResults)
        accumulate(p.rowResult[k].kind, regs[p.rowResult[k].reg], top[k],
                   sum[k]);
  }
#pragma unroll
  for (int k = 0; k < kMaxResults; ++k) {
    if (k >= p.rowResults)
      break;
    warpFold(p.rowResult[k].kind, top[k], sum[k]);
    if (lane != 0)
      continue;
    if (p.rowResult[k].kind == Reduce::Sum) {
      a.out.rowSum[k][i] += sum[k];
    } else {
      float m = a.out.rowMax[k][i], s = a.out.rowSum[k][i];
      mergeLse(m, s, top[k], sum[k]);
      a.out.rowMax[k][i] = m;
      a.out.rowSum[k][i] = s;
    }
  }
}

/// One thread per column and slab of kColRows rows: every column result's
/// partial statistics over the slab, into colPart.
__global__ void __launch_bounds__(kThreads)
    colForward(const __grid_constant__ ForwardArgs a) {
  const int j = blockIdx.x * kThreads + threadIdx.x;
  if (j >= a.cols)
    return;
  const TileProgram &p = a.program;
  const int row0 = blockIdx.y * kColRows;
  const int row1 = min(row0 + kColRows, a.rows);
  float top[kMaxResults], sum[kMaxResults];
#pragma unroll
  for (int k = 0; k < kMaxResults; ++k) {
    top[k] = kNegInf;
    sum[k] = 0;
  }
  float regs[kMaxInstructions];
  for (int i = row0; i < row1; ++i) {
    evaluateAt(p, a.out.leaves, a.sim[static_cast<int64_t>(i) * a.ld + j], i, j,
               regs);
#pragma unroll
    for (int k = 0; k < kMaxResults; ++k)
      if (k < p.colResults)
        accumulate(p.colResult[k].kind, regs[p.colResult[k].reg], top[k],
                   sum[k]);
  }
#pragma unroll
  for (int k = 0; k < kMaxResults; ++k)
    if (k < p.colResults)
      a.colPart[(static_cast<int64_t>(k) * gridDim.y + blockIdx.y) * a.cols +
                j] = make_float2(top[k], sum[k]);
}

struct ColMergeArgs {
  int colResults, parts, cols;
  Reduce kind[kMaxResults];
  float *colMax[kMaxResults], *colSum[kMaxResults];
  const float2 *colPart;
};

/// Folds colForward's slabs, in row order, into the chunk's column
/// statistics.
__global__ void __launch_bounds__(kThreads)
    colMerge(const __grid_constant__ ColMergeArgs a) {
  const int j = blockIdx.x * kThreads + threadIdx.x;
  if (j >= a.cols)
    return;
  for (int k = 0; k < a.colResults; ++k) {
    const float2 *part = a.colPart + static_cast<int64_t>(k) * a.parts * a.cols;
    if (a.kind[k] == Reduce::Sum) {
      float sum = a.colSum[k][j];
      for (int q = 0; q < a.parts; ++q)
        sum += part[static_cast<int64_t>(q) * a.cols + j].y;
      a.colSum[k][j] = sum;
      continue;
    }
    float top = a.colMax[k][j], sum = a.colSum[k][j];
    for (int q = 0; q < a.parts; ++q) {
      const float2 slab = part[static_cast<int64_t>(q) * a.cols + j];
      mergeLse(top, sum, slab.x, slab.y);
    }
    a.colMax[k][j] = top;
    a.colSum[k][j] = sum;
  }
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

struct BackwardArgs {
  TileProgram program;
  SimilarityBackward out;
  float *sim; ///< S in, G out (in place: each element is read, then written,
              ///< by the same thread)
  int64_t ld;
  int rows, cols;
  unsigned *absMax; ///< max|G| over the tile, as the bits of a float
};

static_assert(sizeof(BackwardArgs) < 4000, "backward kernel arguments too big");

/// Adds result `reg`'s seed for one element: ct (sum) or ct exp(e - value)
/// (log-sum-exp: its softmax), as the CPU kernels do; nothing where ct is 0
/// or the result is an empty log-sum-exp (-inf).
__device__ __forceinline__ void seed(Reduce kind, float ct, float value,
                                     const float *regs, int reg, float *cts) {
  if (ct == 0.f)
    return;
  if (kind == Reduce::Sum)
    cts[reg] += ct;
  else if (value != kNegInf)
    cts[reg] += ct * expf(regs[reg] - value);
}

/// After a reverse sweep: returns dL/dS (the `sim` leaves' cotangents) and
/// adds the float per-row and 0-d leaves' cotangents into dLeaf, dScalar.
__device__ __forceinline__ float harvest(const TileProgram &p, const float *cts,
                                         float *dLeaf, float *dScalar) {
  float g = 0;
  for (int t = 0; t < p.count; ++t) {
    const Instr &ins = p.code[t];
    if (ins.op == Op::Sim)
      g += cts[t];
    else if (ins.op == Op::RowLeaf && (p.rowLeafIsFloat >> ins.a & 1u))
      dLeaf[ins.a] += cts[t];
    else if (ins.op == Op::Scalar && (p.scalarIsFloat >> ins.a & 1u))
      dScalar[ins.a] += cts[t];
  }
  return g;
}

/// One warp per row: G over S, the row's leaf gradients (float64, added),
/// and max|G| for the 16-bit copy.
__global__ void __launch_bounds__(kThreads)
    gradient(const __grid_constant__ BackwardArgs a) {
  const int i = blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= a.rows)
    return; // the whole warp
  const TileProgram &p = a.program;
  const SimilarityBackward &o = a.out;
  float rowCt[kMaxResults], rowValue[kMaxResults];
#pragma unroll
  for (int k = 0; k < kMaxResults; ++k) {
    rowCt[k] = k < p.rowResults ? o.rowCt[k][i] : 0.f;
    rowValue[k] = k < p.rowResults ? o.rowValue[k][i] : 0.f;
  }
  float dLeaf[kMaxRowLeaves], dScalar[kMaxScalars], colShare[kMaxScalars];
#pragma unroll
  for (int k = 0; k < kMaxRowLeaves; ++k)
    dLeaf[k] = 0;
#pragma unroll
  for (int k = 0; k < kMaxScalars; ++k)
    dScalar[k] = colShare[k] = 0;
  float regs[kMaxInstructions], cts[kMaxInstructions];
  float *row = a.sim + static_cast<int64_t>(i) * a.ld;
  float largest = 0;
  for (int j = lane; j < a.cols; j += 32) {
    evaluateAt(p, o.leaves, row[j], i, j, regs);
    auto seedColumns = [&] {
      for (int k = 0; k < p.colResults; ++k)
        seed(p.colResult[k].kind, o.colCt[k][j], o.colValue[k][j], regs,
             p.colResult[k].reg, cts);
    };
    for (int t = 0; t < p.count; ++t)
      cts[t] = 0;
#pragma unroll
    for (int k = 0; k < kMaxResults; ++k)
      if (k < p.rowResults)
        seed(p.rowResult[k].kind, rowCt[k], rowValue[k], regs,
             p.rowResult[k].reg, cts);
    if (!o.splitScalars)
      seedColumns();
    epilogue::reverse<float>(p.code, p.count, regs, cts);
    float g = harvest(p, cts, dLeaf, dScalar);
    if (o.splitScalars) {
      // The column results' share of the 0-d gradients goes home with the
      // columns: a second sweep, seeded by them alone (as on the CPU).
      for (int t = 0; t < p.count; ++t)
        cts[t] = 0;
      seedColumns();
      epilogue::reverse<float>(p.code, p.count, regs, cts);
      g += harvest(p, cts, dLeaf, colShare);
    }
    row[j] = g;
    largest = fmaxf(largest, fabsf(g));
  }
#pragma unroll
  for (int k = 0; k < kMaxRowLeaves; ++k) {
    if (k >= p.rowLeaves)
      break;
    const float total = warpSum(dLeaf[k]);
    if (lane == 0 && (p.rowLeafIsFloat >> k & 1u))
      o.dRowLeaf[k][i] += static_cast<double>(total);
  }
#pragma unroll
  for (int k = 0; k < kMaxScalars; ++k) {
    if (k >= p.scalars)
      break;
    const float total = warpSum(dScalar[k]);
    const float share = warpSum(colShare[k]);
    if (lane == 0 && (p.scalarIsFloat >> k & 1u)) {
      o.dScalarRow[k][i] += static_cast<double>(total);
      if (o.splitScalars)
        o.colShareRow[k][i] += static_cast<double>(share);
    }
  }
  largest = warpMax(largest);
  // Non-negative floats order as their bits do.
  if (lane == 0)
    atomicMax(a.absMax, __float_as_uint(largest));
}

template <typename T> __device__ __forceinline__ T fromFloat(float x);
template <> __device__ __forceinline__ __half fromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// The power of two that brings max|G| into [0.5, 1); 1 when it is 0 or not
/// finite.
__device__ __forceinline__ float prescaleOf(unsigned absMaxBits) {
  const float amplitude = __uint_as_float(absMaxBits);
  if (!(amplitude > 0) || !isfinite(amplitude))
    return 1.f;
  int exponent = 0;
  frexpf(amplitude, &exponent);
  return ldexpf(1.f, -exponent);
}

/// 16-bit inputs: G (fp32, over S) times the prescale into `grad` of T;
/// {alpha, beta} = {1 / prescale, 1} for the GEMMs.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    storeGradient(const float *g, int64_t ld, int rows, int cols,
                  const unsigned *absMax, T *grad, float *alphaBeta) {
  const float prescale = prescaleOf(*absMax);
  const int64_t total = static_cast<int64_t>(rows) * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x;
       e < total; e += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i = e / cols, j = e % cols;
    grad[i * ld + j] = fromFloat<T>(g[i * ld + j] * prescale);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    alphaBeta[0] = 1.f / prescale;
    alphaBeta[1] = 1.f;
  }
}

/// fp32 inputs: the GEMMs read G where it is, {alpha, beta} = {1, 1}.
__global__ void unitScale(float *alphaBeta) {
  alphaBeta[0] = 1.f;
  alphaBeta[1] = 1.f;
}

//===----------------------------------------------------------------------===//
// Launch helpers
//===----------------------------------------------------------------------===//

cudaStream_t streamOf(const TileLaunch &launch) {
  return static_cast<cudaStream_t>(launch.stream);
}

unsigned blocksFor(int64_t count, int64_t perBlock) {
  return static_cast<unsigned>(ceilDiv(count, perBlock));
}

/// Where every launcher starts: nothing for an empty tile; otherwise checks
/// it, makes its device current and computes S into the workspace, then
/// body(ws, ld) in that scope.
template <typename Body>
void withSimilarity(const TileLaunch &launch, const Tile &tile,
                    const TileProgram &program, const char *op, Body &&body) {
  if (tile.rowCount <= 0 || tile.colCount <= 0)
    return;
  checkTile(launch, tile, program, op);
  CudaDeviceGuard scope(launch.device);
  check(scope.status(), "cudaSetDevice");
  const Workspace ws = carve(launch, program.colResults);
  const int64_t ld = tileLeadingDim(tile.colCount);
  similarityGemm(launch, tile, ws.sim, ld);
  body(ws, ld);
}

/// 16-bit G from the fp32 one, scaled; into ws.grad.
template <typename T>
void launchStore(const TileLaunch &launch, const Tile &tile,
                 const Workspace &ws, int64_t ld, const unsigned *absMax) {
  const int64_t total = tile.rowCount * tile.colCount;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(ceilDiv(total, kThreads), 4096));
  storeGradient<T><<<blocks, kThreads, 0, streamOf(launch)>>>(
      ws.sim, ld, static_cast<int>(tile.rowCount),
      static_cast<int>(tile.colCount), absMax, static_cast<T *>(ws.grad),
      ws.scale);
  checkLaunch("storeGradient");
}

} // namespace

//===----------------------------------------------------------------------===//
// Public functions
//===----------------------------------------------------------------------===//

size_t similarityWorkspaceBytes(int64_t maxRows, int64_t maxCols,
                                ElementType type, int colResults) {
  const int64_t ld = tileLeadingDim(maxCols);
  return alignUp(sizeof(float) * maxRows * ld) +
         alignUp(elementSize(type) * maxRows * ld) +
         alignUp(sizeof(float2) * colResults * ceilDiv(maxRows, kColRows) *
                 maxCols) +
         alignUp(4 * sizeof(float));
}

void similarityForwardTile(const TileLaunch &launch, const Tile &tile,
                           const TileProgram &program,
                           const SimilarityForward &args) {
  withSimilarity(launch, tile, program, "similarityForwardTile",
                 [&](const Workspace &ws, int64_t ld) {
                   ForwardArgs a;
                   a.program = program;
                   a.out = args;
                   a.sim = ws.sim;
                   a.ld = ld;
                   a.rows = static_cast<int>(tile.rowCount);
                   a.cols = static_cast<int>(tile.colCount);
                   a.colPart = ws.colPart;
                   if (program.rowResults > 0) {
                     rowForward<<<blocksFor(tile.rowCount, kWarps), kThreads, 0,
                                  streamOf(launch)>>>(a);
                     checkLaunch("rowForward");
                   }
                   if (program.colResults == 0)
                     return;
                   const dim3 grid(blocksFor(tile.colCount, kThreads),
                                   blocksFor(tile.rowCount, kColRows));
                   colForward<<<grid, kThreads, 0, streamOf(launch)>>>(a);
                   checkLaunch("colForward");
                   ColMergeArgs merge{};
                   merge.colResults = program.colResults;
                   merge.parts = static_cast<int>(grid.y);
                   merge.cols = a.cols;
                   for (int k = 0; k < program.colResults; ++k) {
                     merge.kind[k] = program.colResult[k].kind;
                     merge.colMax[k] = args.colMax[k];
                     merge.colSum[k] = args.colSum[k];
                   }
                   merge.colPart = ws.colPart;
                   colMerge<<<blocksFor(tile.colCount, kThreads), kThreads, 0,
                              streamOf(launch)>>>(merge);
                   checkLaunch("colMerge");
                 });
}

void similarityBackwardTile(const TileLaunch &launch, const Tile &tile,
                            const TileProgram &program,
                            const SimilarityBackward &args) {
  withSimilarity(
      launch, tile, program, "similarityBackwardTile",
      [&](const Workspace &ws, int64_t ld) {
        unsigned *absMax = reinterpret_cast<unsigned *>(ws.scale + 2);
        check(cudaMemsetAsync(absMax, 0, sizeof(unsigned), streamOf(launch)),
              "cudaMemsetAsync");
        BackwardArgs a;
        a.program = program;
        a.out = args;
        a.sim = ws.sim;
        a.ld = ld;
        a.rows = static_cast<int>(tile.rowCount);
        a.cols = static_cast<int>(tile.colCount);
        a.absMax = absMax;
        gradient<<<blocksFor(tile.rowCount, kWarps), kThreads, 0,
                   streamOf(launch)>>>(a);
        checkLaunch("gradient");
        const void *grad = ws.grad;
        switch (launch.type) {
        case ElementType::F32:
          grad = ws.sim;
          unitScale<<<1, 1, 0, streamOf(launch)>>>(ws.scale);
          checkLaunch("unitScale");
          break;
        case ElementType::F16:
          launchStore<__half>(launch, tile, ws, ld, absMax);
          break;
        case ElementType::BF16:
          launchStore<__nv_bfloat16>(launch, tile, ws, ld, absMax);
          break;
        }
        gradientGemms(launch, tile, grad, ld, ws.scale, args.dRows, args.dCols);
      });
}

} // namespace dloss::cuda
