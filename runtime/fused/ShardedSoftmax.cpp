// dloss.sharded_softmax and its _grad (PartialFC): a softmax over classes
// sharded across the ranks, on the CPU and the GPU.
//
// It needs no ring: each rank reduces its class shard in tiles, and two
// all-reduces (the maxima, then [sums; target dots]) combine the shards; its
// backward needs no communication.
#include "runtime/fused/FusedKernels.h"

#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/fused/TileMath.h"

namespace dloss::fused {

namespace {

#ifdef DLOSS_HAVE_CUDA
// The GPU visits (below, after the CPU ones).
void shardedSoftmaxDevice(KernelContext &ctx, const FusedArgs &args);
void shardedSoftmaxGradDevice(KernelContext &ctx, const FusedArgs &args);
#endif

/// Operands 0-3 of both sharded ops: the gathered rows, this rank's class
/// shard, the scale and the global class targets; and the backward's 4-6:
/// the saved lse_rest and the cotangents.
struct ShardOperands {
  Similarity sim;
  int64_t classOffset = 0;
  at::Tensor targets;
  TileShape tile{1, 1};
  at::Tensor lseRest, ctLse, ctTarget; ///< the backward's
};

ShardOperands shardOperands(const FusedArgs &args, bool backward = false) {
  ShardOperands ops;
  ops.sim = similarityOperands(args);
  std::vector<int64_t> classSizes = args.ctx.rankSizes(1, 0);
  ops.classOffset = offsetOf(classSizes, args.rank);
  ops.targets = args.targets(3, "targets", ops.sim.rows.size(0),
                             total(classSizes), "classes");
  ops.tile =
      clippedTile(ops.sim.rows.size(0), ops.sim.cols.size(0), args.compute);
  if (backward) {
    const int64_t batch = ops.sim.rows.size(0);
    ops.lseRest = args.vector(4, "lse_rest", batch);
    ops.ctLse = args.vector(5, "ct_lse", batch);
    ops.ctTarget = args.vector(6, "ct_target", batch);
  }
  return ops;
}

/// Combines the shards' row statistics (this rank's classes, without the
/// targets) and target dots into the results lse_rest and target_dot. Every
/// rank makes both calls, whatever its shard holds.
void combineShards(KernelContext &ctx, const FusedArgs &args,
                   RowStatistics &rows) {
  Communicator &comm = ctx.communicator();
  at::Tensor globalMax = comm.allReduce(rows.max, Reduction::Max);
  rows.sum.mul_((rows.max - finiteShift(globalMax)).exp_());
  at::Tensor sums =
      comm.allReduce(at::stack({rows.sum, rows.picked}), Reduction::Sum);
  // No class but the target anywhere: max -inf, sum 0, lse -inf.
  ctx.setResult(0, lseOf(globalMax, sums[0]).to(args.type(0)));
  ctx.setResult(1, sums[1].to(args.type(0)));
}

} // namespace

void shardedSoftmax(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.sharded_softmax", "weights");
  DLOSS_DEVICE_DISPATCH(shardedSoftmaxDevice)
  ShardOperands ops = shardOperands(args);
  const int64_t batch = ops.sim.rows.size(0);
  TileScratch scratch(ops.tile, 1, args.options());
  RowStatistics rows = rowStatistics(batch, args);
  Elements targetDotAt(rows.picked);

  forEachBlock(batch, ops.sim.cols.size(0), ops.tile, [&](const Block &block) {
    at::Tensor logits =
        similarityTile(ops.sim, ops.sim.cols, block, scratch(0, block));
    Elements logit(logits);
    // The target dot is unscaled; its logit leaves the sum (lse of the rest).
    forRowTargets(
        ops.targets, block, ops.classOffset,
        [&](int64_t i, int64_t e) { targetDotAt.set(i, logit.get(e)); });
    logits.mul_(ops.sim.scale);
    forRowTargets(ops.targets, block, ops.classOffset,
                  [&](int64_t, int64_t e) { logit.set(e, -kInf); });
    foldLse(logits, 1.0, 1, block, rows.max, rows.sum);
  });
  combineShards(ctx, args, rows);
}

void shardedSoftmaxGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.sharded_softmax_grad", "weights");
  DLOSS_DEVICE_DISPATCH(shardedSoftmaxGradDevice)
  ShardOperands ops = shardOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t batch = sim.rows.size(0), classes = sim.cols.size(0);
  TileScratch scratch(ops.tile, 2, args.options());
  at::Tensor dRows = at::zeros_like(sim.rows);
  at::Tensor dWeights = at::zeros_like(sim.cols);
  double dScale = 0;

  forEachBlock(batch, classes, ops.tile, [&](const Block &block) {
    at::Tensor s = similarityTile(sim, sim.cols, block, scratch(0, block));
    // G = ct_lse P, P the softmax over the classes other than the target.
    at::Tensor grad = scratch(1, block);
    grad.copy_(s).mul_(sim.scale);
    grad.sub_(ops.lseRest.narrow(0, block.row, block.rows).unsqueeze(1)).exp_();
    Elements g(grad);
    forRowTargets(ops.targets, block, ops.classOffset,
                  [&](int64_t, int64_t e) { g.set(e, 0); });
    grad.mul_(ops.ctLse.narrow(0, block.row, block.rows).unsqueeze(1));
    dScale += backpropTile(grad, s, block, sim, sim.cols, dRows, dWeights);
  });

  // target_dot = rows[i] . w_t: its cotangent reaches both factors.
  std::vector<int64_t> rowsHit, classesHit;
  forTargetsIn(ops.targets, 0, batch, ops.classOffset, classes,
               [&](int64_t i, int64_t c) {
                 rowsHit.push_back(i);
                 classesHit.push_back(c);
               });
  at::Tensor rowIndex = at::tensor(rowsHit, at::kLong);
  at::Tensor classIndex = at::tensor(classesHit, at::kLong);
  at::Tensor ct = ops.ctTarget.index_select(0, rowIndex).unsqueeze(1);
  dRows.index_add_(0, rowIndex, sim.cols.index_select(0, classIndex) * ct);
  dWeights.index_add_(0, classIndex, sim.rows.index_select(0, rowIndex) * ct);

  setGradients(ctx, args, dRows, dWeights, {dScale});
}

namespace {

#ifdef DLOSS_HAVE_CUDA
void shardedSoftmaxDevice(KernelContext &ctx, const FusedArgs &args) {
  ShardOperands ops = shardOperands(args);
  const int64_t batch = ops.sim.rows.size(0), classes = ops.sim.cols.size(0);
  DeviceTiles dev(args, batch, classes);
  RowStatistics rows = rowStatistics(batch, args);

  forEachBlock(batch, classes, dev.shape, [&](const Block &block) {
    cuda::ShardedForward tile;
    tile.scale = static_cast<float>(ops.sim.scale);
    tile.targets = dataAt<int64_t>(ops.targets, block.row);
    tile.colBase = ops.classOffset + block.col;
    tile.rowMax = dataAt<float>(rows.max, block.row);
    tile.rowSum = dataAt<float>(rows.sum, block.row);
    tile.targetDot = dataAt<float>(rows.picked, block.row);
    cuda::shardedForwardTile(dev.launch,
                             dev.tile(ops.sim.rows, ops.sim.cols, block), tile);
  });
  combineShards(ctx, args, rows);
}

void shardedSoftmaxGradDevice(KernelContext &ctx, const FusedArgs &args) {
  ShardOperands ops = shardOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t batch = sim.rows.size(0), classes = sim.cols.size(0),
                d = sim.rows.size(1);
  DeviceTiles dev(args, batch, classes);
  DeviceRowGradient rows(args, sim.scale, ops.targets, batch, d);
  at::Tensor dWeights = at::zeros({classes, d}, args.options());
  cuda::prepareGradientScale(dev.launch, static_cast<float>(sim.scale),
                             dataAt<float>(ops.ctLse), batch, nullptr, 0);

  forEachBlock(batch, classes, dev.shape, [&](const Block &block) {
    cuda::ShardedBackward tile;
    rows.point(tile, block, ops.classOffset, dWeights);
    tile.lseRest = dataAt<float>(ops.lseRest, block.row);
    tile.ctLse = dataAt<float>(ops.ctLse, block.row);
    cuda::shardedBackwardTile(dev.launch, dev.tile(sim.rows, sim.cols, block),
                              tile);
  });

  // target_dot = rows[i] . w_t: its cotangent reaches both factors.
  at::Tensor local = ops.targets - ops.classOffset;
  at::Tensor rowIndex =
      (local >= 0).logical_and_(local < classes).nonzero().squeeze(1);
  at::Tensor classIndex = local.index_select(0, rowIndex);
  at::Tensor ct = ops.ctTarget.index_select(0, rowIndex).unsqueeze(1);
  rows.dRows.index_add_(
      0, rowIndex, sim.cols.index_select(0, classIndex).to(at::kFloat) * ct);
  dWeights.index_add_(0, classIndex,
                      sim.rows.index_select(0, rowIndex).to(at::kFloat) * ct);

  setGradients(ctx, args, rows.dRows, dWeights, {totalOf(rows.dScaleRow)});
}
#endif // DLOSS_HAVE_CUDA

} // namespace

} // namespace dloss::fused
