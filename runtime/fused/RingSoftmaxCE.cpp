// dloss.ring_softmax_ce and its _grad (CLIP): both softmax directions of the
// gathered similarity, on the CPU and the GPU.
#include "runtime/fused/FusedKernels.h"

#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/RingDriver.h"
#include "runtime/fused/TileMath.h"

namespace dloss::fused {

namespace {

#ifdef DLOSS_HAVE_CUDA
// The GPU visits (below, after the CPU ones).
void ringSoftmaxCEDevice(KernelContext &ctx, const FusedArgs &args);
void ringSoftmaxCEGradDevice(KernelContext &ctx, const FusedArgs &args);
#endif

/// Operands 0-4 of both softmax ops, with every rank's sizes, and the
/// backward's 5-8: the saved statistics and the cotangents.
struct SoftmaxOperands {
  Similarity sim;
  std::vector<int64_t> rowSizes, colSizes;
  int64_t rowOffset = 0;
  at::Tensor rowTargets, colTargets;
  at::Tensor rowLse, colLse, ctRow, ctCol; ///< the backward's
};

SoftmaxOperands softmaxOperands(const FusedArgs &args, bool backward = false) {
  SoftmaxOperands ops;
  ops.sim = similarityOperands(args);
  ops.rowSizes = args.ctx.rankSizes(0, 0);
  ops.colSizes = args.ctx.rankSizes(1, 0);
  ops.rowOffset = offsetOf(ops.rowSizes, args.rank);
  ops.rowTargets = args.targets(3, "row_targets", ops.sim.rows.size(0),
                                total(ops.colSizes), "columns");
  ops.colTargets = args.targets(4, "col_targets", ops.sim.cols.size(0),
                                total(ops.rowSizes), "rows");
  if (backward) {
    const int64_t n = ops.sim.rows.size(0), m = ops.sim.cols.size(0);
    ops.rowLse = args.vector(5, "row_lse", n);
    ops.colLse = args.vector(6, "col_lse", m);
    ops.ctRow = args.vector(7, "ct_row", n);
    ops.ctCol = args.vector(8, "ct_col", m);
  }
  return ops;
}

/// The backward's chunk features' keys: cols, col targets, col_lse, ct_col
/// are operands 1, 4, 6 and 8.
std::vector<int64_t> gradKeys(const KernelContext &ctx) {
  return {ctx.operandKey(1), ctx.operandKey(4), ctx.operandKey(6),
          ctx.operandKey(8)};
}

/// The forward's results from the rows' and columns' statistics: the
/// per-row and per-column losses and log-sum-exps.
void setSoftmaxResults(KernelContext &ctx, const FusedArgs &args,
                       const RowStatistics &rows, const RowStatistics &cols) {
  at::Tensor rowLse = lseOf(rows.max, rows.sum);
  at::Tensor colLse = lseOf(cols.max, cols.sum);
  ctx.setResult(0, (rowLse - rows.picked).to(args.type(0)));
  ctx.setResult(1, (colLse - cols.picked).to(args.type(1)));
  ctx.setResult(2, rowLse.to(args.type(0)));
  ctx.setResult(3, colLse.to(args.type(1)));
}

/// The CLIP forward's ring and results, for the CPU and GPU ops:
/// tiles(chunk, rows, stats) folds this rank's tiles of a chunk into the row
/// statistics and the chunk's column statistics `stats` [3, length] (running
/// max, sum of exp, target logit).
template <typename Tiles>
void runSoftmaxCE(KernelContext &ctx, const FusedArgs &args,
                  const SoftmaxOperands &ops, Tiles &&tiles) {
  RowStatistics rows = rowStatistics(ops.sim.rows.size(0), args);
  RingPass pass;
  pass.features = {ops.sim.cols, ops.colTargets};
  pass.keys = {ctx.operandKey(1), ctx.operandKey(4)};
  pass.lengths = ops.colSizes;
  pass.newCarry = [&](int64_t length) {
    return Tensors{at::empty({3, length}, args.options())};
  };
  pass.visit = [&](const Chunk &chunk, Tensors &carry) {
    at::Tensor &stats = carry[0];
    stats[0].fill_(-kInf);
    stats.narrow(0, 1, 2).zero_();
    tiles(chunk, rows, stats);
  };
  pass.merge = [](Tensors &mine, const Tensors &upstream) {
    mergeLse(mine[0][0], mine[0][1], upstream[0][0], upstream[0][1]);
    mine[0][2].add_(upstream[0][2]);
  };
  at::Tensor colStats = runRing(ctx.communicator(), pass)[0];

  setSoftmaxResults(ctx, args, rows, {colStats[0], colStats[1], colStats[2]});
}

/// Whether this call's CLIP gathers both sides: the forward's column
/// similarity and the backward's column side are computed a second time,
/// and the forward's and backward's carry exchanges are saved.
bool clipGathersBothSides(KernelContext &ctx, const SoftmaxOperands &ops) {
  return gathersBothSides(ctx.communicator(), ops.sim.rows, ops.sim.cols,
                          ops.rowSizes, ops.colSizes, /*tilesTwice=*/2,
                          /*savedExchanges=*/2);
}

/// CLIP's forward as the gather of both sides: every rank gathers the rows
/// and the columns, then folds its own rows over every column and every row
/// over its own columns. Each statistic is complete where it is computed, so
/// no carry travels: one collective, where the one-sided gather makes two.
/// Twice the tiles' arithmetic, which the cost model takes only where
/// latency, not arithmetic, is the cost.
void softmaxCEBothSides(KernelContext &ctx, const FusedArgs &args,
                        const SoftmaxOperands &ops) {
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0), m = sim.cols.size(0);
  Tensors all = gatherOperands(ctx.communicator(), {sim.rows, sim.cols},
                               {ops.rowSizes, ops.colSizes},
                               {ctx.operandKey(0), ctx.operandKey(1)});
  const Similarity everyRow{all[0], sim.cols, sim.scale};
  const at::Tensor &allCols = all[1];

  RowStatistics rows = rowStatistics(n, args);
  Elements rowPicked(rows.picked);
  // S kept for the backward of the same call, where it is small.
  at::Tensor kept = keepSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   allCols.size(0), args.options());
  forSideBlocks(
      n, allCols.size(0), args, 1, [&](const Block &block, auto &scratch) {
        at::Tensor s = similarityTile(sim, allCols, block, scratch(0, block));
        keepTile(kept, s, block, 0);
        Elements sAt(s);
        forRowTargets(ops.rowTargets, block, 0, [&](int64_t i, int64_t e) {
          rowPicked.set(i, sim.scale * sAt.get(e));
        });
        foldLse(s, sim.scale, 1, block, rows.max, rows.sum);
      });

  RowStatistics cols = rowStatistics(m, args);
  Elements colPicked(cols.picked);
  forSideBlocks(
      everyRow.rows.size(0), m, args, 1,
      [&](const Block &block, auto &scratch) {
        at::Tensor s =
            similarityTile(everyRow, sim.cols, block, scratch(0, block));
        Elements sAt(s);
        forColTargets(ops.colTargets, block, 0, [&](int64_t j, int64_t e) {
          colPicked.set(j, sim.scale * sAt.get(e));
        });
        foldLse(s, sim.scale, 0, block, cols.max, cols.sum);
      });
  setSoftmaxResults(ctx, args, rows, cols);
}

/// CLIP's backward as the gather of both sides: the log-sum-exps,
/// cotangents and targets of every row and column in one collective (the
/// rows and columns themselves too, unless the forward of this call
/// gathered them), then the gradient of this rank's rows over every column
/// and of its columns over every row. Nothing travels home: the one-sided
/// gather's two collectives become one, of O(B) values.
void softmaxCEGradBothSides(KernelContext &ctx, const FusedArgs &args,
                            const SoftmaxOperands &ops) {
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0), m = sim.cols.size(0),
                d = sim.rows.size(1);
  const std::vector<int64_t> &rs = ops.rowSizes, &cs = ops.colSizes;
  Tensors all =
      gatherOperands(ctx.communicator(),
                     {sim.rows, sim.cols, ops.rowLse, ops.ctRow, ops.rowTargets,
                      ops.colLse, ops.ctCol, ops.colTargets},
                     {rs, cs, rs, rs, rs, cs, cs, cs},
                     {ctx.operandKey(0), ctx.operandKey(1), ctx.operandKey(5),
                      ctx.operandKey(7), ctx.operandKey(3), ctx.operandKey(6),
                      ctx.operandKey(8), ctx.operandKey(4)});
  const at::Tensor &allRows = all[0], &allCols = all[1], &allRowLse = all[2],
                   &allCtRow = all[3], &allRowTargets = all[4],
                   &allColLse = all[5], &allCtCol = all[6],
                   &allColTargets = all[7];
  const int64_t colOffset = offsetOf(cs, args.rank);

  // This rank's rows over every column: G = ct_row P_row + ct_col P_col -
  // the one-hot targets of both directions; dRows and the row direction's
  // share of dscale.
  at::Tensor dRows = at::zeros({n, d}, args.options()), none;
  double dScale = 0;
  // The forward's S, where it kept it.
  at::Tensor kept = keptSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   allCols.size(0), args.options());
  forSideBlocks(
      n, allCols.size(0), args, 2, [&](const Block &block, auto &scratch) {
        at::Tensor s =
            similarityTile(sim, allCols, block, scratch(0, block), kept, 0);
        at::Tensor grad = scratch(1, block);
        std::pair<double, double> sums =
            softmaxTileGradient(s, sim.scale, block, ops.rowLse, ops.ctRow,
                                allColLse, allCtCol, grad);
        double rowPart = sums.first - sums.second;
        Elements g(grad), sAt(s), ctRowAt(ops.ctRow), ctColAt(allCtCol);
        forRowTargets(ops.rowTargets, block, 0, [&](int64_t i, int64_t e) {
          g.add(e, -ctRowAt.get(i));
          rowPart -= ctRowAt.get(i) * sAt.get(e);
        });
        forColTargets(allColTargets, block, ops.rowOffset,
                      [&](int64_t j, int64_t e) { g.add(e, -ctColAt.get(j)); });
        backpropGemms(grad, block, sim.rows, allCols, sim.scale, dRows, none);
        dScale += rowPart;
      });

  // Every row over this rank's columns: the same G; dCols and the column
  // direction's share.
  const Similarity everyRow{allRows, sim.cols, sim.scale};
  at::Tensor dCols = at::zeros({m, d}, args.options());
  forSideBlocks(
      allRows.size(0), m, args, 2, [&](const Block &block, auto &scratch) {
        at::Tensor s =
            similarityTile(everyRow, sim.cols, block, scratch(0, block));
        at::Tensor grad = scratch(1, block);
        std::pair<double, double> sums =
            softmaxTileGradient(s, sim.scale, block, allRowLse, allCtRow,
                                ops.colLse, ops.ctCol, grad);
        double colPart = sums.second;
        Elements g(grad), sAt(s), ctRowAt(allCtRow), ctColAt(ops.ctCol);
        forRowTargets(allRowTargets, block, colOffset,
                      [&](int64_t i, int64_t e) { g.add(e, -ctRowAt.get(i)); });
        forColTargets(ops.colTargets, block, 0, [&](int64_t j, int64_t e) {
          g.add(e, -ctColAt.get(j));
          colPart -= ctColAt.get(j) * sAt.get(e);
        });
        backpropGemms(grad, block, allRows, sim.cols, sim.scale, none, dCols);
        dScale += colPart;
      });
  setGradients(ctx, args, dRows, dCols, {dScale});
}

} // namespace

void ringSoftmaxCE(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_softmax_ce");
  DLOSS_DEVICE_DISPATCH(ringSoftmaxCEDevice)
  SoftmaxOperands ops = softmaxOperands(args);
  if (clipGathersBothSides(ctx, ops))
    return softmaxCEBothSides(ctx, args, ops);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0);
  TileShape tile = clippedTile(n, largest(ops.colSizes), args.compute);
  TileScratch scratch(tile, 1, args.options());
  at::Tensor kept = keepSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   total(ops.colSizes), args.options());

  runSoftmaxCE(
      ctx, args, ops,
      [&](const Chunk &chunk, RowStatistics &rows, at::Tensor &stats) {
        const at::Tensor &cols = chunk.features[0],
                         &colTargets = chunk.features[1];
        const at::Tensor colMax = stats[0], colSum = stats[1],
                         colTarget = stats[2];
        Elements rowTargetAt(rows.picked), colTargetAt(colTarget);
        forEachBlock(n, chunk.length(), tile, [&](const Block &block) {
          // The logits are scale * s; the loops scale as they read.
          at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
          keepTile(kept, s, block, chunk.offset);
          Elements sAt(s);
          forRowTargets(ops.rowTargets, block, chunk.offset,
                        [&](int64_t i, int64_t e) {
                          rowTargetAt.set(i, sim.scale * sAt.get(e));
                        });
          forColTargets(colTargets, block, ops.rowOffset,
                        [&](int64_t j, int64_t e) {
                          colTargetAt.set(j, sim.scale * sAt.get(e));
                        });
          foldLseBoth(s, sim.scale, block, rows.max, rows.sum, colMax, colSum);
        });
      });
}

void ringSoftmaxCEGrad(KernelContext &ctx) {
  FusedArgs args(ctx, "dloss.ring_softmax_ce_grad");
  DLOSS_DEVICE_DISPATCH(ringSoftmaxCEGradDevice)
  SoftmaxOperands ops = softmaxOperands(args, /*backward=*/true);
  if (clipGathersBothSides(ctx, ops))
    return softmaxCEGradBothSides(ctx, args, ops);
  const Similarity &sim = ops.sim;
  const at::Tensor &rowLse = ops.rowLse, &ctRow = ops.ctRow;
  const int64_t n = sim.rows.size(0), d = sim.rows.size(1);
  TileShape tile = clippedTile(n, largest(ops.colSizes), args.compute);
  TileScratch scratch(tile, 2, args.options());
  at::Tensor dRows = at::zeros({n, d}, args.options());
  double dScale = 0;
  at::Tensor kept = keptSimilarity(ctx.operandKey(0), ctx.operandKey(1), n,
                                   total(ops.colSizes), args.options());

  // dscale = sum(G * S) splits into the row direction's part (this rank's
  // share) and the column direction's part, which belongs to the columns'
  // owner and travels home with their gradient: each rank's share is then the
  // gradient of its own rows' and columns' losses, as in the unfused plan
  // (and OpenCLIP's local_loss + gather_with_grad).
  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols, double &colShare) {
    const at::Tensor &cols = chunk.features[0], &colTargets = chunk.features[1];
    const at::Tensor &chunkLse = chunk.features[2],
                     &chunkCt = chunk.features[3];
    forEachBlock(n, chunk.length(), tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block), kept,
                                    chunk.offset);
      // G = ct_row P_row + ct_col P_col - the one-hot targets; `all` is
      // sum(G * S) and colPart the column direction's part of it.
      at::Tensor grad = scratch(1, block);
      std::pair<double, double> sums = softmaxTileGradient(
          s, sim.scale, block, rowLse, ctRow, chunkLse, chunkCt, grad);
      double all = sums.first, colPart = sums.second;
      Elements g(grad), sAt(s), ctRowAt(ctRow), ctColAt(chunkCt);
      forRowTargets(ops.rowTargets, block, chunk.offset,
                    [&](int64_t i, int64_t e) {
                      g.add(e, -ctRowAt.get(i));
                      all -= ctRowAt.get(i) * sAt.get(e);
                    });
      forColTargets(colTargets, block, ops.rowOffset,
                    [&](int64_t j, int64_t e) {
                      g.add(e, -ctColAt.get(j));
                      all -= ctColAt.get(j) * sAt.get(e);
                      colPart -= ctColAt.get(j) * sAt.get(e);
                    });
      backpropGemms(grad, block, sim, cols, dRows, dCols);
      dScale += all - colPart;
      colShare += colPart;
    });
  };
  ColumnGradient own = runGradientRing(
      ctx.communicator(), {sim.cols, ops.colTargets, ops.colLse, ops.ctCol},
      ops.colSizes, d, args.options(), tiles, gradKeys(ctx));

  setGradients(ctx, args, dRows, own.dCols,
               {dScale + own.share.item<double>()});
}

namespace {

#ifdef DLOSS_HAVE_CUDA
void ringSoftmaxCEDevice(KernelContext &ctx, const FusedArgs &args) {
  SoftmaxOperands ops = softmaxOperands(args);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0);
  DeviceTiles dev(args, n, largest(ops.colSizes));

  runSoftmaxCE(ctx, args, ops,
               [&](const Chunk &chunk, RowStatistics &rows, at::Tensor &stats) {
                 const at::Tensor &cols = chunk.features[0],
                                  &colTargets = chunk.features[1];
                 const int64_t length = chunk.length();
                 forEachBlock(n, length, dev.shape, [&](const Block &block) {
                   cuda::ClipForward tile;
                   tile.scale = static_cast<float>(sim.scale);
                   tile.rowTargets = dataAt<int64_t>(ops.rowTargets, block.row);
                   tile.colBase = chunk.offset + block.col;
                   tile.colTargets = dataAt<int64_t>(colTargets, block.col);
                   tile.rowBase = ops.rowOffset + block.row;
                   tile.rowMax = dataAt<float>(rows.max, block.row);
                   tile.rowSum = dataAt<float>(rows.sum, block.row);
                   tile.rowTarget = dataAt<float>(rows.picked, block.row);
                   tile.colMax = dataAt<float>(stats, block.col);
                   tile.colSum = dataAt<float>(stats, length + block.col);
                   tile.colTarget =
                       dataAt<float>(stats, 2 * length + block.col);
                   cuda::clipForwardTile(dev.launch,
                                         dev.tile(sim.rows, cols, block), tile);
                 });
               });
}

void ringSoftmaxCEGradDevice(KernelContext &ctx, const FusedArgs &args) {
  SoftmaxOperands ops = softmaxOperands(args, /*backward=*/true);
  const Similarity &sim = ops.sim;
  const int64_t n = sim.rows.size(0), d = sim.rows.size(1);
  DeviceTiles dev(args, n, largest(ops.colSizes));
  // Per row: the row direction's share of dscale (see the CPU op).
  DeviceRowGradient rows(args, sim.scale, ops.rowTargets, n, d);

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    const at::Tensor &cols = chunk.features[0], &colTargets = chunk.features[1];
    const at::Tensor &chunkLse = chunk.features[2],
                     &chunkCt = chunk.features[3];
    at::Tensor colShareRow = perRowShares(n, args);
    cuda::prepareGradientScale(dev.launch, static_cast<float>(sim.scale),
                               dataAt<float>(ops.ctRow), n,
                               dataAt<float>(chunkCt), chunk.length());
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::ClipBackward tile;
      rows.point(tile, block, chunk.offset, dCols);
      tile.rowLse = dataAt<float>(ops.rowLse, block.row);
      tile.ctRow = dataAt<float>(ops.ctRow, block.row);
      tile.colLse = dataAt<float>(chunkLse, block.col);
      tile.ctCol = dataAt<float>(chunkCt, block.col);
      tile.colTargets = dataAt<int64_t>(colTargets, block.col);
      tile.rowBase = ops.rowOffset + block.row;
      tile.colShareRow = dataAt<double>(colShareRow, block.row);
      cuda::clipBackwardTile(dev.launch, dev.tile(sim.rows, cols, block), tile);
    });
    return colShareRow.sum().reshape({1});
  };
  ColumnGradient own = runGradientRing(
      ctx.communicator(), {sim.cols, ops.colTargets, ops.colLse, ops.ctCol},
      ops.colSizes, d, 1, args.options(), tiles, gradKeys(ctx));

  setGradients(ctx, args, rows.dRows, own.dCols,
               {totalOf(rows.dScaleRow) + own.share.item<double>()});
}
#endif // DLOSS_HAVE_CUDA

} // namespace

} // namespace dloss::fused
