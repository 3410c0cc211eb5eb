// Lowering a dloss module to the runtime's plan (FlatBuffers bytes).
#ifndef DLOSS_PASSES_LOWERTOPLAN_H
#define DLOSS_PASSES_LOWERTOPLAN_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"

#include <string>

namespace mlir::dloss {

/// Serializes every function with a body into a plan. Emits a diagnostic at
/// the offending op and fails on what the runtime cannot run. `source` names
/// the input in the plan (for messages).
FailureOr<std::string> lowerToPlan(ModuleOp module, StringRef source = "");

} // namespace mlir::dloss

#endif // DLOSS_PASSES_LOWERTOPLAN_H
