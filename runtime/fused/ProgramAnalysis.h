// Which registers of a tile program each sweep of the CPU row evaluator
// touches (RowEvaluator.h): those it evaluates, those a gradient flows
// through, those whose cotangent it sums along the row, and those of the
// share sweep. Worked out once per call from the program and its facts.
#ifndef DLOSS_RUNTIME_FUSED_PROGRAMANALYSIS_H
#define DLOSS_RUNTIME_FUSED_PROGRAMANALYSIS_H

#include "runtime/fused/SimilarityOperands.h"

#include <vector>

namespace dloss::fused::similarity {

/// The register a result's seed goes to: the picked value's for a pick.
inline int64_t seededRegister(const Output &output) {
  return output.pickReg >= 0 ? output.pickReg : output.reg;
}

constexpr bool isBinaryArithmetic(Op op) {
  return op == Op::Add || op == Op::Sub || op == Op::Mul || op == Op::Div;
}

/// The registers of a program, one flag per instruction, as the sweeps of
/// one call use them.
struct RegisterSets {
  /// Registers a gradient flows through, from some result.
  std::vector<char> carries;
  /// Registers the forward evaluates (every one a result reads), or the
  /// backward (only those an adjoint or a log-sum-exp seed reads).
  std::vector<char> live;
  /// Uniform registers whose cotangent the reverse sweep sums in the adjoint
  /// loop instead of filling a tile row.
  std::vector<char> reduced;
  /// The share sweep's registers: between a column result and a float 0-d
  /// leaf (none when no column result reaches one).
  std::vector<char> shares;
};

/// The register sets of `ops`' program for the forward or the backward.
RegisterSets registerSets(const SimilarityOperands &ops, bool backward);

} // namespace dloss::fused::similarity

#endif // DLOSS_RUNTIME_FUSED_PROGRAMANALYSIS_H
