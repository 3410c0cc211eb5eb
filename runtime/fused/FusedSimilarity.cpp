// dloss.fused_similarity and its _grad: a tile program's row reductions over
// S = rows x cols^T on the CPU, the columns round the ring or tiled in place.
//
// Each block is one GEMM (tileGemm) into a preallocated tile; the program runs
// a tile row at a time: every register is a tile-width array (the `sim` leaf
// is the tile row itself), and each instruction is one tight loop of
// epilogue::apply (or, backward, epilogue::adjoint) over the row, its opcode
// dispatched once per row. Rows are split over ATen's threads, one evaluator
// (registers, cotangents, partial sums) each. The backward fills G = dL/dS in
// a second tile and adds G cols and G^T rows with two GEMMs.
//
// Column results (gathered): their values go to a tile of their own, folded
// along the rows after each block into the chunk's statistics, which travel
// round the ring with it and come home complete; backward, the chunk's column
// results and cotangents travel with it, and their share of the 0-d leaves'
// gradients goes home with the column gradient.
#include "runtime/fused/FusedKernels.h"

#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/Epilogue.h"
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/fused/TileMath.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dloss::fused {

namespace {

using epilogue::Instr;
using epilogue::Op;
using epilogue::Reduce;

constexpr const char *kForwardName = "dloss.fused_similarity";
constexpr const char *kBackwardName = "dloss.fused_similarity_grad";

constexpr const char *kProgramHint =
    "The plan's tile program does not fit its operands: recompile the loss "
    "(if it persists, it is a compiler bug: report it with the plan)";

/// float32 holds every integer of magnitude below 2^24 exactly.
constexpr double kF32Exact = 16777216.0;

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
int64_t operandOf(const Instr &ins, int k) {
  return k == 0 ? ins.a : k == 1 ? ins.b : ins.c;
}

bool reads(const std::vector<Instr> &program, Op op) {
  return std::any_of(program.begin(), program.end(),
                     [&](const Instr &ins) { return ins.op == op; });
}

/// In float32, integer leaves must stay below 2^24 (their values are held in
/// the compute type).
void checkExactInF32(const FusedArgs &args, const at::Tensor &value,
                     const std::string &name) {
  if (args.compute != at::kFloat || value.numel() == 0 ||
      !at::isIntegralType(value.scalar_type(), /*includeBool=*/true))
    return;
  at::Tensor magnitude = value.to(at::kLong).abs();
  int64_t largestValue = magnitude.max().item<int64_t>();
  if (static_cast<double>(largestValue) < kF32Exact)
    return;
  int64_t at = magnitude.view({-1}).argmax().item<int64_t>();
  args.fail(name + " holds " +
                std::to_string(value.view({-1})[at].item<int64_t>()) +
                " (element " + std::to_string(at) +
                "), but the float32 tile program holds integers exactly only "
                "below 2^24 = 16777216",
            "Compute in float64 (pass float64 rows and cols), or keep "
            "integer labels and ids below 2^24");
}

/// Operands and program of either op; `backward` adds the forward results
/// and their cotangents.
SimilarityOperands similarityOperands(const FusedArgs &args,
                                      const SimilarityProgram &spec,
                                      bool backward) {
  SimilarityOperands ops;
  KernelContext &ctx = args.ctx;
  const int64_t operands = static_cast<int64_t>(ctx.numOperands());
  if (spec.outputs.empty() || spec.outputs.size() % 2 != 0)
    args.fail("the tile program's `outputs` must hold 2 integers per result "
              "(register, reduction), got " +
                  std::to_string(spec.outputs.size()),
              kProgramHint);
  const int64_t numOutputs = static_cast<int64_t>(spec.outputs.size()) / 2;
  const int64_t numColOutputs =
      static_cast<int64_t>(spec.colOutputs.size()) / 2;
  const int64_t leafCount =
      operands - 2 - (backward ? 2 * (numOutputs + numColOutputs) : 0);
  if (spec.rowLeaves < 0 || spec.colLeaves < 0 ||
      leafCount < spec.rowLeaves + spec.colLeaves)
    args.fail("the step has " + std::to_string(operands) + " operands: " +
                  std::to_string(std::max<int64_t>(leafCount, 0)) +
                  " leaves" +
                  (backward ? " after rows and cols, before the " +
                                  std::to_string(numOutputs + numColOutputs) +
                                  " results and their cotangents"
                            : std::string(" after rows and cols")) +
                  ", fewer than row_leaves = " +
                  std::to_string(spec.rowLeaves) +
                  " plus col_leaves = " + std::to_string(spec.colLeaves),
              kProgramHint);
  const int64_t scalarCount = leafCount - spec.rowLeaves - spec.colLeaves;
  std::string problem = epilogue::checkProgram(
      spec.program.data(), static_cast<int64_t>(spec.program.size()),
      spec.outputs.data(), static_cast<int64_t>(spec.outputs.size()),
      spec.rowLeaves, spec.colLeaves, scalarCount);
  if (!problem.empty())
    args.fail("malformed tile program (" + std::to_string(spec.rowLeaves) +
                  " per-row, " + std::to_string(spec.colLeaves) +
                  " per-column and " + std::to_string(scalarCount) +
                  " 0-d leaves): " + problem,
              kProgramHint);
  if (problem.empty() && !spec.colOutputs.empty())
    problem = epilogue::checkOutputs(
        spec.colOutputs.data(), static_cast<int64_t>(spec.colOutputs.size()),
        static_cast<int64_t>(spec.program.size()) / 4, "column result");
  if (!problem.empty())
    args.fail("malformed tile program: " + problem, kProgramHint);
  using epilogue::intsOf;
  problem = epilogue::checkFacts(
      intsOf(spec.program), intsOf(spec.outputs), intsOf(spec.colOutputs),
      spec.rowLeaves, spec.colLeaves,
      {intsOf(spec.picks), intsOf(spec.colPicks), intsOf(spec.lsePairs),
       intsOf(spec.classTargets)});
  if (!problem.empty())
    args.fail("the tile program's facts do not fit it: " + problem,
              kProgramHint);
  if (!spec.colOutputs.empty() && !spec.gathered)
    args.fail("column results (`col_outputs`) need a `gathered` step: a "
              "local or sharded step has no reduction over every rank's rows",
              kProgramHint);
  for (size_t t = 0; t < spec.program.size(); t += 4)
    ops.program.push_back(Instr{static_cast<Op>(spec.program[t]),
                                spec.program[t + 1], spec.program[t + 2],
                                spec.program[t + 3]});
  auto outputsOf = [](const std::vector<int64_t> &encoded,
                      const std::vector<int64_t> &picks) {
    std::vector<Output> outputs;
    for (size_t k = 0; k < encoded.size(); k += 2)
      outputs.push_back(Output{encoded[k], static_cast<Reduce>(encoded[k + 1]),
                               picks[k], picks[k + 1]});
    return outputs;
  };
  ops.outputs = outputsOf(spec.outputs, spec.picks);
  ops.colOutputs = outputsOf(spec.colOutputs, spec.colPicks);
  ops.pairs.rowOf = spec.lsePairs;
  ops.pairs.colOf.assign(ops.outputs.size(), -1);
  for (size_t k = 0; k < spec.lsePairs.size(); ++k)
    if (spec.lsePairs[k] >= 0)
      ops.pairs.colOf[spec.lsePairs[k]] = static_cast<int64_t>(k);

  if (args.type(0) != args.type(1))
    args.fail("rows is a " + std::string(c10::toString(args.type(0))) +
                  " tensor and cols a " + c10::toString(args.type(1)) +
                  " one; they must have the same float type",
              "The plan does not match its inputs' types; recompile it");
  ops.rows = args.matrix(0, "rows");
  ops.cols = args.matrix(1, "cols", ops.rows.size(1));
  const int64_t n = ops.rows.size(0), m = ops.cols.size(0);

  for (int64_t k = 0; k < leafCount; ++k) {
    const size_t i = static_cast<size_t>(2 + k);
    const at::Tensor &value = ctx.tensor(i);
    bool isRow = k < spec.rowLeaves, isCol = !isRow && k < spec.rowLeaves +
                                                               spec.colLeaves;
    std::string name =
        isRow   ? "per-row leaf " + std::to_string(k)
        : isCol ? "per-column leaf " + std::to_string(k - spec.rowLeaves)
                : "0-d leaf " +
                      std::to_string(k - spec.rowLeaves - spec.colLeaves);
    name += " (operand " + std::to_string(i) + ")";
    at::ScalarType type = value.scalar_type();
    if (!at::isFloatingType(type) &&
        !at::isIntegralType(type, /*includeBool=*/true))
      args.fail(name + " is a " + c10::toString(type) +
                    " tensor, expected floats or integers",
                "The plan does not match its inputs' types; recompile it");
    int64_t length = isRow ? n : m;
    bool fits = isRow || isCol ? value.dim() == 1 && value.size(0) == length
                               : value.dim() == 0;
    if (!fits)
      args.fail(name + " has shape " + shapeText(value.sizes()) +
                    ", expected " +
                    (isRow || isCol ? "[" + std::to_string(length) + "] (" +
                                          (isRow ? "one per row" :
                                                   "one per column") + ")"
                                    : std::string("a 0-d tensor")),
                kShapeHint);
    checkExactInF32(args, value, name);
    bool isFloat = at::isFloatingType(type);
    if (isRow) {
      ops.rowLeaves.push_back(value.to(args.compute).contiguous());
      ops.rowLeafIsFloat.push_back(isFloat);
    } else if (isCol) {
      ops.colLeaves.push_back(value.to(args.compute).contiguous());
    } else {
      ops.scalars.push_back(value.to(args.compute).item<double>());
      ops.scalarIsFloat.push_back(isFloat);
    }
  }

  if (spec.gathered && spec.sharded)
    args.fail("the step is both `gathered` and `sharded`", kProgramHint);
  ops.colSizes = spec.gathered || spec.sharded ? ctx.rankSizes(1, 0)
                                               : std::vector<int64_t>{m};
  if (spec.sharded)
    ops.colOffset = offsetOf(ops.colSizes, args.rank);
  if (args.compute == at::kFloat && reads(ops.program, Op::ColId) &&
      static_cast<double>(total(ops.colSizes)) > kF32Exact)
    args.fail("the tile program reads column indices up to " +
                  std::to_string(total(ops.colSizes) - 1) +
                  ", but float32 holds integers exactly only below 2^24 = "
                  "16777216",
              "Compute in float64 (pass float64 rows and cols)");
  // Sharded: the rows are the gathered ones, the same on every rank.
  if (!spec.sharded && reads(ops.program, Op::RowId)) {
    // A collective when the sizes are not known from the preflight: every
    // rank runs the same program, so every rank reaches it.
    std::vector<int64_t> rowSizes = ctx.rankSizes(0, 0);
    ops.rowOffset = offsetOf(rowSizes, args.rank);
    if (args.compute == at::kFloat &&
        static_cast<double>(total(rowSizes)) > kF32Exact)
      args.fail("the tile program reads row indices up to " +
                    std::to_string(total(rowSizes) - 1) +
                    ", but float32 holds integers exactly only below 2^24 = "
                    "16777216",
                "Compute in float64 (pass float64 rows and cols)");
  }
  ops.tile = clippedTile(n, spec.gathered ? largest(ops.colSizes) : m,
                         args.compute);

  if (backward) {
    // The results (row ones [n], then column ones [m]), then as many
    // cotangents.
    const size_t base = static_cast<size_t>(2 + leafCount);
    const int64_t all = numOutputs + numColOutputs;
    for (int64_t k = 0; k < all; ++k) {
      bool isRow = k < numOutputs;
      std::string result = "result " + std::to_string(k);
      std::string ct = "cotangent of result " + std::to_string(k);
      at::Tensor value = args.vector(base + k, result.c_str(), isRow ? n : m);
      at::Tensor cotangent =
          args.vector(base + all + k, ct.c_str(), isRow ? n : m);
      (isRow ? ops.results : ops.colResults).push_back(value);
      (isRow ? ops.cts : ops.colCts).push_back(cotangent);
    }
  }
  return ops;
}

//===----------------------------------------------------------------------===//
// The tile program, a row at a time
//===----------------------------------------------------------------------===//

/// Calls fn(r) for each register operand r a gradient flows back to (none
/// for eq, not select's condition).
template <typename Fn> void forGradientOperands(const Instr &ins, Fn &&fn) {
  if (ins.op == Op::Eq)
    return;
  const int first = ins.op == Op::Select ? 1 : 0;
  for (int k = first; k < epilogue::registerOperands(ins.op); ++k)
    fn(operandOf(ins, k));
}

/// The register a result's seed goes to: the picked value's for a pick.
int64_t seededRegister(const Output &output) {
  return output.pickReg >= 0 ? output.pickReg : output.reg;
}

/// The registers the outputs read, directly or not; with `gradients`, only
/// along the operands a gradient flows back through (Eq and Select's
/// condition pass none).
std::vector<char> registersReaching(const SimilarityOperands &ops,
                                    bool gradients) {
  std::vector<char> reached(ops.program.size(), 0);
  for (const std::vector<Output> *list : {&ops.outputs, &ops.colOutputs})
    for (const Output &output : *list)
      reached[seededRegister(output)] = 1;
  for (int64_t t = static_cast<int64_t>(ops.program.size()) - 1; t >= 0; --t) {
    const Instr &ins = ops.program[t];
    if (!reached[t])
      continue;
    auto reach = [&](int64_t r) { reached[r] = 1; };
    if (gradients)
      forGradientOperands(ins, reach);
    else
      for (int k = 0; k < epilogue::registerOperands(ins.op); ++k)
        reach(operandOf(ins, k));
  }
  return reached;
}

/// The registers the backward evaluates: those an adjoint of a register
/// that carries a gradient reads (epilogue::adjointReads), a log-sum-exp
/// result's register (its softmax seed reads it), and what they are computed
/// from.
std::vector<char> registersReadBackward(const SimilarityOperands &ops,
                                        const std::vector<char> &carries) {
  const int64_t count = static_cast<int64_t>(ops.program.size());
  std::vector<char> read(count, 0);
  for (const std::vector<Output> *list : {&ops.outputs, &ops.colOutputs})
    for (const Output &output : *list)
      if (output.pickReg < 0 && output.kind == Reduce::LogSumExp)
        read[output.reg] = 1;
  for (int64_t t = count - 1; t >= 0; --t) {
    const Instr &ins = ops.program[t];
    const int operands = epilogue::registerOperands(ins.op);
    if (carries[t] && operands > 0) {
      const int reads = epilogue::adjointReads(ins.op);
      read[t] |= (reads & epilogue::kReadsOut) != 0;
      for (int k = 0; k < operands; ++k)
        read[operandOf(ins, k)] |= (reads & (1 << k)) != 0;
    }
    if (read[t])
      for (int k = 0; k < operands; ++k)
        read[operandOf(ins, k)] = 1;
  }
  return read;
}

/// The registers of the share sweep: those that carry a gradient from a
/// column result's register to a float 0-d leaf. Their sweep, seeded by the
/// column results alone, gives the columns' share of the 0-d leaves'
/// gradients, which goes home with the columns. Empty of registers when no
/// column result reaches one.
std::vector<char> shareRegisters(const SimilarityOperands &ops,
                                 const std::vector<char> &carries) {
  const int64_t count = static_cast<int64_t>(ops.program.size());
  std::vector<char> toScalar(count, 0), fromColumns(count, 0), shares(count, 0);
  for (int64_t t = 0; t < count; ++t) {
    const Instr &ins = ops.program[t];
    if (ins.op == Op::Scalar)
      toScalar[t] = ops.scalarIsFloat[ins.a];
    forGradientOperands(ins, [&](int64_t r) { toScalar[t] |= toScalar[r]; });
  }
  for (const Output &output : ops.colOutputs)
    fromColumns[seededRegister(output)] = 1;
  for (int64_t t = count - 1; t >= 0; --t)
    if (fromColumns[t])
      forGradientOperands(ops.program[t],
                          [&](int64_t r) { fromColumns[r] = 1; });
  for (int64_t t = 0; t < count; ++t)
    shares[t] = carries[t] && toScalar[t] && fromColumns[t];
  return shares;
}

/// Whether register `t` has one value along a tile row: a 0-d leaf, a
/// constant, a per-row leaf or the row's id.
bool isUniform(const Instr &ins) {
  return ins.op == Op::Scalar || ins.op == Op::Const ||
         ins.op == Op::RowLeaf || ins.op == Op::RowId;
}

constexpr bool isBinaryArithmetic(Op op) {
  return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div;
}

/// The registers whose cotangent along a row is only ever summed, so the
/// reverse sweep sums it inside the adjoint loop instead of filling a
/// tile-row array and summing that (CLIP's scale in `sim * scale`): uniform
/// registers that carry a gradient, are no result's register, and are read
/// (where a gradient flows) only by add, sub, mul and div.
std::vector<char> reducedRegisters(const SimilarityOperands &ops,
                                   const std::vector<char> &carries) {
  const size_t count = ops.program.size();
  std::vector<char> reduced(count, 0);
  for (size_t t = 0; t < count; ++t)
    reduced[t] = carries[t] && isUniform(ops.program[t]);
  for (const std::vector<Output> *list : {&ops.outputs, &ops.colOutputs})
    for (const Output &output : *list)
      reduced[seededRegister(output)] = 0;
  for (size_t t = 0; t < count; ++t) {
    const Instr &ins = ops.program[t];
    if (!carries[t] || isBinaryArithmetic(ins.op))
      continue;
    for (int k = 0; k < epilogue::registerOperands(ins.op); ++k)
      reduced[operandOf(ins, k)] = 0;
  }
  return reduced;
}

/// The column (0 <= c < width) whose global index, base + c, equals `value`;
/// -1 for none (not an integer, out of range, NaN), as eq would find none.
template <typename T> int64_t pickedIndex(T value, int64_t base, int64_t width) {
  const double v = static_cast<double>(value);
  if (!(v >= static_cast<double>(base) &&
        v < static_cast<double>(base + width)))
    return -1;
  const int64_t c = static_cast<int64_t>(v);
  return static_cast<double>(c) == v ? c - base : -1;
}

/// A block's column picks: for each column result that is a pick, the
/// block's columns whose leaf names a row of the block, grouped by that row
/// (CSR: columns of row r are at[start[r] .. start[r + 1])).
template <typename T> struct ColumnPicks {
  struct PerOutput {
    std::vector<int64_t> start, at;
  };
  std::vector<PerOutput> outputs; ///< one per column result (empty: no pick)

  void build(const SimilarityOperands &ops, const Chunk &chunk,
             const Block &block) {
    outputs.assign(ops.colOutputs.size(), PerOutput{});
    for (size_t k = 0; k < ops.colOutputs.size(); ++k) {
      const Output &output = ops.colOutputs[k];
      if (output.pickReg < 0)
        continue;
      const T *leaf =
          chunk.features[1 + output.pickLeaf].template data_ptr<T>() +
          block.col;
      PerOutput &picks = outputs[k];
      std::vector<int64_t> rowOf(block.cols, -1);
      picks.start.assign(block.rows + 1, 0);
      for (int64_t j = 0; j < block.cols; ++j) {
        rowOf[j] = pickedIndex(leaf[j], ops.rowOffset + block.row, block.rows);
        if (rowOf[j] >= 0)
          ++picks.start[rowOf[j] + 1];
      }
      for (int64_t r = 0; r < block.rows; ++r)
        picks.start[r + 1] += picks.start[r];
      picks.at.assign(picks.start[block.rows], 0);
      std::vector<int64_t> next(picks.start.begin(), picks.start.end() - 1);
      for (int64_t j = 0; j < block.cols; ++j)
        if (rowOf[j] >= 0)
          picks.at[next[rowOf[j]]++] = j;
    }
  }

  /// fn(j) for the columns of result k picked at tile row r.
  template <typename Fn> void forRow(size_t k, int64_t r, Fn &&fn) const {
    const PerOutput &picks = outputs[k];
    if (picks.start.empty())
      return;
    for (int64_t e = picks.start[r]; e < picks.start[r + 1]; ++e)
      fn(picks.at[e]);
  }
};

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
DLOSS_ROW_LOOP void adjointRow(const T *a, const T *b, const T *c,
                               const T *out, const T *dt, T *da, T *db, T *dc,
                               int64_t w, Instr ins) {
  if constexpr (O == Op::Eq) {
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
      epilogue::adjoint<O, T>(a[j], b[j], c[j], out[j], dt[j], ins, ga, gb,
                              gc);
      const bool skip = dt[j] == T(0);
      da[j] += skip ? T(0) : ga;
      db[j] += skip ? T(0) : gb;
    }
  } else {
    for (int64_t j = 0; j < w; ++j) {
      T ga = 0, gb = 0, gc = 0;
      epilogue::adjoint<O, T>(a[j], b[j], c[j], out[j], dt[j], ins, ga, gb,
                              gc);
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
DLOSS_ROW_LOOP void reducingAdjointRow(const T *__restrict a,
                                       const T *__restrict b,
                                       const T *__restrict out,
                                       const T *__restrict dt, T *da, T *db,
                                       int64_t w, Instr ins, double *sumA,
                                       double *sumB) {
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
template <typename T, bool Store = false>
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
DLOSS_ROW_LOOP void addBothSoftmaxSeeds(T *__restrict seed,
                                        T *__restrict colPart,
                                        const T *__restrict e, T c, T rowLse,
                                        T u, const T *__restrict cv,
                                        int64_t w) {
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

/// The data of each tensor (contiguous, of type T).
template <typename T> std::vector<const T *> dataOf(const Tensors &tensors) {
  std::vector<const T *> data;
  for (const at::Tensor &tensor : tensors)
    data.push_back(tensor.template data_ptr<T>());
  return data;
}

/// One thread's registers: evaluates the program on a tile row, and (for the
/// backward) sweeps it in reverse.
template <typename T> class RowProgram {
public:
  RowProgram(const SimilarityOperands &ops, const std::vector<char> &live,
             const std::vector<char> &carries,
             const std::vector<char> &reduced,
             const std::vector<char> &shares, int64_t width)
      : ops(ops), live(live), carries(carries), reduced(reduced),
        shares(shares), width(width),
        count(static_cast<int64_t>(ops.program.size())),
        values(count * width), reg(count, nullptr) {
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

  /// Points the per-column leaves at `block` of `chunk` (once per block).
  void prepare(int64_t blockId, const Chunk &chunk, const Block &block) {
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

  /// Evaluates every live register on row `i` (of this rank) whose
  /// similarities are sim[0, w).
  void evaluate(const T *sim, int64_t i, int64_t w) {
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
      const int operands = epilogue::registerOperands(ins.op);
      const T *a = reg[ins.a];
      const T *b = operands > 1 ? reg[ins.b] : a;
      const T *c = operands > 2 ? reg[ins.c] : a;
      T *out = target[t] ? target[t] : slot(t);
      epilogue::dispatch(ins.op, [&](auto tag) {
        applyRow<decltype(tag)::value, T>(out, a, b, c, w, ins);
      });
      reg[t] = out;
    }
  }

  /// Where evaluate writes computed register `t` (null: its own slot), for
  /// the forward's column results, whose values go to a tile of their own.
  std::vector<T *> target;

  /// The values of register `t` on the row last evaluated.
  const T *value(int64_t t) const { return reg[t]; }

  /// Starts the reverse sweep of the row: zeroes the cotangents; those of
  /// `sim` leaves accumulate in `grad` (G's row, w wide, zeroed too).
  void beginReverse(T *grad, int64_t w) {
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

  /// Starts the share sweep of the row (after reverse): zeroes the
  /// cotangents of the registers between the column results and the float
  /// 0-d leaves (shareRegisters), to be seeded by the column results alone.
  void beginShareSweep(int64_t w) {
    for (int64_t t = 0; t < count; ++t)
      if (shares[t] && !reduced[t])
        std::fill_n(ct[t], w, T(0));
  }

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

  /// A reverse sweep over the registers of `mask` (carries, or shares):
  /// a cotangent for a register outside it is dropped.
  void sweep(const std::vector<char> &mask, int64_t i, int64_t w, int64_t n,
             double *dRowLeaf, double *dScalar) {
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
      const T *a = reg[ins.a];
      const T *b = operands > 1 ? reg[ins.b] : a;
      const T *c = operands > 2 ? reg[ins.c] : a;
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
              reducingAdjointRow<O, T, true, true>(a, b, out, dt, da, db, w,
                                                   ins, toA, toB);
            else if (toA)
              reducingAdjointRow<O, T, true, false>(a, b, out, dt, da, db, w,
                                                    ins, toA, toB);
            else
              reducingAdjointRow<O, T, false, true>(a, b, out, dt, da, db, w,
                                                    ins, toA, toB);
          }
        });
        continue;
      }
      epilogue::dispatch(ins.op, [&](auto tag) {
        adjointRow<decltype(tag)::value, T>(a, b, c, out, dt, da, db, dc, w,
                                            ins);
      });
    }
  }

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
      : carries(registersReaching(ops, true)),
        live(backward ? registersReadBackward(ops, carries)
                      : registersReaching(ops, false)),
        reduced(reducedRegisters(ops, carries)),
        shares(shareRegisters(ops, carries)) {
    const int threads = std::max(1, at::get_num_threads());
    programs.reserve(threads); // registers point into their own buffers
    for (int k = 0; k < threads; ++k) {
      programs.emplace_back(ops, live, carries, reduced, shares,
                            ops.tile.cols);
      programs.back().dScalars.assign(ops.scalars.size(), 0.0);
      programs.back().colShares.assign(ops.scalars.size(), 0.0);
    }
    // Enough work per task to pay for the fork: about 16k register values.
    grain = std::max<int64_t>(
        1, 16384 / std::max<int64_t>(
                       1, ops.tile.cols * static_cast<int64_t>(
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
  const std::vector<char> &shareMask() const { return shares; }

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
  std::vector<char> carries, live, reduced, shares;
  std::vector<RowProgram<T>> programs;
  int64_t grain = 1;
  int64_t blocks = 0;
};

/// What travels with a column chunk: cols, then the per-column leaves.
Tensors chunkFeatures(const SimilarityOperands &ops) {
  Tensors features = {ops.cols};
  features.insert(features.end(), ops.colLeaves.begin(), ops.colLeaves.end());
  return features;
}

/// What travels with a column chunk in the backward: chunkFeatures, then
/// the column results and their cotangents.
Tensors gradientChunkFeatures(const SimilarityOperands &ops) {
  Tensors features = chunkFeatures(ops);
  features.insert(features.end(), ops.colResults.begin(), ops.colResults.end());
  features.insert(features.end(), ops.colCts.begin(), ops.colCts.end());
  return features;
}

/// Sharded: combines every shard's row statistics ([outputs, n] each, in
/// f64; the max rows of sum outputs are unused) into the global ones. Every
/// rank makes the same calls.
void combineShards(Communicator &comm, const SimilarityOperands &ops,
                   at::Tensor &max, at::Tensor &sum) {
  bool anyLse = std::any_of(
      ops.outputs.begin(), ops.outputs.end(),
      [](const Output &output) { return output.kind == Reduce::LogSumExp; });
  if (anyLse) {
    at::Tensor top = comm.allReduce(max, Reduction::Max);
    for (size_t k = 0; k < ops.outputs.size(); ++k)
      if (ops.outputs[k].kind == Reduce::LogSumExp)
        sum[k].mul_((max[k] - finiteShift(top[k])).exp_());
    max = top;
  }
  sum = comm.allReduce(sum, Reduction::Sum);
}

/// The statistics of the column results that a chunk carries round the
/// ring, uninitialised: running maxima and sums, [column results, length]
/// each (a sum result uses the sums only); nothing when there are none.
Tensors newColumnStats(const SimilarityOperands &ops, int64_t length,
                       at::TensorOptions options) {
  const int64_t numCol = static_cast<int64_t>(ops.colOutputs.size());
  if (numCol == 0)
    return {};
  return Tensors{at::empty({numCol, length}, options),
                 at::empty({numCol, length}, options)};
}

/// Column statistics of no rows yet: maxima -inf, sums 0.
void clearColumnStats(Tensors &stats) {
  if (stats.empty())
    return;
  stats[0].fill_(-kInf);
  stats[1].zero_();
}

/// Runs `visit` on every rank's columns round the ring (gathered: the
/// chunks' column statistics merge on the way and come home) or on the
/// local class matrix; returns this rank's own columns' statistics.
Tensors
visitColumns(KernelContext &ctx, const SimilarityProgram &spec,
             const SimilarityOperands &ops, at::TensorOptions options,
             const std::function<void(const Chunk &, Tensors &)> &visit) {
  if (!spec.gathered) {
    Tensors features = chunkFeatures(ops);
    Tensors stats = newColumnStats(ops, features[0].size(0), options);
    visit(Chunk{ops.colOffset, features}, stats);
    return {};
  }
  RingPass pass;
  pass.features = chunkFeatures(ops);
  pass.lengths = ops.colSizes;
  if (!ops.colOutputs.empty()) {
    pass.newCarry = [&](int64_t length) {
      return newColumnStats(ops, length, options);
    };
    pass.merge = [&](Tensors &mine, const Tensors &upstream) {
      for (size_t k = 0; k < ops.colOutputs.size(); ++k) {
        if (ops.colOutputs[k].kind == Reduce::Sum)
          mine[1][k].add_(upstream[1][k]);
        else
          mergeLse(mine[0][k], mine[1][k], upstream[0][k], upstream[1][k]);
      }
    };
  }
  pass.visit = visit;
  return runRing(ctx.communicator(), pass);
}

/// Sets the forward's results from the rows' statistics (f64 [results, n],
/// combined across class shards here) and this rank's columns' (from
/// visitColumns).
void setForwardResults(KernelContext &ctx, const FusedArgs &args,
                       const SimilarityProgram &spec,
                       const SimilarityOperands &ops, at::Tensor max,
                       at::Tensor sum, const Tensors &colStats) {
  if (spec.sharded)
    combineShards(ctx.communicator(), ops, max, sum);
  // An all -inf row: max -inf, sum 0, -inf.
  at::Tensor lse = max + sum.log();
  const size_t numOutputs = ops.outputs.size();
  for (size_t k = 0; k < numOutputs; ++k)
    ctx.setResult(k, (ops.outputs[k].kind == Reduce::Sum ? sum[k] : lse[k])
                         .to(args.type(0)));
  for (size_t k = 0; k < ops.colOutputs.size(); ++k)
    ctx.setResult(numOutputs + k,
                  (ops.colOutputs[k].kind == Reduce::Sum
                       ? colStats[1][k]
                       : lseOf(colStats[0][k], colStats[1][k]))
                      .to(args.type(0)));
}

template <typename T>
void forward(KernelContext &ctx, const FusedArgs &args,
             const SimilarityProgram &spec, const SimilarityOperands &ops) {
  const int64_t n = ops.rows.size(0);
  const size_t numOutputs = ops.outputs.size();
  constexpr T inf = std::numeric_limits<T>::infinity();
  // Per output and row: the sum, or the running max and sum of exp(e - max).
  std::vector<double> sums(numOutputs * n, 0.0);
  std::vector<T> maxima(numOutputs * n, -inf);
  // Column results: each one's values in a tile of its own, folded along
  // the rows after the block (tiles 1..numCol).
  const size_t numCol = ops.colOutputs.size();
  TileScratch scratch(ops.tile, 1 + static_cast<int>(numCol), args.options());
  RowPrograms<T> programs(ops, /*backward=*/false);
  Similarity sim{ops.rows, ops.cols, 1};
  const std::vector<const T *> rowLeaves = dataOf<T>(ops.rowLeaves);
  // A register whose log-sum-exp is both a row and a column result is
  // folded along both axes from its column tile at once (foldLseBoth), into
  // per-row statistics of the tile's type.
  const LsePairs &pairs = ops.pairs;
  const std::vector<int64_t> &pairedRow = pairs.rowOf;
  std::vector<char> rowInTile(numOutputs, 0);
  for (size_t o = 0; o < numOutputs; ++o)
    rowInTile[o] = pairs.colOf[o] >= 0;
  Tensors tileRowMax(numOutputs), tileRowSum(numOutputs);
  for (size_t o = 0; o < numOutputs; ++o)
    if (rowInTile[o]) {
      tileRowMax[o] = at::full({n}, -inf, args.options());
      tileRowSum[o] = at::zeros({n}, args.options());
    }
  // Column results evaluated straight into their tiles: the first one of
  // each computed register (the others copy).
  std::vector<char> intoTile(numCol, 0);
  for (size_t k = 0; k < numCol; ++k) {
    const int64_t reg = ops.colOutputs[k].reg;
    bool taken = false;
    for (size_t q = 0; q < k; ++q)
      taken |= intoTile[q] && ops.colOutputs[q].reg == reg;
    intoTile[k] = ops.colOutputs[k].pickReg < 0 && !taken &&
                  epilogue::registerOperands(ops.program[reg].op) > 0;
  }

  // The carry of a chunk: per column result, the running max and sum of
  // exp(e - max) (log-sum-exp) or the sum, over the rows seen so far.
  auto visit = [&](const Chunk &chunk, Tensors &carry) {
    const at::Tensor &cols = chunk.features[0];
    clearColumnStats(carry);
    // The carry's maxima and sums, per column result.
    Tensors colMax, colSum;
    std::vector<T *> colSumData;
    for (size_t k = 0; k < numCol; ++k) {
      colMax.push_back(carry[0][k]);
      colSum.push_back(carry[1][k]);
      colSumData.push_back(colSum.back().template data_ptr<T>());
    }
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
      const T *tile = s.data_ptr<T>();
      const int64_t w = block.cols;
      std::vector<T *> colTiles;
      for (size_t k = 0; k < numCol; ++k)
        colTiles.push_back(scratch(1 + static_cast<int>(k), block).data_ptr<T>());
      ColumnPicks<T> colPicks;
      colPicks.build(ops, chunk, block);
      programs.forRows(chunk, block, [&](RowProgram<T> &program, int64_t r) {
        const int64_t i = block.row + r;
        for (size_t k = 0; k < numCol; ++k)
          if (intoTile[k])
            program.target[ops.colOutputs[k].reg] = colTiles[k] + r * w;
        program.evaluate(tile + r * w, i, w);
        for (size_t k = 0; k < numCol; ++k) {
          const Output &output = ops.colOutputs[k];
          if (output.pickReg < 0) {
            if (!intoTile[k])
              std::copy_n(program.value(output.reg), w, colTiles[k] + r * w);
            continue;
          }
          // Each column is picked at one row at most: no two threads meet.
          const T *x = program.value(output.pickReg);
          T *into = colSumData[k] + block.col;
          colPicks.forRow(k, r, [&](int64_t j) { into[j] += x[j]; });
        }
        for (size_t k = 0; k < numOutputs; ++k) {
          const Output &output = ops.outputs[k];
          if (rowInTile[k])
            continue; // folded from the column tile below
          double &sum = sums[k * n + i];
          if (output.pickReg >= 0) {
            int64_t c = pickedIndex(rowLeaves[output.pickLeaf][i],
                                    chunk.offset + block.col, w);
            if (c >= 0)
              sum += program.value(output.pickReg)[c];
            continue;
          }
          const T *e = program.value(output.reg);
          if (output.kind == Reduce::Sum) {
            sum += rowSum(e, w);
            continue;
          }
          // Online log-sum-exp (TileMath's mergeLse on one row).
          T &max = maxima[k * n + i];
          if (max == inf)
            continue; // already +inf
          T top = rowMax(e, w);
          if (top == -inf)
            continue; // nothing but exp(-inf) = 0
          if (top == inf) {
            max = inf;
            sum = 1;
            continue;
          }
          if (top < max)
            top = max;
          const double acc = rowSumExp(e, top, w);
          sum = sum * std::exp(static_cast<double>(max) -
                               static_cast<double>(top)) +
                acc;
          max = top;
        }
      });
      for (size_t k = 0; k < numCol; ++k) {
        if (ops.colOutputs[k].pickReg >= 0)
          continue; // added in the row loop
        at::Tensor values = scratch(1 + static_cast<int>(k), block);
        if (ops.colOutputs[k].kind == Reduce::Sum)
          colSum[k].narrow(0, block.col, block.cols).add_(values.sum(0));
        else if (pairedRow[k] >= 0)
          foldLseBoth(values, 1.0, block, tileRowMax[pairedRow[k]],
                      tileRowSum[pairedRow[k]], colMax[k], colSum[k]);
        else
          foldLse(values, 1.0, 0, block, colMax[k], colSum[k]);
      }
    });
  };

  Tensors colStats = visitColumns(ctx, spec, ops, args.options(), visit);
  for (size_t o = 0; o < numOutputs; ++o)
    if (rowInTile[o]) {
      const T *max = tileRowMax[o].template data_ptr<T>();
      const T *sum = tileRowSum[o].template data_ptr<T>();
      std::copy_n(max, n, maxima.begin() + o * n);
      std::copy_n(sum, n, sums.begin() + o * n);
    }
  auto f64 = at::TensorOptions(at::kDouble);
  at::Tensor sum = at::empty({static_cast<int64_t>(numOutputs), n}, f64);
  at::Tensor max = at::empty({static_cast<int64_t>(numOutputs), n}, f64);
  std::copy(sums.begin(), sums.end(), sum.data_ptr<double>());
  std::copy(maxima.begin(), maxima.end(), max.data_ptr<double>());
  setForwardResults(ctx, args, spec, ops, max, sum, colStats);
}

template <typename T>
void backward(KernelContext &ctx, const FusedArgs &args,
              const SimilarityProgram &spec, const SimilarityOperands &ops) {
  const int64_t n = ops.rows.size(0), d = ops.rows.size(1);
  const size_t numOutputs = ops.outputs.size();
  const int64_t rowLeafCount = static_cast<int64_t>(ops.rowLeaves.size());
  TileScratch scratch(ops.tile, 2, args.options());
  RowPrograms<T> programs(ops, /*backward=*/true);
  Similarity sim{ops.rows, ops.cols, 1};
  at::Tensor dRows = at::zeros({n, d}, args.options());
  std::vector<double> dRowLeaves(rowLeafCount * n, 0.0);
  std::vector<const T *> results, cts;
  for (size_t k = 0; k < numOutputs; ++k) {
    results.push_back(ops.results[k].data_ptr<T>());
    cts.push_back(ops.cts[k].data_ptr<T>());
  }

  // Column results: seeds from the chunk's results and cotangents (they
  // travel with it, after the per-column leaves).
  const size_t numCol = ops.colOutputs.size();
  const size_t colBase = 1 + ops.colLeaves.size();
  // The chunk's column results and cotangents, per column result (set per
  // chunk: data_ptr is too slow for a tile row's loop).
  std::vector<const T *> colResult(numCol), colCt(numCol);
  const std::vector<const T *> rowLeaves = dataOf<T>(ops.rowLeaves);
  // The column results' share of the 0-d leaves' gradients goes home with
  // the columns. When a column result reaches a float 0-d leaf, a second,
  // share sweep over the registers between them (shareRegisters), seeded by
  // the column results alone, computes it; the first sweep takes every
  // seed. A column log-sum-exp's seed is kept from the first sweep.
  const std::vector<char> &shares = programs.shareMask();
  const bool shareSweep = std::any_of(shares.begin(), shares.end(),
                                      [](char share) { return share != 0; });
  std::vector<char> keep(numCol, 0);
  for (size_t k = 0; k < numCol; ++k) {
    const Output &output = ops.colOutputs[k];
    keep[k] = shareSweep && output.pickReg < 0 &&
              output.kind == Reduce::LogSumExp && shares[output.reg];
  }
  // A register whose log-sum-exp is a row and a column result gets both
  // seeds from one exp per element where the block's lses allow
  // (sharedLseFactors).
  const std::vector<int64_t> &pairedCol = ops.pairs.colOf,
                             &pairedRow = ops.pairs.rowOf;
  // Per block and pair: whether one exp serves, and its factors.
  std::vector<char> oneExp(numOutputs, 0);
  std::vector<std::vector<T>> us(numOutputs), cvs(numOutputs);

  // The column results' seeds of tile row r: every one (share: false), or
  // those of the share sweep's registers (share: true), a kept seed from
  // the first sweep.
  auto seedColumns = [&](RowProgram<T> &program, const Block &block,
                         const ColumnPicks<T> &colPicks, int64_t r, int64_t w,
                         bool share) {
    for (size_t k = 0; k < numCol; ++k) {
      const Output &output = ops.colOutputs[k];
      if (share && !shares[seededRegister(output)])
        continue;
      if (!share && pairedRow[k] >= 0 && oneExp[pairedRow[k]])
        continue; // seeded with its row result
      const T *ct = colCt[k] + block.col;
      T *seed = program.cotangent(seededRegister(output));
      // keep[k] (and so a share sweep's seed from it): a kept tile row.
      T *kept = keep[k] ? program.keptSeeds.data() + k * ops.tile.cols
                        : nullptr;
      if (output.pickReg >= 0)
        colPicks.forRow(k, r, [&](int64_t j) { seed[j] += ct[j]; });
      else if (output.kind == Reduce::Sum)
        addSeed(seed, ct, /*perColumn=*/true, w);
      else if (share)
        addSeed(seed, kept, /*perColumn=*/true, w);
      else if (keep[k]) {
        addColumnSoftmaxSeed<T, /*Store=*/true>(
            kept, program.value(output.reg), ct, colResult[k] + block.col, w);
        addSeed(seed, kept, /*perColumn=*/true, w);
      } else {
        addColumnSoftmaxSeed(seed, program.value(output.reg), ct,
                             colResult[k] + block.col, w);
      }
    }
  };
  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    const at::Tensor &cols = chunk.features[0];
    for (size_t k = 0; k < numCol; ++k) {
      colResult[k] = chunk.features[colBase + k].template data_ptr<T>();
      colCt[k] = chunk.features[colBase + numCol + k].template data_ptr<T>();
    }
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
      at::Tensor grad = scratch(1, block);
      const T *tile = s.data_ptr<T>();
      T *g = grad.data_ptr<T>();
      const int64_t w = block.cols;
      ColumnPicks<T> colPicks;
      colPicks.build(ops, chunk, block);
      for (size_t o = 0; o < numOutputs; ++o) {
        const int64_t k = pairedCol[o];
        oneExp[o] = k >= 0 && sharedLseFactors(results[o] + block.row,
                                               block.rows,
                                               colResult[k] + block.col,
                                               colCt[k] + block.col, w, us[o],
                                               cvs[o]);
      }
      programs.forRows(chunk, block, [&](RowProgram<T> &program, int64_t r) {
        const int64_t i = block.row + r;
        if (program.keptSeeds.empty() && shareSweep) {
          program.keptSeeds.assign(numCol * ops.tile.cols, T(0));
          program.rowShare.assign(ops.scalars.size(), 0.0);
        }
        program.evaluate(tile + r * w, i, w);
        program.beginReverse(g + r * w, w);
        seedColumns(program, block, colPicks, r, w, /*share=*/false);
        // Seeds: ct (sum) or ct exp(e - result) (log-sum-exp, its softmax);
        // a pick's at its one element.
        for (size_t k = 0; k < numOutputs; ++k) {
          const T c = cts[k][i];
          const int64_t reg = ops.outputs[k].reg;
          if (oneExp[k]) { // with its column result's seed
            const int64_t col = pairedCol[k];
            T *seed = program.cotangent(reg);
            const T *e = program.value(reg);
            if (keep[col])
              addBothSoftmaxSeeds<T, true>(
                  seed, program.keptSeeds.data() + col * ops.tile.cols, e, c,
                  results[k][i], us[k][r], cvs[k].data(), w);
            else
              addBothSoftmaxSeeds<T, false>(seed, nullptr, e, c, results[k][i],
                                            us[k][r], cvs[k].data(), w);
            continue;
          }
          if (c == T(0))
            continue;
          if (ops.outputs[k].pickReg >= 0) {
            int64_t at = pickedIndex(rowLeaves[ops.outputs[k].pickLeaf][i],
                                     chunk.offset + block.col, w);
            if (at >= 0)
              program.cotangent(ops.outputs[k].pickReg)[at] += c;
            continue;
          }
          T *seed = program.cotangent(reg);
          if (ops.outputs[k].kind == Reduce::Sum) {
            addSeed(seed, &c, /*perColumn=*/false, w);
            continue;
          }
          const T lse = results[k][i];
          if (lse == -std::numeric_limits<T>::infinity())
            continue;
          addSoftmaxSeed(seed, program.value(reg), c, lse, w);
        }
        program.reverse(i, w, n, dRowLeaves.data(), program.dScalars.data());
        if (shareSweep) {
          program.beginShareSweep(w);
          seedColumns(program, block, colPicks, r, w, /*share=*/true);
          std::fill(program.rowShare.begin(), program.rowShare.end(), 0.0);
          program.reverseShare(i, w, n, program.rowShare.data());
          for (size_t k = 0; k < program.rowShare.size(); ++k) {
            program.dScalars[k] -= program.rowShare[k];
            program.colShares[k] += program.rowShare[k];
          }
        }
      });
      // dRows += G cols, dCols += G^T rows.
      backpropGemms(grad, block, ops.rows, cols, 1.0, dRows, dCols);
    });
  };

  std::vector<double> homeShares(ops.scalars.size(), 0.0);
  at::Tensor dCols;
  if (spec.gathered) {
    // The carry: the chunk's column gradient, and its column results' share
    // of the 0-d gradients ([1] at least: no empty transfers).
    const int64_t shares =
        std::max<int64_t>(1, static_cast<int64_t>(ops.scalars.size()));
    ColumnGradient home = runGradientRing(
        ctx.communicator(), gradientChunkFeatures(ops), ops.colSizes, d, shares,
        args.options(), [&](const Chunk &chunk, at::Tensor &dChunk) {
          tiles(chunk, dChunk);
          at::Tensor share = at::zeros({shares}, at::kDouble);
          std::vector<double> part = programs.takeColShares();
          std::copy(part.begin(), part.end(), share.data_ptr<double>());
          return share;
        });
    dCols = home.dCols;
    const double *share = home.share.data_ptr<double>();
    std::copy_n(share, homeShares.size(), homeShares.begin());
  } else {
    dCols = at::zeros_like(ops.cols);
    Tensors features = chunkFeatures(ops);
    tiles(Chunk{ops.colOffset, features}, dCols);
  }

  std::vector<double> dScalars = programs.dScalars();
  for (size_t k = 0; k < dScalars.size(); ++k)
    dScalars[k] += homeShares[k];
  auto f64 = at::TensorOptions(at::kDouble);
  at::Tensor dLeaves = at::empty({rowLeafCount, n}, f64);
  std::copy(dRowLeaves.begin(), dRowLeaves.end(), dLeaves.data_ptr<double>());
  at::Tensor dScalarTensor =
      at::empty({static_cast<int64_t>(dScalars.size())}, f64);
  std::copy(dScalars.begin(), dScalars.end(), dScalarTensor.data_ptr<double>());
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  ctx.setResult(2, dLeaves.to(args.type(0)));
  ctx.setResult(3, dScalarTensor.to(args.type(0)));
}

#ifdef DLOSS_HAVE_CUDA
//===----------------------------------------------------------------------===//
// The GPU path: the same operands, ring and carries as above, each tile run
// by cuda/SimilarityTiles.h (one element per thread, through the same
// epilogue::evaluate and epilogue::reverse; fp32 statistics on the device,
// combined in f64 as above). f64 inputs are computed in f32 there, as for
// every fused op on the GPU.
//===----------------------------------------------------------------------===//

constexpr const char *kDeviceLimitHint =
    "Pass CPU tensors for this loss, or compile it without fusing "
    "(dlossc --no-fuse, jit::Options::fuse = false)";

/// `count` `what` against the CUDA tiles' fixed-size arrays.
void checkDeviceLimit(const FusedArgs &args, size_t count, int limit,
                      const char *what) {
  if (count > static_cast<size_t>(limit))
    args.fail("the tile program has " + std::to_string(count) + " " + what +
                  ", more than the " + std::to_string(limit) +
                  " the CUDA tiles hold (cuda/SimilarityTiles.h)",
              kDeviceLimitHint);
}

/// The program and its 0-d leaves as the CUDA tiles take them.
cuda::TileProgram deviceProgram(const FusedArgs &args,
                                const SimilarityOperands &ops) {
  checkDeviceLimit(args, ops.program.size(), cuda::kMaxInstructions,
                   "instructions");
  checkDeviceLimit(args, ops.outputs.size(), cuda::kMaxResults, "results");
  checkDeviceLimit(args, ops.colOutputs.size(), cuda::kMaxResults,
                   "column results");
  checkDeviceLimit(args, ops.rowLeaves.size(), cuda::kMaxRowLeaves,
                   "per-row leaves");
  checkDeviceLimit(args, ops.colLeaves.size(), cuda::kMaxColLeaves,
                   "per-column leaves");
  checkDeviceLimit(args, ops.scalars.size(), cuda::kMaxScalars, "0-d leaves");
  cuda::TileProgram program;
  program.count = static_cast<int32_t>(ops.program.size());
  std::copy(ops.program.begin(), ops.program.end(), program.code);
  auto results = [](const std::vector<Output> &outputs,
                    cuda::TileResult *out) {
    for (size_t k = 0; k < outputs.size(); ++k)
      out[k] = cuda::TileResult{static_cast<int32_t>(outputs[k].reg),
                                outputs[k].kind};
    return static_cast<int32_t>(outputs.size());
  };
  program.rowResults = results(ops.outputs, program.rowResult);
  program.colResults = results(ops.colOutputs, program.colResult);
  program.rowLeaves = static_cast<int32_t>(ops.rowLeaves.size());
  program.colLeaves = static_cast<int32_t>(ops.colLeaves.size());
  program.scalars = static_cast<int32_t>(ops.scalars.size());
  for (size_t k = 0; k < ops.scalars.size(); ++k) {
    program.scalar[k] = static_cast<float>(ops.scalars[k]);
    program.scalarIsFloat |= ops.scalarIsFloat[k] ? 1u << k : 0u;
  }
  for (size_t k = 0; k < ops.rowLeaves.size(); ++k)
    program.rowLeafIsFloat |= ops.rowLeafIsFloat[k] ? 1u << k : 0u;
  return program;
}

/// The tiles' workspace size for `colResults` column results.
std::function<size_t(int64_t, int64_t, cuda::ElementType)>
deviceWorkspace(size_t colResults) {
  return [colResults](int64_t rows, int64_t cols, cuda::ElementType type) {
    return cuda::similarityWorkspaceBytes(rows, cols, type,
                                          static_cast<int>(colResults));
  };
}

/// The leaves of `block` of `chunk` (features: cols, then the per-column
/// leaves), as RowProgram reads them.
cuda::TileLeaves deviceLeaves(const SimilarityOperands &ops,
                              const Chunk &chunk, const Block &block) {
  cuda::TileLeaves leaves;
  leaves.rowBase = ops.rowOffset + block.row;
  leaves.colBase = chunk.offset + block.col;
  for (size_t k = 0; k < ops.rowLeaves.size(); ++k)
    leaves.row[k] = dataAt<float>(ops.rowLeaves[k], block.row);
  for (size_t k = 0; k < ops.colLeaves.size(); ++k)
    leaves.col[k] = dataAt<float>(chunk.features[1 + k], block.col);
  return leaves;
}

/// forward() on CUDA tensors: row statistics [results, n] and the chunks'
/// column statistics [column results, length] (max, sum) in f32 on the
/// device.
void fusedSimilarityDevice(KernelContext &ctx, const FusedArgs &args,
                           const SimilarityProgram &spec) {
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/false);
  const cuda::TileProgram program = deviceProgram(args, ops);
  const int64_t n = ops.rows.size(0), m = ops.cols.size(0);
  const int64_t numOutputs = static_cast<int64_t>(ops.outputs.size());
  const int64_t numCol = static_cast<int64_t>(ops.colOutputs.size());
  DeviceTiles dev(args, n, spec.gathered ? largest(ops.colSizes) : m,
                  deviceWorkspace(ops.colOutputs.size()));
  at::Tensor max = at::full({numOutputs, n}, -kInf, args.options());
  at::Tensor sum = at::zeros({numOutputs, n}, args.options());

  auto visit = [&](const Chunk &chunk, Tensors &carry) {
    const at::Tensor &cols = chunk.features[0];
    const int64_t length = chunk.length();
    clearColumnStats(carry);
    forEachBlock(n, length, dev.shape, [&](const Block &block) {
      cuda::SimilarityForward tile;
      tile.leaves = deviceLeaves(ops, chunk, block);
      for (int64_t k = 0; k < numOutputs; ++k) {
        tile.rowMax[k] = dataAt<float>(max, k * n + block.row);
        tile.rowSum[k] = dataAt<float>(sum, k * n + block.row);
      }
      for (int64_t k = 0; k < numCol; ++k) {
        tile.colMax[k] = dataAt<float>(carry[0], k * length + block.col);
        tile.colSum[k] = dataAt<float>(carry[1], k * length + block.col);
      }
      cuda::similarityForwardTile(dev.launch, dev.tile(ops.rows, cols, block),
                                  program, tile);
    });
  };

  Tensors colStats = visitColumns(ctx, spec, ops, args.options(), visit);
  // The shards combine, and the results form, in f64 as on the CPU.
  setForwardResults(ctx, args, spec, ops, max.to(at::kDouble),
                    sum.to(at::kDouble), colStats);
}

/// backward() on CUDA tensors: the per-row shares of the leaves' gradients
/// in f64 [leaf, n] on the device, summed at the end.
void fusedSimilarityGradDevice(KernelContext &ctx, const FusedArgs &args,
                               const SimilarityProgram &spec) {
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/true);
  const cuda::TileProgram program = deviceProgram(args, ops);
  const int64_t n = ops.rows.size(0), m = ops.cols.size(0),
                d = ops.rows.size(1);
  const size_t numOutputs = ops.outputs.size(), numCol = ops.colOutputs.size();
  const int64_t rowLeafCount = static_cast<int64_t>(ops.rowLeaves.size());
  const int64_t scalarCount = static_cast<int64_t>(ops.scalars.size());
  // [1] at least: no empty transfers.
  const int64_t shares = std::max<int64_t>(1, scalarCount);
  const bool splitScalars =
      numCol > 0 && std::any_of(ops.scalarIsFloat.begin(),
                                ops.scalarIsFloat.end(),
                                [](bool isFloat) { return isFloat; });
  DeviceTiles dev(args, n, spec.gathered ? largest(ops.colSizes) : m,
                  deviceWorkspace(numCol));
  const auto f64 = args.options().dtype(at::kDouble);
  at::Tensor dRows = at::zeros({n, d}, args.options());
  at::Tensor dLeaves = at::zeros({rowLeafCount, n}, f64);
  at::Tensor dScalarRow = at::zeros({shares, n}, f64);
  // The chunk's column results and cotangents follow cols and its leaves.
  const size_t colBase = 1 + ops.colLeaves.size();

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols,
                   at::Tensor &colShareRow) {
    const at::Tensor &cols = chunk.features[0];
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::SimilarityBackward tile;
      tile.leaves = deviceLeaves(ops, chunk, block);
      for (size_t k = 0; k < numOutputs; ++k) {
        tile.rowValue[k] = dataAt<float>(ops.results[k], block.row);
        tile.rowCt[k] = dataAt<float>(ops.cts[k], block.row);
      }
      for (size_t k = 0; k < numCol; ++k) {
        tile.colValue[k] = dataAt<float>(chunk.features[colBase + k], block.col);
        tile.colCt[k] =
            dataAt<float>(chunk.features[colBase + numCol + k], block.col);
      }
      tile.splitScalars = splitScalars;
      for (int64_t a = 0; a < rowLeafCount; ++a)
        tile.dRowLeaf[a] = dataAt<double>(dLeaves, a * n + block.row);
      for (int64_t a = 0; a < scalarCount; ++a) {
        tile.dScalarRow[a] = dataAt<double>(dScalarRow, a * n + block.row);
        tile.colShareRow[a] = dataAt<double>(colShareRow, a * n + block.row);
      }
      tile.dRows = dataAt<float>(dRows, block.row * d);
      tile.dCols = dataAt<float>(dCols, block.col * d);
      cuda::similarityBackwardTile(
          dev.launch, dev.tile(ops.rows, cols, block), program, tile);
    });
  };

  at::Tensor dCols, homeShares;
  if (spec.gathered) {
    // The carry: the chunk's column gradient, and its column results' share
    // of the 0-d gradients.
    ColumnGradient home = runGradientRing(
        ctx.communicator(), gradientChunkFeatures(ops), ops.colSizes, d, shares,
        args.options(), [&](const Chunk &chunk, at::Tensor &dChunk) {
          at::Tensor colShareRow = at::zeros({shares, n}, f64);
          tiles(chunk, dChunk, colShareRow);
          return colShareRow.sum(1);
        });
    dCols = home.dCols;
    homeShares = home.share;
  } else {
    dCols = at::zeros({m, d}, args.options());
    at::Tensor colShareRow = at::zeros({shares, n}, f64);
    Tensors features = chunkFeatures(ops);
    tiles(Chunk{ops.colOffset, features}, dCols, colShareRow);
    homeShares = at::zeros({shares}, f64);
  }

  at::Tensor dScalars =
      (dScalarRow.sum(1) + homeShares).narrow(0, 0, scalarCount);
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  ctx.setResult(2, dLeaves.to(args.type(0)));
  ctx.setResult(3, dScalars.to(args.type(0)));
}

// The tile launchers' CUDA and cuBLAS failures become dloss::Errors naming
// the op and rank.
#define DLOSS_SIMILARITY_DEVICE_DISPATCH(fn)                                   \
  if (args.onDevice)                                                           \
    return onDevice(args, [&] { fn(ctx, args, spec); });
#else
#define DLOSS_SIMILARITY_DEVICE_DISPATCH(fn)
#endif

} // namespace

void fusedSimilarity(KernelContext &ctx, const SimilarityProgram &spec) {
  FusedArgs args(ctx, kForwardName);
  DLOSS_SIMILARITY_DEVICE_DISPATCH(fusedSimilarityDevice)
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/false);
  if (args.compute == at::kDouble)
    forward<double>(ctx, args, spec, ops);
  else
    forward<float>(ctx, args, spec, ops);
}

void fusedSimilarityGrad(KernelContext &ctx, const SimilarityProgram &spec) {
  FusedArgs args(ctx, kBackwardName);
  DLOSS_SIMILARITY_DEVICE_DISPATCH(fusedSimilarityGradDevice)
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/true);
  if (args.compute == at::kDouble)
    backward<double>(ctx, args, spec, ops);
  else
    backward<float>(ctx, args, spec, ops);
}

} // namespace dloss::fused
