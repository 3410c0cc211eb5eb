// Named pipelines of dloss passes and their registration.
#include "passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

namespace {
struct DeriveBackwardOptions
    : public PassPipelineOptions<DeriveBackwardOptions> {
  Option<bool> fuse{*this, "fuse",
                    llvm::cl::desc("Run dloss-fuse-gather-similarity (default "
                                   "on; fuse=false keeps every op unfused)"),
                    llvm::cl::init(true)};
  Option<bool> dedicated{
      *this, "dedicated",
      llvm::cl::desc("Use the dedicated CLIP, SigLIP and class-sharded ops "
                     "where they match (default on; false: every similarity "
                     "goes to dloss.fused_similarity)"),
      llvm::cl::init(true)};
};
} // namespace

void dloss::buildDeriveBackwardPipeline(OpPassManager &pm, bool fuse,
                                        bool dedicated) {
  // Inline helpers first so that collectives and replication are seen whole.
  pm.addPass(createInlinerPass());
  pm.addPass(createVerifyCollectivesPass());
  // Fusion matches the forward program; the fused ops' adjoint rules then
  // emit the fused backward.
  if (fuse)
    pm.addPass(createFuseGatherSimilarityPass({dedicated}));
  pm.addPass(createInferReplicationPass());
  pm.addPass(createAutodiffPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void dloss::registerDlossPassesAndPipelines() {
  registerDlossPasses();
  PassPipelineRegistration<DeriveBackwardOptions>(
      "dloss-derive-backward",
      "Verify collectives, fuse gather + similarity + loss, infer "
      "replication, derive @<loss>_grad, then canonicalize and CSE",
      [](OpPassManager &pm, const DeriveBackwardOptions &options) {
        buildDeriveBackwardPipeline(pm, options.fuse, options.dedicated);
      });
}
