// The fused ops' GPU tile launches: one call's workspace, stream, element type,
// error translation.
#include "runtime/fused/DeviceTiles.h"

#include "runtime/support/CudaStream.h"

#include <cstdlib>

namespace dloss::fused {

namespace {

cuda::ElementType elementTypeOf(at::ScalarType type) {
  return type == at::kBFloat16 ? cuda::ElementType::BF16
         : type == at::kHalf   ? cuda::ElementType::F16
                               : cuda::ElementType::F32;
}

} // namespace

DeviceTiles::DeviceTiles(const FusedArgs &args, int64_t rows, int64_t cols)
    : DeviceTiles(args, rows, cols, cuda::tileWorkspaceBytes) {}

DeviceTiles::DeviceTiles(
    const FusedArgs &args, int64_t rows, int64_t cols,
    const std::function<size_t(int64_t, int64_t, cuda::ElementType)> &bytesOf)
    : shape(deviceTileShape(rows, cols)) {
  launch.device = args.device.index();
  launch.stream = currentCudaStream(args.device.index());
  launch.type = elementTypeOf(args.matrixType);
  launch.maxRows = shape.rows;
  launch.maxCols = shape.cols;
  const char *tf32 = std::getenv("DLOSS_CUDA_TF32");
  launch.allowTF32 = tf32 && std::string(tf32) == "1";
  size_t bytes = bytesOf(shape.rows, shape.cols, launch.type);
  workspace =
      at::empty({static_cast<int64_t>(bytes)}, args.options().dtype(at::kByte));
  launch.workspace = workspace.data_ptr();
}

cuda::Tile DeviceTiles::tile(const at::Tensor &rows, const at::Tensor &cols,
                             const Block &block) const {
  const int64_t depth = rows.size(1);
  const size_t row = rows.element_size() * depth;
  cuda::Tile tile;
  tile.rows = static_cast<const char *>(rows.data_ptr()) + block.row * row;
  tile.cols = static_cast<const char *>(cols.data_ptr()) + block.col * row;
  tile.rowCount = block.rows;
  tile.colCount = block.cols;
  tile.depth = depth;
  return tile;
}

void onDevice(KernelContext &ctx, const FusedArgs &args,
              void (*op)(KernelContext &, const FusedArgs &)) {
  onDevice(args, [&] { op(ctx, args); });
}

void onDevice(const FusedArgs &args, const std::function<void()> &op) {
  try {
    op();
  } catch (const Error &) {
    throw;
  } catch (const std::runtime_error &error) {
    args.fail(error.what(),
              "A CUDA kernel or cuBLAS call of the fused op failed; rerun "
              "with CUDA_LAUNCH_BLOCKING=1 to locate it");
  }
}

at::Tensor perRowShares(int64_t n, const FusedArgs &args) {
  return at::zeros({n}, args.options().dtype(at::kDouble));
}

double totalOf(const at::Tensor &shares) { return shares.sum().item<double>(); }

} // namespace dloss::fused
