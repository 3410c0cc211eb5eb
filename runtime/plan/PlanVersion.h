// The plan format version shared by dlossc and the runtime (no LibTorch, no
// MLIR).
#ifndef DLOSS_RUNTIME_PLANVERSION_H
#define DLOSS_RUNTIME_PLANVERSION_H

namespace dloss {

/// The `version` the compiler writes into every plan and the only one the
/// runtime accepts. Bump it whenever the meaning of a plan changes (a new
/// attribute encoding, a changed op semantics), so that stale plans are
/// refused with a clear message instead of being misread.
/// 2: dloss.fused_similarity(_grad) carry the facts of their tile program
/// (`picks`, `col_picks`, `lse_pairs`, `class_targets`; TileEncoding.h),
/// which the runtime reads instead of matching the program.
/// 3: arguments carry `state`; a loss returns its state arguments' new
/// values after the loss (before the gradients).
/// 4: the tile program has a stop_gradient opcode (TileEncoding.h's Op 24),
/// which a version-3 runtime would refuse as unknown at the call.
/// 5: dloss.fused_elementwise, whose program has an `element` leaf
/// (TileEncoding.h's Op 25).
constexpr int kPlanVersion = 5;

} // namespace dloss

#endif // DLOSS_RUNTIME_PLANVERSION_H
