// dloss.fused_elementwise: a chain of element-wise ops in one pass over
// memory. On CPU (float, double) the iteration space is cut into chunks of
// at most kChunk elements of one row, each evaluated by the tile programs'
// vectorised row loops (RowEvaluator.h) in a thread's registers, which stay
// in cache; element leaves are read and results written in place, column
// sums accumulated in double. Elsewhere
// (CUDA tensors, other types) each instruction is one ATen op, as the
// unfused ops would run: no CUDA kernel yet, by choice at run time.
#include "runtime/fused/FusedKernels.h"

#include "runtime/fused/RowEvaluator.h"
#include "runtime/plan/TileEncoding.h"
#include "runtime/support/Error.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

namespace dloss::fused {

namespace {

using epilogue::Instr;
using epilogue::Op;

/// Elements per chunk: a few registers of this many fit in L1/L2.
constexpr int64_t kChunk = 2048;

/// The operands of one step, checked against the program.
struct ElementwiseOperands {
  std::vector<at::Tensor> elements, rows, cols, scalars;
  /// Per element leaf: its buffer, where this step may write a result
  /// into it (KernelContext::consumable), else undefined.
  std::vector<at::Tensor> reusable;
  std::vector<Instr> program;
  std::vector<int64_t> space;
  int64_t numRows = 0, numCols = 0; ///< the space as rows x columns
};

std::string shapeText(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t k = 0; k < sizes.size(); ++k)
    out += (k ? ", " : "") + std::to_string(sizes[k]);
  return out + "]";
}

ElementwiseOperands checkOperands(KernelContext &ctx,
                                  const ElementwiseProgram &p) {
  const int64_t count = static_cast<int64_t>(ctx.numOperands());
  const int64_t scalars = count - p.elements - p.rowLeaves - p.colLeaves;
  std::string problem = epilogue::checkElementwiseProgram(
      epilogue::intsOf(p.program), epilogue::intsOf(p.outputs),
      epilogue::intsOf(p.colSums), p.elements, p.rowLeaves, p.colLeaves,
      scalars);
  if (!problem.empty() || scalars < 0)
    fail("dloss.fused_elementwise has a malformed program: " +
             (problem.empty() ? std::string("more leaves than operands")
                              : problem),
         kPlanBugHint);
  ElementwiseOperands ops;
  for (int64_t k = 0; k < p.elements; ++k)
    ops.reusable.push_back(ctx.consumable(k));
  for (int64_t k = 0; k < count; ++k) {
    const at::Tensor &t = ctx.tensor(k);
    (k < p.elements                               ? ops.elements
     : k < p.elements + p.rowLeaves               ? ops.rows
     : k < p.elements + p.rowLeaves + p.colLeaves ? ops.cols
                                                  : ops.scalars)
        .push_back(t.contiguous());
  }
  const at::Tensor &first = ops.elements.front();
  ops.space = first.sizes().vec();
  ops.numCols = first.dim() == 0 ? 1 : first.size(-1);
  ops.numRows = ops.numCols == 0 ? 0 : first.numel() / ops.numCols;
  auto mismatch = [&](const char *what, int64_t k, const at::Tensor &t,
                      const std::string &want) {
    fail("operand " + std::to_string(k) + " of dloss.fused_elementwise (" +
             what + ") has shape " + shapeText(t.sizes()) + ", " +
             c10::toString(t.scalar_type()) + ", on " + t.device().str() +
             "; expected " + want + ", " + c10::toString(first.scalar_type()) +
             ", on " + first.device().str() + " (the fused ops' operands)",
         "The fused ops' operands must have the shapes and types the plan "
         "gave them: pass tensors of matching sizes (the batch dimensions "
         "of one chain agree), or compile with fuse=False to see which op "
         "rejects them");
  };
  auto same = [&](const at::Tensor &t) {
    return t.scalar_type() == first.scalar_type() &&
           t.device() == first.device();
  };
  int64_t k = 0;
  for (const at::Tensor &t : ops.elements) {
    if (!same(t) || t.sizes() != at::IntArrayRef(ops.space))
      mismatch("of the iteration space", k, t, shapeText(ops.space));
    ++k;
  }
  for (const at::Tensor &t : ops.rows) {
    if (!same(t) || t.dim() != 1 || t.size(0) != ops.numRows)
      mismatch("per row", k, t, "[" + std::to_string(ops.numRows) + "]");
    ++k;
  }
  for (const at::Tensor &t : ops.cols) {
    if (!same(t) || t.dim() != 1 || t.size(0) != ops.numCols)
      mismatch("per column", k, t, "[" + std::to_string(ops.numCols) + "]");
    ++k;
  }
  for (const at::Tensor &t : ops.scalars) {
    if (!same(t) || t.dim() != 0)
      mismatch("0-d", k, t, "[]");
    ++k;
  }
  for (size_t t = 0; t + 3 < p.program.size(); t += 4)
    ops.program.push_back(Instr{static_cast<Op>(p.program[t]), p.program[t + 1],
                                p.program[t + 2], p.program[t + 3]});
  return ops;
}

/// acc[j] += v[j]: a chunk's part of a column sum, in double.
template <typename T>
void addToColumns(double *__restrict acc, const T *__restrict v, int64_t w) {
  for (int64_t j = 0; j < w; ++j)
    acc[j] += static_cast<double>(v[j]);
}

/// The CPU pass: chunks of one row each, split over ATen's threads; column
/// sums accumulate in double per task, then across tasks.
template <typename T>
std::vector<at::Tensor> runCpu(const ElementwiseOperands &ops,
                               const std::vector<int64_t> &outputs,
                               const std::vector<int64_t> &colSums) {
  const at::Tensor &first = ops.elements.front();
  const int64_t count = static_cast<int64_t>(ops.program.size());
  // A result goes into the buffer of an element leaf that dies here (the
  // fresh pages of a new buffer cost several passes over it), unless its
  // register is itself a leaf or names another result too. Such a result
  // is computed into a register and copied out once the chunk's leaves have
  // been read.
  std::vector<char> reused(outputs.size(), 0);
  std::vector<at::Tensor> results;
  size_t spare = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    while (spare < ops.reusable.size() && !ops.reusable[spare].defined())
      ++spare;
    const Op op = ops.program[outputs[k]].op;
    const bool single =
        std::count(outputs.begin(), outputs.end(), outputs[k]) == 1;
    if (spare < ops.reusable.size() && single &&
        epilogue::isElementwiseArithmetic(op)) {
      results.push_back(ops.reusable[spare++]);
      reused[k] = 1;
    } else {
      results.push_back(at::empty(ops.space, first.options()));
    }
  }
  // Without per-row or per-column values the rows do not matter: one row.
  const bool flat = ops.rows.empty() && ops.cols.empty() && colSums.empty();
  const int64_t numRows = flat ? 1 : ops.numRows;
  const int64_t numCols = flat ? first.numel() : ops.numCols;
  const int64_t width = std::max<int64_t>(1, std::min(numCols, kChunk));
  const int64_t blocksPerRow = numCols == 0 ? 0 : (numCols + width - 1) / width;
  const int64_t chunks = numRows * blocksPerRow;

  // The first result naming each register is written in place; any other
  // result naming it is copied from there.
  std::vector<int64_t> target(count, -1);
  for (size_t k = 0; k < outputs.size(); ++k)
    if (target[outputs[k]] < 0 && !reused[k])
      target[outputs[k]] = static_cast<int64_t>(k);
  std::vector<T *> out;
  for (const at::Tensor &r : results)
    out.push_back(r.data_ptr<T>());
  std::vector<const T *> elements, rows, cols;
  for (const at::Tensor &t : ops.elements)
    elements.push_back(t.data_ptr<T>());
  for (const at::Tensor &t : ops.rows)
    rows.push_back(t.data_ptr<T>());
  for (const at::Tensor &t : ops.cols)
    cols.push_back(t.data_ptr<T>());
  std::vector<T> scalars;
  for (const at::Tensor &t : ops.scalars)
    scalars.push_back(t.data_ptr<T>()[0]);

  const size_t sumSize = colSums.size() * static_cast<size_t>(numCols);
  std::vector<double> sums(sumSize, 0.0);
  std::mutex sumsLock;

  const int64_t grain = std::max<int64_t>(1, 16384 / width);
  at::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
    std::vector<double> partial(sumSize, 0.0);
    std::vector<T> slots(static_cast<size_t>(count * width));
    std::vector<const T *> reg(count, nullptr);
    auto slot = [&](int64_t t) { return slots.data() + t * width; };
    for (int64_t t = 0; t < count; ++t) {
      const Instr &ins = ops.program[t];
      if (ins.op == Op::Const || ins.op == Op::Scalar)
        std::fill_n(slot(t), width,
                    ins.op == Op::Const ? T(epilogue::bitsToDouble(ins.a))
                                        : scalars[ins.a]);
    }
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t row = chunk / blocksPerRow;
      const int64_t col = (chunk % blocksPerRow) * width;
      const int64_t w = std::min(width, numCols - col);
      const int64_t base = row * numCols + col;
      for (int64_t t = 0; t < count; ++t) {
        const Instr &ins = ops.program[t];
        switch (ins.op) {
        case Op::Element:
          reg[t] = elements[ins.a] + base;
          continue;
        case Op::RowLeaf:
          std::fill_n(slot(t), w, rows[ins.a][row]);
          reg[t] = slot(t);
          continue;
        case Op::ColLeaf:
          reg[t] = cols[ins.a] + col;
          continue;
        case Op::Scalar:
        case Op::Const:
          reg[t] = slot(t);
          continue;
        default:
          break;
        }
        const int operands = epilogue::registerOperands(ins.op);
        const T *a = reg[ins.a];
        const T *b = operands > 1 ? reg[ins.b] : a;
        const T *c = operands > 2 ? reg[ins.c] : a;
        T *o = target[t] >= 0 ? out[target[t]] + base : slot(t);
        similarity::applyInstructionRow<T>(ins, o, a, b, c, w);
        reg[t] = o;
      }
      // Results into leaves' buffers last: until then the chunk's leaves
      // may still be read (a result naming a leaf, a sum of one).
      for (size_t k = 0; k < outputs.size(); ++k)
        if (!reused[k] && reg[outputs[k]] != out[k] + base)
          std::copy_n(reg[outputs[k]], w, out[k] + base);
      for (size_t k = 0; k < colSums.size(); ++k)
        addToColumns(partial.data() + k * numCols + col, reg[colSums[k]], w);
      for (size_t k = 0; k < outputs.size(); ++k)
        if (reused[k])
          std::copy_n(reg[outputs[k]], w, out[k] + base);
    }
    if (sumSize == 0)
      return;
    std::lock_guard<std::mutex> hold(sumsLock);
    for (size_t k = 0; k < sumSize; ++k)
      sums[k] += partial[k];
  });
  for (size_t k = 0; k < colSums.size(); ++k) {
    at::Tensor sum = at::empty({numCols}, first.options());
    T *data = sum.data_ptr<T>();
    for (int64_t j = 0; j < numCols; ++j)
      data[j] = static_cast<T>(sums[k * numCols + j]);
    results.push_back(std::move(sum));
  }
  return results;
}

/// One ATen op per instruction (CUDA tensors, types the CPU pass lacks).
std::vector<at::Tensor> runAten(const ElementwiseOperands &ops,
                                const std::vector<int64_t> &outputs,
                                const std::vector<int64_t> &colSums) {
  const at::Tensor &first = ops.elements.front();
  std::vector<at::Tensor> reg(ops.program.size());
  const std::vector<int64_t> matrix = {ops.numRows, ops.numCols};
  for (size_t t = 0; t < ops.program.size(); ++t) {
    const Instr &ins = ops.program[t];
    // Register operands (checkElementwiseProgram: earlier instructions).
    auto a = [&] { return reg[ins.a]; };
    auto b = [&] { return reg[ins.b]; };
    switch (ins.op) {
    case Op::Element:
      reg[t] = ops.elements[ins.a].reshape(matrix);
      break;
    case Op::RowLeaf:
      reg[t] = ops.rows[ins.a].reshape({ops.numRows, 1});
      break;
    case Op::ColLeaf:
      reg[t] = ops.cols[ins.a];
      break;
    case Op::Scalar:
      reg[t] = ops.scalars[ins.a];
      break;
    case Op::Const:
      reg[t] =
          at::scalar_tensor(epilogue::bitsToDouble(ins.a), first.options());
      break;
    case Op::Add:
      reg[t] = at::add(a(), b());
      break;
    case Op::Sub:
      reg[t] = at::sub(a(), b());
      break;
    case Op::Mul:
      reg[t] = at::mul(a(), b());
      break;
    case Op::Div:
      reg[t] = at::div(a(), b());
      break;
    case Op::Neg:
      reg[t] = at::neg(a());
      break;
    case Op::Sqrt:
      reg[t] = at::sqrt(a());
      break;
    default: // checkElementwiseProgram admits nothing else
      fail(std::string("dloss.fused_elementwise cannot run ") +
               epilogue::opName(ins.op),
           kPlanBugHint);
    }
  }
  // An op's own full-size result is the output; a leaf, or a value of
  // vectors alone, is copied out to the space's shape.
  std::vector<at::Tensor> results;
  for (int64_t r : outputs) {
    const at::Tensor &value = reg[r];
    const bool own = epilogue::isElementwiseArithmetic(ops.program[r].op) &&
                     value.sizes() == at::IntArrayRef(matrix) &&
                     value.is_contiguous();
    results.push_back(own ? value.view(ops.space)
                          : value.expand(matrix)
                                .clone(at::MemoryFormat::Contiguous)
                                .view(ops.space));
  }
  for (int64_t r : colSums)
    results.push_back(reg[r].expand(matrix).sum(0));
  return results;
}

} // namespace

void fusedElementwise(KernelContext &ctx, const ElementwiseProgram &program) {
  ElementwiseOperands ops = checkOperands(ctx, program);
  const at::Tensor &first = ops.elements.front();
  std::vector<at::Tensor> results;
  if (first.device().is_cpu() && first.scalar_type() == at::kFloat)
    results = runCpu<float>(ops, program.outputs, program.colSums);
  else if (first.device().is_cpu() && first.scalar_type() == at::kDouble)
    results = runCpu<double>(ops, program.outputs, program.colSums);
  else
    results = runAten(ops, program.outputs, program.colSums);
  for (size_t k = 0; k < results.size(); ++k)
    ctx.setResult(k, std::move(results[k]));
}

} // namespace dloss::fused
