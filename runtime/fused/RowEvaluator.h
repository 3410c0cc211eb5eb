// The CPU evaluator of a tile program: a tile row at a time, every register
// a tile-width array (the `sim` leaf is the tile row itself), each
// instruction one tight loop of epilogue::apply (or, backward,
// epilogue::adjoint) over the row, its opcode dispatched once per row; one
// evaluator per ATen thread. With the row loops of the results' reductions
// and softmax seeds. The loops are compiled in RowEvaluator.cpp under the
// flags that let them vectorise (runtime/CMakeLists.txt), for float and
// double.
#ifndef DLOSS_RUNTIME_FUSED_ROWEVALUATOR_H
#define DLOSS_RUNTIME_FUSED_ROWEVALUATOR_H

#include "runtime/fused/ProgramAnalysis.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/fused/SimilarityOperands.h"
#include "runtime/fused/TileMath.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace dloss::fused::similarity {

//===----------------------------------------------------------------------===//
// Row loops (RowEvaluator.cpp instantiates them for float and double)
//===----------------------------------------------------------------------===//

/// sum_j e[j], accumulated in double.
template <typename T> double rowSum(const T *__restrict e, int64_t w);

/// max_j e[j] (-inf for none).
template <typename T> T rowMax(const T *__restrict e, int64_t w);

/// sum_j exp(e[j] - top), accumulated in double.
template <typename T> double rowSumExp(const T *__restrict e, T top, int64_t w);

/// seed[j] += c exp(e[j] - lse): a log-sum-exp result's softmax seed.
template <typename T>
void addSoftmaxSeed(T *__restrict seed, const T *__restrict e, T c, T lse,
                    int64_t w);

/// seed[j] += ct[j] exp(e[j] - lse[j]): the softmax seeds of column
/// log-sum-exp results (none where ct is 0 or the column is empty); Store:
/// seed[j] = the same.
template <typename T, bool Store = false>
void addColumnSoftmaxSeed(T *__restrict seed, const T *__restrict e,
                          const T *__restrict ct, const T *__restrict lse,
                          int64_t w);

/// A register that is a row and a column log-sum-exp result: seed[j] += c
/// p + ct[j] exp(e[j] - colLse[j]) with p = exp(e[j] - rowLse), one exp per
/// element: the column term is p u cv[j] (sharedLseFactors). Keep: the
/// column term also goes to colPart[j], for the share sweep.
template <typename T, bool Keep>
void addBothSoftmaxSeeds(T *__restrict seed, T *__restrict colPart,
                         const T *__restrict e, T c, T rowLse, T u,
                         const T *__restrict cv, int64_t w);

/// seed[j] += c[j] (c: one value per column) or c[0] (`perColumn` false).
template <typename T>
void addSeed(T *__restrict seed, const T *__restrict c, bool perColumn,
             int64_t w);

/// o[j] = instruction `ins` (arithmetic, epilogue::apply) of a[j], b[j],
/// c[j] (operands it does not have: any valid array, unread); o overlaps
/// none of them. The tile programs' row loop, for dloss.fused_elementwise.
template <typename T>
void applyInstructionRow(const Instr &ins, T *o, const T *a, const T *b,
                         const T *c, int64_t w);

//===----------------------------------------------------------------------===//
// The evaluator
//===----------------------------------------------------------------------===//

/// One thread's registers: evaluates the program on a tile row, and (for the
/// backward) sweeps it in reverse.
template <typename T> class RowProgram {
public:
  RowProgram(const SimilarityOperands &ops, const RegisterSets &sets,
             int64_t width);

  /// Points the per-column leaves at `block` of `chunk` (once per block).
  void prepare(int64_t blockId, const Chunk &chunk, const Block &block);

  /// Evaluates every live register on row `i` (of this rank) whose
  /// similarities are sim[0, w).
  void evaluate(const T *sim, int64_t i, int64_t w);

  /// Where evaluate writes computed register `t` (null: its own slot), for
  /// the forward's column results, whose values go to a tile of their own.
  std::vector<T *> target;

  /// The values of register `t` on the row last evaluated.
  const T *value(int64_t t) const { return reg[t]; }

  /// Starts the reverse sweep of the row: zeroes the cotangents; those of
  /// `sim` leaves accumulate in `grad` (G's row, w wide, zeroed too).
  void beginReverse(T *grad, int64_t w);

  /// Starts the share sweep of the row (after reverse): zeroes the
  /// cotangents of the registers between the column results and the float
  /// 0-d leaves (shareRegisters), to be seeded by the column results alone.
  void beginShareSweep(int64_t w);

  /// The cotangent of register `t` (an output's, to seed it).
  T *cotangent(int64_t t) { return ct[t]; }

  /// The reverse sweep of the row evaluated last (epilogue::reverse on each
  /// element): G's row gets dL/dS; the float per-row leaves' and 0-d leaves'
  /// cotangents are summed into dRowLeaf[leaf * n + i] and dScalar[leaf].
  void reverse(int64_t i, int64_t w, int64_t n, double *dRowLeaf,
               double *dScalar) {
    sweep(carries, i, w, n, dRowLeaf, dScalar);
  }

  /// The share sweep: the column results' part of the 0-d leaves'
  /// gradients, summed into share[leaf]; G and the row leaves get nothing.
  void reverseShare(int64_t i, int64_t w, int64_t n, double *share) {
    sweep(shares, i, w, n, nullptr, share);
  }

  /// This thread's partial gradients of the 0-d leaves: from the row
  /// results, and from the column results of the chunk being processed.
  std::vector<double> dScalars, colShares;
  /// The backward's scratch: column log-sum-exp seeds kept for the share
  /// sweep (a tile row per column result), and the row's share.
  std::vector<T> keptSeeds;
  std::vector<double> rowShare;

private:
  T *slot(int64_t t) { return values.data() + t * width; }

  /// The rows of instruction `ins`'s register operands a, b, c (operand a
  /// for those it does not have: a loop may name them without reading).
  std::array<const T *, 3> operandRows(const Instr &ins) const {
    const int operands = epilogue::registerOperands(ins.op);
    const T *a = reg[ins.a];
    return {a, operands > 1 ? reg[ins.b] : a, operands > 2 ? reg[ins.c] : a};
  }

  /// A reverse sweep over the registers of `mask` (carries, or shares):
  /// a cotangent for a register outside it is dropped.
  void sweep(const std::vector<char> &mask, int64_t i, int64_t w, int64_t n,
             double *dRowLeaf, double *dScalar);

  const SimilarityOperands &ops;
  const std::vector<char> &live, &carries, &reduced, &shares;
  const int64_t width, count;
  std::vector<T> values;
  std::vector<const T *> reg;
  std::vector<const T *> rowLeafData;
  std::vector<T> cts, sink;
  std::vector<T *> ct;
  int64_t prepared = -1;
};

/// One RowProgram per ATen thread, and the parallel loop over a block's rows.
template <typename T> class RowPrograms {
public:
  /// `backward`: evaluate only what the reverse sweep reads.
  RowPrograms(const SimilarityOperands &ops, bool backward)
      : sets(registerSets(ops, backward)) {
    const int threads = std::max(1, at::get_num_threads());
    programs.reserve(threads); // registers point into their own buffers
    for (int k = 0; k < threads; ++k) {
      programs.emplace_back(ops, sets, ops.tile.cols);
      programs.back().dScalars.assign(ops.scalars.size(), 0.0);
      programs.back().colShares.assign(ops.scalars.size(), 0.0);
    }
    // Enough work per task to pay for the fork: about 16k register values.
    grain = std::max<int64_t>(
        1,
        16384 / std::max<int64_t>(1, ops.tile.cols * static_cast<int64_t>(
                                                         ops.program.size())));
  }

  /// fn(program, r) for each row r of `block` (rows split over threads).
  template <typename Fn>
  void forRows(const Chunk &chunk, const Block &block, Fn &&fn) {
    const int64_t id = blocks++;
    at::parallel_for(0, block.rows, grain, [&](int64_t begin, int64_t end) {
      int thread = at::get_thread_num();
      RowProgram<T> &program =
          programs[std::min<size_t>(thread, programs.size() - 1)];
      program.prepare(id, chunk, block);
      for (int64_t r = begin; r < end; ++r)
        fn(program, r);
    });
  }

  /// The 0-d leaves' gradients, summed over threads.
  std::vector<double> dScalars() const {
    std::vector<double> total(programs.front().dScalars.size(), 0.0);
    for (const RowProgram<T> &program : programs)
      for (size_t k = 0; k < total.size(); ++k)
        total[k] += program.dScalars[k];
    return total;
  }

  /// The registers of the share sweep (shareRegisters).
  const std::vector<char> &shareMask() const { return sets.shares; }

  /// The column results' shares of the 0-d leaves' gradients since the last
  /// call, summed over threads (then zeroed).
  std::vector<double> takeColShares() {
    std::vector<double> total(programs.front().colShares.size(), 0.0);
    for (RowProgram<T> &program : programs)
      for (size_t k = 0; k < total.size(); ++k) {
        total[k] += program.colShares[k];
        program.colShares[k] = 0;
      }
    return total;
  }

private:
  RegisterSets sets; ///< the programs hold references into it
  std::vector<RowProgram<T>> programs;
  int64_t grain = 1;
  int64_t blocks = 0;
};

extern template class RowProgram<float>;
extern template class RowProgram<double>;

} // namespace dloss::fused::similarity

#endif // DLOSS_RUNTIME_FUSED_ROWEVALUATOR_H
