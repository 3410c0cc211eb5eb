// The fused ops' GPU visits' common part: tile launches on LibTorch's current
// stream, GPU gradient buffers, dispatch.
//
// CUDA tensors (a runtime built with DLOSS_HAVE_CUDA) take the same ring
// driver as the CPU with a device visit: cuda/FusedTiles.h's launchers run
// each tile (cuBLAS GEMMs on the bf16/fp16/f32 inputs as they are, fp32
// accumulation, fused epilogues; f64 is computed in f32 there), on LibTorch's
// current stream; the statistics, carries and results are ATen CUDA tensors.
#ifndef DLOSS_RUNTIME_FUSED_DEVICETILES_H
#define DLOSS_RUNTIME_FUSED_DEVICETILES_H

#include "runtime/fused/FusedArgs.h"
#include "runtime/fused/TileMath.h"

#ifdef DLOSS_HAVE_CUDA
#include "runtime/fused/cuda/FusedTiles.h"
#include "runtime/fused/cuda/SimilarityTiles.h"

#include <functional>

namespace dloss::fused {

/// One call's tile launches: the tile shape and the workspace (from
/// LibTorch's allocator, on the operands' device).
class DeviceTiles {
public:
  DeviceTiles(const FusedArgs &args, int64_t rows, int64_t cols);
  /// The same with a workspace of bytes(maxRows, maxCols, type) bytes, for
  /// launchers that carve their own (cuda/SimilarityTiles.h).
  DeviceTiles(
      const FusedArgs &args, int64_t rows, int64_t cols,
      const std::function<size_t(int64_t, int64_t, cuda::ElementType)> &bytes);

  /// The operands of `block`: rows[block.row...], cols[block.col...].
  cuda::Tile tile(const at::Tensor &rows, const at::Tensor &cols,
                  const Block &block) const;

  TileShape shape;
  cuda::TileLaunch launch;

private:
  at::Tensor workspace;
};

/// Element `offset` of a contiguous tensor of T.
template <typename T> T *dataAt(const at::Tensor &tensor, int64_t offset = 0) {
  return tensor.data_ptr<T>() + offset;
}

/// Runs a GPU op; the tile launchers' CUDA and cuBLAS failures
/// (std::runtime_error) become dloss::Errors naming the op and rank.
void onDevice(KernelContext &ctx, const FusedArgs &args,
              void (*op)(KernelContext &, const FusedArgs &));
/// The same for any callable (ops whose visit takes more than the args).
void onDevice(const FusedArgs &args, const std::function<void()> &op);

/// Per row, in f64, a backward's share of a 0-d parameter's gradient.
at::Tensor perRowShares(int64_t n, const FusedArgs &args);

/// A GPU backward's rows: their targets, the gradient dRows [n, d] and, per
/// row, the share of dscale; what every backward tile takes (BackwardTile).
struct DeviceRowGradient {
  DeviceRowGradient(const FusedArgs &args, double scale,
                    const at::Tensor &targets, int64_t n, int64_t d)
      : scale(scale), targets(targets), d(d),
        dRows(at::zeros({n, d}, args.options())),
        dScaleRow(perRowShares(n, args)) {}

  /// Points `tile`'s BackwardTile fields at `block`, whose columns are the
  /// global columns colOffset + block.col... and whose column gradient is in
  /// dCols ([count, d] float32).
  void point(cuda::BackwardTile &tile, const Block &block, int64_t colOffset,
             const at::Tensor &dCols) const {
    tile.scale = static_cast<float>(scale);
    tile.rowTargets = dataAt<int64_t>(targets, block.row);
    tile.colBase = colOffset + block.col;
    tile.dRows = dataAt<float>(dRows, block.row * d);
    tile.dCols = dataAt<float>(dCols, block.col * d);
    tile.dScaleRow = dataAt<double>(dScaleRow, block.row);
  }

  double scale;
  at::Tensor targets;
  int64_t d;
  at::Tensor dRows, dScaleRow;
};

/// The sum of per-row shares.
double totalOf(const at::Tensor &shares);

} // namespace dloss::fused

/// Sends a fused kernel's CUDA operands to its GPU visit `fn`.
#define DLOSS_DEVICE_DISPATCH(fn)                                              \
  if (args.onDevice)                                                           \
    return onDevice(ctx, args, fn);
#else
#define DLOSS_DEVICE_DISPATCH(fn)
#endif // DLOSS_HAVE_CUDA

#endif // DLOSS_RUNTIME_FUSED_DEVICETILES_H
