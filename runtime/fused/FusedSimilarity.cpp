// dloss.fused_similarity and its _grad: a tile program's row reductions over
// S = rows x cols^T on the CPU, the columns round the ring or tiled in place.
//
// Each block is one GEMM (tileGemm) into a preallocated tile; the program runs
// a tile row at a time (RowEvaluator.h), rows split over ATen's threads. The
// backward fills G = dL/dS in a second tile and adds G cols and G^T rows with
// two GEMMs. The operands are checked in SimilarityOperands.cpp, CUDA
// tensors go to FusedSimilarityDevice.cpp.
//
// Column results (gathered): their values go to a tile of their own, folded
// along the rows after each block into the chunk's statistics, which travel
// round the ring with it and come home complete; backward, the chunk's column
// results and cotangents travel with it, and their share of the 0-d leaves'
// gradients goes home with the column gradient.
#include "runtime/fused/FusedSimilarity.h"

#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/FusedSimilarityDevice.h"
#include "runtime/fused/RowEvaluator.h"
#include "runtime/fused/TileMath.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dloss::fused {

namespace similarity {

namespace {

/// Sharded: combines every shard's row statistics ([outputs, n] each, in
/// f64; the max rows of sum outputs are unused) into the global ones. Every
/// rank makes the same calls.
void combineShards(Communicator &comm, const SimilarityOperands &ops,
                   at::Tensor &max, at::Tensor &sum) {
  bool anyLse = std::any_of(
      ops.outputs.begin(), ops.outputs.end(),
      [](const Output &output) { return output.kind == Reduce::LogSumExp; });
  if (anyLse) {
    at::Tensor top = comm.allReduce(max, Reduction::Max);
    for (size_t k = 0; k < ops.outputs.size(); ++k)
      if (ops.outputs[k].kind == Reduce::LogSumExp)
        sum[k].mul_((max[k] - finiteShift(top[k])).exp_());
    max = top;
  }
  sum = comm.allReduce(sum, Reduction::Sum);
}

/// The statistics of the column results that a chunk carries round the
/// ring, uninitialised: running maxima and sums, [column results, length]
/// each (a sum result uses the sums only); nothing when there are none.
Tensors newColumnStats(const SimilarityOperands &ops, int64_t length,
                       at::TensorOptions options) {
  const int64_t numCol = static_cast<int64_t>(ops.colOutputs.size());
  if (numCol == 0)
    return {};
  return Tensors{at::empty({numCol, length}, options),
                 at::empty({numCol, length}, options)};
}

} // namespace

Tensors chunkFeatures(const SimilarityOperands &ops) {
  Tensors features = {ops.cols};
  features.insert(features.end(), ops.colLeaves.begin(), ops.colLeaves.end());
  return features;
}

std::vector<int64_t> chunkKeys(const KernelContext &ctx,
                               const SimilarityProgram &spec) {
  // The columns are operand 1, the per-column leaves follow the per-row
  // ones from operand 2 (SimilarityOperands.cpp).
  std::vector<int64_t> keys = {ctx.operandKey(1)};
  for (int64_t j = 0; j < spec.colLeaves; ++j)
    keys.push_back(ctx.operandKey(static_cast<size_t>(2 + spec.rowLeaves + j)));
  return keys;
}

Tensors gradientChunkFeatures(const SimilarityOperands &ops) {
  Tensors features = chunkFeatures(ops);
  features.insert(features.end(), ops.colResults.begin(), ops.colResults.end());
  features.insert(features.end(), ops.colCts.begin(), ops.colCts.end());
  return features;
}

void clearColumnStats(Tensors &stats) {
  if (stats.empty())
    return;
  stats[0].fill_(-kInf);
  stats[1].zero_();
}

Tensors
visitColumns(KernelContext &ctx, const SimilarityProgram &spec,
             const SimilarityOperands &ops, at::TensorOptions options,
             const std::function<void(const Chunk &, Tensors &)> &visit) {
  if (!spec.gathered) {
    Tensors features = chunkFeatures(ops);
    Tensors stats = newColumnStats(ops, features[0].size(0), options);
    visit(Chunk{ops.colOffset, features}, stats);
    return {};
  }
  RingPass pass;
  pass.features = chunkFeatures(ops);
  pass.keys = chunkKeys(ctx, spec);
  pass.lengths = ops.colSizes;
  if (!ops.colOutputs.empty()) {
    pass.newCarry = [&](int64_t length) {
      return newColumnStats(ops, length, options);
    };
    pass.merge = [&](Tensors &mine, const Tensors &upstream) {
      for (size_t k = 0; k < ops.colOutputs.size(); ++k) {
        if (ops.colOutputs[k].kind == Reduce::Sum)
          mine[1][k].add_(upstream[1][k]);
        else
          mergeLse(mine[0][k], mine[1][k], upstream[0][k], upstream[1][k]);
      }
    };
  }
  pass.visit = visit;
  return runRing(ctx.communicator(), pass);
}

void setForwardResults(KernelContext &ctx, const FusedArgs &args,
                       const SimilarityProgram &spec,
                       const SimilarityOperands &ops, at::Tensor max,
                       at::Tensor sum, const Tensors &colStats) {
  if (spec.sharded)
    combineShards(ctx.communicator(), ops, max, sum);
  // An all -inf row: max -inf, sum 0, -inf.
  at::Tensor lse = max + sum.log();
  const size_t numOutputs = ops.outputs.size();
  for (size_t k = 0; k < numOutputs; ++k)
    ctx.setResult(k, (ops.outputs[k].kind == Reduce::Sum ? sum[k] : lse[k])
                         .to(args.type(0)));
  for (size_t k = 0; k < ops.colOutputs.size(); ++k)
    ctx.setResult(numOutputs + k, (ops.colOutputs[k].kind == Reduce::Sum
                                       ? colStats[1][k]
                                       : lseOf(colStats[0][k], colStats[1][k]))
                                      .to(args.type(0)));
}

namespace {

/// The column (0 <= c < width) whose global index, base + c, equals `value`;
/// -1 for none (not an integer, out of range, NaN), as eq would find none.
template <typename T>
int64_t pickedIndex(T value, int64_t base, int64_t width) {
  const double v = static_cast<double>(value);
  if (!(v >= static_cast<double>(base) &&
        v < static_cast<double>(base + width)))
    return -1;
  const int64_t c = static_cast<int64_t>(v);
  return static_cast<double>(c) == v ? c - base : -1;
}

/// A block's column picks: for each column result that is a pick, the
/// block's columns whose leaf names a row of the block, grouped by that row
/// (CSR: columns of row r are at[start[r] .. start[r + 1])).
template <typename T> struct ColumnPicks {
  struct PerOutput {
    std::vector<int64_t> start, at;
  };
  std::vector<PerOutput> outputs; ///< one per column result (empty: no pick)

  void build(const SimilarityOperands &ops, const Chunk &chunk,
             const Block &block) {
    outputs.assign(ops.colOutputs.size(), PerOutput{});
    for (size_t k = 0; k < ops.colOutputs.size(); ++k) {
      const Output &output = ops.colOutputs[k];
      if (output.pickReg < 0)
        continue;
      const T *leaf =
          chunk.features[1 + output.pickLeaf].template data_ptr<T>() +
          block.col;
      PerOutput &picks = outputs[k];
      std::vector<int64_t> rowOf(block.cols, -1);
      picks.start.assign(block.rows + 1, 0);
      for (int64_t j = 0; j < block.cols; ++j) {
        rowOf[j] = pickedIndex(leaf[j], ops.rowOffset + block.row, block.rows);
        if (rowOf[j] >= 0)
          ++picks.start[rowOf[j] + 1];
      }
      for (int64_t r = 0; r < block.rows; ++r)
        picks.start[r + 1] += picks.start[r];
      picks.at.assign(picks.start[block.rows], 0);
      std::vector<int64_t> next(picks.start.begin(), picks.start.end() - 1);
      for (int64_t j = 0; j < block.cols; ++j)
        if (rowOf[j] >= 0)
          picks.at[next[rowOf[j]]++] = j;
    }
  }

  /// fn(j) for the columns of result k picked at tile row r.
  template <typename Fn> void forRow(size_t k, int64_t r, Fn &&fn) const {
    const PerOutput &picks = outputs[k];
    if (picks.start.empty())
      return;
    for (int64_t e = picks.start[r]; e < picks.start[r + 1]; ++e)
      fn(picks.at[e]);
  }
};

/// The data of each tensor (contiguous, of type T).
template <typename T> std::vector<const T *> dataOf(const Tensors &tensors) {
  std::vector<const T *> data;
  for (const at::Tensor &tensor : tensors)
    data.push_back(tensor.template data_ptr<T>());
  return data;
}

template <typename T>
void forward(KernelContext &ctx, const FusedArgs &args,
             const SimilarityProgram &spec, const SimilarityOperands &ops) {
  const int64_t n = ops.rows.size(0);
  const size_t numOutputs = ops.outputs.size();
  constexpr T inf = std::numeric_limits<T>::infinity();
  // Per output and row: the sum, or the running max and sum of exp(e - max).
  std::vector<double> sums(numOutputs * n, 0.0);
  std::vector<T> maxima(numOutputs * n, -inf);
  // Column results: each one's values in a tile of its own, folded along
  // the rows after the block (tiles 1..numCol).
  const size_t numCol = ops.colOutputs.size();
  TileScratch scratch(ops.tile, 1 + static_cast<int>(numCol), args.options());
  RowPrograms<T> programs(ops, /*backward=*/false);
  Similarity sim{ops.rows, ops.cols, 1};
  const std::vector<const T *> rowLeaves = dataOf<T>(ops.rowLeaves);
  // A register whose log-sum-exp is both a row and a column result is
  // folded along both axes from its column tile at once (foldLseBoth), into
  // per-row statistics of the tile's type.
  const LsePairs &pairs = ops.pairs;
  const std::vector<int64_t> &pairedRow = pairs.rowOf;
  std::vector<char> rowInTile(numOutputs, 0);
  for (size_t o = 0; o < numOutputs; ++o)
    rowInTile[o] = pairs.colOf[o] >= 0;
  Tensors tileRowMax(numOutputs), tileRowSum(numOutputs);
  for (size_t o = 0; o < numOutputs; ++o)
    if (rowInTile[o]) {
      tileRowMax[o] = at::full({n}, -inf, args.options());
      tileRowSum[o] = at::zeros({n}, args.options());
    }
  // Column results evaluated straight into their tiles: the first one of
  // each computed register (the others copy).
  std::vector<char> intoTile(numCol, 0);
  for (size_t k = 0; k < numCol; ++k) {
    const int64_t reg = ops.colOutputs[k].reg;
    bool taken = false;
    for (size_t q = 0; q < k; ++q)
      taken |= intoTile[q] && ops.colOutputs[q].reg == reg;
    intoTile[k] = ops.colOutputs[k].pickReg < 0 && !taken &&
                  epilogue::registerOperands(ops.program[reg].op) > 0;
  }

  // The carry of a chunk: per column result, the running max and sum of
  // exp(e - max) (log-sum-exp) or the sum, over the rows seen so far.
  auto visit = [&](const Chunk &chunk, Tensors &carry) {
    const at::Tensor &cols = chunk.features[0];
    clearColumnStats(carry);
    // The carry's maxima and sums, per column result.
    Tensors colMax, colSum;
    std::vector<T *> colSumData;
    for (size_t k = 0; k < numCol; ++k) {
      colMax.push_back(carry[0][k]);
      colSum.push_back(carry[1][k]);
      colSumData.push_back(colSum.back().template data_ptr<T>());
    }
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
      const T *tile = s.data_ptr<T>();
      const int64_t w = block.cols;
      std::vector<T *> colTiles;
      for (size_t k = 0; k < numCol; ++k)
        colTiles.push_back(
            scratch(1 + static_cast<int>(k), block).data_ptr<T>());
      ColumnPicks<T> colPicks;
      colPicks.build(ops, chunk, block);
      programs.forRows(chunk, block, [&](RowProgram<T> &program, int64_t r) {
        const int64_t i = block.row + r;
        for (size_t k = 0; k < numCol; ++k)
          if (intoTile[k])
            program.target[ops.colOutputs[k].reg] = colTiles[k] + r * w;
        program.evaluate(tile + r * w, i, w);
        for (size_t k = 0; k < numCol; ++k) {
          const Output &output = ops.colOutputs[k];
          if (output.pickReg < 0) {
            if (!intoTile[k])
              std::copy_n(program.value(output.reg), w, colTiles[k] + r * w);
            continue;
          }
          // Each column is picked at one row at most: no two threads meet.
          const T *x = program.value(output.pickReg);
          T *into = colSumData[k] + block.col;
          colPicks.forRow(k, r, [&](int64_t j) { into[j] += x[j]; });
        }
        for (size_t k = 0; k < numOutputs; ++k) {
          const Output &output = ops.outputs[k];
          if (rowInTile[k])
            continue; // folded from the column tile below
          double &sum = sums[k * n + i];
          if (output.pickReg >= 0) {
            int64_t c = pickedIndex(rowLeaves[output.pickLeaf][i],
                                    chunk.offset + block.col, w);
            if (c >= 0)
              sum += program.value(output.pickReg)[c];
            continue;
          }
          const T *e = program.value(output.reg);
          if (output.kind == Reduce::Sum) {
            sum += rowSum(e, w);
            continue;
          }
          // Online log-sum-exp (TileMath's mergeLse on one row).
          T &max = maxima[k * n + i];
          if (max == inf)
            continue; // already +inf
          T top = rowMax(e, w);
          if (top == -inf)
            continue; // nothing but exp(-inf) = 0
          if (top == inf) {
            max = inf;
            sum = 1;
            continue;
          }
          if (top < max)
            top = max;
          const double acc = rowSumExp(e, top, w);
          sum = sum * std::exp(static_cast<double>(max) -
                               static_cast<double>(top)) +
                acc;
          max = top;
        }
      });
      for (size_t k = 0; k < numCol; ++k) {
        if (ops.colOutputs[k].pickReg >= 0)
          continue; // added in the row loop
        at::Tensor values = scratch(1 + static_cast<int>(k), block);
        if (ops.colOutputs[k].kind == Reduce::Sum)
          colSum[k].narrow(0, block.col, block.cols).add_(values.sum(0));
        else if (pairedRow[k] >= 0)
          foldLseBoth(values, 1.0, block, tileRowMax[pairedRow[k]],
                      tileRowSum[pairedRow[k]], colMax[k], colSum[k]);
        else
          foldLse(values, 1.0, 0, block, colMax[k], colSum[k]);
      }
    });
  };

  Tensors colStats = visitColumns(ctx, spec, ops, args.options(), visit);
  for (size_t o = 0; o < numOutputs; ++o)
    if (rowInTile[o]) {
      const T *max = tileRowMax[o].template data_ptr<T>();
      const T *sum = tileRowSum[o].template data_ptr<T>();
      std::copy_n(max, n, maxima.begin() + o * n);
      std::copy_n(sum, n, sums.begin() + o * n);
    }
  auto f64 = at::TensorOptions(at::kDouble);
  at::Tensor sum = at::empty({static_cast<int64_t>(numOutputs), n}, f64);
  at::Tensor max = at::empty({static_cast<int64_t>(numOutputs), n}, f64);
  std::copy(sums.begin(), sums.end(), sum.data_ptr<double>());
  std::copy(maxima.begin(), maxima.end(), max.data_ptr<double>());
  setForwardResults(ctx, args, spec, ops, max, sum, colStats);
}

template <typename T>
void backward(KernelContext &ctx, const FusedArgs &args,
              const SimilarityProgram &spec, const SimilarityOperands &ops) {
  const int64_t n = ops.rows.size(0), d = ops.rows.size(1);
  const size_t numOutputs = ops.outputs.size();
  const int64_t rowLeafCount = static_cast<int64_t>(ops.rowLeaves.size());
  TileScratch scratch(ops.tile, 2, args.options());
  RowPrograms<T> programs(ops, /*backward=*/true);
  Similarity sim{ops.rows, ops.cols, 1};
  at::Tensor dRows = at::zeros({n, d}, args.options());
  std::vector<double> dRowLeaves(rowLeafCount * n, 0.0);
  std::vector<const T *> results, cts;
  for (size_t k = 0; k < numOutputs; ++k) {
    results.push_back(ops.results[k].data_ptr<T>());
    cts.push_back(ops.cts[k].data_ptr<T>());
  }

  // Column results: seeds from the chunk's results and cotangents (they
  // travel with it, after the per-column leaves).
  const size_t numCol = ops.colOutputs.size();
  const size_t colBase = 1 + ops.colLeaves.size();
  // The chunk's column results and cotangents, per column result (set per
  // chunk: data_ptr is too slow for a tile row's loop).
  std::vector<const T *> colResult(numCol), colCt(numCol);
  const std::vector<const T *> rowLeaves = dataOf<T>(ops.rowLeaves);
  // The column results' share of the 0-d leaves' gradients goes home with
  // the columns. When a column result reaches a float 0-d leaf, a second,
  // share sweep over the registers between them (shareRegisters), seeded by
  // the column results alone, computes it; the first sweep takes every
  // seed. A column log-sum-exp's seed is kept from the first sweep.
  const std::vector<char> &shares = programs.shareMask();
  const bool shareSweep = std::any_of(shares.begin(), shares.end(),
                                      [](char share) { return share != 0; });
  std::vector<char> keep(numCol, 0);
  for (size_t k = 0; k < numCol; ++k) {
    const Output &output = ops.colOutputs[k];
    keep[k] = shareSweep && output.pickReg < 0 &&
              output.kind == Reduce::LogSumExp && shares[output.reg];
  }
  // A register whose log-sum-exp is a row and a column result gets both
  // seeds from one exp per element where the block's lses allow
  // (sharedLseFactors).
  const std::vector<int64_t> &pairedCol = ops.pairs.colOf,
                             &pairedRow = ops.pairs.rowOf;
  // Per block and pair: whether one exp serves, and its factors.
  std::vector<char> oneExp(numOutputs, 0);
  std::vector<std::vector<T>> us(numOutputs), cvs(numOutputs);

  // The column results' seeds of tile row r: every one (share: false), or
  // those of the share sweep's registers (share: true), a kept seed from
  // the first sweep.
  auto seedColumns = [&](RowProgram<T> &program, const Block &block,
                         const ColumnPicks<T> &colPicks, int64_t r, int64_t w,
                         bool share) {
    for (size_t k = 0; k < numCol; ++k) {
      const Output &output = ops.colOutputs[k];
      if (share && !shares[seededRegister(output)])
        continue;
      if (!share && pairedRow[k] >= 0 && oneExp[pairedRow[k]])
        continue; // seeded with its row result
      const T *ct = colCt[k] + block.col;
      T *seed = program.cotangent(seededRegister(output));
      // keep[k] (and so a share sweep's seed from it): a kept tile row.
      T *kept =
          keep[k] ? program.keptSeeds.data() + k * ops.tile.cols : nullptr;
      if (output.pickReg >= 0)
        colPicks.forRow(k, r, [&](int64_t j) { seed[j] += ct[j]; });
      else if (output.kind == Reduce::Sum)
        addSeed(seed, ct, /*perColumn=*/true, w);
      else if (share)
        addSeed(seed, kept, /*perColumn=*/true, w);
      else if (keep[k]) {
        addColumnSoftmaxSeed<T, /*Store=*/true>(
            kept, program.value(output.reg), ct, colResult[k] + block.col, w);
        addSeed(seed, kept, /*perColumn=*/true, w);
      } else {
        addColumnSoftmaxSeed(seed, program.value(output.reg), ct,
                             colResult[k] + block.col, w);
      }
    }
  };
  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols) {
    const at::Tensor &cols = chunk.features[0];
    for (size_t k = 0; k < numCol; ++k) {
      colResult[k] = chunk.features[colBase + k].template data_ptr<T>();
      colCt[k] = chunk.features[colBase + numCol + k].template data_ptr<T>();
    }
    forEachBlock(n, chunk.length(), ops.tile, [&](const Block &block) {
      at::Tensor s = similarityTile(sim, cols, block, scratch(0, block));
      at::Tensor grad = scratch(1, block);
      const T *tile = s.data_ptr<T>();
      T *g = grad.data_ptr<T>();
      const int64_t w = block.cols;
      ColumnPicks<T> colPicks;
      colPicks.build(ops, chunk, block);
      for (size_t o = 0; o < numOutputs; ++o) {
        const int64_t k = pairedCol[o];
        oneExp[o] =
            k >= 0 && sharedLseFactors(results[o] + block.row, block.rows,
                                       colResult[k] + block.col,
                                       colCt[k] + block.col, w, us[o], cvs[o]);
      }
      programs.forRows(chunk, block, [&](RowProgram<T> &program, int64_t r) {
        const int64_t i = block.row + r;
        if (program.keptSeeds.empty() && shareSweep) {
          program.keptSeeds.assign(numCol * ops.tile.cols, T(0));
          program.rowShare.assign(ops.scalars.size(), 0.0);
        }
        program.evaluate(tile + r * w, i, w);
        program.beginReverse(g + r * w, w);
        seedColumns(program, block, colPicks, r, w, /*share=*/false);
        // Seeds: ct (sum) or ct exp(e - result) (log-sum-exp, its softmax);
        // a pick's at its one element.
        for (size_t k = 0; k < numOutputs; ++k) {
          const T c = cts[k][i];
          const int64_t reg = ops.outputs[k].reg;
          if (oneExp[k]) { // with its column result's seed
            const int64_t col = pairedCol[k];
            T *seed = program.cotangent(reg);
            const T *e = program.value(reg);
            if (keep[col])
              addBothSoftmaxSeeds<T, true>(
                  seed, program.keptSeeds.data() + col * ops.tile.cols, e, c,
                  results[k][i], us[k][r], cvs[k].data(), w);
            else
              addBothSoftmaxSeeds<T, false>(seed, nullptr, e, c, results[k][i],
                                            us[k][r], cvs[k].data(), w);
            continue;
          }
          if (c == T(0))
            continue;
          if (ops.outputs[k].pickReg >= 0) {
            int64_t at = pickedIndex(rowLeaves[ops.outputs[k].pickLeaf][i],
                                     chunk.offset + block.col, w);
            if (at >= 0)
              program.cotangent(ops.outputs[k].pickReg)[at] += c;
            continue;
          }
          T *seed = program.cotangent(reg);
          if (ops.outputs[k].kind == Reduce::Sum) {
            addSeed(seed, &c, /*perColumn=*/false, w);
            continue;
          }
          const T lse = results[k][i];
          if (lse == -std::numeric_limits<T>::infinity())
            continue;
          addSoftmaxSeed(seed, program.value(reg), c, lse, w);
        }
        program.reverse(i, w, n, dRowLeaves.data(), program.dScalars.data());
        if (shareSweep) {
          program.beginShareSweep(w);
          seedColumns(program, block, colPicks, r, w, /*share=*/true);
          std::fill(program.rowShare.begin(), program.rowShare.end(), 0.0);
          program.reverseShare(i, w, n, program.rowShare.data());
          for (size_t k = 0; k < program.rowShare.size(); ++k) {
            program.dScalars[k] -= program.rowShare[k];
            program.colShares[k] += program.rowShare[k];
          }
        }
      });
      // dRows += G cols, dCols += G^T rows.
      backpropGemms(grad, block, ops.rows, cols, 1.0, dRows, dCols);
    });
  };

  std::vector<double> homeShares(ops.scalars.size(), 0.0);
  at::Tensor dCols;
  if (spec.gathered) {
    // The carry: the chunk's column gradient, and its column results' share
    // of the 0-d gradients ([1] at least: no empty transfers).
    const int64_t shares =
        std::max<int64_t>(1, static_cast<int64_t>(ops.scalars.size()));
    ColumnGradient home = runGradientRing(
        ctx.communicator(), gradientChunkFeatures(ops), ops.colSizes, d, shares,
        args.options(),
        [&](const Chunk &chunk, at::Tensor &dChunk) {
          tiles(chunk, dChunk);
          at::Tensor share = at::zeros({shares}, at::kDouble);
          std::vector<double> part = programs.takeColShares();
          std::copy(part.begin(), part.end(), share.data_ptr<double>());
          return share;
        },
        chunkKeys(ctx, spec));
    dCols = home.dCols;
    const double *share = home.share.data_ptr<double>();
    std::copy_n(share, homeShares.size(), homeShares.begin());
  } else {
    dCols = at::zeros_like(ops.cols);
    Tensors features = chunkFeatures(ops);
    tiles(Chunk{ops.colOffset, features}, dCols);
  }

  std::vector<double> dScalars = programs.dScalars();
  for (size_t k = 0; k < dScalars.size(); ++k)
    dScalars[k] += homeShares[k];
  auto f64 = at::TensorOptions(at::kDouble);
  at::Tensor dLeaves = at::empty({rowLeafCount, n}, f64);
  std::copy(dRowLeaves.begin(), dRowLeaves.end(), dLeaves.data_ptr<double>());
  at::Tensor dScalarTensor =
      at::empty({static_cast<int64_t>(dScalars.size())}, f64);
  std::copy(dScalars.begin(), dScalars.end(), dScalarTensor.data_ptr<double>());
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  ctx.setResult(2, dLeaves.to(args.type(0)));
  ctx.setResult(3, dScalarTensor.to(args.type(0)));
}

} // namespace
} // namespace similarity

namespace {
constexpr const char *kForwardName = "dloss.fused_similarity";
constexpr const char *kBackwardName = "dloss.fused_similarity_grad";
} // namespace

#ifdef DLOSS_HAVE_CUDA
// The tile launchers' CUDA and cuBLAS failures become dloss::Errors naming
// the op and rank.
#define DLOSS_SIMILARITY_DEVICE_DISPATCH(fn)                                   \
  if (args.onDevice)                                                           \
    return onDevice(args, [&] { fn(ctx, args, spec); });
#else
#define DLOSS_SIMILARITY_DEVICE_DISPATCH(fn)
#endif

void fusedSimilarity(KernelContext &ctx, const SimilarityProgram &spec) {
  using namespace similarity;
  FusedArgs args(ctx, kForwardName);
  DLOSS_SIMILARITY_DEVICE_DISPATCH(fusedSimilarityDevice)
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/false);
  if (args.compute == at::kDouble)
    forward<double>(ctx, args, spec, ops);
  else
    forward<float>(ctx, args, spec, ops);
}

void fusedSimilarityGrad(KernelContext &ctx, const SimilarityProgram &spec) {
  using namespace similarity;
  FusedArgs args(ctx, kBackwardName);
  DLOSS_SIMILARITY_DEVICE_DISPATCH(fusedSimilarityGradDevice)
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/true);
  if (args.compute == at::kDouble)
    backward<double>(ctx, args, spec, ops);
  else
    backward<float>(ctx, args, spec, ops);
}

} // namespace dloss::fused
