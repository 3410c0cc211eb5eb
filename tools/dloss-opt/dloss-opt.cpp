// dloss-opt: mlir-opt with the dloss dialect, for lit tests and debugging.
#include "dialect/DlossOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  // The upstream clean-ups that the dloss pipelines use.
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  mlir::registerInlinerPass();
  mlir::dloss::registerDlossPassesAndPipelines();

  mlir::DialectRegistry registry;
  registry.insert<mlir::dloss::DlossDialect, mlir::arith::ArithDialect,
                  mlir::func::FuncDialect, mlir::scf::SCFDialect,
                  mlir::tensor::TensorDialect>();
  mlir::func::registerInlinerExtension(registry);
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "dloss optimizer: the dloss dialect and its passes\n",
      registry));
}
