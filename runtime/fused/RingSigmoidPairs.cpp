// dloss.ring_sigmoid_pairs and its _grad (SigLIP): the sigmoid loss of every
// pair of the gathered similarity, on the CPU and the GPU.
#include "runtime/fused/FusedKernels.h"

#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/fused/TileMath.h"

namespace dloss::fused {

namespace {

#ifdef DLOSS_HAVE_CUDA
// The GPU visits (below, after the CPU ones).
void ringSigmoidPairsDevice(KernelContext &ctx, const FusedArgs &args);
void ringSigmoidPairsGradDevice(KernelContext &ctx, const FusedArgs &args);
#endif

/// Operands 0-4 of both sigmoid ops, with every rank's column counts, and
/// the backward's cotangents 5-6.
struct SigmoidOperands {
  Similarity sim;
  double bias = 0;
  std::vector<int64_t> colSizes;
  at::Tensor targets;
  TileShape tile{1, 1};
  at::Tensor ctPair, ctPositive; ///< the backward's
};

SigmoidOperands sigmoidOperands(const FusedArgs &args, bool backward = false) {
  SigmoidOperands ops;
  ops.sim = similarityOperands(args);
  ops.bias = args.scalar(3, "bias");
  ops.colSizes = args.ctx.rankSizes(1, 0);
  ops.targets = args.targets(4, "targets", ops.sim.rows.size(0),
                             total(ops.colSizes), "columns");
  ops.tile =
      clippedTile(ops.sim.rows.size(0), largest(ops.colSizes), args.compute);
  if (backward) {
    ops.ctPair = args.vector(5, "ct_pair", ops.sim.rows.size(0));
    ops.ctPositive = args.vector(6, "ct_positive", ops.sim.rows.size(0));
  }
  return ops;
}

/// The SigLIP forward's ring and results, for the CPU and GPU ops:
/// tiles(chunk, pairSum, positive) adds this rank's tiles of a chunk to each
/// row's sum of softplus(L) and stores L at its target into `positive`.
template <typename Tiles>
void runSigmoidPairs(KernelContext &ctx, const FusedArgs &args,
                     const SigmoidOperands &ops, Tiles &&tiles) {
  const int64_t n = ops.sim.rows.size(0);
  at::Tensor pairSum = at::zeros({n}, args.options());
  at::Tensor positive = at::zeros({n}, args.options());
  RingPass pass;
  pass.features = {ops.sim.cols};
  pass.keys = {ctx.operandKey(1)};
  pass.lengths = ops.colSizes;
  pass.visit = [&](const Chunk &chunk, Tensors &) {
    tiles(chunk, pairSum, positive);
  };
  runRing(ctx.communicator(), pass);

  ctx.setResult(0, pairSum.to(args.type(0)));
  ctx.setResult(1, positive.to(args.type(0)));
}

/// SigLIP's backward as the gather of both sides (on the CPU, when the
/// call's setting or auto's choice for moving the rows and the columns is
/// the gather): every row with its cotangents and targets in one
/// collective (the columns too, unless this call's forward gathered them),
/// then the gradient of this rank's rows over every column and of its
/// columns over every row. Nothing travels home, where the one-sided
/// gather sends every column's gradient to its owner. False, having done
/// nothing, when the call runs the passes of runRing.
bool sigmoidPairsGradBothSides(KernelContext &ctx, const FusedArgs &args,
                               const SigmoidOperands &ops) {
  Communicator &comm = ctx.communicator();
  const Similarity &sim = ops.sim;
  const std::vector<int64_t> rowSizes = ctx.rankSizes(0, 0);
  // The column side's tiles are computed a second time; the exchange of
  // the columns' gradients is saved.
  if (!gathersBothSides(comm, sim.rows, sim.cols, rowSizes, ops.colSizes,
                        /*tilesTwice=*/1, /*savedExchanges=*/1))
    return false;
  const std::vector<int64_t> &rs = rowSizes;
  Tensors all = gatherOperands(
      comm, {sim.rows, sim.cols, ops.ctPair, ops.ctPositive, ops.targets},
      {rs, ops.colSizes, rs, rs, rs},
      {ctx.operandKey(0), ctx.operandKey(1), ctx.operandKey(5),
       ctx.operandKey(6), ctx.operandKey(4)});
  const at::Tensor &allRows = all[0], &allCols = all[1], &allCtPair = all[2],
                   &allCtPositive = all[3], &allTargets = all[4];
  const int64_t n = sim.rows.size(0), m = sim.cols.size(0),
                d = sim.rows.size(1);

  // G = ct_pair sigmoid(L) + ct_positive at the targets, tile by tile over
  // `side`'s rows x `cols`; the row side adds every pair's share of dscale
  // and dbias, each pair once.
  // The row side's S is the forward's where it kept it.
  at::Tensor none, kept = keptSimilarity(ctx.operandKey(0), ctx.operandKey(1),
                                         n, allCols.size(0), args.options());
  auto side = [&](const Similarity &operands, const at::Tensor &cols,
                  const at::Tensor &ctPair, const at::Tensor &ctPositive,
                  const at::Tensor &targets, int64_t colBase,
                  const at::Tensor &keptS, at::Tensor &dRows, at::Tensor &dCols,
                  double *dScale, double *dBias) {
    forSideBlocks(operands.rows.size(0), cols.size(0), args, 2,
                  [&](const Block &block, auto &scratch) {
                    at::Tensor s = similarityTile(operands, cols, block,
                                                  scratch(0, block), keptS, 0);
                    at::Tensor grad = scratch(1, block);
                    std::pair<double, double> sums = sigmoidTileGradient(
                        s, operands.scale, ops.bias, block, ctPair, grad);
                    Elements g(grad), sAt(s), ctAt(ctPositive);
                    forRowTargets(targets, block, colBase,
                                  [&](int64_t i, int64_t e) {
                                    g.add(e, ctAt.get(i));
                                    sums.first += ctAt.get(i);
                                    sums.second += ctAt.get(i) * sAt.get(e);
                                  });
                    backpropGemms(grad, block, operands.rows, cols,
                                  operands.scale, dRows, dCols);
                    if (dBias)
                      *dBias += sums.first;
                    if (dScale)
                      *dScale += sums.second;
                  });
  };
  at::Tensor dRows = at::zeros({n, d}, args.options());
  at::Tensor dCols = at::zeros({m, d}, args.options());
  double dScale = 0, dBias = 0;
  side(sim, allCols, ops.ctPair, ops.ctPositive, ops.targets, 0, kept, dRows,
       none, &dScale, &dBias);
  side(Similarity{allRows, sim.cols, sim.scale}, sim.cols, allCtPair,
       allCtPositive, allTargets, offsetOf(ops.colSizes, args.rank), none, none,
       dCols, nullptr, nullptr);
  setGradients(ctx, args, dRows, dCols, {dScale, dBias});
  return true;
}

} // namespace

void ringSigmoidPairs(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_sigmoid_pairs");
  DLOSS_DEVICE_DISPATCH(ringSigmoidPairsDevice)
  SigmoidOperands ops = sigmoidOperands(args);
  const int64_t n = ops.sim.rows.size(0);
  TileScratch scratch(ops.tile, 1, args.options());
  // S kept for the backward of the same call, where it is small.
  at::Tensor kept = keepSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   total(ops.colSizes), args.options());

  runSigmoidPairs(
      ctx, args, ops,
      [&](const Chunk &chunk, at::Tensor &pairSum, at::Tensor &positive) {
        Elements positiveAt(positive);
        forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
          // The logits are scale * s + bias; the loops form them as they read.
          at::Tensor s = similarityTile(ops.sim, chunk.features[0], block,
                                        scratch(0, block));
          keepTile(kept, s, block, chunk.offset);
          Elements sAt(s);
          forRowTargets(
              ops.targets, block, chunk.offset, [&](int64_t i, int64_t e) {
                positiveAt.set(i, ops.sim.scale * sAt.get(e) + ops.bias);
              });
          softplusRowSums(s, ops.sim.scale, ops.bias, block, pairSum);
        });
      });
}

void ringSigmoidPairsGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_sigmoid_pairs_grad");
  DLOSS_DEVICE_DISPATCH(ringSigmoidPairsGradDevice)
  SigmoidOperands ops = sigmoidOperands(args, /*backward=*/true);
  if (sigmoidPairsGradBothSides(ctx, args, ops))
    return;
  const int64_t n = ops.sim.rows.size(0), d = ops.sim.rows.size(1);
  TileScratch scratch(ops.tile, 2, args.options());
  at::Tensor dRows = at::zeros({n, d}, args.options());
  double dScale = 0, dBias = 0;
  at::Tensor kept = keptSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   total(ops.colSizes), args.options());

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols, double &) {
    const at::Tensor &cols = chunk.features[0];
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      // S in tile 0 (the forward's, where it kept it); G = ct_pair
      // sigmoid(L) + ct_positive at the targets.
      at::Tensor s = similarityTile(ops.sim, cols, block, scratch(0, block),
                                    kept, chunk.offset);
      at::Tensor grad = scratch(1, block);
      std::pair<double, double> sums = sigmoidTileGradient(
          s, ops.sim.scale, ops.bias, block, ops.ctPair, grad);
      dBias += sums.first;
      dScale += sums.second;
      Elements g(grad), sAt(s), ctAt(ops.ctPositive);
      forRowTargets(ops.targets, block, chunk.offset,
                    [&](int64_t i, int64_t e) {
                      g.add(e, ctAt.get(i));
                      dBias += ctAt.get(i);
                      dScale += ctAt.get(i) * sAt.get(e);
                    });
      backpropGemms(grad, block, ops.sim, cols, dRows, dCols);
    });
  };
  at::Tensor dCols =
      runGradientRing(ctx.communicator(), {ops.sim.cols}, ops.colSizes, d,
                      args.options(), tiles, {ctx.operandKey(1)})
          .dCols;

  setGradients(ctx, args, dRows, dCols, {dScale, dBias});
}

namespace {

#ifdef DLOSS_HAVE_CUDA
void ringSigmoidPairsDevice(KernelContext &ctx, const FusedArgs &args) {
  SigmoidOperands ops = sigmoidOperands(args);
  const int64_t n = ops.sim.rows.size(0);
  DeviceTiles dev(args, n, largest(ops.colSizes));

  runSigmoidPairs(
      ctx, args, ops,
      [&](const Chunk &chunk, at::Tensor &pairSum, at::Tensor &positive) {
        forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
          cuda::SigmoidForward tile;
          tile.scale = static_cast<float>(ops.sim.scale);
          tile.bias = static_cast<float>(ops.bias);
          tile.targets = dataAt<int64_t>(ops.targets, block.row);
          tile.colBase = chunk.offset + block.col;
          tile.pairSum = dataAt<float>(pairSum, block.row);
          tile.positive = dataAt<float>(positive, block.row);
          cuda::sigmoidForwardTile(
              dev.launch, dev.tile(ops.sim.rows, chunk.features[0], block),
              tile);
        });
      });
}

void ringSigmoidPairsGradDevice(KernelContext &ctx, const FusedArgs &args) {
  SigmoidOperands ops = sigmoidOperands(args, /*backward=*/true);
  const int64_t n = ops.sim.rows.size(0), d = ops.sim.rows.size(1);
  DeviceTiles dev(args, n, largest(ops.colSizes));
  DeviceRowGradient rows(args, ops.sim.scale, ops.targets, n, d);
  at::Tensor dBiasRow = perRowShares(n, args);
  // G's magnitude depends on this rank's cotangents only: one prescale.
  cuda::prepareGradientScale(dev.launch, static_cast<float>(ops.sim.scale),
                             dataAt<float>(ops.ctPair), n,
                             dataAt<float>(ops.ctPositive), n);

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::SigmoidBackward tile;
      rows.point(tile, block, chunk.offset, dCols);
      tile.bias = static_cast<float>(ops.bias);
      tile.ctPair = dataAt<float>(ops.ctPair, block.row);
      tile.ctPositive = dataAt<float>(ops.ctPositive, block.row);
      tile.dBiasRow = dataAt<double>(dBiasRow, block.row);
      cuda::sigmoidBackwardTile(
          dev.launch, dev.tile(ops.sim.rows, chunk.features[0], block), tile);
    });
    return at::zeros({1}, args.options().dtype(at::kDouble));
  };
  at::Tensor dCols =
      runGradientRing(ctx.communicator(), {ops.sim.cols}, ops.colSizes, d, 1,
                      args.options(), tiles, {ctx.operandKey(1)})
          .dCols;

  setGradients(ctx, args, rows.dRows, dCols,
               {totalOf(rows.dScaleRow), totalOf(dBiasRow)});
}
#endif // DLOSS_HAVE_CUDA

} // namespace

} // namespace dloss::fused
