// dlossc --report: peak memory and bytes sent per call, fused vs unfused.
#ifndef DLOSS_REPORT_REPORT_H
#define DLOSS_REPORT_REPORT_H

#include "report/Evaluate.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"

#include <string>

namespace llvm {
class raw_ostream;
} // namespace llvm

namespace mlir::dloss {

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

#endif // DLOSS_REPORT_REPORT_H
