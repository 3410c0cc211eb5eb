// parseLoss / compileToPlan: what dlossc and the JIT both do.
#include "driver/Compile.h"

#include "dialect/CostModel.h"
#include "dialect/DlossOps.h"
#include "passes/LowerToPlan.h"
#include "passes/Passes.h"

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
#include "llvm/Support/SourceMgr.h"

using namespace mlir;

void dloss::registerLossDialects(DialectRegistry &registry) {
  registry.insert<DlossDialect, arith::ArithDialect, func::FuncDialect,
                  scf::SCFDialect, tensor::TensorDialect>();
  func::registerInlinerExtension(registry);
  registerArithCostModels(registry);
}

/// Names arguments after their SSA names in the source unless already named.
static void nameArgumentsFromSource(ModuleOp module,
                                    const AsmParserState &state) {
  module.walk([&](func::FuncOp func) {
    if (func.isExternal())
      return;
    const AsmParserState::BlockDefinition *def =
        state.getBlockDef(&func.getBody().front());
    if (!def)
      return;
    for (auto [i, arg] : llvm::enumerate(def->arguments)) {
      if (func.getArgAttr(i, dloss::DlossDialect::kNameAttrName))
        continue;
      StringRef text(arg.loc.Start.getPointer(),
                     arg.loc.End.getPointer() - arg.loc.Start.getPointer());
      text.consume_front("%");
      if (!text.empty())
        func.setArgAttr(i, dloss::DlossDialect::kNameAttrName,
                        StringAttr::get(func.getContext(), text));
    }
  });
}

OwningOpRef<ModuleOp> dloss::parseLoss(llvm::SourceMgr &sourceMgr,
                                       MLIRContext *context) {
  Block block;
  AsmParserState state;
  ParserConfig config(context);
  if (failed(parseAsmSourceFile(sourceMgr, &block, config, &state)))
    return nullptr;
  OwningOpRef<ModuleOp> module;
  if (block.getOperations().size() == 1 && isa<ModuleOp>(block.front())) {
    module = cast<ModuleOp>(block.front());
    module.get()->remove();
  } else {
    StringRef name = sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID())
                         ->getBufferIdentifier();
    module = ModuleOp::create(FileLineColLoc::get(context, name, 1, 1));
    module->getBody()->getOperations().splice(module->getBody()->begin(),
                                              block.getOperations());
  }
  if (failed(verify(*module)))
    return nullptr;
  nameArgumentsFromSource(*module, state);
  return module;
}

LogicalResult dloss::overrideGradMode(ModuleOp module, StringRef mode) {
  if (mode != "ddp" && mode != "global")
    return emitError(module.getLoc())
           << "the gradient mode must be ddp or global, got '" << mode << "'";
  module.walk([&](func::FuncOp func) {
    if (func->hasAttr(DlossDialect::kLossAttrName))
      func->setAttr(DlossDialect::kGradModeAttrName,
                    StringAttr::get(module.getContext(), mode));
  });
  return success();
}

FailureOr<std::string> dloss::compileToPlan(ModuleOp module, StringRef source,
                                            bool fuse, bool dedicated) {
  PassManager pm(module.getContext());
  buildDeriveBackwardPipeline(pm, fuse, dedicated);
  // After autodiff: the chains it derives (batch norm's backward) fuse too.
  // Then independent small all-reduces run as one collective each.
  if (fuse) {
    pm.addPass(createFuseElementwisePass());
    pm.addPass(createCoalesceAllReducesPass());
  }
  if (failed(pm.run(module)))
    return failure();
  return lowerToPlan(module, source);
}
