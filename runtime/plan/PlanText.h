// A readable text form of a plan, for `dlossc --emit=plan-text`, dumps and
// tests.
#ifndef DLOSS_RUNTIME_PLANTEXT_H
#define DLOSS_RUNTIME_PLANTEXT_H

#include <string>

namespace dloss::plan {
struct Plan;
struct TypeInfo;

/// One line per function header and per step, e.g.
///   %5 = dloss.matmul(%0, %3) {transpose_rhs = 1} loc("clip.mlir":19:12)
///   free(%3)
std::string toText(const Plan &plan);
std::string typeToText(const TypeInfo &type);
} // namespace dloss::plan

#endif // DLOSS_RUNTIME_PLANTEXT_H
