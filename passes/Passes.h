// The dloss passes and the pipelines built from them.
#ifndef DLOSS_PASSES_PASSES_H
#define DLOSS_PASSES_PASSES_H

#include "dialect/DlossOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Pass/Pass.h"

namespace mlir::dloss {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Adds inline -> verify-collectives -> fuse-gather-similarity (when `fuse`)
/// -> infer-replication -> autodiff -> canonicalize/CSE.
void buildDeriveBackwardPipeline(OpPassManager &pm, bool fuse = true);

/// Registers the passes and the named pipelines (dloss-derive-backward).
void registerDlossPassesAndPipelines();

} // namespace mlir::dloss

#endif // DLOSS_PASSES_PASSES_H
