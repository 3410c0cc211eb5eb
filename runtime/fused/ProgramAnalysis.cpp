// Which registers each sweep of the CPU row evaluator touches
// (ProgramAnalysis.h).
#include "runtime/fused/ProgramAnalysis.h"

#include "runtime/fused/Epilogue.h"

namespace dloss::fused::similarity {

namespace {

/// Calls fn(r) for each register operand r a gradient flows back to (none
/// for eq and stop_gradient, not select's condition).
template <typename Fn> void forGradientOperands(const Instr &ins, Fn &&fn) {
  if (ins.op == Op::Eq || ins.op == Op::StopGradient)
    return;
  const int first = ins.op == Op::Select ? 1 : 0;
  for (int k = first; k < epilogue::registerOperands(ins.op); ++k)
    fn(operandOf(ins, k));
}

/// The registers the outputs read, directly or not; with `gradients`, only
/// along the operands a gradient flows back through (Eq, StopGradient and
/// Select's condition pass none).
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
  return ins.op == Op::Scalar || ins.op == Op::Const || ins.op == Op::RowLeaf ||
         ins.op == Op::RowId;
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

} // namespace

RegisterSets registerSets(const SimilarityOperands &ops, bool backward) {
  RegisterSets sets;
  sets.carries = registersReaching(ops, /*gradients=*/true);
  sets.live = backward ? registersReadBackward(ops, sets.carries)
                       : registersReaching(ops, /*gradients=*/false);
  sets.reduced = reducedRegisters(ops, sets.carries);
  sets.shares = shareRegisters(ops, sets.carries);
  return sets;
}

} // namespace dloss::fused::similarity
