// One function's memory and communication under concrete sizes, op by op
// through the ops' cost rules.
#ifndef DLOSS_REPORT_EVALUATE_H
#define DLOSS_REPORT_EVALUATE_H

#include "dialect/CostModel.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::dloss {

/// The concrete sizes the report assumes. Every rank holds the same sizes.
struct ReportOptions {
  /// The world size and the fused kernels' nominal tile.
  CostOptions cost;
  /// Rows per rank: every dynamic dimension 0 of an argument.
  int64_t batch = 4096;
  /// Every other dynamic dimension of an argument.
  int64_t dim = 256;
  /// Shapes of named arguments (`dloss.name`), overriding the defaults.
  llvm::StringMap<SmallVector<int64_t>> argumentShapes;
  bool json = false;
};

struct LiveValue {
  std::string what, type;
  int64_t bytes;
};

struct Transfer {
  std::string op, location, how;
  double bytes;
};

/// One function's peak memory (every tensor its own buffer, live from its
/// definition to its last use, plus the kernel's temporaries) and the bytes
/// one rank sends per call.
struct FunctionReport {
  std::string name;
  int64_t peakBytes = 0, liveBytes = 0, workspaceBytes = 0;
  std::string peakOp = "(entry)", peakLocation, workspaceHow;
  std::vector<LiveValue> largest; ///< live at the peak, largest first
  std::vector<Transfer> transfers;
  double sentBytes = 0;
};

/// Evaluates `func` (straight-line) on the representative rank. Errors (an op
/// without a cost rule, sizes that contradict the IR) go to the context's
/// diagnostic handler.
FailureOr<FunctionReport> evaluateFunction(func::FuncOp func,
                                           const ReportOptions &options);

} // namespace mlir::dloss

#endif // DLOSS_REPORT_EVALUATE_H
