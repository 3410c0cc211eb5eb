// The compiling half of libdloss_compiler's C API (dloss_compiler.h): text in,
// plan bytes and diagnostics out, through driver/Compile.h as dlossc does.
#include "compiler/dloss_compiler.h"

#include "driver/Compile.h"
#include "runtime/plan/CompilerIdentity.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <deque>
#include <string>
#include <vector>

struct dloss_compile_result {
  bool ok = false;
  std::string plan;
  std::string messages;
  struct Entry {
    int32_t severity;
    std::string file;
    int32_t line, column;
    std::string message;
  };
  std::deque<Entry> entries; // stable addresses for the returned pointers
};

namespace {

int32_t severityOf(mlir::DiagnosticSeverity severity) {
  switch (severity) {
  case mlir::DiagnosticSeverity::Error:
    return DLOSS_SEVERITY_ERROR;
  case mlir::DiagnosticSeverity::Warning:
    return DLOSS_SEVERITY_WARNING;
  case mlir::DiagnosticSeverity::Remark:
    return DLOSS_SEVERITY_REMARK;
  case mlir::DiagnosticSeverity::Note:
    return DLOSS_SEVERITY_NOTE;
  }
  return DLOSS_SEVERITY_ERROR;
}

void record(dloss_compile_result &result, const mlir::Diagnostic &diag) {
  dloss_compile_result::Entry entry{severityOf(diag.getSeverity()), "", 0, 0,
                                    diag.str()};
  if (auto at = mlir::Location(diag.getLocation())
                    ->findInstanceOf<mlir::FileLineColLoc>()) {
    entry.file = at.getFilename().str();
    entry.line = static_cast<int32_t>(at.getLine());
    entry.column = static_cast<int32_t>(at.getColumn());
  }
  result.entries.push_back(std::move(entry));
}

} // namespace

extern "C" {

int32_t dloss_compiler_api_version(void) { return DLOSS_COMPILER_API_VERSION; }

const char *dloss_compiler_identity(void) { return dloss::kCompilerIdentity; }

dloss_compile_result *dloss_compile(const dloss_compile_request *request) {
  auto *result = new dloss_compile_result();
  std::string name = request->name ? request->name : "<source>";
  std::string gradMode = request->grad_mode ? request->grad_mode : "";

  mlir::DialectRegistry registry;
  mlir::dloss::registerLossDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(
          llvm::StringRef(request->source, request->source_size), name),
      llvm::SMLoc());
  llvm::raw_string_ostream os(result->messages);
  // The printed form (with the source line) for messages, then each
  // diagnostic, its notes included, as data: the later handler runs first
  // and passes every diagnostic on.
  mlir::SourceMgrDiagnosticHandler printer(sourceMgr, &context, os);
  mlir::ScopedDiagnosticHandler recorder(&context, [&](mlir::Diagnostic &diag) {
    record(*result, diag);
    for (const mlir::Diagnostic &note : diag.getNotes())
      record(*result, note);
    return mlir::failure();
  });

  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::dloss::parseLoss(sourceMgr, &context);
  bool ok = static_cast<bool>(module);
  if (ok && !gradMode.empty())
    ok = mlir::succeeded(mlir::dloss::overrideGradMode(*module, gradMode));
  if (ok) {
    mlir::FailureOr<std::string> bytes =
        mlir::dloss::compileToPlan(*module, name, request->fuse != 0,
                                   /*dedicated=*/request->general_only == 0);
    if (mlir::succeeded(bytes)) {
      result->plan = std::move(*bytes);
      result->ok = true;
    }
  }
  os.flush();
  return result;
}

void dloss_compile_result_free(dloss_compile_result *result) { delete result; }

int32_t dloss_compile_ok(const dloss_compile_result *result) {
  return result->ok ? 1 : 0;
}

const uint8_t *dloss_compile_plan(const dloss_compile_result *result,
                                  size_t *size) {
  *size = result->plan.size();
  return reinterpret_cast<const uint8_t *>(result->plan.data());
}

size_t dloss_compile_diagnostic_count(const dloss_compile_result *result) {
  return result->entries.size();
}

dloss_diagnostic dloss_compile_diagnostic(const dloss_compile_result *result,
                                          size_t index) {
  // Built without exceptions: an index past the end gets an empty note
  // rather than an abort.
  if (index >= result->entries.size())
    return dloss_diagnostic{DLOSS_SEVERITY_NOTE, "", 0, 0, ""};
  const dloss_compile_result::Entry &entry = result->entries[index];
  return dloss_diagnostic{entry.severity, entry.file.c_str(), entry.line,
                          entry.column, entry.message.c_str()};
}

const char *dloss_compile_messages(const dloss_compile_result *result) {
  return result->messages.c_str();
}

} // extern "C"
