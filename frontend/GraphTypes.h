// The plain types of dloss::Graph's API (frontend/Graph.h), shared with the
// compiler library that builds its MLIR (compiler/GraphBuilder.cpp, through
// compiler/dloss_compiler.h, where the enumerations travel as their values).
#ifndef DLOSS_FRONTEND_GRAPHTYPES_H
#define DLOSS_FRONTEND_GRAPHTYPES_H

#include "runtime/comm/Reduction.h"

namespace dloss {

enum class DType { F16, BF16, F32, F64, I32, I64 };
enum class GatherGrad { Exact, Local, None };
enum class GradMode { Ddp, Global };

/// Where in the user's C++ an op was built: errors (at build time and at
/// run time) point there. Filled in at the call site by default arguments.
struct SourceLoc {
  const char *file = "";
  int line = 0;
  static SourceLoc current(const char *file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
    return {file, line};
  }
};

struct InputOptions {
  /// Differentiate the loss with respect to this input.
  bool grad = false;
  /// The same value on every rank (a loss parameter: a logit scale, ArcFace's
  /// W).
  bool replicated = false;
  /// Loss state (DINO's centre, an EMA): replicated, no gradient; the loss
  /// returns its new value (Graph::setLoss's `state`), which the call
  /// stores in the input.
  bool state = false;
};

} // namespace dloss

#endif // DLOSS_FRONTEND_GRAPHTYPES_H
