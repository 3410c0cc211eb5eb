// dlossc --report: peak memory and bytes sent per call, fused vs unfused.
#ifndef DLOSS_PASSES_REPORT_H
#define DLOSS_PASSES_REPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include <cstdint>
#include <string>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace mlir::dloss {

/// The concrete sizes the report assumes. Every rank holds the same sizes.
struct ReportOptions {
  int64_t worldSize = 4;
  /// Rows per rank: every dynamic dimension 0 of an argument.
  int64_t batch = 4096;
  /// Every other dynamic dimension of an argument.
  int64_t dim = 256;
  /// Shapes of named arguments (`dloss.name`), overriding the defaults.
  llvm::StringMap<SmallVector<int64_t>> argumentShapes;
  /// The nominal tile (rows x columns) of the fused kernels' workspace.
  int64_t tileRows = 256, tileCols = 1024;
  bool json = false;
};

/// Parses one `NAME=AxB...` (`NAME=` for a 0-d argument) into `options`;
/// false with `error` set when it is malformed.
bool parseArgumentShape(StringRef spec, ReportOptions &options,
                        std::string &error);

/// Compiles clones of `module` (left unchanged) with the fused and the unfused
/// dloss-derive-backward pipeline, evaluates every function's shapes under
/// `options` and writes the report to `os`. Diagnostics (an op the report has
/// no rule for, sizes that contradict the IR, an unknown argument name) go to
/// the context's handler.
LogicalResult writeReport(ModuleOp module, StringRef source,
                          const ReportOptions &options, llvm::raw_ostream &os);

} // namespace mlir::dloss

#endif // DLOSS_PASSES_REPORT_H
