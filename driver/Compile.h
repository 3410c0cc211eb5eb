// The compiler's front door, shared by dlossc and the LibTorch JIT: parse a
// loss, derive its backward, lower it to a plan.
#ifndef DLOSS_DRIVER_COMPILE_H
#define DLOSS_DRIVER_COMPILE_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/LLVM.h"

#include <string>

namespace llvm {
class SourceMgr;
} // namespace llvm

namespace mlir {
class DialectRegistry;
namespace dloss {

/// The dialects a loss may use: dloss, func, arith, scf, tensor (+ the func
/// inliner, which the pipeline runs first, and the cost rules of arith ops).
void registerLossDialects(DialectRegistry &registry);

/// Parses and verifies the first buffer of `sourceMgr` into a module (the
/// file's own, or one made around its functions). Arguments without
/// `dloss.name` are named after their SSA names in the source (`%image` ->
/// "image"), so tools and runtime errors can refer to inputs by name.
/// Diagnostics go to the context's handler; null on failure.
OwningOpRef<ModuleOp> parseLoss(llvm::SourceMgr &sourceMgr,
                                MLIRContext *context);

/// Sets `dloss.grad_mode` on every loss of `module` ("ddp" or "global").
LogicalResult overrideGradMode(ModuleOp module, StringRef mode);

/// Derives every loss's gradient (dloss-derive-backward, fused unless `fuse`
/// is false; `dedicated`: the fusion pass's option of that name), fuses its
/// element-wise chains (dloss-fuse-elementwise, unless `fuse` is false) and
/// lowers the module to plan bytes. Diagnostics go to the context's handler.
FailureOr<std::string> compileToPlan(ModuleOp module, StringRef source,
                                     bool fuse = true, bool dedicated = true);

} // namespace dloss
} // namespace mlir

#endif // DLOSS_DRIVER_COMPILE_H
