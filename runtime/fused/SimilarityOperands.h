// The checked operands of dloss.fused_similarity and its _grad, as the CPU
// and GPU paths take them: the tile program and its facts decoded, the
// leaves in the compute type, the columns' sizes round the ring or over the
// class shards, and (backward) the forward results and their cotangents.
#ifndef DLOSS_RUNTIME_FUSED_SIMILARITYOPERANDS_H
#define DLOSS_RUNTIME_FUSED_SIMILARITYOPERANDS_H

#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/FusedKernels.h"
#include "runtime/plan/TileEncoding.h"

#include <cstdint>
#include <vector>

namespace dloss::fused::similarity {

using epilogue::Instr;
using epilogue::Op;
using epilogue::Reduce;

/// One result: the register it reduces and how.
struct Output {
  int64_t reg;
  Reduce kind;
  /// A pick (the step's `picks` or `col_picks`; CPU only): a sum of
  /// select(eq(col_id, row leaf L), x, 0) along a row, or of
  /// select(eq(row_id, column leaf L), x, 0) along a column, is x at the one
  /// place the leaf names. pickReg is x and pickLeaf is L; -1: not a pick.
  /// So a target pick-up costs one element per row (column) instead of an
  /// eq, a select and a sum over the whole tile, and backward seeds that
  /// element alone; the eq and select registers are then evaluated only if
  /// something else reads them.
  int64_t pickReg = -1, pickLeaf = -1;
};

/// Registers whose log-sum-exp is both a row and a column result (CLIP's
/// logits; the step's `lse_pairs`): their two directions are folded, and
/// seeded, from one exp per element. rowOf[k]: column result k's row
/// result, or -1; colOf[o]: row result o's column result, or -1.
struct LsePairs {
  std::vector<int64_t> rowOf, colOf;
};

/// The checked program and operands of one call, in the compute type.
struct SimilarityOperands {
  std::vector<Instr> program;
  std::vector<Output> outputs;
  /// Column results (gathered only): over this rank's own columns, each
  /// reducing along every rank's rows.
  std::vector<Output> colOutputs;
  LsePairs pairs;
  at::Tensor rows, cols;
  Tensors rowLeaves, colLeaves; ///< [n] and [m], contiguous
  std::vector<double> scalars;
  std::vector<bool> rowLeafIsFloat, scalarIsFloat;
  /// Every rank's column count (gathered, sharded), or the local matrix's.
  std::vector<int64_t> colSizes;
  int64_t colOffset = 0; ///< sharded: global index of this shard's class 0
  int64_t rowOffset = 0; ///< global index of row 0 (row_id)
  TileShape tile{1, 1};
  Tensors results, cts; ///< the backward's [n] forward results, cotangents
  Tensors colResults, colCts; ///< the backward's [m] column ones
};

/// Register operand k (0, 1, 2: a, b, c) of an instruction.
inline int64_t operandOf(const Instr &ins, int k) {
  return k == 0 ? ins.a : k == 1 ? ins.b : ins.c;
}

/// Operands and program of either op; `backward` adds the forward results
/// and their cotangents. Everything the plan or the inputs could get wrong
/// raises a dloss::Error naming the op and rank.
SimilarityOperands similarityOperands(const FusedArgs &args,
                                      const SimilarityProgram &spec,
                                      bool backward);

} // namespace dloss::fused::similarity

#endif // DLOSS_RUNTIME_FUSED_SIMILARITYOPERANDS_H
