// Named pipelines of dloss passes and their registration.
#include "passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void dloss::buildDeriveBackwardPipeline(OpPassManager &pm) {
  // Inline helpers first so that collectives and replication are seen whole.
  pm.addPass(createInlinerPass());
  pm.addPass(createVerifyCollectivesPass());
  pm.addPass(createInferReplicationPass());
  pm.addPass(createAutodiffPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void dloss::registerDlossPassesAndPipelines() {
  registerDlossPasses();
  PassPipelineRegistration<>(
      "dloss-derive-backward",
      "Verify collectives, infer replication, derive @<loss>_grad, then "
      "canonicalize and CSE",
      buildDeriveBackwardPipeline);
}
