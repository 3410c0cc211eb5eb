// dlossc: the dloss compiler driver: a loss in .mlir in, a runtime plan out.
#include "dialect/DlossOps.h"
#include "passes/LowerToPlan.h"
#include "passes/Passes.h"
#include "runtime/PlanText.h"
#include "runtime/Plan_generated.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/AsmParser/AsmParserState.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
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
    outputFile("o", llvm::cl::desc("Output file (default: <input>.plan for "
                                   "--emit=plan, standard output otherwise)"),
               llvm::cl::value_desc("file"));
static llvm::cl::opt<Emit> emit(
    "emit", llvm::cl::desc("What to write"), llvm::cl::init(Emit::Plan),
    llvm::cl::values(
        clEnumValN(Emit::Input, "input", "the parsed and verified input IR"),
        clEnumValN(Emit::Backward, "backward",
                   "the IR after deriving @<loss>_grad (dloss-derive-backward)"),
        clEnumValN(Emit::Plan, "plan", "the binary plan for dloss-run / the runtime"),
        clEnumValN(Emit::PlanText, "plan-text", "the plan as readable text")));

static llvm::cl::opt<std::string> gradMode(
    "grad-mode",
    llvm::cl::desc("Override the gradient contract of every loss: ddp "
                   "(N * dF/dx_r, for DDP's average) or global (dF/dx_r)"),
    llvm::cl::value_desc("ddp|global"));

/// Names arguments after their SSA names in the source (`%image` ->
/// dloss.name = "image") unless the user named them already: tools and error
/// messages refer to inputs by these names.
static void nameArgumentsFromSource(ModuleOp module, const AsmParserState &state,
                                    const llvm::SourceMgr &sourceMgr) {
  module.walk([&](func::FuncOp func) {
    if (func.isExternal())
      return;
    const AsmParserState::BlockDefinition *def =
        state.getBlockDef(&func.getBody().front());
    if (!def)
      return;
    for (auto [i, arg] : llvm::enumerate(def->arguments)) {
      if (func.getArgAttr(i, mlir::dloss::DlossDialect::kNameAttrName))
        continue;
      StringRef text(arg.loc.Start.getPointer(),
                     arg.loc.End.getPointer() - arg.loc.Start.getPointer());
      text.consume_front("%");
      if (!text.empty())
        func.setArgAttr(i, mlir::dloss::DlossDialect::kNameAttrName,
                        StringAttr::get(func.getContext(), text));
    }
  });
}

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

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  llvm::cl::ParseCommandLineOptions(
      argc, argv,
      "dlossc: compiles a distributed loss (.mlir) into a runtime plan.\n\n"
      "Runs dloss-verify-collectives, dloss-infer-replication, dloss-autodiff "
      "(adding @<loss>_grad), canonicalize and CSE, then lowers every function "
      "to the plan that dloss-run and the LibTorch runtime execute.\n");

  DialectRegistry registry;
  registry.insert<mlir::dloss::DlossDialect, arith::ArithDialect, func::FuncDialect,
                  scf::SCFDialect, tensor::TensorDialect>();
  func::registerInlinerExtension(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> input = openInputFile(inputFile, &error);
  if (!input) {
    llvm::errs() << "dlossc: cannot read '" << inputFile << "': " << error << "\n";
    return 1;
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagnostics(sourceMgr, &context);

  Block block;
  AsmParserState state;
  ParserConfig config(&context);
  if (failed(parseAsmSourceFile(sourceMgr, &block, config, &state)))
    return 1;
  // The module: the file's own, or one made around its top-level ops.
  OwningOpRef<ModuleOp> module;
  if (block.getOperations().size() == 1 && isa<ModuleOp>(block.front())) {
    module = cast<ModuleOp>(block.front());
    module.get()->remove();
  } else {
    module = ModuleOp::create(FileLineColLoc::get(&context, inputFile, 1, 1));
    module->getBody()->getOperations().splice(module->getBody()->begin(),
                                              block.getOperations());
  }
  if (failed(verify(*module)))
    return 1;
  nameArgumentsFromSource(*module, state, sourceMgr);
  if (!gradMode.empty()) {
    if (gradMode != "ddp" && gradMode != "global") {
      llvm::errs() << "dlossc: --grad-mode must be ddp or global, got '"
                   << gradMode << "'\n";
      return 2;
    }
    module->walk([&](func::FuncOp func) {
      if (func->hasAttr(mlir::dloss::DlossDialect::kLossAttrName))
        func->setAttr(mlir::dloss::DlossDialect::kGradModeAttrName,
                      StringAttr::get(&context, gradMode.getValue()));
    });
  }

  if (emit == Emit::Input) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os);
    return failed(writeOutput(outputFile.empty() ? std::string("-") : std::string(outputFile), text));
  }

  PassManager pm(&context);
  mlir::dloss::buildDeriveBackwardPipeline(pm);
  if (failed(pm.run(*module)))
    return 1;
  if (emit == Emit::Backward) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os);
    return failed(writeOutput(outputFile.empty() ? std::string("-") : std::string(outputFile), text));
  }

  FailureOr<std::string> bytes =
      mlir::dloss::lowerToPlan(*module, llvm::sys::path::filename(inputFile));
  if (failed(bytes))
    return 1;
  if (emit == Emit::PlanText)
    return failed(writeOutput(outputFile.empty() ? std::string("-") : std::string(outputFile),
                              ::dloss::plan::toText(*::dloss::plan::GetPlan(bytes->data()))));
  std::string path = outputFile;
  if (path.empty()) {
    llvm::SmallString<128> derived(inputFile);
    llvm::sys::path::replace_extension(derived, "plan");
    path = std::string(derived);
  }
  return failed(writeOutput(path, *bytes));
}
