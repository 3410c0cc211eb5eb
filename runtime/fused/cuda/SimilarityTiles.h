// CUDA tile launchers of dloss.fused_similarity and its _grad, over raw device
// pointers: no CUDA, cuBLAS or ATen type crosses this header (as
// cuda/FusedTiles.h, whose TileLaunch, Tile and GEMMs they share).
//
// A tile is a block of rowCount rows x colCount columns of S = rows cols^T,
// computed in fp32 by one cuBLAS GEMM into the workspace. The tile program
// (runtime/fused/Epilogue.h) then runs one element per thread, through the
// same epilogue::evaluate and epilogue::reverse the CPU kernels' rules come
// from. The statistics they update are those of the CPU kernels
// (runtime/fused/FusedSimilarity.cpp), with the same meaning, so the same
// ring driver merges and forwards them.
//
// Per-row pointers point at the tile's first row, per-column ones at its
// first column; everything is float32 unless it says float64. Nothing
// synchronises the host. The limits below are checked by the caller (the
// runtime's operand checks), with errors that name the plan.
#ifndef DLOSS_RUNTIME_CUDA_SIMILARITYTILES_H
#define DLOSS_RUNTIME_CUDA_SIMILARITYTILES_H

#include "runtime/fused/Epilogue.h"
#include "runtime/fused/cuda/FusedTiles.h"

#include <cstddef>
#include <cstdint>

namespace dloss::cuda {

/// The most instructions a device program holds: each thread keeps one
/// register per instruction (and, backward, one cotangent) in an array of
/// this size.
constexpr int kMaxInstructions = 64;
/// The most per-row, per-column and 0-d leaves, and row or column results.
constexpr int kMaxRowLeaves = 8;
constexpr int kMaxColLeaves = 8;
constexpr int kMaxScalars = 8;
constexpr int kMaxResults = 8;

/// One result: the register it reduces and how (epilogue::Reduce).
struct TileResult {
  int32_t reg = 0;
  epilogue::Reduce kind = epilogue::Reduce::Sum;
};

/// The tile program and its 0-d leaves, copied by value into every launch
/// (kernel parameter space: every thread reads the same instruction at the
/// same time, a broadcast).
struct TileProgram {
  epilogue::Instr code[kMaxInstructions];
  int32_t count = 0;
  int32_t rowResults = 0, colResults = 0;
  TileResult rowResult[kMaxResults], colResult[kMaxResults];
  int32_t rowLeaves = 0, colLeaves = 0, scalars = 0;
  /// The 0-d leaves' values.
  float scalar[kMaxScalars] = {};
  /// Bit k: per-row leaf k (0-d leaf k) is a float and gets a gradient
  /// (integer labels and ids get none).
  uint32_t rowLeafIsFloat = 0, scalarIsFloat = 0;
};

/// The leaves of one tile: the global indices of its row 0 and column 0
/// (row_id, col_id) and the per-row and per-column operands.
struct TileLeaves {
  int64_t rowBase = 0, colBase = 0;
  const float *row[kMaxRowLeaves] = {};
  const float *col[kMaxColLeaves] = {};
};

/// The workspace of the launchers below for tiles of at most maxRows x
/// maxCols and `colResults` column results (TileLaunch::workspace).
size_t similarityWorkspaceBytes(int64_t maxRows, int64_t maxCols,
                                ElementType type, int colResults);

/// The forward on one tile: folds every row result's values into its
/// running statistics (sum: rowSum[k] only; log-sum-exp: rowMax[k], rowSum[k],
/// the running max and sum of exp(e - max), as the CPU's online log-sum-exp)
/// and every column result's into the chunk's column statistics (colMax[k],
/// colSum[k], the same way along the rows).
struct SimilarityForward {
  TileLeaves leaves;
  float *rowMax[kMaxResults] = {}, *rowSum[kMaxResults] = {};
  float *colMax[kMaxResults] = {}, *colSum[kMaxResults] = {};
};
void similarityForwardTile(const TileLaunch &launch, const Tile &tile,
                           const TileProgram &program,
                           const SimilarityForward &args);

/// The backward on one tile: recomputes the program, seeds every result's
/// register with its cotangent (sum: ct; log-sum-exp: ct exp(e - result),
/// its softmax), sweeps it in reverse and forms G = dL/dS; then dRows +=
/// G cols and dCols += G^T rows (fp32 [count, depth] accumulators). Per row
/// i (float64, [leaf] pointers at the tile's first row): dRowLeaf[a][i] takes
/// float per-row leaf a's gradient and dScalarRow[a][i] float 0-d leaf a's.
/// With splitScalars, the column results' part of the 0-d leaves' gradients
/// goes to colShareRow[a][i] instead (it belongs to the columns' owner).
struct SimilarityBackward {
  TileLeaves leaves;
  const float *rowValue[kMaxResults] = {}, *rowCt[kMaxResults] = {};
  const float *colValue[kMaxResults] = {}, *colCt[kMaxResults] = {};
  bool splitScalars = false;
  double *dRowLeaf[kMaxRowLeaves] = {};
  double *dScalarRow[kMaxScalars] = {}, *colShareRow[kMaxScalars] = {};
  float *dRows = nullptr, *dCols = nullptr;
};
void similarityBackwardTile(const TileLaunch &launch, const Tile &tile,
                            const TileProgram &program,
                            const SimilarityBackward &args);

} // namespace dloss::cuda

#endif // DLOSS_RUNTIME_CUDA_SIMILARITYTILES_H
