// The encoding of the tile program of dloss.fused_similarity and its _grad
// (and of dloss.fused_elementwise's, at the end of the file):
// the contract between the compiler, which writes it into the op's attributes
// and the plan step's, and the runtime, which runs it (its scalar rules are
// runtime/fused/Epilogue.h's). It sits beside Plan.fbs, the plan's other
// contract, so that the compiler includes nothing of the runtime's kernels.
//
// The op computes, for each of this rank's rows i and every column j (every
// rank's columns when gathered, every class otherwise), a few values e_k(i, j)
// from the similarity S_ij = rows_i . cols_j and reduces each along the row:
// r_k[i] = sum_j e_k(i, j) or logsumexp_j e_k(i, j). The values come from a
// straight-line program over scalars; instruction t defines register t.
// Integer values (labels, global ids) are held in the compute type: exact up
// to 2^24 in float32 (the kernels check the column count and integer leaves).
//
// Encoding: `program` holds four int64 per instruction (opcode, a, b, c),
// `outputs` two per result (register, Reduce). A register operand a, b or c
// must name an earlier instruction. A gathered op may also reduce along the
// columns: `col_outputs` (same encoding) gives results over this rank's own
// columns j, each reducing e(i, j) over every rank's rows i (CLIP's second
// direction, from the same tiles); they follow the row results.
//
// Beside the program the compiler writes what it knows about it
// (passes/TileProgram.cpp derives it), so that the runtime reads these facts
// instead of matching the program at every call:
// - `picks`, two per row result: (x, L) when the result is the sum along the
//   row of select(eq(col_id, row leaf L), x, 0), i.e. x at the one column
//   whose index row leaf L names (nothing when none does); (-1, -1)
//   otherwise. The kernels then evaluate and seed that element alone.
// - `col_picks`, two per column result: the same with row_id and a column
//   leaf L (x at the row that column leaf L names).
// - `lse_pairs`, one per column result: the row result that is the
//   log-sum-exp of the same register (CLIP's logits), or -1; each row result
//   is paired at most once. Both directions then come from one exp.
// - `class_targets`: the row leaves that the program compares with col_id
//   (ascending): their values are column (class) indices, which the
//   runtime's preflight range-checks on a local step.
// `col_picks` and `lse_pairs` are there exactly when `col_outputs` is.
//
// No MLIR, ATen or CUDA type appears here: plain C++ that nvcc also compiles
// (DLOSS_HD marks the functions both sides call).
#ifndef DLOSS_RUNTIME_PLAN_TILEENCODING_H
#define DLOSS_RUNTIME_PLAN_TILEENCODING_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// Forced inline on the host too: the CPU kernels' loops over a row only
// vectorise when each element's rule is inlined (in a shared library a
// plain inline function may be called through the PLT).
#if defined(__CUDACC__)
#define DLOSS_HD __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define DLOSS_HD inline __attribute__((always_inline))
#else
#define DLOSS_HD inline
#endif

namespace dloss::epilogue {

/// Instruction opcodes. The numbers are the plan's encoding: append, never
/// renumber (PlanVersion.h changes when this table does).
enum class Op : int64_t {
  // Leaves
  Sim = 0,     ///< S_ij
  ColId = 1,   ///< the column's index: global (gathered) or the class index
  RowLeaf = 2, ///< a: which per-row operand, read at row i
  ColLeaf = 3, ///< a: which per-column operand, read at column j
  Scalar = 4,  ///< a: which 0-d operand
  Const = 5,   ///< a: the bits of a double
  // Arithmetic on registers a, b (c)
  Add = 6,
  Sub = 7,
  Mul = 8,
  Div = 9,
  Neg = 10,
  Exp = 11,
  Log = 12,
  Softplus = 13,
  LogSigmoid = 14,
  Sigmoid = 15,
  Cos = 16,
  Acos = 17,
  Sin = 18,
  Sqrt = 19,
  Clamp = 20,        ///< a: register; b, c: the bits of the double bounds
  Eq = 21,           ///< 1 where a == b, else 0 (no gradient)
  Select = 22,       ///< a != 0 ? b : c (a gets no gradient)
  RowId = 23,        ///< the row's global index (the rows' shard offset + i)
  StopGradient = 24, ///< a's value, with no gradient (dloss.stop_gradient)
  // Leaf of dloss.fused_elementwise only (see the end of the file)
  Element = 25, ///< a: which operand of the iteration space's shape
};

/// The number of opcodes (one past the last).
constexpr int64_t kOpCount = 26;

/// How a result reduces its value along the row.
enum class Reduce : int64_t {
  Sum = 0,
  LogSumExp = 1,
};

/// One instruction, as the `program` attribute holds it.
struct Instr {
  Op op;
  int64_t a, b, c;
};

/// The double whose bits an int64 field holds (Const, Clamp's bounds).
DLOSS_HD double bitsToDouble(int64_t bits) {
  double value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

inline int64_t doubleToBits(double value) {
  int64_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

/// How many register operands an arithmetic opcode reads (0 for leaves).
DLOSS_HD int registerOperands(Op op) {
  switch (op) {
  case Op::Add:
  case Op::Sub:
  case Op::Mul:
  case Op::Div:
  case Op::Eq:
    return 2;
  case Op::Select:
    return 3;
  case Op::Sim:
  case Op::ColId:
  case Op::RowLeaf:
  case Op::ColLeaf:
  case Op::Scalar:
  case Op::Const:
  case Op::RowId:
  case Op::Element:
    return 0;
  default:
    return 1;
  }
}

// The checks and names below are host code for the compiler and the runtime's
// operand checks; nvcc's objects (runtime/fused/cuda/SimilarityTiles.cu) skip
// them, so no std::string is compiled there (cuda/FusedTiles.cu's rule).
#if !defined(__CUDACC__)
/// The name of an opcode (plan text, errors, the fusion remarks), or null.
inline const char *opName(Op op) {
  static const char *const names[kOpCount] = {
      "sim",           "col_id",   "row",         "col",     "scalar", "const",
      "add",           "sub",      "mul",         "div",     "neg",    "exp",
      "log",           "softplus", "log_sigmoid", "sigmoid", "cos",    "acos",
      "sin",           "sqrt",     "clamp",       "eq",      "select", "row_id",
      "stop_gradient", "element"};
  auto k = static_cast<int64_t>(op);
  return k >= 0 && k < kOpCount ? names[k] : nullptr;
}

/// Checks a list of outputs (register, reduction) of a program of `count`
/// instructions; `what` names an entry in the message ("result").
inline std::string checkOutputs(const int64_t *outputs, int64_t outputsSize,
                                int64_t count, const char *what) {
  if (outputsSize % 2 != 0)
    return std::string("the ") + what +
           "s must hold 2 integers each (register, reduction), got " +
           std::to_string(outputsSize);
  for (int64_t k = 0; k < outputsSize / 2; ++k) {
    int64_t reg = outputs[2 * k], kind = outputs[2 * k + 1];
    if (reg < 0 || reg >= count)
      return std::string(what) + " " + std::to_string(k) + " names register " +
             std::to_string(reg) + " of " + std::to_string(count);
    if (kind != static_cast<int64_t>(Reduce::Sum) &&
        kind != static_cast<int64_t>(Reduce::LogSumExp))
      return std::string(what) + " " + std::to_string(k) +
             " has unknown reduction " + std::to_string(kind);
  }
  return {};
}

/// Checks the instructions of an encoded program against the op's leaf
/// counts (`elements`: operands of dloss.fused_elementwise's iteration
/// space, none in a tile program): returns what is wrong, or an empty
/// string.
inline std::string checkInstructions(const int64_t *program,
                                     int64_t programSize, int64_t rowLeaves,
                                     int64_t colLeaves, int64_t scalars,
                                     int64_t elements) {
  auto at = [](int64_t t) { return "instruction " + std::to_string(t) + ": "; };
  if (programSize <= 0 || programSize % 4 != 0)
    return "the program must hold 4 integers per instruction (opcode, a, b, "
           "c), got " +
           std::to_string(programSize);
  if (rowLeaves < 0 || colLeaves < 0 || scalars < 0 || elements < 0)
    return "negative leaf counts";
  const int64_t count = programSize / 4;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t *ins = program + 4 * t;
    if (ins[0] < 0 || ins[0] >= kOpCount)
      return at(t) + "unknown opcode " + std::to_string(ins[0]);
    auto op = static_cast<Op>(ins[0]);
    int operands = registerOperands(op);
    for (int k = 0; k < operands; ++k)
      if (ins[1 + k] < 0 || ins[1 + k] >= t)
        return at(t) + opName(op) + " reads register " +
               std::to_string(ins[1 + k]) + ", not an earlier instruction";
    int64_t limit = op == Op::RowLeaf   ? rowLeaves
                    : op == Op::ColLeaf ? colLeaves
                    : op == Op::Scalar  ? scalars
                    : op == Op::Element ? elements
                                        : -1;
    if (limit >= 0 && (ins[1] < 0 || ins[1] >= limit))
      return at(t) + opName(op) + " reads leaf " + std::to_string(ins[1]) +
             " of " + std::to_string(limit);
  }
  return {};
}

/// Checks an encoded tile program against the op's leaf counts: returns
/// what is wrong with it, or an empty string. The compiler's verifier and
/// the runtime's operand checks both call it, so they agree on what is
/// valid.
inline std::string checkProgram(const int64_t *program, int64_t programSize,
                                const int64_t *outputs, int64_t outputsSize,
                                int64_t rowLeaves, int64_t colLeaves,
                                int64_t scalars) {
  std::string problem = checkInstructions(program, programSize, rowLeaves,
                                          colLeaves, scalars, /*elements=*/0);
  if (!problem.empty())
    return problem;
  if (outputsSize <= 0)
    return "the program has no outputs";
  return checkOutputs(outputs, outputsSize, programSize / 4, "result");
}

/// A read-only view of an integer attribute (a std::vector, an ArrayRef or
/// a plan's vector: anything with data() and size()); empty when absent.
struct Ints {
  const int64_t *data = nullptr;
  int64_t size = 0;
  int64_t operator[](int64_t k) const { return data[k]; }
};

template <typename Container> Ints intsOf(const Container &values) {
  return Ints{values.data(), static_cast<int64_t>(values.size())};
}

/// The facts the compiler writes beside a program (see the top of the
/// file), as views of their attributes.
struct ProgramFacts {
  Ints picks, colPicks, lsePairs, classTargets;
};

/// Checks the facts of a program that checkProgram and checkOutputs accept:
/// their sizes, that every register and leaf they name exists, and that
/// they agree with the results they describe (a pick is a sum, a pair two
/// log-sum-exps of one register). Returns what is wrong, or an empty
/// string. The verifier and the runtime both call it: what it accepts is
/// safe to run.
inline std::string checkFacts(Ints program, Ints outputs, Ints colOutputs,
                              int64_t rowLeaves, int64_t colLeaves,
                              const ProgramFacts &facts) {
  const int64_t count = program.size / 4;
  const int64_t numOutputs = outputs.size / 2, numCol = colOutputs.size / 2;
  auto sizeError = [](const char *name, int64_t size, int64_t want,
                      const char *per) {
    return std::string("`") + name + "` holds " + std::to_string(size) +
           " integers, expected " + std::to_string(want) + " (" + per + ")";
  };
  auto checkPicks = [&](const char *name, Ints picks, Ints results,
                        int64_t leaves, const char *leafKind) -> std::string {
    if (picks.size != results.size)
      return sizeError(name, picks.size, results.size,
                       "2 per result: register, leaf; or -1, -1");
    for (int64_t k = 0; k < picks.size / 2; ++k) {
      const int64_t reg = picks[2 * k], leaf = picks[2 * k + 1];
      const std::string at =
          std::string("`") + name + "` entry " + std::to_string(k) + " ";
      if (reg == -1 && leaf == -1)
        continue;
      if (reg < 0 || reg >= count)
        return at + "names register " + std::to_string(reg) + " of " +
               std::to_string(count);
      if (leaf < 0 || leaf >= leaves)
        return at + "names " + leafKind + " leaf " + std::to_string(leaf) +
               " of " + std::to_string(leaves);
      if (results[2 * k + 1] != static_cast<int64_t>(Reduce::Sum))
        return at + "is a pick, but its result is not a sum";
    }
    return {};
  };
  std::string problem =
      checkPicks("picks", facts.picks, outputs, rowLeaves, "per-row");
  if (problem.empty())
    problem = checkPicks("col_picks", facts.colPicks, colOutputs, colLeaves,
                         "per-column");
  if (!problem.empty())
    return problem;
  if (facts.lsePairs.size != numCol)
    return sizeError("lse_pairs", facts.lsePairs.size, numCol,
                     "1 per column result: a row result, or -1");
  for (int64_t k = 0; k < numCol; ++k) {
    const int64_t row = facts.lsePairs[k];
    if (row == -1)
      continue;
    const std::string at = "`lse_pairs` entry " + std::to_string(k) + " ";
    if (row < 0 || row >= numOutputs)
      return at + "names row result " + std::to_string(row) + " of " +
             std::to_string(numOutputs);
    const int64_t lse = static_cast<int64_t>(Reduce::LogSumExp);
    if (colOutputs[2 * k + 1] != lse || outputs[2 * row + 1] != lse ||
        colOutputs[2 * k] != outputs[2 * row])
      return at + "pairs results that are not log-sum-exps of one register";
    for (int64_t q = 0; q < k; ++q)
      if (facts.lsePairs[q] == row)
        return at + "pairs row result " + std::to_string(row) +
               " a second time";
  }
  for (int64_t k = 0; k < facts.classTargets.size; ++k) {
    const int64_t leaf = facts.classTargets[k];
    if (leaf < 0 || leaf >= rowLeaves ||
        (k > 0 && leaf <= facts.classTargets[k - 1]))
      return "`class_targets` must list per-row leaves (of " +
             std::to_string(rowLeaves) + ") in ascending order, got " +
             std::to_string(leaf) + " at " + std::to_string(k);
  }
  return {};
}

/// The facts of a program that checkProgram and checkOutputs accept, as the
/// compiler derives them (passes/TileProgram.cpp writes them; the verifier
/// requires a fused op's facts to be these): a row result `sum
/// select(eq(col_id, row leaf L), x, 0)` (either order of eq) picks x at
/// L, a column result with row_id and a column leaf likewise; a column
/// log-sum-exp pairs with the first unpaired row log-sum-exp of the same
/// register; the class targets are the per-row leaves compared with col_id.
struct DerivedFacts {
  std::vector<int64_t> picks, colPicks, lsePairs, classTargets;
};

/// The leaf index L of `eq(index, leaf L)` (either order) at register `eq`,
/// or -1.
inline int64_t comparedLeaf(Ints program, int64_t eq, Op index, Op leaf) {
  auto opAt = [&](int64_t reg) { return static_cast<Op>(program[4 * reg]); };
  if (opAt(eq) != Op::Eq)
    return -1;
  int64_t a = program[4 * eq + 1], b = program[4 * eq + 2];
  if (opAt(a) == leaf)
    std::swap(a, b);
  return opAt(a) == index && opAt(b) == leaf ? program[4 * b + 1] : -1;
}

inline DerivedFacts deriveFacts(Ints program, Ints outputs, Ints colOutputs) {
  auto picksOf = [&](Ints results, Op index, Op leaf) {
    std::vector<int64_t> picks;
    for (int64_t k = 0; k + 1 < results.size; k += 2) {
      const int64_t *select = &program.data[4 * results[k]];
      int64_t leafIndex = -1;
      if (results[k + 1] == static_cast<int64_t>(Reduce::Sum) &&
          static_cast<Op>(select[0]) == Op::Select) {
        const int64_t *zero = &program.data[4 * select[3]];
        if (static_cast<Op>(zero[0]) == Op::Const &&
            bitsToDouble(zero[1]) == 0.0)
          leafIndex = comparedLeaf(program, select[1], index, leaf);
      }
      picks.push_back(leafIndex < 0 ? -1 : select[2]);
      picks.push_back(leafIndex);
    }
    return picks;
  };
  DerivedFacts facts;
  facts.picks = picksOf(outputs, Op::ColId, Op::RowLeaf);
  facts.colPicks = picksOf(colOutputs, Op::RowId, Op::ColLeaf);
  const auto lse = static_cast<int64_t>(Reduce::LogSumExp);
  std::vector<bool> paired(static_cast<size_t>(outputs.size / 2), false);
  for (int64_t k = 0; k + 1 < colOutputs.size; k += 2) {
    int64_t row = -1;
    for (int64_t o = 0; o + 1 < outputs.size && colOutputs[k + 1] == lse;
         o += 2)
      if (!paired[o / 2] && outputs[o + 1] == lse &&
          outputs[o] == colOutputs[k]) {
        row = o / 2;
        paired[o / 2] = true;
        break;
      }
    facts.lsePairs.push_back(row);
  }
  for (int64_t t = 0; t < program.size / 4; ++t) {
    int64_t leaf = comparedLeaf(program, t, Op::ColId, Op::RowLeaf);
    if (leaf >= 0 &&
        std::find(facts.classTargets.begin(), facts.classTargets.end(), leaf) ==
            facts.classTargets.end())
      facts.classTargets.push_back(leaf);
  }
  std::sort(facts.classTargets.begin(), facts.classTargets.end());
  return facts;
}

//===----------------------------------------------------------------------===//
// dloss.fused_elementwise
//===----------------------------------------------------------------------===//
//
// The same instructions describe a chain of element-wise ops over one
// iteration space (a tensor's shape, seen as rows x columns: its last axis
// is the columns, the others the rows), which dloss.fused_elementwise runs in
// one pass over memory (passes/FuseElementwise.cpp writes it). Its leaves:
// `element a` (operand a, of the iteration space's shape, read at the
// element), `row a` (a per-row vector, read at the element's row), `col a`
// (a per-column vector, read at its column), `scalar a` (a 0-d operand) and
// `const`. `outputs` holds one register per full result, written in full;
// `col_sums` one register per further result, its sum over the rows (one
// value per column: a reduction over the batch that ends the chain).
// The op only runs forward (it is made after autodiff), so the arithmetic
// is the set whose ATen kernels round the same way as epilogue::apply.

/// The arithmetic a fused element-wise program may hold.
inline bool isElementwiseArithmetic(Op op) {
  switch (op) {
  case Op::Add:
  case Op::Sub:
  case Op::Mul:
  case Op::Div:
  case Op::Neg:
  case Op::Sqrt:
    return true;
  default:
    return false;
  }
}

/// Checks a fused element-wise program, its outputs and its column sums
/// (one register each) against the op's leaf counts: what is wrong, or an empty
/// string. The verifier and the runtime both call it.
inline std::string checkElementwiseProgram(Ints program, Ints outputs,
                                           Ints colSums, int64_t elements,
                                           int64_t rowLeaves, int64_t colLeaves,
                                           int64_t scalars) {
  std::string problem = checkInstructions(program.data, program.size, rowLeaves,
                                          colLeaves, scalars, elements);
  if (!problem.empty())
    return problem;
  const int64_t count = program.size / 4;
  for (int64_t t = 0; t < count; ++t) {
    const auto op = static_cast<Op>(program[4 * t]);
    const bool leaf = op == Op::Element || op == Op::RowLeaf ||
                      op == Op::ColLeaf || op == Op::Scalar || op == Op::Const;
    if (!leaf && !isElementwiseArithmetic(op))
      return "instruction " + std::to_string(t) + ": " + opName(op) +
             " is not an instruction of a fused element-wise program";
  }
  if (elements <= 0)
    return "a fused element-wise program needs an operand of its iteration "
           "space's shape";
  if (outputs.size + colSums.size <= 0)
    return "the program has no outputs";
  for (int64_t k = 0; k < outputs.size + colSums.size; ++k) {
    const int64_t reg =
        k < outputs.size ? outputs[k] : colSums[k - outputs.size];
    if (reg < 0 || reg >= count)
      return "result " + std::to_string(k) + " names register " +
             std::to_string(reg) + " of " + std::to_string(count);
  }
  return {};
}
#endif // !defined(__CUDACC__)

} // namespace dloss::epilogue

#endif // DLOSS_RUNTIME_PLAN_TILEENCODING_H
