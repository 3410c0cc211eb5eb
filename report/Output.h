// The cost report's text and JSON forms.
#ifndef DLOSS_REPORT_OUTPUT_H
#define DLOSS_REPORT_OUTPUT_H

#include "report/Evaluate.h"

#include "llvm/Support/raw_ostream.h"

namespace mlir::dloss {

/// A function's fused and unfused evaluations (unfused null when the
/// unfused compilation has no function of that name).
struct ReportEntry {
  const FunctionReport *fused;
  const FunctionReport *unfused;
};

/// `remarks`: what the fused compilation's passes said (why a similarity
/// stays unfused), "file:line:col: message".
void writeReportText(llvm::raw_ostream &os, StringRef source,
                     const ReportOptions &options,
                     ArrayRef<ReportEntry> entries,
                     ArrayRef<std::string> remarks);

void writeReportJson(llvm::raw_ostream &os, StringRef source,
                     const ReportOptions &options,
                     ArrayRef<ReportEntry> entries,
                     ArrayRef<std::string> remarks);

} // namespace mlir::dloss

#endif // DLOSS_REPORT_OUTPUT_H
