// Ready-made distributed losses on dloss::Graph: CLIP, SigLIP, ArcFace and
// CosFace.
#ifndef DLOSS_FRONTEND_LOSSES_H
#define DLOSS_FRONTEND_LOSSES_H

#include "frontend/Graph.h"

namespace dloss::losses {

/// OpenCLIP's ClipLoss: inputs image [B_r, dim], text [B_r, dim] (features,
/// usually L2-normalised) and the replicated logit scale (already
/// exponentiated). Mean of the image->text and text->image cross-entropies
/// over the global batch; positives labelled from each rank's offset, so
/// uneven batches are right.
struct ClipOptions {
  int64_t dim = -1; ///< feature size, -1 for any
  DType dtype = DType::F32;
  GradMode mode = GradMode::Ddp;
};
Graph clip(const ClipOptions &options = {});

/// SigLIP's pairwise sigmoid loss: inputs image, text, the replicated
/// log-temperature log_t and bias; -1/B * sum_ij log sigmoid(z_ij (e^t x_i.y_j
/// + b)).
struct SiglipOptions {
  int64_t dim = -1;
  DType dtype = DType::F32;
  GradMode mode = GradMode::Ddp;
};
Graph siglip(const SiglipOptions &options = {});

/// ArcFace (additive angular margin) or CosFace (additive cosine margin) with
/// replicated (or, with shardedClasses, class-sharded) class weights: inputs
/// embeddings [B_r, dim], labels [B_r] (i64) and weights [classes, dim]; mean
/// cross-entropy over the global batch of s * cos(theta + m) (ArcFace) or s *
/// (cos(theta) - m) (CosFace) at the target class and s * cos(theta) elsewhere.
struct MarginOptions {
  enum Kind { ArcFace, CosFace } kind = ArcFace;
  int64_t dim = -1;
  int64_t classes = -1;
  double scale = 64.0;
  double margin = 0.5;
  DType dtype = DType::F32;
  /// ddp when W is a DDP parameter; global when W is kept outside DDP.
  GradMode mode = GradMode::Ddp;
  /// PartialFC: W is sharded by class across the ranks. Each rank passes its
  /// own block of classes (rank r owns the ids after the lower ranks'
  /// blocks; blocks may differ in size; `classes` is then the block size, or
  /// -1 for any) and labels are global class ids. The softmax spans every
  /// shard; fused, no rank holds more than its own B_global x C_r tiles.
  bool shardedClasses = false;
  /// ArcFace as pytorch-metric-learning computes it: where theta > pi - m,
  /// cos(theta + m) would start to rise again, so the target logit becomes
  /// cos(theta) - m sin(m) there (monotonic in theta). Off: cos(theta + m)
  /// everywhere (insightface).
  bool pmlBeyondPiMinusMargin = false;
};
Graph margin(const MarginOptions &options = {});

} // namespace dloss::losses

#endif // DLOSS_FRONTEND_LOSSES_H
