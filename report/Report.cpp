// dlossc --report: compiles a module fused and unfused, evaluates every
// function, writes the report.
#include "report/Report.h"

#include "dialect/DlossOps.h"
#include "passes/LocationText.h"
#include "passes/Passes.h"
#include "report/Output.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace mlir::dloss;

namespace {

/// Succeeds when some function of `module` has an argument called `name`;
/// else an error at the first loss listing the losses' argument names.
LogicalResult checkArgumentName(ModuleOp module, StringRef name) {
  func::FuncOp first;
  SmallVector<std::string> known;
  for (func::FuncOp func : module.getOps<func::FuncOp>()) {
    if (!first || (!first->hasAttr(DlossDialect::kLossAttrName) &&
                   func->hasAttr(DlossDialect::kLossAttrName)))
      first = func;
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i) {
      auto arg =
          func.getArgAttrOfType<StringAttr>(i, DlossDialect::kNameAttrName);
      if (!arg)
        continue;
      if (arg.getValue() == name)
        return success();
      if (!llvm::is_contained(known, arg.getValue()))
        known.push_back(arg.getValue().str());
    }
  }
  Location loc = first ? first.getLoc() : module.getLoc();
  return emitError(loc) << "--report-size names '" << name
                        << "', which is no argument here (arguments: "
                        << llvm::join(known, ", ") << ")";
}

/// "file:line:col: message" of a remark, with its notes' locations.
std::string remarkText(Diagnostic &diagnostic) {
  std::string text = locationText(diagnostic.getLocation(), true);
  text += (text.empty() ? "" : ": ") + diagnostic.str();
  for (Diagnostic &note : diagnostic.getNotes()) {
    std::string at = locationText(note.getLocation(), true);
    // The pass manager's "see current operation" adds nothing here.
    if (!at.empty() && !StringRef(note.str()).starts_with("see current"))
      text += " (" + note.str() + ": " + at + ")";
  }
  return text;
}

/// Compiles a copy of `module`; the remarks of the passes (why a
/// similarity stays unfused) go to `remarks` instead of the output.
FailureOr<std::vector<FunctionReport>>
evaluateCompiled(ModuleOp module, bool fuse, const ReportOptions &options,
                 std::vector<std::string> &remarks) {
  OwningOpRef<ModuleOp> clone = module.clone();
  PassManager pm(module.getContext());
  buildDeriveBackwardPipeline(pm, fuse);
  ScopedDiagnosticHandler capture(
      module.getContext(), [&](Diagnostic &diagnostic) {
        if (diagnostic.getSeverity() != DiagnosticSeverity::Remark)
          return failure(); // errors and warnings go on to the caller
        remarks.push_back(remarkText(diagnostic));
        return success();
      });
  if (failed(pm.run(*clone)))
    return failure();
  std::vector<FunctionReport> reports;
  for (func::FuncOp func : clone->getOps<func::FuncOp>()) {
    if (func.isExternal())
      continue;
    FailureOr<FunctionReport> report = evaluateFunction(func, options);
    if (failed(report))
      return failure();
    reports.push_back(std::move(*report));
  }
  return reports;
}

} // namespace

bool mlir::dloss::parseArgumentShape(StringRef spec, ReportOptions &options,
                                     std::string &error) {
  auto [name, dims] = spec.split('=');
  if (name.empty() || !spec.contains('=')) {
    error = "expected NAME=AxB..., got '" + spec.str() + "'";
    return false;
  }
  SmallVector<int64_t> shape;
  if (!dims.empty()) {
    SmallVector<StringRef> parts;
    dims.split(parts, 'x');
    for (StringRef part : parts) {
      int64_t size;
      if (part.getAsInteger(10, size) || size < 0) {
        error =
            ("'" + part + "' in '" + spec +
             "' is not a size (expected NAME=AxB..., e.g. weights=25000x256)")
                .str();
        return false;
      }
      shape.push_back(size);
    }
  }
  options.argumentShapes[name] = shape;
  return true;
}

LogicalResult mlir::dloss::writeReport(ModuleOp module, StringRef source,
                                       const ReportOptions &options,
                                       llvm::raw_ostream &os) {
  if (options.cost.worldSize < 1 || options.batch < 0 || options.dim < 0)
    return emitError(module.getLoc())
           << "the report needs at least one rank and non-negative sizes";
  // Every --report-size must name an argument, or a typo would go unnoticed.
  for (const auto &entry : options.argumentShapes)
    if (failed(checkArgumentName(module, entry.getKey())))
      return failure();

  std::vector<std::string> remarks, unfusedRemarks;
  FailureOr<std::vector<FunctionReport>> fused =
      evaluateCompiled(module, true, options, remarks);
  if (failed(fused))
    return failure();
  FailureOr<std::vector<FunctionReport>> unfused =
      evaluateCompiled(module, false, options, unfusedRemarks);
  if (failed(unfused))
    return failure();
  std::vector<ReportEntry> entries;
  for (const FunctionReport &f : *fused) {
    ReportEntry entry{&f, nullptr};
    for (const FunctionReport &u : *unfused)
      if (u.name == f.name)
        entry.unfused = &u;
    entries.push_back(entry);
  }
  if (options.json)
    writeReportJson(os, source, options, entries, remarks);
  else
    writeReportText(os, source, options, entries, remarks);
  return success();
}
