// The GPU glue of dloss.fused_similarity and its _grad
// (FusedSimilarityDevice.h).
#include "runtime/fused/FusedSimilarityDevice.h"

#ifdef DLOSS_HAVE_CUDA
#include "runtime/fused/DeviceTiles.h"
#include "runtime/fused/FusedSimilarity.h"
#include "runtime/fused/SimilarityOperands.h"
#include "runtime/fused/TileMath.h"

#include <algorithm>

namespace dloss::fused::similarity {

namespace {

constexpr const char *kDeviceLimitHint =
    "Pass CPU tensors for this loss, or compile it without fusing "
    "(dlossc --no-fuse, jit::Options::fuse = false)";

/// `count` `what` against the CUDA tiles' fixed-size arrays.
void checkDeviceLimit(const FusedArgs &args, size_t count, int limit,
                      const char *what) {
  if (count > static_cast<size_t>(limit))
    args.fail("the tile program has " + std::to_string(count) + " " + what +
                  ", more than the " + std::to_string(limit) +
                  " the CUDA tiles hold (cuda/SimilarityTiles.h)",
              kDeviceLimitHint);
}

/// The program and its 0-d leaves as the CUDA tiles take them.
cuda::TileProgram deviceProgram(const FusedArgs &args,
                                const SimilarityOperands &ops) {
  checkDeviceLimit(args, ops.program.size(), cuda::kMaxInstructions,
                   "instructions");
  checkDeviceLimit(args, ops.outputs.size(), cuda::kMaxResults, "results");
  checkDeviceLimit(args, ops.colOutputs.size(), cuda::kMaxResults,
                   "column results");
  checkDeviceLimit(args, ops.rowLeaves.size(), cuda::kMaxRowLeaves,
                   "per-row leaves");
  checkDeviceLimit(args, ops.colLeaves.size(), cuda::kMaxColLeaves,
                   "per-column leaves");
  checkDeviceLimit(args, ops.scalars.size(), cuda::kMaxScalars, "0-d leaves");
  cuda::TileProgram program;
  program.count = static_cast<int32_t>(ops.program.size());
  std::copy(ops.program.begin(), ops.program.end(), program.code);
  auto results = [](const std::vector<Output> &outputs, cuda::TileResult *out) {
    for (size_t k = 0; k < outputs.size(); ++k)
      out[k] = cuda::TileResult{static_cast<int32_t>(outputs[k].reg),
                                outputs[k].kind};
    return static_cast<int32_t>(outputs.size());
  };
  program.rowResults = results(ops.outputs, program.rowResult);
  program.colResults = results(ops.colOutputs, program.colResult);
  program.rowLeaves = static_cast<int32_t>(ops.rowLeaves.size());
  program.colLeaves = static_cast<int32_t>(ops.colLeaves.size());
  program.scalars = static_cast<int32_t>(ops.scalars.size());
  for (size_t k = 0; k < ops.scalars.size(); ++k) {
    program.scalar[k] = static_cast<float>(ops.scalars[k]);
    program.scalarIsFloat |= ops.scalarIsFloat[k] ? 1u << k : 0u;
  }
  for (size_t k = 0; k < ops.rowLeaves.size(); ++k)
    program.rowLeafIsFloat |= ops.rowLeafIsFloat[k] ? 1u << k : 0u;
  return program;
}

/// The tiles' workspace size for `colResults` column results.
std::function<size_t(int64_t, int64_t, cuda::ElementType)>
deviceWorkspace(size_t colResults) {
  return [colResults](int64_t rows, int64_t cols, cuda::ElementType type) {
    return cuda::similarityWorkspaceBytes(rows, cols, type,
                                          static_cast<int>(colResults));
  };
}

/// The leaves of `block` of `chunk` (features: cols, then the per-column
/// leaves), as RowProgram reads them.
cuda::TileLeaves deviceLeaves(const SimilarityOperands &ops, const Chunk &chunk,
                              const Block &block) {
  cuda::TileLeaves leaves;
  leaves.rowBase = ops.rowOffset + block.row;
  leaves.colBase = chunk.offset + block.col;
  for (size_t k = 0; k < ops.rowLeaves.size(); ++k)
    leaves.row[k] = dataAt<float>(ops.rowLeaves[k], block.row);
  for (size_t k = 0; k < ops.colLeaves.size(); ++k)
    leaves.col[k] = dataAt<float>(chunk.features[1 + k], block.col);
  return leaves;
}

} // namespace

void fusedSimilarityDevice(KernelContext &ctx, const FusedArgs &args,
                           const SimilarityProgram &spec) {
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/false);
  const cuda::TileProgram program = deviceProgram(args, ops);
  const int64_t n = ops.rows.size(0), m = ops.cols.size(0);
  const int64_t numOutputs = static_cast<int64_t>(ops.outputs.size());
  const int64_t numCol = static_cast<int64_t>(ops.colOutputs.size());
  DeviceTiles dev(args, n, spec.gathered ? largest(ops.colSizes) : m,
                  deviceWorkspace(ops.colOutputs.size()));
  at::Tensor max = at::full({numOutputs, n}, -kInf, args.options());
  at::Tensor sum = at::zeros({numOutputs, n}, args.options());

  auto visit = [&](const Chunk &chunk, Tensors &carry) {
    const at::Tensor &cols = chunk.features[0];
    const int64_t length = chunk.length();
    clearColumnStats(carry);
    forEachBlock(n, length, dev.shape, [&](const Block &block) {
      cuda::SimilarityForward tile;
      tile.leaves = deviceLeaves(ops, chunk, block);
      for (int64_t k = 0; k < numOutputs; ++k) {
        tile.rowMax[k] = dataAt<float>(max, k * n + block.row);
        tile.rowSum[k] = dataAt<float>(sum, k * n + block.row);
      }
      for (int64_t k = 0; k < numCol; ++k) {
        tile.colMax[k] = dataAt<float>(carry[0], k * length + block.col);
        tile.colSum[k] = dataAt<float>(carry[1], k * length + block.col);
      }
      cuda::similarityForwardTile(dev.launch, dev.tile(ops.rows, cols, block),
                                  program, tile);
    });
  };

  Tensors colStats = visitColumns(ctx, spec, ops, args.options(), visit);
  // The shards combine, and the results form, in f64 as on the CPU.
  setForwardResults(ctx, args, spec, ops, max.to(at::kDouble),
                    sum.to(at::kDouble), colStats);
}

void fusedSimilarityGradDevice(KernelContext &ctx, const FusedArgs &args,
                               const SimilarityProgram &spec) {
  SimilarityOperands ops = similarityOperands(args, spec, /*backward=*/true);
  const cuda::TileProgram program = deviceProgram(args, ops);
  const int64_t n = ops.rows.size(0), m = ops.cols.size(0),
                d = ops.rows.size(1);
  const size_t numOutputs = ops.outputs.size(), numCol = ops.colOutputs.size();
  const int64_t rowLeafCount = static_cast<int64_t>(ops.rowLeaves.size());
  const int64_t scalarCount = static_cast<int64_t>(ops.scalars.size());
  // [1] at least: no empty transfers.
  const int64_t shares = std::max<int64_t>(1, scalarCount);
  const bool splitScalars =
      numCol > 0 &&
      std::any_of(ops.scalarIsFloat.begin(), ops.scalarIsFloat.end(),
                  [](bool isFloat) { return isFloat; });
  DeviceTiles dev(args, n, spec.gathered ? largest(ops.colSizes) : m,
                  deviceWorkspace(numCol));
  const auto f64 = args.options().dtype(at::kDouble);
  at::Tensor dRows = at::zeros({n, d}, args.options());
  at::Tensor dLeaves = at::zeros({rowLeafCount, n}, f64);
  at::Tensor dScalarRow = at::zeros({shares, n}, f64);
  // The chunk's column results and cotangents follow cols and its leaves.
  const size_t colBase = 1 + ops.colLeaves.size();

  auto tiles = [&](const Chunk &chunk, at::Tensor &dCols,
                   at::Tensor &colShareRow) {
    const at::Tensor &cols = chunk.features[0];
    forEachBlock(n, chunk.length(), dev.shape, [&](const Block &block) {
      cuda::SimilarityBackward tile;
      tile.leaves = deviceLeaves(ops, chunk, block);
      for (size_t k = 0; k < numOutputs; ++k) {
        tile.rowValue[k] = dataAt<float>(ops.results[k], block.row);
        tile.rowCt[k] = dataAt<float>(ops.cts[k], block.row);
      }
      for (size_t k = 0; k < numCol; ++k) {
        tile.colValue[k] =
            dataAt<float>(chunk.features[colBase + k], block.col);
        tile.colCt[k] =
            dataAt<float>(chunk.features[colBase + numCol + k], block.col);
      }
      tile.splitScalars = splitScalars;
      for (int64_t a = 0; a < rowLeafCount; ++a)
        tile.dRowLeaf[a] = dataAt<double>(dLeaves, a * n + block.row);
      for (int64_t a = 0; a < scalarCount; ++a) {
        tile.dScalarRow[a] = dataAt<double>(dScalarRow, a * n + block.row);
        tile.colShareRow[a] = dataAt<double>(colShareRow, a * n + block.row);
      }
      tile.dRows = dataAt<float>(dRows, block.row * d);
      tile.dCols = dataAt<float>(dCols, block.col * d);
      cuda::similarityBackwardTile(dev.launch, dev.tile(ops.rows, cols, block),
                                   program, tile);
    });
  };

  at::Tensor dCols, homeShares;
  if (spec.gathered) {
    // The carry: the chunk's column gradient, and its column results' share
    // of the 0-d gradients.
    ColumnGradient home = runGradientRing(
        ctx.communicator(), gradientChunkFeatures(ops), ops.colSizes, d, shares,
        args.options(),
        [&](const Chunk &chunk, at::Tensor &dChunk) {
          at::Tensor colShareRow = at::zeros({shares, n}, f64);
          tiles(chunk, dChunk, colShareRow);
          return colShareRow.sum(1);
        },
        chunkKeys(ctx, spec));
    dCols = home.dCols;
    homeShares = home.share;
  } else {
    dCols = at::zeros({m, d}, args.options());
    at::Tensor colShareRow = at::zeros({shares, n}, f64);
    Tensors features = chunkFeatures(ops);
    tiles(Chunk{ops.colOffset, features}, dCols, colShareRow);
    homeShares = at::zeros({shares}, f64);
  }

  at::Tensor dScalars =
      (dScalarRow.sum(1) + homeShares).narrow(0, 0, scalarCount);
  ctx.setResult(0, dRows.to(args.type(0)));
  ctx.setResult(1, dCols.to(args.type(1)));
  ctx.setResult(2, dLeaves.to(args.type(0)));
  ctx.setResult(3, dScalars.to(args.type(0)));
}

} // namespace dloss::fused::similarity
#endif // DLOSS_HAVE_CUDA
