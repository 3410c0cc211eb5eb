// CUDA tile launchers of the fused similarity ops, over raw device pointers:
// no CUDA, cuBLAS or ATen type crosses this header, so plain C++ (the
// runtime's fused/DeviceTiles.cpp, tests, benches) can include it.
//
// One tile is a block of `rowCount` rows x `colCount` columns of the
// similarity S = rows cols^T. Each launcher runs the tile's GEMM(s) with
// cuBLAS (bf16/fp16/fp32 inputs, fp32 accumulation and output) and the op's
// epilogue kernels, enqueued on `TileLaunch::stream`; nothing synchronises
// the host. The statistics they update are the ones the CPU kernels of
// runtime/fused/TileMath.h keep, with the same meaning, so the same ring
// driver merges and forwards them.
#ifndef DLOSS_RUNTIME_CUDA_FUSEDTILES_H
#define DLOSS_RUNTIME_CUDA_FUSEDTILES_H

#include <cstddef>
#include <cstdint>

namespace dloss::cuda {

/// The element type of the rows and columns (the GEMM inputs).
enum class ElementType : int { F32, F16, BF16 };

size_t elementSize(ElementType type);

/// Where the tiles of one call run, and their scratch memory.
struct TileLaunch {
  /// The CUDA device (ordinal); made current for each launch and restored.
  int device = 0;
  /// A cudaStream_t; null is the legacy default stream.
  void *stream = nullptr;
  /// Device memory of at least tileWorkspaceBytes(maxRows, maxCols, type)
  /// bytes, 256-byte aligned, used by one launch at a time (stream order).
  void *workspace = nullptr;
  int64_t maxRows = 0, maxCols = 0;
  ElementType type = ElementType::F32;
  /// fp32 inputs only: let the GEMMs use TF32 tensor cores (~1e-3 relative
  /// error in S instead of fp32's 1e-7).
  bool allowTF32 = false;
};

size_t tileWorkspaceBytes(int64_t maxRows, int64_t maxCols, ElementType type);

/// One tile's operands: row-major [count, depth] blocks of `type`.
struct Tile {
  const void *rows = nullptr; ///< the block's first row
  const void *cols = nullptr; ///< the block's first column
  int64_t rowCount = 0, colCount = 0, depth = 0;
};

// Targets are int64 global indices. `colBase` is the global index of the
// tile's column 0 (a target names it when targets[i] - colBase is in
// [0, colCount)); `rowBase` that of its row 0. Per-row pointers point at the
// tile's first row, per-column ones at its first column.

/// dloss.ring_softmax_ce: with L = scale S, folds the tile into the running
/// row statistics (rowMax, rowSum: online log-sum-exp, sum of exp(L - max))
/// and the chunk's column statistics, and stores L at each row's and
/// column's target into rowTarget / colTarget. All float32.
struct ClipForward {
  float scale = 1;
  const int64_t *rowTargets = nullptr;
  int64_t colBase = 0;
  const int64_t *colTargets = nullptr;
  int64_t rowBase = 0;
  float *rowMax = nullptr, *rowSum = nullptr, *rowTarget = nullptr;
  float *colMax = nullptr, *colSum = nullptr, *colTarget = nullptr;
};
void clipForwardTile(const TileLaunch &launch, const Tile &tile,
                     const ClipForward &args);

/// dloss.ring_sigmoid_pairs: with L = scale S + bias, adds each row's sum of
/// softplus(L) into pairSum and stores L at its target into positive.
struct SigmoidForward {
  float scale = 1, bias = 0;
  const int64_t *targets = nullptr;
  int64_t colBase = 0;
  float *pairSum = nullptr, *positive = nullptr;
};
void sigmoidForwardTile(const TileLaunch &launch, const Tile &tile,
                        const SigmoidForward &args);

/// dloss.sharded_softmax: folds L = scale S, without each row's target
/// column, into (rowMax, rowSum) and stores the unscaled S at the target into
/// targetDot.
struct ShardedForward {
  float scale = 1;
  const int64_t *targets = nullptr;
  int64_t colBase = 0;
  float *rowMax = nullptr, *rowSum = nullptr, *targetDot = nullptr;
};
void shardedForwardTile(const TileLaunch &launch, const Tile &tile,
                        const ShardedForward &args);

/// Must precede the backward tiles whose cotangents are taken from `a` and
/// `b` (float32 device vectors; b may be null) and whose scale is `scale`:
/// picks the power of two that keeps |G| < 1 in the stored G tile (|G| is at
/// most max|a| + max|b|), so small cotangents do not underflow in fp16; the
/// GEMMs' alpha divides it back out. Kept in the workspace for every later
/// backward tile of the same workspace.
void prepareGradientScale(const TileLaunch &launch, float scale, const float *a,
                          int64_t na, const float *b, int64_t nb);

/// What every backward tile takes and accumulates: each row's target
/// (rowTargets, from colBase as above); with L = scale S and G the op's
/// dLoss/dL, dRows += scale G cols and dCols += scale G^T rows (float32
/// [count, depth] accumulators), and per row i (in float64) its part of
/// sum_j G_ij S_ij into dScaleRow[i].
struct BackwardTile {
  float scale = 1;
  const int64_t *rowTargets = nullptr;
  int64_t colBase = 0;
  float *dRows = nullptr, *dCols = nullptr;
  double *dScaleRow = nullptr;
};

/// Backward of dloss.ring_softmax_ce on one tile: recomputes S and forms
/// G = ct_row P_row + ct_col P_col - the one-hot targets of both directions.
/// dScaleRow[i] takes the row direction's part of sum_j G_ij S_ij, and
/// colShareRow[i] the column direction's (it belongs to the columns' owner).
struct ClipBackward : BackwardTile {
  const float *rowLse = nullptr, *ctRow = nullptr;
  const float *colLse = nullptr, *ctCol = nullptr;
  const int64_t *colTargets = nullptr;
  int64_t rowBase = 0;
  double *colShareRow = nullptr;
};
void clipBackwardTile(const TileLaunch &launch, const Tile &tile,
                      const ClipBackward &args);

/// Backward of dloss.ring_sigmoid_pairs: G = ct_pair sigmoid(scale S + bias)
/// + ct_positive at the targets; per row sum_j G_ij into dBiasRow (float64).
struct SigmoidBackward : BackwardTile {
  float bias = 0;
  const float *ctPair = nullptr, *ctPositive = nullptr;
  double *dBiasRow = nullptr;
};
void sigmoidBackwardTile(const TileLaunch &launch, const Tile &tile,
                         const SigmoidBackward &args);

/// Backward of dloss.sharded_softmax's log-sum-exp: G = ct_lse
/// exp(L - lse_rest), zero at the target. (The target dot's gradient is a
/// gather, left to the caller.)
struct ShardedBackward : BackwardTile {
  const float *lseRest = nullptr, *ctLse = nullptr;
};
void shardedBackwardTile(const TileLaunch &launch, const Tile &tile,
                         const ShardedBackward &args);

//===----------------------------------------------------------------------===//
// The tiles' GEMMs, shared with the other launchers (cuda/SimilarityTiles.cu).
// The caller has checked the tile (dimensions below 2^31) and made
// launch.device current; both enqueue on launch.stream.
//===----------------------------------------------------------------------===//

/// The leading dimension of a tile of `cols` columns (S and G): rounded up
/// to 8, so that 16-bit G rows are 16-byte aligned for the tensor cores.
int64_t tileLeadingDim(int64_t cols);

/// S = rows cols^T of `tile` into `sim`: fp32, row-major [rowCount, ld].
void similarityGemm(const TileLaunch &launch, const Tile &tile, float *sim,
                    int64_t ld);

/// dRows += alpha G cols and dCols += alpha G^T rows into the fp32
/// [count, depth] accumulators, with G [rowCount, ld] of launch.type and
/// {alpha, beta = 1} read from the device memory at `alphaBeta`.
void gradientGemms(const TileLaunch &launch, const Tile &tile, const void *grad,
                   int64_t ld, const float *alphaBeta, float *dRows,
                   float *dCols);

/// The number of CUDA devices; 0 when there is none or no usable driver.
int deviceCount();

} // namespace dloss::cuda

#endif // DLOSS_RUNTIME_CUDA_FUSEDTILES_H
