// The dloss passes and the pipelines built from them.
#ifndef DLOSS_PASSES_PASSES_H
#define DLOSS_PASSES_PASSES_H

#include "dialect/DlossOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace mlir {
class DominanceInfo;
} // namespace mlir

namespace mlir::dloss {

class ReplicationAnalysis;

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Adds the patterns of dloss-fuse-gather-similarity that start at a loss
/// (CLIP, SigLIP, class-sharded softmax: the dedicated ops, when
/// `dedicated`; a softmax with a margin on the target over a local class
/// matrix: the general op, always), for the ops of one function.
/// `replication` and `dominance` must describe that function whenever a
/// pattern runs: a driver recomputes them after each rewrite (the class-sharded
/// pattern asks whether its rows vary; every pattern asks whether its operands
/// are defined before the fused op). The patterns create, replace and erase
/// ops only through the rewriter.
void populateFuseGatherSimilarityPatterns(
    RewritePatternSet &patterns, const ReplicationAnalysis &replication,
    const DominanceInfo &dominance, bool dedicated = true);

/// Adds the general pattern of dloss-fuse-gather-similarity: any similarity
/// read only by element-wise ops that end in row reductions becomes one
/// dloss.fused_similarity (passes/TileProgram.h derives its program); a
/// similarity it cannot fuse gets a remark saying why. The pass applies it
/// after the dedicated patterns, whose kernels are specialised.
void populateFuseSimilarityPatterns(RewritePatternSet &patterns,
                                    const DominanceInfo &dominance);

/// Adds inline -> verify-collectives -> fuse-gather-similarity (when `fuse`;
/// `dedicated`: its option of that name) -> infer-replication -> autodiff ->
/// canonicalize/CSE.
void buildDeriveBackwardPipeline(OpPassManager &pm, bool fuse = true,
                                 bool dedicated = true);

/// Registers the passes and the named pipelines (dloss-derive-backward).
void registerDlossPassesAndPipelines();

} // namespace mlir::dloss

#endif // DLOSS_PASSES_PASSES_H
