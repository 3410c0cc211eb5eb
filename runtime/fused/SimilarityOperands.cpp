// Checks and decodes the operands of dloss.fused_similarity and its _grad
// (SimilarityOperands.h).
#include "runtime/fused/SimilarityOperands.h"

#include "runtime/fused/TileMath.h"

#include <algorithm>
#include <string>

namespace dloss::fused::similarity {

namespace {

constexpr const char *kProgramHint =
    "The plan's tile program does not fit its operands: recompile the loss "
    "(if it persists, it is a compiler bug: report it with the plan)";

/// float32 holds every integer of magnitude below 2^24 exactly.
constexpr double kF32Exact = 16777216.0;

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

} // namespace

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
    args.fail(
        "the step has " + std::to_string(operands) + " operands: " +
            std::to_string(std::max<int64_t>(leafCount, 0)) + " leaves" +
            (backward ? " after rows and cols, before the " +
                            std::to_string(numOutputs + numColOutputs) +
                            " results and their cotangents"
                      : std::string(" after rows and cols")) +
            ", fewer than row_leaves = " + std::to_string(spec.rowLeaves) +
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
  if (!spec.colOutputs.empty())
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
    bool isRow = k < spec.rowLeaves,
         isCol = !isRow && k < spec.rowLeaves + spec.colLeaves;
    std::string name =
        isRow ? "per-row leaf " + std::to_string(k)
        : isCol
            ? "per-column leaf " + std::to_string(k - spec.rowLeaves)
            : "0-d leaf " + std::to_string(k - spec.rowLeaves - spec.colLeaves);
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
                    (isRow || isCol
                         ? "[" + std::to_string(length) + "] (" +
                               (isRow ? "one per row" : "one per column") + ")"
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
  ops.tile =
      clippedTile(n, spec.gathered ? largest(ops.colSizes) : m, args.compute);

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

} // namespace dloss::fused::similarity
