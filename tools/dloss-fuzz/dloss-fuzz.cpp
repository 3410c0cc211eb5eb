// dloss-fuzz: libFuzzer target over parsing and the whole dloss compiler.
//
// Invalid input is the normal case and is rejected quietly (diagnostics are
// swallowed). What counts as a finding: a crash or sanitizer report anywhere,
// and three internal errors that are not crashes but break the compiler's
// contracts, reported by abort() so that libFuzzer keeps the input:
//   - a pass that succeeds but leaves IR that does not verify;
//   - verified IR whose printed form does not parse back (the input, and the
//     derived backward);
//   - a plan that the runtime's FlatBuffers verifier rejects.
// Each input gets a fresh single-threaded MLIRContext, so a finding replays
// exactly with dloss-opt or dlossc, which also start from a fresh context.
#include "dialect/DlossOps.h"
#include "driver/Compile.h"
#include "passes/LowerToPlan.h"
#include "passes/Passes.h"
#include "runtime/plan/PlanText.h"
#include "runtime/plan/Plan_generated.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>
#include <string>

using namespace mlir;

namespace {

/// Collects diagnostics only while `capture` is set (to explain an internal
/// error); otherwise drops them unformatted.
struct DiagnosticSink {
  bool capture = false;
  std::string text;
};

[[noreturn]] void internalError(const llvm::Twine &what, StringRef detail) {
  llvm::errs() << "dloss-fuzz: internal error: " << what << "\n"
               << detail << "\n";
  llvm::errs().flush();
  abort();
}

/// Verifies the IR after every pass that reports success: a pass that leaves
/// invalid IR is a compiler bug, whereas a failing pass is a rejected input.
struct VerifyAfterSuccessfulPass : PassInstrumentation {
  explicit VerifyAfterSuccessfulPass(DiagnosticSink &sink) : sink(sink) {}
  void runAfterPass(Pass *pass, Operation *op) override {
    sink.capture = true;
    sink.text.clear();
    if (failed(verify(op))) {
      std::string ir;
      llvm::raw_string_ostream os(ir);
      op->print(os, OpPrintingFlags().printGenericOpForm().assumeVerified());
      internalError("'" + pass->getArgument() +
                        "' succeeded but left IR that does not verify",
                    sink.text + "\n" + ir);
    }
    sink.capture = false;
  }
  DiagnosticSink &sink;
};

/// Prints `module` and parses it back in the same context.
void checkRoundTrip(ModuleOp module, StringRef what, DiagnosticSink &sink) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  sink.capture = true;
  sink.text.clear();
  OwningOpRef<ModuleOp> reparsed =
      parseSourceString<ModuleOp>(text, ParserConfig(module.getContext()));
  if (!reparsed)
    internalError("the printed " + what + " does not parse back",
                  sink.text + "\n" + text);
  sink.capture = false;
}

/// Runs the passes that `build` adds on a clone of `module`; returns the
/// clone when they all succeed.
OwningOpRef<ModuleOp>
runOnClone(ModuleOp module, DiagnosticSink &sink,
           llvm::function_ref<void(OpPassManager &)> build) {
  OwningOpRef<ModuleOp> clone = module.clone();
  PassManager pm(module.getContext());
  // The instrumentation verifies after each pass instead, telling a pass that
  // broke the IR (a bug) from one that rejected it (a diagnostic).
  pm.enableVerifier(false);
  pm.addInstrumentation(std::make_unique<VerifyAfterSuccessfulPass>(sink));
  build(pm);
  if (failed(pm.run(*clone)))
    return nullptr;
  return clone;
}

/// Lowers `module` to a plan and checks the bytes as the runtime would.
void lowerAndCheckPlan(ModuleOp module) {
  FailureOr<std::string> bytes = mlir::dloss::lowerToPlan(module, "fuzz-input");
  if (failed(bytes))
    return;
  const auto *data = reinterpret_cast<const uint8_t *>(bytes->data());
  // The same limits as runtime/plan/PlanFile.cpp.
  flatbuffers::Verifier verifier(data, bytes->size(), /*max_depth=*/64,
                                 /*max_tables=*/1u << 26);
  if (!::dloss::plan::VerifyPlanBuffer(verifier))
    internalError("lowerToPlan produced a plan that FlatBuffers rejects", "");
  std::string text = ::dloss::plan::toText(*::dloss::plan::GetPlan(data));
  (void)text;
}

const DialectRegistry &lossRegistry() {
  static const DialectRegistry *registry = [] {
    auto *r = new DialectRegistry();
    mlir::dloss::registerLossDialects(*r);
    return r;
  }();
  return *registry;
}

} // namespace

// Debian's MLIR libraries are not instrumented, so ASan cannot see them read
// freed memory (an op used after erase()), and its quarantine keeps the stale
// bytes intact. Filling freed memory makes such reads fault, as they do in a
// normal build. ASAN_OPTIONS from the environment still override this.
extern "C" const char *__asan_default_options() {
  return "max_free_fill_size=65536:free_fill_byte=85";
}

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
  // The passes that dloss-opt registers, so that pass names and options in
  // pipelines resolve as they do there.
  registerCanonicalizerPass();
  registerCSEPass();
  registerSymbolDCEPass();
  registerInlinerPass();
  mlir::dloss::registerDlossPassesAndPipelines();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  MLIRContext context(lossRegistry(), MLIRContext::Threading::DISABLED);
  context.loadAllAvailableDialects();
  DiagnosticSink sink;
  context.getDiagEngine().registerHandler([&sink](Diagnostic &diag) {
    if (sink.capture) {
      sink.text += diag.str();
      sink.text += "\n";
      for (const Diagnostic &note : diag.getNotes())
        sink.text += "  note: " + note.str() + "\n";
    }
    return success();
  });

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(
          StringRef(reinterpret_cast<const char *>(data), size), "fuzz-input"),
      llvm::SMLoc());
  // Parses and verifies, as dlossc and the JIT do.
  OwningOpRef<ModuleOp> module = mlir::dloss::parseLoss(sourceMgr, &context);
  if (!module)
    return 0;
  checkRoundTrip(*module, "input", sink);

  // Each pass alone, as the lit tests run them through dloss-opt.
  runOnClone(*module, sink, [](OpPassManager &pm) {
    pm.addPass(mlir::dloss::createVerifyCollectivesPass());
  });
  runOnClone(*module, sink, [](OpPassManager &pm) {
    pm.addPass(mlir::dloss::createInferReplicationPass({/*annotate=*/true}));
  });
  runOnClone(*module, sink, [](OpPassManager &pm) {
    pm.addPass(mlir::dloss::createFuseGatherSimilarityPass());
  });
  runOnClone(*module, sink, [](OpPassManager &pm) {
    pm.addPass(mlir::dloss::createAutodiffPass());
  });
  runOnClone(*module, sink, [](OpPassManager &pm) {
    pm.addPass(createCanonicalizerPass());
    pm.addPass(createCSEPass());
  });
  {
    OwningOpRef<ModuleOp> clone = module->clone();
    lowerAndCheckPlan(*clone);
  }

  // The whole compiler, fused and unfused: dloss-derive-backward, then the
  // plan (dlossc, dlossc --no-fuse).
  for (bool fuse : {true, false}) {
    OwningOpRef<ModuleOp> derived =
        runOnClone(*module, sink, [fuse](OpPassManager &pm) {
          mlir::dloss::buildDeriveBackwardPipeline(pm, fuse);
        });
    if (!derived)
      return 0;
    checkRoundTrip(*derived, "derived backward", sink);
    lowerAndCheckPlan(*derived);
  }
  return 0;
}
