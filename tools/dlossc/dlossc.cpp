// dlossc: the dloss compiler driver: a loss in .mlir in, a runtime plan out.
#include "dialect/DlossOps.h"
#include "driver/Compile.h"
#include "passes/LowerToPlan.h"
#include "passes/Passes.h"
#include "report/Report.h"
#include "runtime/plan/PlanText.h"
#include "runtime/plan/Plan_generated.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;

namespace {
enum class Emit { Input, Backward, Plan, PlanText };
} // namespace

static llvm::cl::opt<std::string> inputFile(llvm::cl::Positional,
                                            llvm::cl::desc("<loss.mlir>"),
                                            llvm::cl::Required);
static llvm::cl::opt<std::string>
    outputFile("o",
               llvm::cl::desc("Output file (default: <input>.plan for "
                              "--emit=plan, standard output otherwise)"),
               llvm::cl::value_desc("file"));
static llvm::cl::opt<Emit> emit(
    "emit", llvm::cl::desc("What to write"), llvm::cl::init(Emit::Plan),
    llvm::cl::values(
        clEnumValN(Emit::Input, "input", "the parsed and verified input IR"),
        clEnumValN(
            Emit::Backward, "backward",
            "the IR after deriving @<loss>_grad (dloss-derive-backward)"),
        clEnumValN(Emit::Plan, "plan",
                   "the binary plan for dloss-run / the runtime"),
        clEnumValN(Emit::PlanText, "plan-text", "the plan as readable text")));
static llvm::cl::opt<std::string> gradMode(
    "grad-mode",
    llvm::cl::desc("Override the gradient contract of every loss: ddp "
                   "(N * dF/dx_r, for DDP's average) or global (dF/dx_r)"),
    llvm::cl::value_desc("ddp|global"));

static llvm::cl::opt<bool> noFuse(
    "no-fuse",
    llvm::cl::desc("Do not run dloss-fuse-gather-similarity: keep the "
                   "all_gather + matmul + loss ops unfused (for comparison)"),
    llvm::cl::init(false));

static llvm::cl::OptionCategory
    reportCategory("Report options",
                   "--report: peak memory and bytes communicated per call, "
                   "fused vs unfused, at concrete sizes");
static llvm::cl::opt<bool> generalOnly(
    "general-fusion-only",
    llvm::cl::desc("Fuse every similarity into dloss.fused_similarity, "
                   "CLIP, SigLIP and PartialFC included, instead of their "
                   "dedicated ops (to compare the two)"),
    llvm::cl::init(false));
static llvm::cl::opt<bool>
    remarks("remarks",
            llvm::cl::desc("Print the passes' remarks (why a similarity stays "
                           "unfused); --report lists them too"),
            llvm::cl::init(false));
static llvm::cl::opt<bool> report(
    "report",
    llvm::cl::desc("Write, per function, the peak memory estimate and the "
                   "bytes communicated per call, fused vs unfused (no plan)"),
    llvm::cl::init(false), llvm::cl::cat(reportCategory));
static llvm::cl::opt<int64_t> reportWorld("report-world",
                                          llvm::cl::desc("Ranks (default 4)"),
                                          llvm::cl::init(4),
                                          llvm::cl::cat(reportCategory));
static llvm::cl::opt<int64_t> reportBatch(
    "report-batch",
    llvm::cl::desc(
        "Rows per rank: every dynamic dim 0 of an argument (default 4096)"),
    llvm::cl::init(4096), llvm::cl::cat(reportCategory));
static llvm::cl::opt<int64_t> reportDim(
    "report-dim",
    llvm::cl::desc("Every other dynamic dim of an argument (default 256)"),
    llvm::cl::init(256), llvm::cl::cat(reportCategory));
static llvm::cl::list<std::string>
    reportSize("report-size",
               llvm::cl::desc("An argument's shape on every rank, by name "
                              "(e.g. weights=25000x256)"),
               llvm::cl::value_desc("NAME=AxB"), llvm::cl::CommaSeparated,
               llvm::cl::cat(reportCategory));
static llvm::cl::opt<std::string>
    reportFormat("report-format", llvm::cl::desc("text (default) or json"),
                 llvm::cl::init("text"), llvm::cl::value_desc("text|json"),
                 llvm::cl::cat(reportCategory));

static LogicalResult writeOutput(StringRef path, StringRef contents) {
  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(path, &error);
  if (!out) {
    llvm::errs() << "dlossc: cannot write '" << path << "': " << error << "\n";
    return failure();
  }
  out->os() << contents;
  out->keep();
  return success();
}

static std::string printed(ModuleOp module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "dlossc: compiles a distributed loss (.mlir) into a runtime plan.\n\n"
      "Runs dloss-verify-collectives, dloss-fuse-gather-similarity (unless "
      "--no-fuse), dloss-infer-replication, dloss-autodiff "
      "(adding @<loss>_grad), canonicalize and CSE, then lowers every function "
      "to the plan that dloss-run and the LibTorch runtime execute.\n");

  DialectRegistry registry;
  mlir::dloss::registerLossDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> input = openInputFile(inputFile, &error);
  if (!input) {
    llvm::errs() << "dlossc: cannot read '" << inputFile << "': " << error
                 << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);
  // Remarks are for those who ask (--remarks, --report): a loss that stays
  // partly unfused still compiles and runs.
  ScopedDiagnosticHandler quiet(&context, [](Diagnostic &diagnostic) {
    return success(diagnostic.getSeverity() == DiagnosticSeverity::Remark &&
                   !remarks);
  });

  OwningOpRef<ModuleOp> module = mlir::dloss::parseLoss(sourceMgr, &context);
  if (!module)
    return 1;
  if (!gradMode.empty() &&
      failed(mlir::dloss::overrideGradMode(*module, gradMode)))
    return 2;
  std::string out = outputFile;

  if (report) {
    mlir::dloss::ReportOptions options;
    options.cost.worldSize = reportWorld;
    options.batch = reportBatch;
    options.dim = reportDim;
    if (reportFormat != "text" && reportFormat != "json") {
      llvm::errs() << "dlossc: --report-format must be text or json, got '"
                   << reportFormat << "'\n";
      return 2;
    }
    options.json = reportFormat == "json";
    for (const std::string &spec : reportSize) {
      std::string problem;
      if (!mlir::dloss::parseArgumentShape(spec, options, problem)) {
        llvm::errs() << "dlossc: --report-size: " << problem << "\n";
        return 2;
      }
    }
    std::string text;
    llvm::raw_string_ostream os(text);
    if (failed(mlir::dloss::writeReport(
            *module, llvm::sys::path::filename(inputFile), options, os)))
      return 1;
    return failed(writeOutput(out.empty() ? "-" : out, text));
  }

  if (emit == Emit::Input)
    return failed(writeOutput(out.empty() ? "-" : out, printed(*module)));
  if (emit == Emit::Backward) {
    PassManager pm(&context);
    mlir::dloss::buildDeriveBackwardPipeline(pm, !noFuse, !generalOnly);
    if (failed(pm.run(*module)))
      return 1;
    return failed(writeOutput(out.empty() ? "-" : out, printed(*module)));
  }

  FailureOr<std::string> bytes = mlir::dloss::compileToPlan(
      *module, llvm::sys::path::filename(inputFile), !noFuse, !generalOnly);
  if (failed(bytes))
    return 1;
  if (emit == Emit::PlanText)
    return failed(writeOutput(
        out.empty() ? "-" : out,
        ::dloss::plan::toText(*::dloss::plan::GetPlan(bytes->data()))));
  if (out.empty()) {
    llvm::SmallString<128> derived(inputFile);
    llvm::sys::path::replace_extension(derived, "plan");
    out = std::string(derived);
  }
  return failed(writeOutput(out, *bytes));
}
