// The CPU row evaluator of the tile programs (RowEvaluator.h). Built with
// -fno-trapping-math, -fno-math-errno and -fopenmp-simd
// (runtime/CMakeLists.txt), as TileLoops.cpp is: the row loops vectorise
// only when the compiler may evaluate both sides of a select and inline
// sqrt without setting errno; the results are the same.
#include "runtime/fused/RowEvaluator.h"

#include "runtime/fused/Epilogue.h"

#include <cmath>
#include <limits>

namespace dloss::fused::similarity {

namespace {

// The loops over a tile row dominate the epilogue: one function per
// instruction and type, each compiled for AVX-512, AVX2 and baseline x86-64
// (GCC's target_clones; the loader picks the widest the CPU has: 5x on
// softplus at 16 lanes against SSE's 4). Out of line, so that the
// vectoriser sees each loop alone.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DLOSS_ROW_LOOP                                                         \
  __attribute__((noinline, target_clones("avx512f", "avx2", "default")))
#else
#define DLOSS_ROW_LOOP
#endif

/// o[j] = instruction O of x[j], y[j], z[j] (a register never overlaps its
/// operands).
template <Op O, typename T>
DLOSS_ROW_LOOP void applyRow(T *__restrict o, const T *__restrict x,
                             const T *__restrict y, const T *__restrict z,
                             int64_t w, Instr ins) {
  for (int64_t j = 0; j < w; ++j)
    o[j] = epilogue::apply<O, T>(x[j], y[j], z[j], ins);
}

/// Adds instruction O's cotangents of its operands, given its operands a,
/// b, c, its value `out` and its cotangent `dt`, to da, db, dc (which may
/// be the same register: x * x). A zero cotangent passes nothing, as in
/// epilogue::reverse (no 0 * inf).
template <Op O, typename T>
DLOSS_ROW_LOOP void adjointRow(const T *a, const T *b, const T *c, const T *out,
                               const T *dt, T *da, T *db, T *dc, int64_t w,
                               Instr ins) {
  if constexpr (O == Op::Eq || O == Op::StopGradient) {
    return; // no gradient
  } else if constexpr (O == Op::Select) {
    // The condition gets none.
    for (int64_t j = 0; j < w; ++j) {
      const bool pick = a[j] != T(0);
      db[j] += pick ? dt[j] : T(0);
      dc[j] += pick ? T(0) : dt[j];
    }
  } else if constexpr (O == Op::Add || O == Op::Sub || O == Op::Mul ||
                       O == Op::Div) {
    for (int64_t j = 0; j < w; ++j) {
      T ga = 0, gb = 0, gc = 0;
      epilogue::adjoint<O, T>(a[j], b[j], c[j], out[j], dt[j], ins, ga, gb, gc);
      const bool skip = dt[j] == T(0);
      da[j] += skip ? T(0) : ga;
      db[j] += skip ? T(0) : gb;
    }
  } else {
    for (int64_t j = 0; j < w; ++j) {
      T ga = 0, gb = 0, gc = 0;
      epilogue::adjoint<O, T>(a[j], b[j], c[j], out[j], dt[j], ins, ga, gb, gc);
      da[j] += dt[j] == T(0) ? T(0) : ga;
    }
  }
}

/// adjointRow for add, sub, mul and div, where operand a (ReduceA) or b
/// (ReduceB) is uniform along the row or outside the sweep: its cotangents
/// are summed, in double, into *sumA or *sumB (which may be one) instead of
/// added to da or db. At most one array is written, and it overlaps no
/// operand, so `omp simd` holds.
template <Op O, typename T, bool ReduceA, bool ReduceB>
DLOSS_ROW_LOOP void
reducingAdjointRow(const T *__restrict a, const T *__restrict b,
                   const T *__restrict out, const T *__restrict dt, T *da,
                   T *db, int64_t w, Instr ins, double *sumA, double *sumB) {
  static_assert(ReduceA || ReduceB, "adjointRow writes both arrays");
  double sa = 0, sb = 0;
#pragma omp simd reduction(+ : sa, sb)
  for (int64_t j = 0; j < w; ++j) {
    T ga = 0, gb = 0, gc = 0;
    epilogue::adjoint<O, T>(a[j], b[j], b[j], out[j], dt[j], ins, ga, gb, gc);
    const bool skip = dt[j] == T(0);
    ga = skip ? T(0) : ga;
    gb = skip ? T(0) : gb;
    if constexpr (ReduceA)
      sa += ga;
    else
      da[j] += ga;
    if constexpr (ReduceB)
      sb += gb;
    else
      db[j] += gb;
  }
  if constexpr (ReduceA)
    *sumA += sa;
  if constexpr (ReduceB)
    *sumB += sb;
}

} // namespace

/// sum_j e[j], accumulated in double.
template <typename T>
DLOSS_ROW_LOOP double rowSum(const T *__restrict e, int64_t w) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < w; ++j)
    acc += e[j];
  return acc;
}

/// max_j e[j] (-inf for none).
template <typename T>
DLOSS_ROW_LOOP T rowMax(const T *__restrict e, int64_t w) {
  T top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < w; ++j)
    top = e[j] > top ? e[j] : top;
  return top;
}

/// sum_j exp(e[j] - top), accumulated in double.
template <typename T>
DLOSS_ROW_LOOP double rowSumExp(const T *__restrict e, T top, int64_t w) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t j = 0; j < w; ++j)
    acc += epilogue::detail::expNonPositive_(e[j] - top);
  return acc;
}

/// seed[j] += c exp(e[j] - lse): a log-sum-exp result's softmax seed.
template <typename T>
DLOSS_ROW_LOOP void addSoftmaxSeed(T *__restrict seed, const T *__restrict e,
                                   T c, T lse, int64_t w) {
  for (int64_t j = 0; j < w; ++j)
    seed[j] += c * epilogue::detail::expNonPositive_(e[j] - lse);
}

/// seed[j] += ct[j] exp(e[j] - lse[j]): the softmax seeds of column
/// log-sum-exp results (none where ct is 0 or the column is empty); Store:
/// seed[j] = the same.
template <typename T, bool Store>
DLOSS_ROW_LOOP void addColumnSoftmaxSeed(T *__restrict seed,
                                         const T *__restrict e,
                                         const T *__restrict ct,
                                         const T *__restrict lse, int64_t w) {
  constexpr T inf = std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < w; ++j) {
    // lse[j] = -inf gives garbage here, dropped below.
    const T add = ct[j] * epilogue::detail::expNonPositive_(e[j] - lse[j]);
    const T value = ct[j] == T(0) || lse[j] == -inf ? T(0) : add;
    seed[j] = Store ? value : seed[j] + value;
  }
}

/// A register that is a row and a column log-sum-exp result: seed[j] += c
/// p + ct[j] exp(e[j] - colLse[j]) with p = exp(e[j] - rowLse), one exp per
/// element: the column term is p u cv[j] (sharedLseFactors). Keep: the
/// column term also goes to colPart[j], for the share sweep.
template <typename T, bool Keep>
DLOSS_ROW_LOOP void
addBothSoftmaxSeeds(T *__restrict seed, T *__restrict colPart,
                    const T *__restrict e, T c, T rowLse, T u,
                    const T *__restrict cv, int64_t w) {
  for (int64_t j = 0; j < w; ++j) {
    const T p = epilogue::detail::expNonPositive_(e[j] - rowLse);
    const T col = p * u * cv[j];
    seed[j] += c * p + col;
    if constexpr (Keep)
      colPart[j] = col;
  }
}

/// seed[j] += c[j] (c: one value per column) or c[0] (`perColumn` false).
template <typename T>
DLOSS_ROW_LOOP void addSeed(T *__restrict seed, const T *__restrict c,
                            bool perColumn, int64_t w) {
  if (perColumn) {
    for (int64_t j = 0; j < w; ++j)
      seed[j] += c[j];
    return;
  }
  const T value = c[0];
  for (int64_t j = 0; j < w; ++j)
    seed[j] += value;
}

template <typename T>
void applyInstructionRow(const Instr &ins, T *o, const T *a, const T *b,
                         const T *c, int64_t w) {
  epilogue::dispatch(ins.op, [&](auto tag) {
    applyRow<decltype(tag)::value, T>(o, a, b, c, w, ins);
  });
}

template <typename T>
RowProgram<T>::RowProgram(const SimilarityOperands &ops,
                          const RegisterSets &sets, int64_t width)
    : ops(ops), live(sets.live), carries(sets.carries), reduced(sets.reduced),
      shares(sets.shares), width(width),
      count(static_cast<int64_t>(ops.program.size())), values(count * width),
      reg(count, nullptr) {
  target.assign(count, nullptr);
  // A register the backward does not evaluate still points at memory:
  // an adjoint loop may name its operand without reading it.
  for (int64_t t = 0; t < count; ++t)
    reg[t] = slot(t);
  // Leaves that never change: constants and 0-d values.
  for (int64_t t = 0; t < count; ++t) {
    const Instr &ins = ops.program[t];
    if (ins.op != Op::Const && ins.op != Op::Scalar)
      continue;
    T value = ins.op == Op::Const ? T(epilogue::bitsToDouble(ins.a))
                                  : T(ops.scalars[ins.a]);
    std::fill_n(slot(t), width, value);
    reg[t] = slot(t);
  }
  for (const at::Tensor &leaf : ops.rowLeaves)
    rowLeafData.push_back(leaf.data_ptr<T>());
}

template <typename T>
void RowProgram<T>::prepare(int64_t blockId, const Chunk &chunk,
                            const Block &block) {
  if (blockId == prepared)
    return;
  prepared = blockId;
  for (int64_t t = 0; t < count; ++t) {
    const Instr &ins = ops.program[t];
    if (ins.op == Op::ColId) {
      T *out = slot(t);
      const int64_t base = chunk.offset + block.col;
      for (int64_t j = 0; j < block.cols; ++j)
        out[j] = T(base + j);
      reg[t] = out;
    } else if (ins.op == Op::ColLeaf) {
      reg[t] = chunk.features[1 + ins.a].template data_ptr<T>() + block.col;
    }
  }
}

template <typename T>
void RowProgram<T>::evaluate(const T *sim, int64_t i, int64_t w) {
  for (int64_t t = 0; t < count; ++t) {
    if (!live[t])
      continue;
    const Instr &ins = ops.program[t];
    switch (ins.op) {
    case Op::Sim:
      reg[t] = sim;
      continue;
    case Op::RowLeaf:
      std::fill_n(slot(t), w, rowLeafData[ins.a][i]);
      reg[t] = slot(t);
      continue;
    case Op::RowId:
      std::fill_n(slot(t), w, T(ops.rowOffset + i));
      reg[t] = slot(t);
      continue;
    case Op::ColId:
    case Op::ColLeaf:
    case Op::Scalar:
    case Op::Const:
      continue;
    default:
      break;
    }
    const auto [a, b, c] = operandRows(ins);
    T *out = target[t] ? target[t] : slot(t);
    epilogue::dispatch(ins.op, [&](auto tag) {
      applyRow<decltype(tag)::value, T>(out, a, b, c, w, ins);
    });
    reg[t] = out;
  }
}

template <typename T> void RowProgram<T>::beginReverse(T *grad, int64_t w) {
  if (cts.empty()) {
    cts.assign(count * width, T(0));
    ct.assign(count, nullptr);
    sink.assign(width, T(0));
  }
  std::fill_n(grad, w, T(0));
  for (int64_t t = 0; t < count; ++t) {
    if (!carries[t] || reduced[t])
      continue; // a reduced register's cotangent is summed as it goes
    if (ops.program[t].op == Op::Sim) {
      ct[t] = grad;
    } else {
      ct[t] = cts.data() + t * width;
      std::fill_n(ct[t], w, T(0));
    }
  }
}

template <typename T> void RowProgram<T>::beginShareSweep(int64_t w) {
  for (int64_t t = 0; t < count; ++t)
    if (shares[t] && !reduced[t])
      std::fill_n(ct[t], w, T(0));
}

template <typename T>
void RowProgram<T>::sweep(const std::vector<char> &mask, int64_t i, int64_t w,
                          int64_t n, double *dRowLeaf, double *dScalar) {
  // Where a summed cotangent goes: a reduced register's leaf gradient, or
  // nowhere (constants, ids, integer leaves, registers outside `mask`).
  double discard = 0;
  auto sumOf = [&](int64_t r) -> double * {
    const Instr &leaf = ops.program[r];
    if (!mask[r])
      return &discard;
    if (leaf.op == Op::Scalar && ops.scalarIsFloat[leaf.a])
      return &dScalar[leaf.a];
    if (leaf.op == Op::RowLeaf && ops.rowLeafIsFloat[leaf.a])
      return &dRowLeaf[leaf.a * n + i];
    return &discard;
  };
  for (int64_t t = count - 1; t >= 0; --t) {
    if (!mask[t] || reduced[t])
      continue;
    const Instr &ins = ops.program[t];
    const T *dt = ct[t];
    switch (ins.op) {
    case Op::RowLeaf:
      if (ops.rowLeafIsFloat[ins.a])
        dRowLeaf[ins.a * n + i] += rowSum(dt, w);
      continue;
    case Op::Scalar:
      if (ops.scalarIsFloat[ins.a])
        dScalar[ins.a] += rowSum(dt, w);
      continue;
    case Op::Sim: // already in G
    case Op::ColId:
    case Op::ColLeaf: // the compiler fuses no float column leaf needing one
    case Op::Const:
    case Op::RowId:
      continue;
    default:
      break;
    }
    const int operands = epilogue::registerOperands(ins.op);
    const auto [a, b, c] = operandRows(ins);
    const T *out = reg[t];
    T *da = operands > 0 && mask[ins.a] ? ct[ins.a] : sink.data();
    T *db = operands > 1 && mask[ins.b] ? ct[ins.b] : sink.data();
    T *dc = operands > 2 && mask[ins.c] ? ct[ins.c] : sink.data();
    // Add, sub, mul, div sum the cotangent of a reduced operand, or of
    // one outside the mask (into `discard`), instead of writing an array.
    const bool sumA = reduced[ins.a] || !mask[ins.a];
    const bool sumB = operands > 1 && (reduced[ins.b] || !mask[ins.b]);
    if (isBinaryArithmetic(ins.op) && (sumA || sumB)) {
      double *toA = sumA ? sumOf(ins.a) : nullptr;
      double *toB = sumB ? sumOf(ins.b) : nullptr;
      epilogue::dispatch(ins.op, [&](auto tag) {
        constexpr Op O = decltype(tag)::value;
        if constexpr (isBinaryArithmetic(O)) {
          if (toA && toB)
            reducingAdjointRow<O, T, true, true>(a, b, out, dt, da, db, w, ins,
                                                 toA, toB);
          else if (toA)
            reducingAdjointRow<O, T, true, false>(a, b, out, dt, da, db, w, ins,
                                                  toA, toB);
          else
            reducingAdjointRow<O, T, false, true>(a, b, out, dt, da, db, w, ins,
                                                  toA, toB);
        }
      });
      continue;
    }
    epilogue::dispatch(ins.op, [&](auto tag) {
      adjointRow<decltype(tag)::value, T>(a, b, c, out, dt, da, db, dc, w, ins);
    });
  }
}

// The row loops and the evaluator for both compute types: their clones are
// made here, under this file's flags; the ring code calls them.
#define DLOSS_INSTANTIATE_ROW_EVALUATOR(T)                                     \
  template double rowSum<T>(const T *__restrict, int64_t);                     \
  template T rowMax<T>(const T *__restrict, int64_t);                          \
  template double rowSumExp<T>(const T *__restrict, T, int64_t);               \
  template void addSoftmaxSeed<T>(T *__restrict, const T *__restrict, T, T,    \
                                  int64_t);                                    \
  template void addColumnSoftmaxSeed<T, false>(                                \
      T *__restrict, const T *__restrict, const T *__restrict,                 \
      const T *__restrict, int64_t);                                           \
  template void addColumnSoftmaxSeed<T, true>(                                 \
      T *__restrict, const T *__restrict, const T *__restrict,                 \
      const T *__restrict, int64_t);                                           \
  template void addBothSoftmaxSeeds<T, false>(T *__restrict, T *__restrict,    \
                                              const T *__restrict, T, T, T,    \
                                              const T *__restrict, int64_t);   \
  template void addBothSoftmaxSeeds<T, true>(T *__restrict, T *__restrict,     \
                                             const T *__restrict, T, T, T,     \
                                             const T *__restrict, int64_t);    \
  template void addSeed<T>(T *__restrict, const T *__restrict, bool, int64_t); \
  template void applyInstructionRow<T>(const Instr &, T *, const T *,          \
                                       const T *, const T *, int64_t);         \
  template class RowProgram<T>;

DLOSS_INSTANTIATE_ROW_EVALUATOR(float)
DLOSS_INSTANTIATE_ROW_EVALUATOR(double)
#undef DLOSS_INSTANTIATE_ROW_EVALUATOR

} // namespace dloss::fused::similarity
