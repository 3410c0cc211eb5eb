// One fused step's operands: checked against the plan, converted to the compute
// type, on the CPU or one GPU.
//
// Compute type: f64 inputs in f64, every other float type in f32 (results
// are converted back). Targets of any integer type are read as int64. On the
// GPU the tiles take bf16, f16 and f32 as they are (matrixType).
#ifndef DLOSS_RUNTIME_FUSED_FUSEDARGS_H
#define DLOSS_RUNTIME_FUSED_FUSEDARGS_H

#include "runtime/kernels/KernelTable.h"
#include "runtime/support/Error.h"
#include "runtime/support/Format.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

namespace dloss::fused {

/// The hint of a fused op's operand whose shape does not fit: plans keep
/// batch and feature sizes dynamic, so the cause is the inputs (features of
/// different widths on one rank, say), not the plan.
inline constexpr const char *kShapeHint =
    "Check the shapes of the inputs this rank passed: the fused loss's "
    "operands must agree (for example, features of one width)";

using Tensors = std::vector<at::Tensor>;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The sum of `sizes`.
int64_t total(const std::vector<int64_t> &sizes);
/// The largest of `sizes` (not empty).
int64_t largest(const std::vector<int64_t> &sizes);
/// The sum of the sizes of the ranks below `rank`.
int64_t offsetOf(const std::vector<int64_t> &sizes, int rank);

/// The operands of one fused step, checked and converted to the compute type;
/// errors name the op, the rank and the operand.
class FusedArgs {
public:
  /// `colsName` names operand 1 (cols, or the class weights).
  FusedArgs(KernelContext &ctx, const char *op, const char *colsName = "cols")
      : ctx(ctx), op(op), colsName(colsName), rank(ctx.communicator().rank()) {
    const at::Tensor &rows = floats(0, "rows"), &cols = floats(1, colsName);
    bool isDouble =
        rows.scalar_type() == at::kDouble || cols.scalar_type() == at::kDouble;
    compute = isDouble ? at::kDouble : at::kFloat;
    matrixType = compute;
    onDevice = rows.is_cuda() || cols.is_cuda();
    if (!onDevice)
      return;
#ifndef DLOSS_HAVE_CUDA
    fail(std::string(rows.is_cuda() ? "rows" : colsName) +
             " is a CUDA tensor, but this dloss runtime was built without "
             "CUDA",
         "Rebuild dloss where nvcc and cuBLAS are found (/usr/local/cuda, "
         "-DDLOSS_ENABLE_CUDA=ON) against a CUDA LibTorch, or pass CPU "
         "tensors");
#endif
    // The GPU tiles take bf16, f16 and f32 as they are (one type for both
    // operands), accumulate in f32, and compute f64 in f32.
    device = rows.is_cuda() ? rows.device() : cols.device();
    compute = at::kFloat;
    at::ScalarType type = rows.scalar_type();
    matrixType = type == cols.scalar_type() &&
                         (type == at::kBFloat16 || type == at::kHalf)
                     ? type
                     : at::kFloat;
  }

  [[noreturn]] void fail(const std::string &problem,
                         const std::string &hint) const {
    throw Error(problem, hint).withRank(rank).withOp(op);
  }

  /// Operand `i`, a [size, width] float matrix; `width` -1 takes any.
  at::Tensor matrix(size_t i, const char *name, int64_t width = -1) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 2 || (width >= 0 && value.size(1) != width))
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected a matrix" +
               (width >= 0 ? " with " + std::to_string(width) + " columns"
                           : std::string()),
           kShapeHint);
    return converted(value, matrixType);
  }

  /// Operand `i`, a float vector of `length` elements.
  at::Tensor vector(size_t i, const char *name, int64_t length) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 1 || value.size(0) != length)
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected [" + std::to_string(length) + "]",
           kShapeHint);
    return converted(value, compute);
  }

  /// Operand `i`, a 0-d float.
  double scalar(size_t i, const char *name) const {
    const at::Tensor &value = floats(i, name);
    if (value.dim() != 0)
      fail(std::string(name) + " has shape " + shapeText(value.sizes()) +
               ", expected a 0-d tensor",
           kShapeHint);
    return value.item<double>();
  }

  /// Operand `i`, `length` integer targets, each in [0, bound) (`bound`
  /// global `what`), as int64. Checked before any transfer: every rank with a
  /// bad target raises here, and peers that have none fail at their deadline.
  at::Tensor targets(size_t i, const char *name, int64_t length, int64_t bound,
                     const char *what) const {
    const at::Tensor &value = ctx.tensor(i);
    if (!at::isIntegralType(value.scalar_type(), /*includeBool=*/false) ||
        value.dim() != 1 || value.size(0) != length)
      fail(std::string(name) + " is a " + c10::toString(value.scalar_type()) +
               " tensor of shape " + shapeText(value.sizes()) +
               ", expected integers of shape [" + std::to_string(length) + "]",
           kShapeHint);
    auto outOfRange = [&](int64_t k, int64_t target) {
      fail(std::string(name) + "[" + std::to_string(k) +
               "] = " + std::to_string(target) + " is out of range [0, " +
               std::to_string(bound) + "): there are " + std::to_string(bound) +
               " " + what + " on all ranks",
           "Targets are indices into the gathered batch (or the classes of "
           "every shard), and this one is row " +
               std::to_string(k) +
               " of the gathered targets: check the labels every rank "
               "passes");
    };
    if (onDevice) {
      at::Tensor result = value.to(device, at::kLong).contiguous();
      at::Tensor bad = (result < 0).logical_or_(result >= bound);
      if (bad.any().item<bool>()) {
        int64_t k = bad.nonzero()[0][0].item<int64_t>();
        outOfRange(k, result[k].item<int64_t>());
      }
      return result;
    }
    at::Tensor result = value.to(at::kLong).contiguous();
    const int64_t *data = result.data_ptr<int64_t>();
    for (int64_t k = 0; k < length; ++k)
      if (data[k] < 0 || data[k] >= bound)
        outOfRange(k, data[k]);
    return result;
  }

  /// The element type of operand `i`, for its results.
  at::ScalarType type(size_t i) const { return ctx.tensor(i).scalar_type(); }

  at::TensorOptions options() const {
    return at::TensorOptions(compute).device(device);
  }

  KernelContext &ctx;
  const char *op;
  const char *colsName;
  int rank;
  at::ScalarType compute = at::kFloat;
  /// The type rows and cols are converted to: `compute`, except on the GPU.
  at::ScalarType matrixType = at::kFloat;
  /// Whether the operands are CUDA tensors (then every tensor the op makes
  /// lives on `device`).
  bool onDevice = false;
  at::Device device = at::kCPU;

private:
  const at::Tensor &floats(size_t i, const char *name) const {
    const at::Tensor &value = ctx.tensor(i);
    if (!at::isFloatingType(value.scalar_type()))
      fail(std::string(name) + " is a " + c10::toString(value.scalar_type()) +
               " tensor, expected floats",
           "The plan does not match its inputs' types; recompile it");
    return value;
  }

  at::Tensor converted(const at::Tensor &value, at::ScalarType type) const {
    if (onDevice)
      return value.to(device, type).contiguous();
    return value.to(type).contiguous();
  }
};

/// What every similarity kernel starts with: S = rows x cols^T, L = scale S.
struct Similarity {
  at::Tensor rows; ///< [n, d], this rank's (or the gathered) rows.
  at::Tensor cols; ///< [m, d], this rank's columns (or class weights).
  double scale = 1;
};

/// Operands 0-2 of every fused op: rows, cols (or the class weights), scale.
Similarity similarityOperands(const FusedArgs &args);

/// Sets a backward op's results: the gradients of rows and cols (of the
/// types of operands 0 and 1), then those of its 0-d operands 2, 3, ...
/// (this rank's partial gradients, on the operands' device).
void setGradients(KernelContext &ctx, const FusedArgs &args,
                  const at::Tensor &dRows, const at::Tensor &dCols,
                  std::initializer_list<double> scalars);

} // namespace dloss::fused

#endif // DLOSS_RUNTIME_FUSED_FUSEDARGS_H
