// The ready-made losses, written as the program one rank runs.
#include "frontend/Losses.h"

#include <cmath>

namespace dloss::losses {

namespace {
/// The labels of this rank's rows: their global row numbers.
Tensor globalRowLabels(Graph &g, Tensor rows) {
  return g.arange(g.shardOffset(rows, 0), g.dim(rows, 0));
}
/// Sum over the rank's rows, summed over ranks, divided by the global batch.
Tensor globalMean(Graph &g, Tensor perRow, Tensor rows, DType dtype,
                  double extraDivisor = 1.0) {
  Tensor total =
      g.allReduce(g.reduce(perRow, Reduction::Sum, {0}), Reduction::Sum);
  Tensor count = g.toTensor(g.globalSize(rows, 0), dtype);
  if (extraDivisor != 1.0)
    count = count * extraDivisor;
  return total / count;
}
} // namespace

Graph clip(const ClipOptions &o) {
  Graph g("clip");
  Tensor image = g.input("image", o.dtype, {-1, o.dim}, {true, false});
  Tensor text = g.input("text", o.dtype, {-1, o.dim}, {true, false});
  Tensor scale = g.input("scale", o.dtype, {}, {true, true});
  Tensor labels = globalRowLabels(g, image);
  Tensor logitsImage =
      g.matmul(image, g.allGather(text, 0), false, true) * scale;
  Tensor logitsText =
      g.matmul(text, g.allGather(image, 0), false, true) * scale;
  Tensor perRow =
      g.crossEntropy(logitsImage, labels) + g.crossEntropy(logitsText, labels);
  g.setLoss(globalMean(g, perRow, image, o.dtype, 2.0), o.mode);
  return g;
}

Graph siglip(const SiglipOptions &o) {
  Graph g("siglip");
  Tensor image = g.input("image", o.dtype, {-1, o.dim}, {true, false});
  Tensor text = g.input("text", o.dtype, {-1, o.dim}, {true, false});
  Tensor logT = g.input("log_t", o.dtype, {}, {true, true});
  Tensor bias = g.input("bias", o.dtype, {}, {true, true});
  Tensor labels = globalRowLabels(g, image);
  Tensor logits =
      g.matmul(image, g.allGather(text, 0), false, true) * g.exp(logT) + bias;
  // -log sigmoid(-l) = softplus(l); -log sigmoid(l) = softplus(l) - l.
  Tensor pairs = g.reduce(g.softplus(logits), Reduction::Sum, {0, 1});
  Tensor positives =
      g.reduce(g.takeAlong(logits, labels, 1), Reduction::Sum, {0});
  Tensor total = g.allReduce(pairs - positives, Reduction::Sum);
  g.setLoss(total / g.toTensor(g.globalSize(image, 0), o.dtype), o.mode);
  return g;
}

Graph margin(const MarginOptions &o) {
  Graph g(o.kind == MarginOptions::ArcFace ? "arcface" : "cosface");
  Tensor x = g.input("embeddings", o.dtype, {-1, o.dim}, {true, false});
  Tensor labels = g.input("labels", DType::I64, {-1}, {false, false});
  Tensor w = g.input("weights", o.dtype, {o.classes, o.dim},
                     {true, !o.shardedClasses});
  Tensor rows = g.l2Normalize(x, 1);
  if (o.shardedClasses) {
    // Every shard scores the whole global batch against its own classes;
    // the class axis is the all_gather of those blocks.
    rows = g.allGather(rows, 0);
    labels = g.allGather(labels, 0);
  }
  Tensor cos = g.matmul(rows, g.l2Normalize(w, 1), false, true);
  if (o.shardedClasses)
    cos = g.allGather(cos, 1);
  Tensor target = g.takeAlong(cos, labels, 1);
  Tensor adjusted;
  if (o.kind == MarginOptions::ArcFace) {
    // Clamp keeps acos's gradient finite at |cos| = 1.
    Tensor theta = g.acos(g.clamp(target, -1.0 + 1e-7, 1.0 - 1e-7));
    adjusted = g.cos(theta + o.margin);
    if (o.pmlBeyondPiMinusMargin) {
      // theta <= pi - m  <=>  cos(theta) >= -cos(m): 1 there, else 0 (eq
      // carries no gradient; each branch gets its own).
      Tensor inRange =
          g.eq(g.clamp(target, -std::cos(o.margin), std::nullopt), target);
      Tensor linear = target - o.margin * std::sin(o.margin);
      adjusted = linear + inRange * (adjusted - linear);
    }
  } else {
    adjusted = target - o.margin;
  }
  Tensor logits = g.putAlong(cos, labels, adjusted, 1) * o.scale;
  Tensor perRow = g.crossEntropy(logits, labels);
  if (o.shardedClasses) {
    // Every rank holds the losses of the whole global batch already.
    Tensor count = g.toTensor(g.globalSize(x, 0), o.dtype);
    g.setLoss(g.reduce(perRow, Reduction::Sum, {0}) / count, o.mode);
    return g;
  }
  g.setLoss(globalMean(g, perRow, x, o.dtype), o.mode);
  return g;
}

} // namespace dloss::losses
